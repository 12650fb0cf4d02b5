// One emitter per fusion kind behind one interface (STYLE.md #5). An emitter gets a
// fusion group and a config and returns an LLVM module with one kernel plus its
// launch shape; it knows nothing of meshes, ranks or files.
//
// The group is a Graph on local shapes: its params are the kernel's inputs in
// order, its outputs the kernel's outputs in order, and its nodes primitive ops
// (no composites, no collectives); number literals are Constant nodes and become
// immediates. Views (transpose, permute, reshape, expand, slice, concat) and broadcasting inside
// the group are folded into index arithmetic; nothing is materialised but outputs.
//
// Kernel ABI, the same for every kind:
//   NVPTX: `void @<entry>(ptr addrspace(1) in0, ..., ptr addrspace(1) out0, ...)`,
//          launched with LaunchShape's grid/block/shared memory.
//   Host:  `void @<entry>(ptr args)`, args an array of pointers (inputs then
//          outputs); the whole grid runs inside the call, as loops.
// Tensors are dense, C order, in their storage dtype (f16/bf16 as 16-bit
// patterns, bool as one byte); arithmetic on f16/bf16 is done in f32.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "autotune/config.h"
#include "codegen/ir/graph.h"
#include "codegen/llvm/backend.h"
#include "runtime/plan/tensor_map.h"

namespace sf {

// KernelKind, KernelConfig and Precision live in autotune/config.h (no LLVM there).

struct KernelSpec {
  std::string entry;  // the kernel's symbol, a C identifier
  KernelKind kind = KernelKind::Pointwise;
  Graph group;
  Precision precision = Precision::Fused;
  // f32 matmuls may multiply on the tensor cores in TF32 (10-bit mantissa inputs,
  // f32 accumulation), as torch.backends.cuda.matmul.allow_tf32; off: exact FMA.
  bool allow_tf32 = false;
  // sm_90a matmuls may read their operands by TMA (cp.async.bulk.tensor) through
  // tensor maps the runtime encodes (LaunchShape::tensor_maps); off: cp.async.
  bool tma = false;
};

// A TMA tensor map a kernel reads one of its inputs through: the runtime encodes it
// over the input's buffer, stores it in global memory and passes its address as an
// extra kernel argument, after the outputs, in LaunchShape::tensor_maps' order. The
// Plan's own type (runtime/plan/tensor_map.h), so compile_plan copies it as it is.
using TensorMapSpec = PlanTensorMap;
inline constexpr int kMaxTensorMapRank = kPlanTensorMapRank;  // TMA's limit

struct LaunchShape {
  std::array<int64_t, 3> grid{1, 1, 1};
  std::array<int, 3> block{1, 1, 1};
  int shared_bytes = 0;
  // The outputs must be zero before the launch: the kernel adds into them (split-K
  // matmuls add each block's partial sums atomically).
  bool zero_outputs = false;
  std::vector<TensorMapSpec> tensor_maps;  // extra arguments after the outputs
  // Bytes of device scratch the kernel takes as its last argument (after the tensor
  // maps); 0: none. It must be zero when allocated, and every launch leaves it zero.
  // A split-K matmul whose result is not its bare f32 output sums its partials there
  // (docs/kernels.md, "Split-K").
  int64_t workspace_bytes = 0;
  // grid[0] is a persistent walk (a persistent matmul): the kernel strides its work
  // items by the launch's width, so any width computes every item, and a runtime may
  // launch fewer blocks where the device holds fewer at once.
  bool persistent = false;
  // Blocks per thread-block cluster along x (the PTX's `.reqnctapercluster`; 1: none):
  // grid[0] is then a multiple of it, and a runtime shortening a persistent walk keeps
  // it one (a cluster's blocks take the same work items).
  int cluster = 1;
};

struct EmittedKernel {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
  std::string entry;
  LaunchShape launch;  // NVPTX only; the host entry runs the whole grid
  // A clause for report.txt's "form:" line that only the emitter knows (the
  // attention: whether TMA brings k and v, and if not, why); empty: none.
  std::string form;
};

class Emitter {
 public:
  virtual ~Emitter() = default;
  // A Diag (never a crash) for a group or config this emitter cannot handle; the
  // fusion pass then falls back to smaller groups.
  virtual Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                                     const llvmb::Target& target) const = 0;
};

// The emitter for a kind (codegen/kernels/emitter.cpp). A kind without one yet
// answers every emit() with a Diag.
const Emitter& emitter_for(KernelKind k);

}  // namespace sf
