// The tensor-core matmul's instructions (internal to codegen/kernels): each PTX
// instruction the kernel of matmul_mma.cpp issues (cp.async groups, ldmatrix,
// mma.sync, wgmma and its fences, TMA copies, mbarriers, bar.sync), emitted either
// for NVPTX or, in the host build (`sim`), as calls to the MmaSimHooks the tests
// implement (tests/kernels/mma_sim.h). MmaKernel builds the kernel on top of it.
//
// Every wgmma-family and mbarrier/TMA instruction is inline PTX, here and nowhere
// else: LLVM 19 has no intrinsics for them. The host build calls the hooks instead,
// and the wgmma fences, commits and waits become calls too (its wgmma completes
// before it returns).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/matmul_mma_tiling.h"

namespace sf::matmul_detail {

// The inline PTX the attention emitter shares with the matmul's (its
// register-resident form on sm_90a, docs/kernels.md "Attention").
// An inline-PTX statement with a memory clobber.
void ptx_stmt(llvm::IRBuilderBase& b, const std::string& text);
// A wgmma matrix descriptor for the 32-bit shared address `addr` (MmaIsa::descriptor).
llvm::Value* wgmma_descriptor(llvm::IRBuilderBase& b, llvm::Value* addr, int64_t lbo, int64_t sbo);
// D (d.size() = N / 2 f32 a thread) += A (m64 x k) * B (k x N), scale-d 1:
// wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T (T = `type`: "bf16", "f16"; "tf32":
// m64nNk8, both operands K-major, no imm-trans operands). A from shared memory through
// the descriptor `da` (MN-major when `trans_a`), or, where `a_regs` holds four .b32
// registers (16-bit types only), from them: the warp's 16 rows of the warpgroup's 64,
// laid out as mma.m16n8k16's A fragment. B through `db`, MN-major when `trans_b`.
std::vector<llvm::Value*> wgmma_inline(llvm::IRBuilderBase& b, const std::vector<llvm::Value*>& a_regs, llvm::Value* da,
                                       llvm::Value* db, std::vector<llvm::Value*> d, const std::string& type, int trans_a,
                                       int trans_b);

// mbarrier.init of the mbarrier at 32-bit shared address `bar` with `count` arrivals;
// mbarrier.arrive.expect_tx of `bytes` on it; mbarrier.try_wait.parity (an i32, 1 when
// the phase of that parity completed).
void mbar_init_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, int count);
void mbar_arrive_ptx(llvm::IRBuilderBase& b, llvm::Value* bar);  // mbarrier.arrive, no transaction bytes
void mbar_expect_tx_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, llvm::Value* bytes);
llvm::Value* mbar_try_wait_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, llvm::Value* parity);
// bar.sync (`sync`) or bar.arrive on named barrier `id` (an integer value) of
// `threads` threads, convergent: never duplicated into, or sunk out of, the code every
// thread of the warpgroup runs.
void named_barrier_ptx(llvm::IRBuilderBase& b, llvm::Value* id, int threads, bool sync);
// setmaxnreg.inc (`inc`) or .dec to `count` registers a thread, the warpgroup's.
void setmaxnreg_ptx(llvm::IRBuilderBase& b, int count, bool inc);
// cp.async.bulk.tensor.{2,3}d of one box of the tensor map at generic address `map`
// at coordinates `coords` (i32, innermost first) into shared address `dst`,
// completing its bytes on the mbarrier at shared address `bar`.
void tma_load_ptx(llvm::IRBuilderBase& b, llvm::Value* map, llvm::Value* dst, const std::vector<llvm::Value*>& coords,
                  llvm::Value* bar);
// The same copy multicast to the blocks of the cluster in the 16-bit `mask` (bit r:
// the block of rank r): the box lands at `dst`'s offset in each one's shared memory
// and completes its bytes on the mbarrier at `bar`'s offset in each.
void tma_load_multicast_ptx(llvm::IRBuilderBase& b, llvm::Value* map, llvm::Value* dst,
                            const std::vector<llvm::Value*>& coords, llvm::Value* bar, int mask);
// mbarrier.arrive (release, cluster scope) on the mbarrier at 32-bit shared address
// `bar` of the cluster's block of rank `rank` (i32), mapped there by mapa.
void mbar_arrive_cluster_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, llvm::Value* rank);
// barrier.cluster.arrive.release + barrier.cluster.wait.acquire, convergent: every
// thread of every block of the cluster.
void cluster_sync_ptx(llvm::IRBuilderBase& b);
// cp.async.bulk.tensor.{2..5}d.global.shared::cta.bulk_group: one box of shared memory
// at 32-bit shared address `src` to the tensor map at generic address `map` at
// `coords` (i32, innermost first), in the thread's bulk async-group.
void tma_store_ptx(llvm::IRBuilderBase& b, llvm::Value* map, llvm::Value* src, const std::vector<llvm::Value*>& coords);

class MmaIsa {
 protected:
  MmaIsa(const MatmulGroup& p, const MmaTiling& t, llvm::Module& m, bool sim)
      : p_(p), t_(t), m_(m), b_(m.getContext()), sim_(sim) {}

  llvm::Value* k(int64_t v) { return llvm::ConstantInt::get(it_, static_cast<uint64_t>(v)); }
  llvm::Value* add(llvm::Value* x, llvm::Value* y) { return b_.CreateAdd(x, y, "", true, true); }
  llvm::Value* mul(llvm::Value* x, int64_t s) { return s == 1 ? x : b_.CreateMul(x, k(s), "", true, true); }
  llvm::Value* smem_at(llvm::Value* byte_off) { return b_.CreateInBoundsGEP(b_.getInt8Ty(), smem_, byte_off); }
  // The stage's "full" mbarrier (TMA: its copies complete on it).
  llvm::Value* mbar(llvm::Value* stage) { return add(k(t_.mbar_off), mul(stage, 8)); }
  // Warp specialisation: the stage's "empty" mbarrier, which the consumer warpgroups
  // arrive on once their wgmma no longer reads the stage.
  llvm::Value* empty_mbar(llvm::Value* stage) { return add(k(t_.mbar_off + 8 * t_.stages), mul(stage, 8)); }
  // An mbarrier or shared destination as the instruction takes it: the 32-bit shared
  // address, or (host build) the pointer.
  llvm::Value* smem_operand(llvm::Value* off) { return sim_ ? smem_at(off) : shared_addr(off); }
  // `body` emitted for thread 0 of the block alone.
  void if_thread0(const std::function<void()>& body);
  // mbarrier.arrive (no transaction bytes) on the mbarrier at shared offset `off`.
  void mbar_arrive(llvm::Value* off);
  // cp.async.bulk.tensor of one box (at coordinates c0, c1 and, rank 3, c2) through
  // tensor map `map` into shared `dst`, completing on mbarrier `bar`.
  // `coords`: one per dim of the map (2 to 5).
  void tma_load(llvm::Value* map, llvm::Value* dst, const std::vector<llvm::Value*>& coords, llvm::Value* bar);
  // Clusters (MmaTiling::cluster): the copy multicast to the blocks in `mask`; an
  // arrive on the mbarrier at shared offset `off` of the block of rank `rank`; the
  // cluster-wide barrier of every thread.
  void tma_load_multicast(llvm::Value* map, llvm::Value* dst, const std::vector<llvm::Value*>& coords, llvm::Value* bar,
                          int mask);
  void mbar_arrive_cluster(llvm::Value* off, llvm::Value* rank);
  void cluster_sync();
  // TMA stores (MmaTiling::tma_store): one box from shared byte offset `src_off` to
  // tensor map `map` at `coords`; cp.async.bulk.commit_group; cp.async.bulk.wait_group
  // `pending` (`read`: .read, until the groups have read shared memory); and
  // fence.proxy.async.shared::cta (this thread's shared-memory writes visible to TMA).
  void tma_store(llvm::Value* map, llvm::Value* src_off, const std::vector<llvm::Value*>& coords);
  void bulk_commit();
  void bulk_wait(int pending, bool read);
  void store_fence();
  // Every thread: until the stage's mbarrier has completed the phase of parity `parity`.
  void mbar_wait(llvm::Value* stage, llvm::Value* parity) { mbar_wait_at(mbar(stage), parity); }
  void mbar_wait_at(llvm::Value* off, llvm::Value* parity);
  // cp.async.commit_group / wait_group, wgmma.commit_group / wait_group.
  void commit();
  void wait(int pending);
  void wgmma_commit();
  void wgmma_wait(int pending);
  // hook_[h](ctx, thread, extra i32s...).
  void sim_call(int h, std::vector<llvm::Value*> extra);
  void barrier();  // bar.sync 0
  // bar.sync (`sync`) or bar.arrive on named barrier `id` (1..15) of `threads` threads:
  // the ping-pong consumers' turn-taking (MmaTiling::pingpong).
  void named_barrier(llvm::Value* id, int threads, bool sync);
  // setmaxnreg.inc (`inc`) or .dec .sync.aligned.u32 `count`, by every thread of a
  // warpgroup (MmaTiling::consumer_regs).
  void set_max_regs(int count, bool inc);
  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 from the row this lane points at.
  std::vector<llvm::Value*> ldmatrix_x4(llvm::Value* row_ptr, bool trans);
  // D = A * B + C, mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32,
  // or m16n8k8.row.col.f32.tf32.tf32.f32 (the registers' f32 bits as TF32: the
  // tensor cores read the top 19 bits).
  std::vector<llvm::Value*> mma(const std::vector<llvm::Value*>& a, const std::vector<llvm::Value*>& bf,
                                const std::vector<llvm::Value*>& c);
  // An alloca in the entry block (the host build's operand buffers for the hooks).
  llvm::Value* entry_alloca(llvm::Type* t);
  // An inline-PTX statement with a memory clobber (nothing in the host build).
  void asm_stmt(const std::string& text);
  void proxy_fence() { asm_stmt("fence.proxy.async.shared::cta;"); }
  // The 32-bit shared-memory address of byte `off` of the dynamic shared memory (the
  // host build: `off` itself, its shared memory's base being address 0).
  llvm::Value* shared_addr(llvm::Value* off);
  // A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
  // start address, leading and stride dimension byte offsets, each >> 4 in 14 bits,
  // base offset 0, and 128-byte swizzling (mode 1, bits 62-63).
  llvm::Value* descriptor(llvm::Value* addr, int64_t lbo, int64_t sbo);
  // D (bn / 2 f32 per thread) += A (m64 x k16) * B (k16 x bn), both from shared
  // memory; A K-major unless trans_a, B K-major unless trans_b.
  std::vector<llvm::Value*> wgmma(llvm::Value* da, llvm::Value* db, std::vector<llvm::Value*> d);

  // matmul_mma_compute.cpp: the byte offset of element (row, col) of `tile` (col a
  // multiple of a 16-byte chunk's elements), one stage's products on the mma.sync
  // path (the warp's tile at wm0_, wn0_) and on the wgmma path (the warpgroup's rows
  // from wg_row_, `lag_` groups left in flight), and one raw 32-bit element.
  llvm::Value* tile_offset(const SmemTile& tile, llvm::Value* row, llvm::Value* col);
  std::vector<llvm::Value*> compute(llvm::Value* stage, std::vector<llvm::Value*> acc);
  std::vector<llvm::Value*> compute_wgmma(llvm::Value* stage, std::vector<llvm::Value*> acc);
  llvm::Value* lds32(llvm::Value* base, const SmemTile& tile, llvm::Value* row, llvm::Value* col);

  const MatmulGroup& p_;
  const MmaTiling& t_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  bool sim_ = false;
  llvm::Function* fn_ = nullptr;
  llvm::Type* it_ = nullptr;   // the index type (i32 where every index fits)
  llvm::Type* f32_ = nullptr;
  llvm::Type* i32_ = nullptr;
  llvm::Value* smem_ = nullptr;  // the dynamic shared memory
  llvm::Value* tid_ = nullptr;   // threadIdx.x, index-typed
  llvm::Value* tid32_ = nullptr;  // the host build: threadIdx.x as the hooks take it
  // The thread's place, set by the kernel before its K loops: the lane, the warp's
  // first row and column in the block tile (mma.sync), the warpgroup's first row
  // (wgmma), and the wgmma groups left in flight across K tiles.
  llvm::Value *lane_ = nullptr, *wm0_ = nullptr, *wn0_ = nullptr, *wg_row_ = nullptr;
  int lag_ = 0;
  // The host build's MmaSimHooks: {ctx, barrier, ldmatrix_x4, mma, wgmma, cp_async,
  // cp_commit, cp_wait, wgmma_commit, wgmma_wait, tma_load, mbar_init,
  // mbar_expect_tx, mbar_try_wait, mbar_arrive, named_barrier, shfl_bfly (unused
  // here), setmaxnreg, wgmma_ra (unused here), tma_store, bulk_commit, bulk_wait,
  // proxy_fence, tma_load_multicast, mbar_arrive_cluster, cluster_barrier}.
  static constexpr int kHooks = 26;
  llvm::Value* hook_[kHooks] = {};
};

}  // namespace sf::matmul_detail
