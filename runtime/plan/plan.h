// A Plan: everything a rank needs to run a compiled graph, without LLVM (DESIGN.md:
// a Plan written on a machine with LLVM runs on one that has only the CUDA driver
// and NCCL). On disk it is a directory: plan.json (this structure), one .ptx per
// distinct kernel, and report.txt. docs/plan.md documents the JSON schema.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/collective.h"
#include "runtime/core/diag.h"
#include "runtime/core/kernel_kind.h"
#include "runtime/core/mesh.h"
#include "runtime/core/tensor.h"
#include "runtime/gpu/gemm.h"
#include "runtime/plan/tensor_map.h"

namespace sf {

struct PlanKernel {
  std::string id;     // unique in the plan; also the .ptx file's stem
  std::string entry;  // the .entry symbol in the PTX
  KernelKind kind = KernelKind::Pointwise;  // "kind" in plan.json: kernel_kind_name
  std::string ptx_file;
  std::array<int64_t, 3> grid{1, 1, 1};
  std::array<int, 3> block{1, 1, 1};
  int shared_bytes = 0;
  bool zero_outputs = false;  // zero the outputs before the launch (split-K adds into them)
  // grid[0] is a persistent walk (LaunchShape::persistent): the runtime launches at
  // most the blocks the device holds at once.
  bool persistent = false;
  // Blocks per thread-block cluster along x (LaunchShape::cluster; the PTX sets it):
  // grid[0] is whole clusters, and a persistent walk shortened keeps it so. 1: none.
  int cluster = 1;
  int registers = -1;  // from ptxas -v; -1 when ptxas was not run
  int64_t spill_bytes = -1;
  int64_t bytes_read = 0, bytes_written = 0, flops = 0;
  std::vector<std::string> ops;
  std::string config;         // the kernel's config as "name=value ..." (config_str)
  std::string config_source;  // "default", "cache" or "tuned"
  std::vector<PlanTensorMap> tensor_maps;  // extra arguments after the outputs
  // Bytes of scratch passed after the tensor maps, zeroed when allocated; the kernel
  // leaves it zero (split-K sums there); 0: none.
  int64_t workspace_bytes = 0;
  // The kernel's host (CPU) code in Plan::host_object, for `exec --device cpu`:
  // its symbol (`void f(void** args)`, args the step's inputs then outputs; empty
  // when the host emitter could not build it), whether its outputs are zeroed
  // first, and its host config.
  std::string host_symbol;
  bool host_zero_outputs = false;
  std::string host_config;
};

struct PlanBuffer {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;  // local shape on this rank
};

// A "gemm" step: a fused matmul kernel whose tuned winner is a library GEMM
// (docs/plan.md). Its `in` buffers are A, B and the bias (when the epilogue has one),
// its one `out` is C.
struct PlanGemm {
  std::string name;  // the fused kernel it stands for (k0_matmul_add_relu), for messages and traces
  GemmDesc desc;
};

// One step of a rank's program, as the CUDA runtime will issue it.
struct PlanStep {
  std::string op;  // kernel, gemm, all_gather, all_reduce, reduce_scatter, all_to_all, wait, slice, partialize
  // The collective `op` names (runtime/core/collective.h), nullopt for the other steps.
  std::optional<CollectiveKind> collective() const { return parse_collective(op); }
  std::string stream;  // compute or comm
  std::string kernel;  // kernel: PlanKernel::id
  std::vector<int> in, out;  // buffer ids
  int handle = -1;           // collective start/wait pairing
  std::string mesh_dim;      // collectives, slice, partialize
  std::vector<int> group;    // collectives: the ranks, in group order
  int dim = 0, dim2 = 0;
  std::string reduce_op;
  std::vector<int64_t> sizes, sizes2, offset;
  bool keep = true;
  PlanGemm gemm;  // gemm steps
};

struct PlanRank {
  int rank = 0;
  std::vector<PlanBuffer> buffers;
  std::vector<int> inputs;                 // per graph param: its buffer
  std::vector<std::string> input_specs;    // per graph param: its placement
  std::vector<int> outputs;                // per graph output: its buffer
  std::vector<std::string> output_specs;
  std::vector<PlanStep> steps;
};

// Limits on a Plan read from plan.json (docs/plan.md): a world of at most 2^16
// ranks, and at most 2^40 elements in one buffer, so that element and byte counts
// (x 8 bytes, x 2^16 members of a collective) stay far inside int64.
inline constexpr int64_t kMaxPlanWorld = int64_t{1} << 16;
inline constexpr int64_t kMaxPlanElements = int64_t{1} << 40;

struct Plan {
  // 2: kernels' host code (host_object, PlanKernel::host_symbol).
  static constexpr int kVersion = 2;
  std::string graph;
  // FNV-1a of the printed graph (plan_graph_digest) that `compile` wrote the Plan
  // for; `exec` compares it with graph.sf's, after checking graph.sf's shapes and
  // placements against the buffers (runtime/plan/plan_verify.h).
  std::string graph_digest;
  std::string mesh;  // "tp=4", "" for one rank
  int world = 1;
  std::string arch;
  // How the kernels round f16/bf16 values (compile --precision): "fused" (once, at
  // their stores) or "eager" (at every op); "" in a Plan that does not say, which
  // exec --check treats as eager (the eager reference alone).
  std::string precision;
  std::vector<std::string> params, outputs;  // names, in graph order
  std::vector<PlanKernel> kernels;
  std::vector<PlanRank> ranks;
  // The shared object (a file name in the Plan directory) holding the kernels' host
  // code; empty when the Plan has none.
  std::string host_object;
};

std::string plan_to_json(const Plan& p);
// A Plan's "mesh" ("dp=2 tp=2", Mesh::str) back into a Mesh; a Diag naming `file`.
Result<Mesh> parse_plan_mesh(const std::string& mesh, const std::string& file);
// Parses and validates plan.json text (`file` names it in Diags): version, every
// field's type and range (by its JSON path), then verify_plan (runtime/plan/plan_verify.h):
// buffers defined before use, collectives that match across ranks, and so on.
Result<Plan> plan_from_json(const std::string& text, const std::string& file);

}  // namespace sf
