// The pointwise emitter (STYLE.md #5; XLA's gpu/fusions/loop.cc, Inductor's
// pointwise template): a group of elementwise ops and views becomes one kernel over a
// flat index space of the outputs' element count. docs/kernels.md describes the
// strategy; emitter.h the ABI.
#pragma once

#include <cstdint>

// EmittedKernel destroys an LLVMContext and a Module: callers need their definitions
// (emitter.h only forward-declares them).
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/emitter.h"

namespace sf {

// Emits `spec.group` as one pointwise kernel for `target`.
//
// The group may hold params, constants, elementwise ops (unary, binary, comparisons,
// where, cast) and views (transpose, permute, reshape, expand, slice, concat); its outputs must all
// have the same number of elements n, the iteration space (each output is written at
// its own C-order flat index). Anything else, a config out of range, an entry that is
// not a C identifier or an unknown arch is a Diag.
//
// NVPTX reads block, vector, elems_per_thread, grid_stride and max_blocks; the host
// reads none (one loop over n, left to LLVM's loop vectoriser).
Result<EmittedKernel> emit_pointwise(const KernelSpec& spec, const KernelConfig& config,
                                     const llvmb::Target& target);

// The NVPTX kernel of emit_pointwise, built for the host so that tests can run its
// tiling, grid-stride loop, vector steps, tails and misaligned fallback without a
// GPU: `void entry(ptr args, i32 block_idx, i32 thread_idx, i32 grid_dim)` runs one
// thread (args as the host ABI: inputs then outputs). Calling it for every block and
// thread of `launch` computes what the GPU kernel computes, with the host's math
// functions in place of libdevice's.
Result<EmittedKernel> emit_pointwise_thread_on_host(const KernelSpec& spec, const KernelConfig& config);

// The launch emit_pointwise gives an NVPTX kernel over n elements: block threads,
// grid = ceil(n / (block * vector * elems_per_thread)) tiles, capped at max_blocks
// when grid_stride, and at least 1 (an empty kernel still launches).
//
// A grid-stride kernel strides by the launch's width (%nctaid.x), so any grid
// computes every element. One whose capped grid holds no more threads than an
// H100/H200 keeps resident (132 SMs x 2048, kPersistentGridThreads: the persistent
// grids of the tuner's space and of the sm_90 default) is marked
// LaunchShape::persistent: a runtime on a part with fewer SMs launches only the
// blocks it holds at once, instead of a second, short wave that would do a whole
// block's share of the elements each. Larger caps (4096 blocks of 256) stay as they are.
inline constexpr int64_t kPersistentGridThreads = int64_t{132} * 2048;
LaunchShape pointwise_launch(int64_t n, const KernelConfig& config);

}  // namespace sf
