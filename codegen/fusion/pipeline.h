// The per-rank lowering pipeline as one list of named stages (STYLE.md #1; as
// Halide's lower_impl and Triton's add_stages): lower the global graph for every
// rank, decompose composites, decompose collective matmuls into ring steps, fuse into
// kernels, schedule collectives. compile, run, explain, simulate and tune all run it
// through rank_programs; --dump-after and --verify-each observe the same stages.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/dist/lower.h"
#include "codegen/fusion/collective_matmul.h"
#include "codegen/fusion/fuse.h"

namespace sf {

struct RankPipelineOptions {
  bool fuse = true;     // false: one kernel per op
  // Attention as one kernel (fuse.h); false (--no-flash-attention): its matmuls and
  // softmax as separate kernels, torch's math backend.
  bool flash_attention = true;
  bool reorder = true;  // false: collectives where lowering put them
  // Whether a kernel can be emitted for the target; when set, a fused kernel that
  // cannot is split again: its ops are fused anew, each a kernel of its own, so an
  // emitter's limit costs one group's fusion, not the run. Called once per distinct
  // kernel (by group text).
  std::function<bool(const LocalKernel&)> can_emit;
  // Collective-matmul decomposition (collective_matmul.h): auto (the estimates
  // decide), always, never (--no-decompose).
  DecomposeOptions decompose;
  // When set, receives one line per collective matmul considered (for explain).
  std::vector<DecomposeDecision>* decisions = nullptr;
  // Check every rank's programs after each stage (lower, decompose,
  // collective-matmul, fuse, schedule; verify_programs.h): `--verify-each`, and on
  // whenever SHARDFUSE_VERIFY_EACH is set (the test suite sets it). A failure stops
  // the pipeline there and is returned as an internal Diag (Diag::internal).
  bool verify_each = false;
  // Called after each stage (after its --verify-each check) with the stage's name and
  // every rank's programs: --dump-after prints them.
  std::function<void(std::string_view stage, const std::vector<LocalProgram>&)> after_stage;
};

// The stages rank_programs runs under `opts`, in order: lower, decompose,
// collective-matmul, fuse, and schedule unless !opts.reorder.
std::vector<std::string> pipeline_stages(const RankPipelineOptions& opts);
// Every stage name the pipeline has under some options.
const std::vector<std::string>& all_pipeline_stages();

// Every rank's program. Fusion decides for all ranks together (fuse_all), so the
// programs have the same kernels and steps whatever the local shapes. A Diag only
// for a bug: a stage's broken invariant (--verify-each, or a stage's own check,
// which stages raise as DiagError or std::logic_error inside the pipeline), marked
// Diag::internal; no exception leaves this function.
Result<std::vector<LocalProgram>> rank_programs(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh,
                                                const RankPipelineOptions& opts = {});

// One rank's program: the same as rank_programs(...)[rank] (it lowers every rank
// to decide fusion alike, which is cheap next to running one).
Result<LocalProgram> rank_program(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank,
                                  const RankPipelineOptions& opts = {});

}  // namespace sf
