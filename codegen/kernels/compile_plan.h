// `shardfuse compile`: the whole pipeline to a Plan for a GPU arch: propagate,
// lower, fuse and schedule every rank, emit each distinct kernel as PTX (checked
// and measured by ptxas when it is there), and write the Plan directory.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "codegen/fusion/pipeline.h"
#include "codegen/kernels/emitter.h"
#include "codegen/kernels/tune.h"
#include "runtime/plan/plan.h"
#include "runtime/plan/plan_host.h"

namespace sf {

struct CompileOptions {
  std::string arch = "sm_90a";
  bool run_ptxas = true;
  RankPipelineOptions pipeline;
  KernelConfig config;
  Precision precision = Precision::Fused;  // how kernels round f16/bf16 values (autotune/config.h)
  bool allow_tf32 = false;                 // f32 matmuls may take TF32 tensor cores (KernelSpec::allow_tf32)
  bool tma = true;                         // sm_90a matmuls read their operands by TMA (KernelSpec::tma)
  // Picks each kernel's config (the tuning cache's choice); when empty every kernel
  // gets `config` (reductions: the emitter's suggestion from it).
  std::function<KernelChoice(const LocalKernel&)> choose;
  // `compile --matmul-config`: every matmul kernel takes this config, over the cache
  // and the default (its config_source says "flag"); one whose tensor-core knobs
  // (warp_specialize, persistent) its tensor-core kernel cannot take is an error.
  std::optional<KernelConfig> matmul_config;
  // `compile --attention-config`: config text ("wgmma=1") whose fields every fused
  // attention kernel takes over its config (the cache's or the default); its
  // config_source says "flag". A config the emitter refuses is that kernel's error.
  std::optional<std::string> attention_config;
  // `compile --reduction-config`: the same for every reduction kernel ("rows_per_block=32
  // threads_per_row=32"), over the cache's config or the emitter's suggestion.
  std::optional<std::string> reduction_config;
  // PTX for `arch` (false: a Plan that runs only on the host, `run --device cpu`;
  // arch is then "host").
  bool ptx = true;
  // Every kernel's host (CPU) code too, so the Plan runs with `--device cpu`:
  //   Object: one shared object in the Plan (Plan::host_object), linked by the
  //           system C compiler driver (codegen/llvm/backend.h); for `compile`;
  //   Jit:    compiled into this process (CompiledPlan::host_kernels); for `run`.
  // A kernel the host emitter cannot build gets no host symbol (said in the report).
  //   Reference: every kernel on the reference evaluator (`run --kernels reference`).
  enum class HostCode : uint8_t { None, Object, Jit, Reference };
  HostCode host = HostCode::Object;
  // Every output Replicate at the end (collectives added to gather them), so each
  // rank holds the whole result: `run --rank`, where every process reports it.
  bool replicate_outputs = false;
  // Each kernel's host config (the host tuning cache's choice); default when empty.
  std::function<KernelConfig(const LocalKernel&)> host_choose;
};

struct CompiledPlan {
  Plan plan;
  std::map<std::string, std::string> ptx;  // file name -> PTX text
  std::string report;                      // report.txt
  std::string graph_source;                // graph.sf: the graph's text, for `exec` (when known)
  std::string host_object;                 // HostCode::Object: the shared object's bytes
  std::shared_ptr<const HostKernels> host_kernels;  // HostCode::Jit: the kernels' code in this process
};

// A Diag naming every kernel that could not be emitted or that ptxas rejected.
Result<CompiledPlan> compile_plan(const Graph& g, const CompileOptions& opts);

// Writes plan.json, the .ptx files and report.txt into `dir`, atomically: into a
// fresh sibling directory first, which then replaces `dir`; on failure `dir` is
// left as it was and nothing half-written remains. `dir` must be absent, empty, or
// a Plan directory this function wrote (its .shardfuse-plan marker lists every file
// in it); anything else (a file, a link, the working directory, a directory of the
// user's) is refused with a Diag naming it, never deleted.
Result<void> write_plan_dir(const CompiledPlan& p, const std::string& dir);

}  // namespace sf
