// The fused attention's wgmma form on sm_90a (KernelConfig::wgmma; docs/kernels.md,
// "Attention"): the register-resident form's two products by wgmma.mma_async, the
// pipelined key loop (wgmma = 2) and its ping-pong between warpgroups, and k and v by
// TMA. The instructions themselves are matmul_mma_isa.h's (inline PTX in one place),
// or MmaSimHooks calls in MmaSim.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>

#include "codegen/kernels/attention_code.h"
#include "codegen/kernels/matmul_mma_isa.h"

namespace sf::attention_detail {

Result<void> AttentionCode::key_loop_pipelined(llvm::Value* b, llvm::Value* kv_end) {
  // FlashAttention-3's intra-warpgroup pipelining: the scores of tile t and the
  // output products of tile t - 1 are issued together, and tile t's chain and softmax
  // run while the tensor cores still work on tile t - 1's output.
  //   tile 0: scores, softmax -> p_0
  //   tile t = 1, 2, ...: issue S_t = q k_t^T and O += p_{t-1} v_{t-1}; wait for S_t
  //     (wait_group 1); softmax -> p_t, alpha_t; wait for O (wait_group 0); O *= alpha_t
  //   after the last tile: O += p_last v_last
  // Key tile t lives in buffer t % 3: at the top of iteration t (its copies waited
  // for, fenced and published by the barrier) the buffer of tile t + 1 is that of tile
  // t - 2, whose products every warpgroup retired in iteration t - 1.
  llvm::Type* f32 = b_.getFloatTy();
  llvm::Type* i32 = b_.getInt32Ty();
  const int64_t nkk = t_.bn / 16;
  auto buf = [&](llvm::Value* kv0) {  // tile kv0's buffer, as a byte offset
    return b_.CreateMul(b_.CreateURem(b_.CreateUDiv(kv0, c(t_.bn)), c(3)), c(t_.kv_bytes()));
  };
  // Without TMA the threads' copies are published by a barrier per tile. With TMA,
  // thread 0 brings tile t once every warp released its buffer's previous use (tile
  // t - 3's, whose output products retired in iteration t - 2), use n of a buffer
  // completes its full mbarrier's phase n, and every thread waits for that phase: no
  // barrier in the key loop (q's copies are published once, before it).
  auto tile_of = [&](llvm::Value* kv0) { return b_.CreateUDiv(kv0, c(t_.bn)); };
  auto publish = [&](llvm::Value* kv0) {
    if (tma_src_) {
      llvm::Value* tile = tile_of(kv0);
      tma_wait(b_.CreateURem(tile, c(3)), b_.CreateAnd(b_.CreateUDiv(tile, c(3)), c(1)));
      return;
    }
    cp_wait(0);
    proxy_fence();
    barrier();
  };
  auto copy_next = [&](llvm::Value* kv0) -> Result<void> {
    llvm::Value* next = b_.CreateAdd(kv0, c(t_.bn));
    if (tma_src_) {
      tma_fetch(b, next, kv_end, 3);
      return ok();
    }
    SF_TRY(when(b_.CreateICmpSLT(next, kv_end), [&]() { return load_kv16(b, next, b_.CreateUDiv(buf(next), c(2))); }));
    cp_commit();
    return ok();
  };
  // p's A fragments, carried from one tile to the next.
  std::vector<llvm::Value*> pslot;
  for (int64_t i = 0; i < 4 * nkk; ++i) pslot.push_back(slot(i32));
  auto keep_p = [&](const std::vector<std::vector<llvm::Value*>>& a) {
    for (size_t kk = 0; kk < a.size(); ++kk)
      for (size_t r = 0; r < 4; ++r) b_.CreateStore(a[kk][r], pslot[4 * kk + r]);
  };
  auto saved_p = [&]() {
    std::vector<std::vector<llvm::Value*>> a(static_cast<size_t>(nkk));
    for (size_t kk = 0; kk < a.size(); ++kk)
      for (size_t r = 0; r < 4; ++r) a[kk].push_back(b_.CreateLoad(i32, pslot[4 * kk + r]));
    return a;
  };
  auto saved_o = [&]() {
    std::vector<llvm::Value*> d;
    for (llvm::Value* o : o_[0]) d.push_back(b_.CreateLoad(f32, o));
    return d;
  };
  auto keep_o = [&](const std::vector<llvm::Value*>& d) {
    for (size_t i = 0; i < d.size(); ++i) b_.CreateStore(d[i], o_[0][i]);
  };
  if (tma_src_) {
    tma_fetch(b, c(0), kv_end, 3);
    cp_commit();  // q's copies
    cp_wait(0);
    proxy_fence();
    barrier();
  } else {
    SF_TRY(when(b_.CreateICmpSGT(kv_end, c(0)), [&]() { return load_kv16(b, c(0), c(0)); }));
    cp_commit();
  }
  return when(b_.CreateICmpSGT(kv_end, c(0)), [&]() -> Result<void> {
    publish(c(0));
    SF_TRY(copy_next(c(0)));
    std::vector<llvm::Value*> s0 = zeros(t_.bn / 2);
    fence_operands(s0);
    turn_first();
    turn_begin();
    wgmma_fence();
    s0 = scores_wgmma(c(0), std::move(s0));
    wgmma_commit();
    turn_end(/*last=*/false);
    wgmma_wait(0);
    fence_operands(s0);
    std::vector<Frags> sc = {fragments(s0)};
    // The output is still zero: tile 0's alpha has nothing to rescale.
    SF_TRY(softmax_tile(c(0), sc));
    keep_p(p_fragments(sc[0]));
    SF_TRY(emit_loop(b_, c(t_.bn), kv_end, c(t_.bn), "kv", [&](llvm::Value* kv0) -> Result<void> {
      publish(kv0);
      SF_TRY(copy_next(kv0));
      // Every input register of the two groups defined before the wgmma.fence: ptxas
      // serializes a kernel's wgmma where "non wgmma instructions" define their input
      // registers "between start and end of the pipeline stage" (note C7513).
      std::vector<llvm::Value*> s = zeros(t_.bn / 2), o = saved_o();
      std::vector<std::vector<llvm::Value*>> p = saved_p();
      fence_operands(s);
      fence_operands(o);
      for (std::vector<llvm::Value*>& a : p) fence_operands(a);
      turn_begin();
      wgmma_fence();
      s = scores_wgmma(buf(kv0), std::move(s));
      wgmma_commit();
      o = output_wgmma(p, buf(b_.CreateSub(kv0, c(t_.bn))), std::move(o));
      wgmma_commit();
      turn_end(/*last=*/false);
      wgmma_wait(1);  // the scores' group (committed first)
      fence_operands(s);
      std::vector<Frags> st = {fragments(s)};
      Result<std::vector<std::array<llvm::Value*, 2>>> alpha = softmax_tile(kv0, st);
      if (!alpha) return alpha.error();
      wgmma_wait(0);  // the output's
      fence_operands(o);
      // Tile t - 1's buffer is read no more (its scores retired in iteration t - 1).
      if (tma_src_) tma_release(b_.CreateURem(tile_of(b_.CreateSub(kv0, c(t_.bn))), c(3)));
      for (size_t i = 0; i < o.size(); ++i) o[i] = b_.CreateFMul(o[i], (*alpha)[0][i % 4 / 2]);
      keep_o(o);
      // p_t packed only now: the output products just retired still read p_{t-1}'s
      // registers, which LLVM gives p_t too (one value carried around the loop), and
      // writing them under an unretired wgmma would make ptxas serialize (C7513).
      keep_p(p_fragments(st[0]));
      return ok();
    }));
    // The last tile's output products.
    llvm::Value* last = b_.CreateMul(b_.CreateUDiv(b_.CreateSub(kv_end, c(1)), c(t_.bn)), c(t_.bn));
    std::vector<llvm::Value*> o = saved_o();
    std::vector<std::vector<llvm::Value*>> p = saved_p();
    fence_operands(o);
    for (std::vector<llvm::Value*>& a : p) fence_operands(a);
    turn_begin();
    wgmma_fence();
    o = output_wgmma(p, buf(last), std::move(o));
    wgmma_commit();
    turn_end(/*last=*/true);
    wgmma_wait(0);
    fence_operands(o);
    keep_o(o);
    return ok();
  });
}

std::optional<AttentionCode::TmaSource> AttentionCode::tma_source(int node, int64_t rows, int64_t cols, std::string* why) {
  std::optional<std::pair<int, kernels::IndexMap>> src = copy_source(node, /*runs=*/false);
  if (!src) {
    if (why) *why = "it is computed, not a view of one input";
    return std::nullopt;
  }
  const int64_t head = rows * cols;
  const TensorType& op = spec_.group.node(node).type;
  const Node& p = spec_.group.node(spec_.group.params()[static_cast<size_t>(src->first)]);
  if (head <= 0 || numel(op.shape) % head != 0) {
    if (why) *why = "it is not whole heads of " + std::to_string(rows) + " x " + std::to_string(cols);
    return std::nullopt;
  }
  Result<KvTmaLayout> l =
      kv_tma_layout(src->second, numel(op.shape) / head, rows, cols, numel(p.type.shape), dtype_size(p.type.dtype));
  if (!l) {
    if (why) *why = l.error().message;
    return std::nullopt;
  }
  return TmaSource{src->first, std::move(*l)};
}

std::optional<std::pair<AttentionCode::TmaSource, AttentionCode::TmaSource>> AttentionCode::tma_sources(size_t num_params,
                                                                                                        std::string* why) {
  const int kr = k_rows_node();
  if (kr < 0) {
    *why = "k is not transposed from a [..., S, E] operand";
    return std::nullopt;
  }
  GroupValues gv(spec_.group, cg_, std::vector<llvm::Value*>(num_params, nullptr));
  gv_ = &gv;
  std::string kwhy, vwhy;
  std::optional<TmaSource> k = tma_source(kr, m_.s, m_.e, &kwhy), v = tma_source(m_.v, m_.s, m_.ev, &vwhy);
  gv_ = nullptr;
  if (!k || !v) {
    *why = !k ? "k: " + kwhy : "v: " + vwhy;
    return std::nullopt;
  }
  return std::pair{*k, *v};
}

llvm::Value* AttentionCode::mbar_at(llvm::Value* buf, bool empty) {
  llvm::Value* off = b_.CreateAdd(c(t_.mbar_off + (empty ? 8 * t_.kv_buffers : 0)), b_.CreateMul(buf, c(8)));
  if (mode_ == Mode::MmaSim) return b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_, off);
  return b_.CreateAdd(b_.CreatePtrToInt(buf_, b_.getInt32Ty()), b_.CreateTrunc(off, b_.getInt32Ty()));
}

void AttentionCode::tma_init() {
  llvm::Type* i32 = b_.getInt32Ty();
  Result<void> r = when(b_.CreateICmpEQ(tid_, c(0)), [&]() -> Result<void> {
    for (int64_t i = 0; i < t_.kv_buffers; ++i)
      for (bool empty : {false, true}) {
        // full: thread 0's arrive.expect_tx; empty: one arrival per warp.
        const int count = empty ? warps_n_ : 1;
        if (mode_ == Mode::MmaSim)
          b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32, b_.getPtrTy(), i32}, false), hook_[13],
                        {hook_[0], tid32_, mbar_at(c(i), empty), b_.getInt32(static_cast<uint32_t>(count))});
        else
          matmul_detail::mbar_init_ptx(b_, mbar_at(c(i), empty), count);
      }
    // The initialisation visible to the async proxy (the copies complete on them).
    if (mode_ == Mode::Mma) matmul_detail::ptx_stmt(b_, "fence.mbarrier_init.release.cluster;");
    return ok();
  });
  (void)r;  // the body cannot fail
  barrier();
}

void AttentionCode::tma_kv(llvm::Value* b, llvm::Value* kv0, llvm::Value* buf, llvm::Value* buf_off) {
  llvm::Type* i32 = b_.getInt32Ty();
  const TmaSource& ks = tma_src_->first;
  const TmaSource& vs = tma_src_->second;
  // The block's head b in each map: its coordinate in each of the map's head dims.
  auto head = [&](const TmaSource& s) {
    std::vector<llvm::Value*> at;
    for (const KvTmaLayout::HeadDim& d : s.layout.head_dims) {
      llvm::Value* x = d.div > 1 ? b_.CreateUDiv(b, c(d.div)) : b;
      x = d.radix > 1 ? b_.CreateURem(x, c(d.radix)) : c(0);
      at.push_back(b_.CreateTrunc(d.start ? b_.CreateAdd(x, c(d.start)) : x, i32));
    }
    return at;
  };
  llvm::Value* bar = mbar_at(buf);
  const int64_t bytes = t_.kv_bytes();
  if (mode_ == Mode::MmaSim)
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32, b_.getPtrTy(), i32}, false), hook_[14],
                  {hook_[0], tid32_, bar, b_.getInt32(static_cast<uint32_t>(bytes))});
  else
    matmul_detail::mbar_expect_tx_ptx(b_, bar, b_.getInt32(static_cast<uint32_t>(bytes)));
  // One box of 64 columns x bn keys of the head per panel; keys past S arrive as zeros.
  auto copy = [&](llvm::Value* map, const std::vector<llvm::Value*>& h, int64_t cols, int64_t base) {
    for (int64_t p = 0; p < Tiles::panels(cols); ++p) {
      llvm::Value* off = b_.CreateAdd(buf_off, c(base + p * t_.bn * 128));
      std::vector<llvm::Value*> at = {b_.getInt32(static_cast<uint32_t>(64 * p)), b_.CreateTrunc(kv0, i32)};
      at.insert(at.end(), h.begin(), h.end());
      if (mode_ == Mode::MmaSim) {
        // The simulation's hook takes five coordinates, those past the map's rank 0.
        llvm::Type* ptr = b_.getPtrTy();
        auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32, ptr, ptr, i32, i32, i32, i32, i32, ptr}, false);
        std::vector<llvm::Value*> args = {hook_[0], tid32_, map, b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_, off)};
        for (size_t i = 0; i < 5; ++i) args.push_back(i < at.size() ? at[i] : b_.getInt32(0));
        args.push_back(bar);
        b_.CreateCall(fty, hook_[12], args);
      } else {
        llvm::Value* dst = b_.CreateAdd(b_.CreatePtrToInt(buf_, i32), b_.CreateTrunc(off, i32));
        matmul_detail::tma_load_ptx(b_, map, dst, at, bar);
      }
    }
  };
  copy(kmap_, head(ks), m_.e, t_.k16);
  copy(vmap_, head(vs), m_.ev, t_.v16);
}

void AttentionCode::tma_wait(llvm::Value* buf, llvm::Value* parity) { mbar_wait(mbar_at(buf), parity); }

void AttentionCode::tma_wait_empty(llvm::Value* buf, llvm::Value* use) {
  (void)(when(b_.CreateICmpSGE(use, c(1)), [&]() -> Result<void> {
    mbar_wait(mbar_at(buf, true), b_.CreateAnd(b_.CreateSub(use, c(1)), c(1)));
    return ok();
  }));
}

void AttentionCode::tma_release(llvm::Value* buf) {
  llvm::Value* lane0 = b_.CreateICmpEQ(b_.CreateURem(tid_, c(32)), c(0));
  (void)(when(lane0, [&]() -> Result<void> {
    llvm::Value* bar = mbar_at(buf, true);
    if (mode_ == Mode::MmaSim)
      b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt32Ty(), b_.getPtrTy()}, false), hook_[16],
                    {hook_[0], tid32_, bar});
    else
      matmul_detail::mbar_arrive_ptx(b_, bar);
    return ok();
  }));
}

void AttentionCode::tma_fetch(llvm::Value* b, llvm::Value* kv0, llvm::Value* kv_end, int64_t n) {
  if (ws_) return;  // the producer warpgroup brings every tile (producer_branch)
  llvm::Value* go = b_.CreateAnd(b_.CreateICmpEQ(tid_, c(0)), b_.CreateICmpSLT(kv0, kv_end));
  (void)(when(go, [&]() -> Result<void> {
    tma_bring(b, kv0, n);
    return ok();
  }));
}

void AttentionCode::tma_bring(llvm::Value* b, llvm::Value* kv0, int64_t n) {
  llvm::Value* tile = b_.CreateUDiv(kv0, c(t_.bn));
  llvm::Value* buf = b_.CreateURem(tile, c(n));
  tma_wait_empty(buf, b_.CreateUDiv(tile, c(n)));
  tma_kv(b, kv0, buf, b_.CreateMul(buf, c(t_.kv_bytes())));
}

void AttentionCode::mbar_wait(llvm::Value* bar, llvm::Value* parity) {
  llvm::Type* i32 = b_.getInt32Ty();
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  llvm::BasicBlock* spin = llvm::BasicBlock::Create(b_.getContext(), "mbar.wait", fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(b_.getContext(), "mbar.done", fn);
  llvm::Value* par = b_.CreateTrunc(parity, i32);
  b_.CreateBr(spin);
  b_.SetInsertPoint(spin);
  llvm::Value* ready =
      mode_ == Mode::MmaSim
          ? b_.CreateCall(llvm::FunctionType::get(i32, {b_.getPtrTy(), i32, b_.getPtrTy(), i32}, false), hook_[15],
                          {hook_[0], tid32_, bar, par})
          : matmul_detail::mbar_try_wait_ptx(b_, bar, par);
  b_.CreateCondBr(b_.CreateICmpNE(ready, b_.getInt32(0)), done, spin);
  b_.SetInsertPoint(done);
}

void AttentionCode::wgmma_fence() {
  if (mode_ == Mode::Mma) matmul_detail::ptx_stmt(b_, "wgmma.fence.sync.aligned;");
}

void AttentionCode::set_max_regs(int count, bool inc) {
  if (mode_ == Mode::MmaSim) {
    llvm::Type* i32 = b_.getInt32Ty();
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32, i32, i32}, false), hook_[18],
                  {hook_[0], tid32_, b_.getInt32(static_cast<uint32_t>(count)), b_.getInt32(inc ? 1 : 0)});
    return;
  }
  matmul_detail::setmaxnreg_ptx(b_, count, inc);
}

void AttentionCode::producer_branch(llvm::Value* b, llvm::Value* kv_end) {
  llvm::LLVMContext& ctx = b_.getContext();
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  tma_init();  // thread 0's mbarrier.init, then every thread's barrier
  llvm::BasicBlock* producer = llvm::BasicBlock::Create(ctx, "ws.producer", fn);
  llvm::BasicBlock* consumer = llvm::BasicBlock::Create(ctx, "ws.consumer", fn);
  b_.CreateCondBr(b_.CreateICmpUGE(tid_, c(consumer_threads_)), producer, consumer);
  b_.SetInsertPoint(producer);
  // Every warp of the warpgroup executes the same setmaxnreg.
  set_max_regs(kProducerRegs, /*inc=*/false);
  const int64_t n = t_.kv_buffers;
  (void)(when(b_.CreateICmpEQ(tid_, c(consumer_threads_)), [&]() -> Result<void> {
    return emit_loop(b_, c(0), kv_end, c(t_.bn), "ws.kv", [&](llvm::Value* kv0) -> Result<void> {
      tma_bring(b, kv0, n);
      return ok();
    });
  }));
  b_.CreateRetVoid();
  b_.SetInsertPoint(consumer);
  set_max_regs(kConsumerRegs, /*inc=*/true);
  consumers_only_ = true;
}

void AttentionCode::named_barrier(llvm::Value* id, int threads, bool sync) {
  if (mode_ == Mode::MmaSim) {
    llvm::Type* i32 = b_.getInt32Ty();
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32, i32, i32, i32}, false), hook_[17],
                  {hook_[0], tid32_, b_.CreateTrunc(id, i32), b_.getInt32(static_cast<uint32_t>(threads)),
                   b_.getInt32(sync ? 1 : 0)});
    return;
  }
  matmul_detail::named_barrier_ptx(b_, id, threads, sync);
}

// The warpgroup's pair p = wg / 2 and role r = wg % 2 name its barrier 1 + 2 p + r and
// the other's 1 + 2 p + (1 - r) (ids 1 to 4 for up to 4 warpgroups; 0 is bar.sync's).
void AttentionCode::turn_first() {
  if (!pp_) return;
  llvm::Value* wg = b_.CreateUDiv(warp_, c(4));
  (void)(when(b_.CreateICmpEQ(b_.CreateURem(wg, c(2)), c(1)), [&]() -> Result<void> {
    named_barrier(wg, 256, /*sync=*/false);  // the first's, 1 + 2 p: wg = 2 p + 1 here
    return ok();
  }));
}

void AttentionCode::turn_begin() {
  if (!pp_) return;
  named_barrier(b_.CreateAdd(b_.CreateUDiv(warp_, c(4)), c(1)), 256, /*sync=*/true);
}

void AttentionCode::turn_end(bool last) {
  if (!pp_) return;
  llvm::Value* wg = b_.CreateUDiv(warp_, c(4));
  llvm::Value* role = b_.CreateURem(wg, c(2));
  llvm::Value* other = b_.CreateAdd(b_.CreateXor(wg, c(1)), c(1));
  if (!last) {
    named_barrier(other, 256, /*sync=*/false);
    return;
  }
  (void)(when(b_.CreateICmpEQ(role, c(0)), [&]() -> Result<void> {
    named_barrier(other, 256, /*sync=*/false);
    return ok();
  }));
}

void AttentionCode::proxy_fence() {
  if (mode_ == Mode::Mma) matmul_detail::ptx_stmt(b_, "fence.proxy.async.shared::cta;");
}

void AttentionCode::wgmma_commit() {
  if (mode_ == Mode::MmaSim) {
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt32Ty()}, false), hook_[9],
                  {hook_[0], tid32_});
    return;
  }
  matmul_detail::ptx_stmt(b_, "wgmma.commit_group.sync.aligned;");
}

void AttentionCode::wgmma_wait(int pending) {
  if (mode_ == Mode::MmaSim) {
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt32Ty(), b_.getInt32Ty()}, false),
                  hook_[10], {hook_[0], tid32_, b_.getInt32(static_cast<uint32_t>(pending))});
    return;
  }
  matmul_detail::ptx_stmt(b_, "wgmma.wait_group.sync.aligned " + std::to_string(pending) + ";");
}

void AttentionCode::fence_operands(std::vector<llvm::Value*>& v) {
  if (mode_ != Mode::Mma) return;
  // Each value through an empty volatile asm after the wait: LLVM keeps volatile asm
  // in order, so nothing reads the register before the wgmma that writes it retired
  // (CUTLASS's warpgroup_fence_operand).
  for (llvm::Value*& x : v) {
    llvm::Type* t = x->getType();
    auto* fty = llvm::FunctionType::get(t, {t}, false);
    x = b_.CreateCall(llvm::InlineAsm::get(fty, "", t->isFloatTy() ? "=f,0" : "=r,0", /*hasSideEffects=*/true), {x});
  }
}

std::vector<llvm::Value*> AttentionCode::zeros(int64_t n) {
  return std::vector<llvm::Value*>(static_cast<size_t>(n), llvm::ConstantFP::get(b_.getFloatTy(), 0.0));
}

std::vector<llvm::Value*> AttentionCode::scores_wgmma(llvm::Value* kvoff, std::vector<llvm::Value*> d) {
  // Per k step one m64n{bn}k16 over the whole key tile, both operands K-major from
  // shared memory: the warpgroup's 64 rows of q and the k tile. K step s starts in
  // panel s / 4, 32 bytes per step into its 128-byte rows (the hardware swizzles the
  // address it forms); 8 rows are 1024 bytes. `d` holds the accumulators' start.
  llvm::Value* wg_rows = b_.CreateMul(b_.CreateUDiv(warp_, c(4)), c(64 * 128));  // the warpgroup's first q row
  for (int64_t s = 0; s < t_.e / 16; ++s) {
    llvm::Value* qat = b_.CreateAdd(wg_rows, c(t_.q16 + s / 4 * t_.bm * 128 + s % 4 * 32));
    llvm::Value* kat = b_.CreateAdd(kvoff, c(t_.k16 + s / 4 * t_.bn * 128 + s % 4 * 32));
    d = wgmma({}, qat, kat, t_.bn * 128, std::move(d), /*trans_b=*/false);
  }
  return d;
}

std::vector<llvm::Value*> AttentionCode::output_wgmma(const std::vector<std::vector<llvm::Value*>>& a, llvm::Value* kvoff,
                                                      std::vector<llvm::Value*> d) {
  // Per k step (16 keys) one m64n{Ev}k16 into all Ev / 8 output tiles, A p's
  // fragments, B the v tile MN-major (rows keys, 64-column panels bn rows apart): k
  // step kk starts 16 rows (2048 bytes) on; the leading byte offset is the next
  // panel's.
  for (int64_t kk = 0; kk < t_.bn / 16; ++kk)
    d = wgmma(a[static_cast<size_t>(kk)], nullptr, b_.CreateAdd(kvoff, c(t_.v16 + kk * 2048)), t_.bn * 128, std::move(d),
              /*trans_b=*/true);
  return d;
}

std::vector<std::vector<llvm::Value*>> AttentionCode::p_fragments(const Frags& p) {
  std::vector<std::vector<llvm::Value*>> a;
  for (int64_t kk = 0; kk < t_.bn / 16; ++kk) {
    llvm::Value* el[8];
    for (int e = 0; e < 8; ++e) {
      auto [tile, i] = a_from_c(e);
      el[e] = p[static_cast<size_t>(2 * kk + tile)][static_cast<size_t>(i)];
    }
    a.push_back({pack(el[0], el[1]), pack(el[2], el[3]), pack(el[4], el[5]), pack(el[6], el[7])});
  }
  return a;
}

AttentionCode::Frags AttentionCode::fragments(const std::vector<llvm::Value*>& d) {
  // D's element 4j + i is C element i of n8 tile j (the accumulator figure repeats
  // mma's C figure per 8 columns, each warp on its 16 rows).
  Frags f(d.size() / 4);
  for (size_t j = 0; j < f.size(); ++j) f[j].assign(d.begin() + static_cast<std::ptrdiff_t>(4 * j), d.begin() + static_cast<std::ptrdiff_t>(4 * j + 4));
  return f;
}

std::vector<llvm::Value*> AttentionCode::flat(const Frags& f) {
  std::vector<llvm::Value*> d;
  for (const std::vector<llvm::Value*>& t : f) d.insert(d.end(), t.begin(), t.end());
  return d;
}

std::vector<llvm::Value*> AttentionCode::wgmma(const std::vector<llvm::Value*>& a, llvm::Value* a_off, llvm::Value* b_off,
                                               int64_t lbo, std::vector<llvm::Value*> d, bool trans_b) {
  llvm::Type* i32 = b_.getInt32Ty();
  llvm::Type* f32 = b_.getFloatTy();
  // A descriptor's start: the 32-bit shared address (the host build: the offset from
  // its shared memory, which the simulation counts from).
  auto desc = [&](llvm::Value* off) {
    llvm::Value* addr = b_.CreateTrunc(off, i32);
    if (mode_ == Mode::Mma) addr = b_.CreateAdd(b_.CreatePtrToInt(buf_, i32), addr);
    return matmul_detail::wgmma_descriptor(b_, addr, lbo, 1024);
  };
  llvm::Value* db = desc(b_off);
  llvm::Value* da = a.empty() ? desc(a_off) : nullptr;
  if (mode_ == Mode::Mma)
    return matmul_detail::wgmma_inline(b_, a, da, db, std::move(d), f16() ? "f16" : "bf16", 0, trans_b ? 1 : 0);
  const size_t n = d.size();
  llvm::Value* dbuf = slot(llvm::ArrayType::get(f32, n));
  for (size_t i = 0; i < n; ++i) b_.CreateStore(d[i], b_.CreateConstInBoundsGEP1_64(f32, dbuf, i));
  const int32_t mode = (f16() ? 1 : 0) | (trans_b ? 4 : 0) | static_cast<int32_t>(2 * n) << 8;
  llvm::Type* ptr = b_.getPtrTy();
  llvm::Type* i64 = b_.getInt64Ty();
  if (a.empty()) {
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32, i64, i64, i32, ptr}, false);
    b_.CreateCall(fty, hook_[11], {hook_[0], tid32_, da, db, b_.getInt32(static_cast<uint32_t>(mode)), dbuf});
  } else {
    llvm::Value* abuf = slot(llvm::ArrayType::get(i32, 4));
    for (size_t i = 0; i < 4; ++i) b_.CreateStore(a[i], b_.CreateConstInBoundsGEP1_64(i32, abuf, i));
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32, ptr, i64, i32, ptr}, false);
    b_.CreateCall(fty, hook_[8], {hook_[0], tid32_, abuf, db, b_.getInt32(static_cast<uint32_t>(mode)), dbuf});
  }
  for (size_t i = 0; i < n; ++i) d[i] = b_.CreateLoad(f32, b_.CreateConstInBoundsGEP1_64(f32, dbuf, i));
  return d;
}

}  // namespace sf::attention_detail
