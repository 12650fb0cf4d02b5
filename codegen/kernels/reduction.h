// The reduction emitter (STYLE.md #5; XLA's gpu/fusions/reduction.cc, Inductor's
// persistent/looped reduction templates): a group of one or more reductions that all
// reduce the same tensor shape X over the same dims, with the elementwise prologue
// that computes X-shaped values and an epilogue either in X's space (softmax's
// exp(x - max) / sum) or in the reduced space (mean = sum * 1/N, rsqrt(var + eps)).
// docs/kernels.md ("Reduction") describes the strategy; emitter.h the ABI.
//
// Vocabulary: a *row* is one coordinate of the kept (not reduced) dims; it owns the
// `n` = numel(reduced dims) elements of X that fold into one reduced value. Reductions
// are evaluated in *passes* over a row's elements: a pass holds the reductions whose
// operands depend only on reductions of earlier passes (softmax: max, then sum; layer
// norm: mean, then var), and the prologue is recomputed in every pass that reads it.
#pragma once

#include <cstdint>
#include <vector>

// EmittedKernel destroys an LLVMContext and a Module: callers need their definitions
// (emitter.h only forward-declares them).
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/emitter.h"

namespace sf {

// Emits `spec.group` (spec.kind == KernelKind::Reduction) as one kernel for `target`.
//
// The group may hold params, constants, elementwise ops, views and sum/max/min/mean
// nodes; every reduction must reduce the same shape X over the same dims, and every
// output must have numel(X) elements (written per element of X, at its own C-order
// flat index) or one per row (written once per row). A value computed from reduced
// values must read them at its own row (a view that moves reduced values to other
// rows is a Diag: the fusion pass then splits the group). Max/min over rows with no
// elements (a reduced dim of size 0 while rows exist) is a Diag, as the reference
// evaluator errors too; sum gives 0 and mean NaN there. numel(X) == 0 with no rows
// is a kernel that does nothing.
//
// Host: one loop over rows; per row, one loop per pass (blocked: partial sums over
// chunks of about sqrt(n) elements, so the f32 error grows like 2 sqrt(n) rather than
// n), then reduced-space outputs, then a loop writing X-space outputs.
// NVPTX: threads_per_row threads per row, rows_per_block rows per block, a block
// reduction per pass (per-thread partials, warp butterfly shuffles, shared memory
// across warps); reads threads_per_row, rows_per_block, grid_stride and max_blocks.
// Floats accumulate in f32, integer sums in i64. A row whose share per thread fits
// in registers (ReductionInfo::persistent) is read once, with 16-byte accesses where
// it is contiguous, and every pass and output reuses the registers (each prologue
// value, such as softmax's exp, is computed once); longer rows are read per pass.
Result<EmittedKernel> emit_reduction(const KernelSpec& spec, const KernelConfig& config,
                                     const llvmb::Target& target);

// emit_reduction behind the Emitter interface (emitter_for(KernelKind::Reduction)).
const Emitter& reduction_emitter();

// What emit_reduction makes of a group, for tests, the autotuner's pruning and reports.
struct ReductionInfo {
  Shape x;                        // the reduced tensor's shape
  std::vector<int> reduced_dims;  // sorted
  int64_t rows = 0;               // numel of the kept dims
  int64_t row_elems = 0;          // numel of the reduced dims
  int passes = 0;                 // sweeps over each row's elements, before the X-space epilogue
  int x_outputs = 0, row_outputs = 0;
  LaunchShape launch;             // NVPTX: grid, block; shared_bytes stays 0 (dynamic)
  int static_shared_bytes = 0;    // NVPTX: the cross-warp scratch the kernel declares
  // NVPTX: rows held in registers and read once (at most 32 elements per thread, no
  // split), `vector` adjacent elements per access where the row is contiguous and
  // the pointers aligned; otherwise the multi-pass form that reads the row per pass.
  bool persistent = false;
  int vector = 1;
  int64_t elems_per_thread = 0;   // persistent: register slots x vector
  // NVPTX: blocks (grid y) that share each row (KernelConfig::split_reduction): each
  // stores its share's partials in the workspace (launch.workspace_bytes), and a row
  // group's last block combines them in share order and stores the outputs.
  int split = 1;
  // X's innermost dim is kept (rows neighbours in memory, a row's elements a row
  // length or more apart): an outer reduction. `outer`: the block's threads take
  // rows fastest, so a warp's lanes read neighbouring rows (Plan::outer).
  bool inner_kept = false;
  bool outer = false;
  // NVPTX: the lanes of a warp that read neighbouring X elements at one step (a run
  // of adjacent_lanes elements; 1: every lane its own 32-byte sector, uncoalesced).
  int adjacent_lanes = 1;
  // How often the kernel reads each row from memory: once when held in registers,
  // else once per pass and once more for the X-space epilogue.
  int row_reads() const { return persistent ? 1 : passes + (x_outputs > 0 ? 1 : 0); }
};
Result<ReductionInfo> reduction_info(const KernelSpec& spec, const KernelConfig& config);

// A starting config for the group (the autotuner's first candidate, and a default
// better than KernelConfig's for short rows): `base` with threads_per_row and
// rows_per_block set from the row length and layout. Rows whose innermost X dim is
// reduced get about 8 elements per thread (a power of two from 1 to 256; rows of up
// to 32 elements one thread per element, so a warp reads whole neighbouring rows);
// rows whose reduced dims are outer (a column reduction) get about 64 elements per
// thread, so that neighbouring rows, adjacent in memory, are read by neighbouring
// threads. Blocks are filled to 256 threads with rows; an outer reduction whose rows
// are longer than 512 elements gets 32 rows a block instead (a warp's lanes on 32
// neighbouring rows) and up to 32 threads a row. When that leaves fewer blocks than
// an H100's 132 SMs, rows are split over blocks (split_reduction, a power of two) until
// the blocks cover the SMs, while every thread keeps 64 elements or more of its share,
// where the group allows a split (one pass, outputs per row). A Diag when the group is
// not a reduction group.
Result<KernelConfig> suggest_reduction_config(const KernelSpec& spec, KernelConfig base = {});

// The NVPTX kernel of emit_reduction built for the host, so that tests can run its
// block reduction (strided partials, butterfly shuffles, shared memory, barriers,
// grid-stride row loop, masked rows) without a GPU:
//   void entry(ptr args, i32 block_idx, i32 thread_idx, i32 grid_dim, ptr hooks)
// runs one thread; args as the host ABI (inputs then outputs, then a split's
// workspace: launch.workspace_bytes, zeroed before the first launch), `hooks` a
// ReductionSimHooks. Running every thread of a block concurrently (each its own OS
// thread, blocks one after another) computes what the GPU kernel computes, with the
// host's math functions in place of libdevice's.
struct ReductionSimHooks {
  void* ctx = nullptr;
  void (*barrier)(void* ctx) = nullptr;  // __syncthreads() of the calling thread's block
  // shfl.sync.bfly.b32: the value of thread (tid ^ lane_mask) of the same warp.
  int32_t (*shfl_bfly)(void* ctx, int32_t tid, int32_t value, int32_t lane_mask) = nullptr;
  void* shared = nullptr;  // the block's shared memory, static_shared_bytes, 8-aligned
  // When set: called with the X index of each element (the first of each vector) a
  // thread loads to fold, in the thread's order, so a test can see which addresses a
  // warp's lanes read together.
  void (*trace)(void* ctx, int32_t tid, int64_t x_index) = nullptr;
};
Result<EmittedKernel> emit_reduction_block_on_host(const KernelSpec& spec, const KernelConfig& config);

}  // namespace sf
