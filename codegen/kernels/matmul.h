// The matmul emitter (STYLE.md #5; Inductor's mm template with an epilogue, Triton's
// tutorial matmul): one matmul, its operands read in place through transposes and
// permutes of params, and an elementwise epilogue on its output space become one
// kernel. docs/kernels.md ("Matmul") describes the strategy; emitter.h the ABI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

// ---- tensor cores -------------------------------------------------------------------
// On NVPTX sm_80 and later, emit_matmul builds the tensor-core kernel (matmul_mma.cpp:
// 16-byte cp.async into swizzled shared tiles, ldmatrix, mma.sync.m16n8k16 with f32
// accumulators) when the matmul is f16 or bf16, each operand has a unit-stride dim
// whose rows start 16-byte aligned, and the config fits (block_k >= 16, the shared
// tiles' contiguous sides 32 or a multiple of 64, stages >= 2, split_k = 1, warp tiles
// of whole 16x16 blocks). Otherwise it builds the SIMT kernel above. Operand base
// addresses must be 16-byte aligned (every buffer the runtime allocates is).
// On sm_90a the same pipeline feeds wgmma.mma_async instead (each warpgroup of 4
// warps computes m64 x block_n per instruction, operands read from shared memory
// through descriptors) when the config also fits it: warps a multiple of 4, block_m
// a multiple of 64 per warpgroup, both tiles' contiguous sides multiples of 64 (the
// 128-byte swizzle atom), at most 128 accumulators per thread.

// Whether PTX multiplies on the tensor cores (mma.sync or sm_90a's wgmma.mma_async):
// what report.txt and the tuner's cost model price at the tensor-core rate.
inline bool ptx_uses_tensor_cores(std::string_view ptx) {
  return ptx.find("mma.sync.aligned") != std::string_view::npos || ptx.find("wgmma.mma_async") != std::string_view::npos;
}
// ... in TF32 (--allow-tf32), priced at the TF32 rate. (exec, built without LLVM,
// looks for the same text in a Plan's PTX.)
inline bool ptx_uses_tf32(std::string_view ptx) { return ptx.find(".f32.tf32.tf32") != std::string_view::npos; }

// Which NVPTX kernel emit_matmul builds for `spec` under `config` on `arch`, and why.
struct MatmulPath {
  bool tensor_cores = false;
  bool wgmma = false;  // sm_90a's warpgroup MMA (else mma.sync) when tensor_cores
  std::string why;     // tensor_cores: the instructions; otherwise why not
};
Result<MatmulPath> matmul_path(const KernelSpec& spec, const KernelConfig& config, const std::string& arch);

// A config for the tensor-core kernel when `spec` can take it on `arch` (f16/bf16
// operands, or f32 under allow_tf32; sm_80+, suitable layouts), base's group_m:
// - sm_80..sm_89: 128x128x32 tiles (smaller for small matrices), 4 warps, 3 stages;
// - sm_90a: 128x256x64 wgmma tiles (64 rows and fewer columns for small matrices),
//   4 stages; a 16-bit 128x256 tile with a wave of output tiles or more, read by TMA
//   (spec.tma), becomes the warp-specialised persistent kernel with setmaxnreg=232;
// split-K where the output tiles leave most SMs idle. `base` unchanged otherwise.
KernelConfig suggest_matmul_config(const KernelSpec& spec, const KernelConfig& base, const std::string& arch);

// The SM count of an arch's usual data-center part (A100 108, H100/H200 132; 84 for
// sm_86's A40/RTX parts, 128 for sm_89's): an estimate for default configs, which
// tuning replaces with measurements; the runtime launches a persistent grid with no
// more blocks than the device holds.
int typical_sms(int sm);

// What the host build of the tensor-core kernel calls for the warp-collective
// instructions and the barrier (emit_matmul_mma_block_on_host). The simulation
// behind them is the tests' (tests/kernels/matmul_mma_test.cpp), written from the
// PTX ISA independently of mma_layout.h.
struct MmaSimHooks {
  void* ctx = nullptr;
  void (*barrier)(void* ctx) = nullptr;  // bar.sync 0
  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: `row` is the 16-byte row
  // address thread `thread` supplies; out[0..3] receive its four registers.
  void (*ldmatrix_x4)(void* ctx, int32_t thread, const void* row, int32_t trans, uint32_t* out) = nullptr;
  // mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32 (T = bf16 for kind 0, f16 for 1),
  // or kind 2: m16n8k8.row.col.f32.tf32.tf32.f32 (one f32's bits per register): a[4],
  // b[2] are thread `thread`'s operand registers; cd[4] its C in, D out.
  void (*mma)(void* ctx, int32_t thread, int32_t kind, const uint32_t* a, const uint32_t* b, float* cd) = nullptr;
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T with both operands in shared
  // memory, scale-d 1: `desc_a`, `desc_b` are the matrix descriptors (start
  // addresses counted from the block's shared memory), `mode` is f16 (bit 0; else
  // bf16) | imm-trans-a << 1 | imm-trans-b << 2 | tf32 << 3 (m64nNk8, both operands
  // K-major, 32-bit elements) | N << 8; d[N / 2] is thread
  // `thread`'s accumulator fragment, in and out. Called by all 128 threads of a
  // warpgroup, complete when it returns.
  void (*wgmma)(void* ctx, int32_t thread, uint64_t desc_a, uint64_t desc_b, int32_t mode, float* d) = nullptr;
  // cp.async.cg.shared.global 16 bytes with source size `bytes` (the rest zero-filled),
  // and the thread's cp.async.commit_group / cp.async.wait_group `pending`: the
  // simulation may copy at once but knows when the data may be read.
  void (*cp_async)(void* ctx, int32_t thread, void* dst, const void* src, int32_t bytes) = nullptr;
  void (*cp_commit)(void* ctx, int32_t thread) = nullptr;
  void (*cp_wait)(void* ctx, int32_t thread, int32_t pending) = nullptr;
  // wgmma.commit_group / wgmma.wait_group `pending`, by every thread of a warpgroup:
  // until a wgmma's group is waited for, it may still read its shared-memory operands.
  void (*wgmma_commit)(void* ctx, int32_t thread) = nullptr;
  void (*wgmma_wait)(void* ctx, int32_t thread, int32_t pending) = nullptr;
  // TMA (KernelSpec::tma): cp.async.bulk.tensor of one box of `map` (a SimTensorMap*)
  // at coordinates (c0, ..., c4; those past the map's rank 0) into `dst` with the 128-byte swizzle, completing its
  // bytes on the mbarrier at `mbar`; mbarrier.init with an arrival count,
  // mbarrier.arrive.expect_tx, and mbarrier.try_wait.parity (nonzero: the phase of
  // that parity has completed).
  void (*tma_load)(void* ctx, int32_t thread, const void* map, void* dst, int32_t c0, int32_t c1, int32_t c2,
                   int32_t c3, int32_t c4, void* mbar) = nullptr;
  void (*mbar_init)(void* ctx, int32_t thread, void* mbar, int32_t count) = nullptr;
  void (*mbar_expect_tx)(void* ctx, int32_t thread, void* mbar, int32_t bytes) = nullptr;
  int32_t (*mbar_try_wait)(void* ctx, int32_t thread, void* mbar, int32_t parity) = nullptr;
  // mbarrier.arrive without transaction bytes (warp specialisation's "empty" barriers).
  void (*mbar_arrive)(void* ctx, int32_t thread, void* mbar) = nullptr;
  // bar.sync (`sync` 1) or bar.arrive (0) on named barrier `id` of `count` threads:
  // the barrier completes when `count` threads have arrived or synced, and a syncing
  // thread waits for that (the ping-pong consumers' turns, MmaTiling::pingpong).
  void (*named_barrier)(void* ctx, int32_t thread, int32_t id, int32_t count, int32_t sync) = nullptr;
  // shfl.sync.bfly.b32 over the full warp: `v` of the lane `lane_mask` away (the
  // fused attention's register-resident row max and sum; every lane calls it).
  float (*shfl_bfly)(void* ctx, int32_t thread, float v, int32_t lane_mask) = nullptr;
  // setmaxnreg.inc (`inc` 1) or .dec (0).sync.aligned.u32 `count`: the registers a
  // thread of the caller's warpgroup owns from then on (MmaTiling::consumer_regs).
  // Every warp of a warpgroup must execute the same one.
  void (*setmaxnreg)(void* ctx, int32_t thread, int32_t count, int32_t inc) = nullptr;
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T with A from registers: a[4] are
  // thread `thread`'s four .b32 registers of A (two 16-bit elements each, the lower
  // index in the low half), `desc_b` B's descriptor, `mode` as wgmma's (imm-trans-a
  // unused); d[N / 2] in and out. The fused attention's sm_90a form (its q and p).
  void (*wgmma_ra)(void* ctx, int32_t thread, const uint32_t* a, uint64_t desc_b, int32_t mode, float* d) = nullptr;
  // TMA stores (the epilogue's, MmaTiling::tma_store): cp.async.bulk.tensor of one box
  // from shared `src` (128-byte swizzled) to `map` (a SimTensorMap*) at (c0, ..., c4;
  // those past the map's rank 0), out-of-bounds elements not written, into the thread's
  // open bulk group; cp.async.bulk.commit_group; cp.async.bulk.wait_group `pending`
  // (`read` 1: .read, only until the groups have read their sources): until at most
  // that many of the thread's committed groups are incomplete; and
  // fence.proxy.async.shared::cta, which makes the thread's writes to shared memory
  // visible to TMA (the async proxy).
  void (*tma_store)(void* ctx, int32_t thread, const void* map, const void* src, int32_t c0, int32_t c1, int32_t c2,
                    int32_t c3, int32_t c4) = nullptr;
  void (*bulk_commit)(void* ctx, int32_t thread) = nullptr;
  void (*bulk_wait)(void* ctx, int32_t thread, int32_t pending, int32_t read) = nullptr;
  void (*proxy_fence)(void* ctx, int32_t thread) = nullptr;
  // Thread-block clusters (MmaTiling::cluster; `ctx` is the calling block's): the TMA
  // copy multicast to the cluster's blocks in `mask` (bit r: rank r), landing at `dst`'s
  // offset in each one's shared memory and completing on the mbarrier at `mbar`'s offset
  // in each; mbarrier.arrive on the mbarrier at `mbar`'s offset in the shared memory of
  // the block of rank `rank` (mapa, then arrive.release.cluster); and
  // barrier.cluster.arrive + wait, by every thread of every block of the cluster.
  void (*tma_load_multicast)(void* ctx, int32_t thread, const void* map, void* dst, int32_t c0, int32_t c1, int32_t c2,
                             int32_t c3, int32_t c4, void* mbar, int32_t mask) = nullptr;
  void (*mbar_arrive_cluster)(void* ctx, int32_t thread, void* mbar, int32_t rank) = nullptr;
  void (*cluster_barrier)(void* ctx, int32_t thread) = nullptr;
};

// What the host build's kernel arguments hold in place of each encoded tensor map
// (LaunchShape::tensor_maps, in order): its spec and the input's base address.
struct SimTensorMap {
  TensorMapSpec spec;
  const void* base = nullptr;
  size_t bytes = 0;  // the buffer's size (a TMA store writing past it fails); 0: not checked
};

// The tensor-core kernel of emit_matmul built for the host:
//   void entry(ptr args, i32 block_x, i32 block_y, i32 thread, ptr smem, ptr hooks,
//              i32 block_z, i32 grid_x)
// runs one thread of one block (grid_x: the launch's blocks in x, which a persistent
// kernel strides its work items by); `hooks` is an MmaSimHooks*, `smem` the block's shared
// memory (launch.shared_bytes; 128-byte aligned, 1024 for wgmma). The caller runs
// launch.block[0] threads concurrently. cp.async and the commits and waits of both
// cp.async and wgmma call the hooks. `wgmma`: the sm_90a warpgroup kernel (as for --arch sm_90a), else the
// mma.sync one (as for sm_90). A Diag when that kernel does not apply (as
// matmul_path says).
Result<EmittedKernel> emit_matmul_mma_block_on_host(const KernelSpec& spec, const KernelConfig& config,
                                                    bool wgmma = false);

// The emitter registered for KernelKind::Matmul in emitter_for (emitter.cpp).
const Emitter& matmul_emitter();

}  // namespace sf
