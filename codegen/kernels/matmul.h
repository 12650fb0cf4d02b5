// The matmul emitter (STYLE.md #5; Inductor's mm template with an epilogue, Triton's
// tutorial matmul): one matmul, its operands read in place through transposes and
// permutes of params, and an elementwise epilogue on its output space become one
// kernel. docs/kernels.md ("Matmul") describes the strategy; emitter.h the ABI.
#pragma once

#include <cstdint>

// EmittedKernel destroys an LLVMContext and a Module: callers need their definitions
// (emitter.h only forward-declares them).
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/emitter.h"

namespace sf {

// Emits `spec.group` as one matmul kernel for `target`.
//
// The group (what codegen/fusion/fuse.cpp forms for a "matmul" kernel) holds params,
// constants, exactly one matmul [..., M, K] x [..., K, N] (2-D or batched, batch
// dims broadcast, either operand may lack them), views (transpose, permute, expand)
// between params and the matmul's operands, and elementwise ops: the epilogue. Every
// output must lie on the matmul's output space (its shape equal to the matmul's up to
// size-1 dims) and is written at its own C-order index; the raw matmul result may be
// an output too. Anything else is a Diag, as is a config out of range, an integer or
// bool matmul on NVPTX, split_k > 1, an entry that is not a C identifier or an
// unknown arch.
//
// NVPTX reads block_m, block_n, block_k, warps, stages and group_m: a tiled SIMT
// kernel with f32 accumulators and A/B tiles staged in dynamic shared memory
// (LaunchShape::shared_bytes; above 48 KiB the launcher must raise
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), copied by cp.async for f32 on
// sm_80+ and through registers otherwise. The host reads none: loops with
// an f32 (integers: i64) accumulator, the j loop innermost for the vectoriser.
Result<EmittedKernel> emit_matmul(const KernelSpec& spec, const KernelConfig& config,
                                  const llvmb::Target& target);

// The NVPTX kernel of emit_matmul built for the host, so that tests can run its
// tiling, shared-memory pipeline, GROUP_M swizzle and edge handling without a GPU:
//   void entry(ptr args, i32 block_x, i32 block_y, i32 thread, ptr smem,
//              ptr barrier_fn, ptr barrier_ctx)
// runs one thread of one block (args as the host ABI: inputs then outputs). `smem` is
// the block's shared memory (launch.shared_bytes, 16-byte aligned) and
// `barrier_fn(barrier_ctx)` stands for bar.sync: the caller runs the block's
// launch.block[0] threads concurrently (one OS thread each) and makes barrier_fn wait
// for all of them. Math functions are the host's. `wide_index` forces the i64 index
// arithmetic that emit_matmul picks only for operands of 2^30 elements or more.
Result<EmittedKernel> emit_matmul_block_on_host(const KernelSpec& spec, const KernelConfig& config,
                                                bool wide_index = false);

// The emitter registered for KernelKind::Matmul in emitter_for (emitter.cpp).
const Emitter& matmul_emitter();

}  // namespace sf
