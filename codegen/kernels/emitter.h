// One emitter per fusion kind behind one interface (STYLE.md #5). An emitter gets a
// fusion group and a config and returns an LLVM module with one kernel plus its
// launch shape; it knows nothing of meshes, ranks or files.
//
// The group is a Graph on local shapes: its params are the kernel's inputs in
// order, its outputs the kernel's outputs in order, and its nodes primitive ops
// (no composites, no collectives); number literals are Constant nodes and become
// immediates. Views (transpose, permute, reshape, expand) and broadcasting inside
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

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/ir/graph.h"
#include "codegen/llvm/backend.h"

namespace sf {

enum class KernelKind : uint8_t { Pointwise, Reduction, Matmul, Gather };
std::string_view kernel_kind_name(KernelKind k);

struct KernelSpec {
  std::string entry;  // the kernel's symbol, a C identifier
  KernelKind kind = KernelKind::Pointwise;
  Graph group;
};

// Tuning knobs; every field has a sane default and an emitter reads the ones that
// concern its kind. The autotuner searches over them.
struct KernelConfig {
  // pointwise and reduction
  int block = 256;          // threads per block
  int vector = 4;           // elements per vector load/store where alignment allows
  int elems_per_thread = 1; // vectors per thread, a block apart (warp accesses stay coalesced)
  bool grid_stride = true;  // loop over the index space with a capped grid, or one shot
  int max_blocks = 4096;    // cap on the grid when grid_stride
  // reduction
  int rows_per_block = 1;
  int threads_per_row = 256;
  // matmul
  int block_m = 64, block_n = 64, block_k = 16;
  int warps = 4;
  int stages = 2;
  int group_m = 8;   // GROUP_M swizzle of block indices for L2 reuse
  int split_k = 1;
};

struct LaunchShape {
  std::array<int64_t, 3> grid{1, 1, 1};
  std::array<int, 3> block{1, 1, 1};
  int shared_bytes = 0;
};

struct EmittedKernel {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
  std::string entry;
  LaunchShape launch;  // NVPTX only; the host entry runs the whole grid
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
