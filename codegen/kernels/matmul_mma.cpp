// The tensor-core matmul kernel for sm_80 and later (docs/kernels.md, "Tensor-core
// matmul"): f16/bf16 operands staged by 16-byte cp.async into XOR-swizzled shared
// tiles in a multi-stage pipeline, ldmatrix.x4 into fragments, mma.sync.m16n8k16 with
// f32 accumulators, and the group's epilogue applied on the accumulator fragments.
// The index maps are those of mma_layout.h, which tests/kernels/mma_layout_test.cpp
// proves against the PTX ISA's figures; matmul_mma_test.cpp runs this very kernel on
// the host with every warp simulated (MmaSimHooks) to prove the emitted addressing.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/matmul.h"
#include "codegen/kernels/matmul_group.h"
#include "codegen/kernels/matmul_mma_epilogue.h"
#include "codegen/kernels/matmul_mma_isa.h"
#include "codegen/kernels/matmul_mma_tiling.h"
#include "codegen/llvm/backend.h"

namespace sf::matmul_detail {

namespace {

class MmaKernel : MmaIsa {
 public:
  MmaKernel(const KernelSpec& spec, const MatmulGroup& plan, const MmaTiling& t, const llvmb::Target& target,
            llvm::Module& m, bool sim)
      : MmaIsa(plan, t, m, sim), spec_(spec), g_(spec.group), target_(target) {}

  Result<void> build() {
    const size_t np = g_.params().size(), no = g_.outputs().size();
    it_ = mma_fits_i32(g_, p_, t_) ? b_.getInt32Ty() : b_.getInt64Ty();
    f32_ = b_.getFloatTy();
    i32_ = b_.getInt32Ty();
    llvm::Value *bx = nullptr, *by = nullptr, *bz = nullptr;
    if (!sim_) {
      // 128-byte aligned: the swizzle's banks are counted from each tile's base, and
      // every tile and stage is a multiple of 128 bytes.
      // wgmma: 1024, where the 128-byte swizzle's pattern repeats (its descriptors
      // carry a base offset of 0, so every tile must start on a repeat).
      NvptxEntry e = begin_nvptx_matmul(m_, b_, spec_, t_.launch_threads(), t_.wgmma ? 1024 : 128, extra_args());
      fn_ = e.fn;
      in_ = e.in;
      out_ = e.out;
      take_extra(e.extra);
      smem_ = e.smem;
      // Register reallocation: one block an SM, so ptxas gives every thread the
      // launch's 168 registers, the pool setmaxnreg shares out (MmaTiling::consumer_regs).
      if (t_.consumer_regs > 0) llvmb::set_min_blocks_per_sm(*fn_, 1);
      if (t_.cluster > 1) llvmb::set_cluster_dims(*fn_, t_.cluster);
      tid_ = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, it_);
      bx = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, it_);
      by = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y, it_);
      if (t_.split > 1) bz = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z, it_);
      if (t_.persistent) grid_ = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x, it_);
    } else {
      llvm::Type* ptr = b_.getPtrTy();
      // void entry(ptr args, i32 blockIdx.x, i32 blockIdx.y, i32 threadIdx.x, ptr smem, ptr hooks,
      //            i32 blockIdx.z, i32 gridDim.x); args: inputs, outputs, then (TMA) the two tensor
      // maps: SimTensorMap*, then (split-K in a workspace) the workspace.
      kernels::KernelEntry e = kernels::begin_host_kernel(m_, b_, spec_.entry, np, no,
                                                          {i32_, i32_, i32_, ptr, ptr, i32_, i32_},
                                                          static_cast<size_t>(extra_args()));
      fn_ = e.fn;
      in_ = e.in;
      out_ = e.out;
      take_extra(e.extra);
      bx = b_.CreateZExt(fn_->getArg(1), it_);
      by = b_.CreateZExt(fn_->getArg(2), it_);
      tid_ = b_.CreateZExt(fn_->getArg(3), it_);
      smem_ = fn_->getArg(4);
      // MmaSimHooks' pointers (MmaIsa::kHooks).
      llvm::Value* hooks = fn_->getArg(5);
      for (int i = 0; i < kHooks; ++i)
        hook_[i] = b_.CreateAlignedLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, hooks, static_cast<uint64_t>(i)),
                                        llvm::Align(8));
      tid32_ = fn_->getArg(3);
      if (t_.split > 1) bz = b_.CreateZExt(fn_->getArg(6), it_);
      if (t_.persistent) grid_ = b_.CreateZExt(fn_->getArg(7), it_);
    }
    fn_->setDoesNotThrow();
    lag_ = t_.wgmma && t_.stages >= 3 ? 1 : 0;
    cg_.emplace(b_, m_, target_, spec_.precision);
    if (numel(p_.out) == 0) {
      b_.CreateRetVoid();
      return {};
    }

    kbase_ = bz ? b_.CreateMul(bz, k(t_.kt * t_.bk), "kbase", true, true) : k(0);
    gk0_ = k(0);
    // The warp's place in the block tile and the lane's in the warp.
    llvm::Value* warp = warp_ = b_.CreateLShr(tid_, k(5), "warp");
    lane_ = b_.CreateAnd(tid_, k(31), "lane");
    if (t_.wgmma) {
      // Warpgroup w = warp / 4 owns rows w * wg_m ..; within each of its m64 steps,
      // warp % 4 holds 16 rows of the accumulator (the ISA's wgmma D figure).
      // Ping-pong: each consumer warpgroup holds whole tiles, its rows from 0.
      wg_ = b_.CreateLShr(warp, k(2), "wg");
      wg_row_ = t_.pingpong ? k(0) : mul(wg_, t_.wg_m);
      wm0_ = add(wg_row_, mul(b_.CreateAnd(warp, k(3)), 16));
      wn0_ = k(0);
    } else {
      wm0_ = b_.CreateMul(b_.CreateUDiv(warp, k(t_.wn)), k(t_.warp_m), "wm0", true, true);
      wn0_ = b_.CreateMul(b_.CreateURem(warp, k(t_.wn)), k(t_.warp_n), "wn0", true, true);
    }
    // The persistent walk's first item and stride: the block's, or (clusters) the
    // cluster's, whose blocks are consecutive in x (cluster dims (cluster, 1, 1)), so
    // %cluster_ctarank is blockIdx.x % cluster.
    rank_ = k(0);
    walk_first_ = bx;
    walk_grid_ = grid_;
    if (t_.cluster > 1) {
      rank_ = b_.CreateURem(bx, k(t_.cluster), "cta.rank");
      walk_first_ = b_.CreateUDiv(bx, k(t_.cluster), "cluster");
      if (grid_) walk_grid_ = b_.CreateUDiv(grid_, k(t_.cluster), "clusters");
    }
    if (t_.tma && t_.kt > 0) init_mbarriers();
    if (t_.persistent) return persistent();
    start_item(walk_first_, by);
    std::vector<llvm::Value*> acc = zeros();
    if (t_.kt > 0) acc = t_.ws ? k_loop_ws() : k_loop();
    return epilogue(acc, nullptr);
  }

 private:
  // The arguments after the outputs: A's and B's tensor maps (TMA) and the outputs'
  // (TMA stores), then the split-K workspace (MmaTiling::split_ws).
  int extra_args() const { return static_cast<int>(t_.maps.size()) + (t_.split_ws ? 1 : 0); }
  void take_extra(std::vector<llvm::Value*> extra) {
    if (t_.split_ws) {
      ws_ = extra.back();
      extra.pop_back();
    }
    tmap_ = std::move(extra);
  }

  std::vector<llvm::Value*> zeros() {
    return std::vector<llvm::Value*>(static_cast<size_t>(t_.mi * t_.ni * 4), llvm::ConstantFP::get(f32_, 0.0));
  }

  // The work item's output tile (bx, by GROUP_M-swizzled tile and batch): its origin,
  // batch offsets and copy addresses.
  void start_item(llvm::Value* bx, llvm::Value* by) {
    bz_ = by;
    // A cluster's item is a pair of tiles: the GROUP_M swizzle over the pairs, then
    // this block's tile of the pair (the rank-th along M or N).
    const bool by_m = t_.cluster > 1 && t_.cluster_shares_b, by_n = t_.cluster > 1 && !t_.cluster_shares_b;
    TileOrigin o = group_m_tile(b_, p_, bx, t_.bm * (by_m ? t_.cluster : 1), t_.bn * (by_n ? t_.cluster : 1), t_.group_m);
    m0_ = by_m ? add(o.m0, mul(rank_, t_.bm)) : o.m0;
    n0_ = by_n ? add(o.n0, mul(rank_, t_.bn)) : o.n0;
    bi_ = batch_index(b_, p_, by);
    zbase_ = b_.CreateMul(by, k(p_.M * p_.N), "zbase", true, true);
    item_ = add(mul(by, t_.tiles), bx);
    plan_copies();
  }

  // ---- the persistent grid (KernelConfig::persistent) ----
  // Block b takes work items w = b, b + grid, ...: tile w % tiles of batch w / tiles.
  // `grid` is the launch's (%nctaid.x), not the config's count: any grid covers every
  // item, so a runtime may launch fewer blocks where the device holds fewer at once.
  // gk0_ (the item's first K tile counted over the block's whole life) keeps the
  // stages and mbarrier phases running on from item to item. Without warp
  // specialisation every thread walks the items, with a barrier after each epilogue
  // (the next item's copies overwrite the shared memory it staged through); with it,
  // the producer's thread walks them issuing copies, ahead into the next item's tiles
  // while the consumers finish the last one's epilogue (staged in chunks through
  // shared memory of their own, matmul_mma_epilogue.h).
  struct ItemLoop {
    llvm::BasicBlock *loop = nullptr, *latch = nullptr, *done = nullptr;
    llvm::PHINode *w = nullptr, *iter = nullptr;
    int stride = 1;
  };
  // `iter0`: the block's item number of `first` (ping-pong: the consumer warpgroup,
  // whose first item may not exist); `stride`: items of the block between two taken.
  ItemLoop open_items(llvm::Value* first, llvm::Value* iter0 = nullptr, int stride = 1) {
    llvm::LLVMContext& c = m_.getContext();
    ItemLoop l;
    l.stride = stride;
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    l.loop = llvm::BasicBlock::Create(c, "item", fn_);
    l.latch = llvm::BasicBlock::Create(c, "item.next", fn_);
    l.done = llvm::BasicBlock::Create(c, "items.done", fn_);
    // A block may have no item: a ping-pong warpgroup's first, or a launch wider than
    // the items.
    b_.CreateCondBr(b_.CreateICmpULT(first, k(t_.items)), l.loop, l.done);
    b_.SetInsertPoint(l.loop);
    l.w = b_.CreatePHI(it_, 2, "item");
    l.w->addIncoming(first, pre);
    l.iter = b_.CreatePHI(it_, 2, "item.iter");
    l.iter->addIncoming(iter0 ? iter0 : k(0), pre);
    gk0_ = mul(l.iter, t_.kt);
    start_item(b_.CreateURem(l.w, k(t_.tiles)), b_.CreateUDiv(l.w, k(t_.tiles)));
    return l;
  }
  // The latch (the builder must be in it): the next item `stride` grids apart, while any.
  // `consumer`: the loop of threads that store outputs, which with TMA stores wait at
  // the end for their warp's last bulk groups to complete.
  // `tail`: code for the loop's thread after its last item, before it returns.
  void close_items(ItemLoop& l, bool consumer = false, const std::function<void()>& tail = {}) {
    llvm::Value* next = add(l.w, mul(walk_grid_, l.stride));
    l.w->addIncoming(next, b_.GetInsertBlock());
    l.iter->addIncoming(add(l.iter, k(l.stride)), b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, k(t_.items)), l.loop, l.done);
    b_.SetInsertPoint(l.done);
    if (consumer && t_.tma_store) {
      // Every lane 0 (the one that issued its warp's stores); a warp with no item
      // has none, and the wait passes at once.
      llvm::LLVMContext& c = m_.getContext();
      llvm::BasicBlock* lead = llvm::BasicBlock::Create(c, "tma.drain", fn_);
      llvm::BasicBlock* out = llvm::BasicBlock::Create(c, "tma.drained", fn_);
      b_.CreateCondBr(b_.CreateICmpEQ(lane_, k(0)), lead, out);
      b_.SetInsertPoint(lead);
      bulk_wait(0, /*read=*/false);
      b_.CreateBr(out);
      b_.SetInsertPoint(out);
    }
    if (tail) tail();
    b_.CreateRetVoid();
  }

  Result<void> persistent() {
    llvm::LLVMContext& c = m_.getContext();
    if (t_.ws) {
      // The producer warpgroup: its first thread walks the items issuing their copies
      // (none when K = 0), the others return at once. With register reallocation the
      // whole warpgroup first gives up registers, and the consumers' warpgroups take
      // them (every warp of a warpgroup executes the same setmaxnreg, and the two
      // counts add up to the launch's registers: MmaTiling::consumer_regs).
      llvm::BasicBlock* producer = llvm::BasicBlock::Create(c, "ws.producer", fn_);
      llvm::BasicBlock* consumer = llvm::BasicBlock::Create(c, "ws.consumer", fn_);
      llvm::BasicBlock* leave = llvm::BasicBlock::Create(c, "ws.leave", fn_);
      b_.CreateCondBr(b_.CreateICmpUGE(tid_, k(t_.threads)), producer, consumer);
      b_.SetInsertPoint(leave);
      b_.CreateRetVoid();
      b_.SetInsertPoint(producer);
      if (t_.consumer_regs > 0) set_max_regs(t_.producer_regs, /*inc=*/false);
      if (t_.kt > 0) {
        llvm::BasicBlock* lead = llvm::BasicBlock::Create(c, "ws.lead", fn_);
        b_.CreateCondBr(b_.CreateICmpEQ(tid_, k(t_.threads)), lead, leave);
        b_.SetInsertPoint(lead);
        ItemLoop pitems = open_items(walk_first_);
        producer_loop();
        b_.CreateBr(pitems.latch);
        b_.SetInsertPoint(pitems.latch);
        close_items(pitems, false, [this] {
          if (t_.cluster > 1) producer_tail(b_.CreateSelect(
              b_.CreateICmpULT(walk_first_, k(t_.items)),
              add(b_.CreateUDiv(b_.CreateSub(k(t_.items - 1), walk_first_), walk_grid_), k(1)), k(0)));
        });
      } else {
        b_.CreateBr(leave);
      }
      b_.SetInsertPoint(consumer);
      if (t_.consumer_regs > 0) set_max_regs(t_.consumer_regs, /*inc=*/true);
    }
    if (t_.pingpong) return pingpong_consumer();
    ItemLoop items = open_items(walk_first_);
    std::vector<llvm::Value*> acc = t_.kt == 0 ? zeros() : t_.ws ? consumer_loop(/*release_last=*/true) : k_loop();
    if (Result<void> r = epilogue(acc, items.latch, /*producer_joins=*/false); !r) return r;
    b_.SetInsertPoint(items.latch);
    if (!t_.ws) barrier();
    close_items(items, /*consumer=*/true);
    return {};
  }

  // A ping-pong consumer warpgroup (wg_ 0 or 1): the block's items wg_, wg_ + 2, ...
  // Before item j's K loop (j > 0) it waits on named barrier 1 + wg_ until the other
  // warpgroup has issued item j - 1's last wgmma group; once it has issued its own
  // last, it lets the other start item j + 1, when there is one. So the warpgroups
  // multiply in turn, one's epilogue during the other's K loop. The turns also keep each full-mbarrier wait within one
  // phase of the stage's progress: a warpgroup reaching tile g has seen every earlier
  // tile's copies complete (the other's through the barrier), so the parity it waits
  // for cannot be that of a phase two back.
  Result<void> pingpong_consumer() {
    llvm::LLVMContext& c = m_.getContext();
    ItemLoop items = open_items(add(walk_first_, b_.CreateMul(wg_, walk_grid_, "", true, true)), wg_, /*stride=*/2);
    std::vector<llvm::Value*> acc = zeros();
    if (t_.kt > 0) {
      llvm::BasicBlock* turn = llvm::BasicBlock::Create(c, "pp.turn", fn_);
      llvm::BasicBlock* go = llvm::BasicBlock::Create(c, "pp.go", fn_);
      b_.CreateCondBr(b_.CreateICmpNE(items.iter, k(0)), turn, go);
      b_.SetInsertPoint(turn);
      named_barrier(add(wg_, k(1)), 256, /*sync=*/true);
      b_.CreateBr(go);
      b_.SetInsertPoint(go);
      // The turn passes once the item's last group is issued, before it retires: the
      // other warpgroup's groups queue behind it on the tensor cores, which do not
      // drain between the two (CUTLASS's ping-pong hands over at the same point).
      acc = consumer_loop(/*release_last=*/true, [&] {
        llvm::BasicBlock* pass = llvm::BasicBlock::Create(c, "pp.pass", fn_);
        llvm::BasicBlock* passed = llvm::BasicBlock::Create(c, "pp.passed", fn_);
        b_.CreateCondBr(b_.CreateICmpULT(add(items.w, walk_grid_), k(t_.items)), pass, passed);
        b_.SetInsertPoint(pass);
        named_barrier(b_.CreateSub(k(2), wg_), 256, /*sync=*/false);
        b_.CreateBr(passed);
        b_.SetInsertPoint(passed);
      });
    }
    if (Result<void> r = epilogue(acc, items.latch, /*producer_joins=*/false); !r) return r;
    b_.SetInsertPoint(items.latch);
    close_items(items, /*consumer=*/true);
    return {};
  }

  // One 16-byte chunk a thread copies from global to shared memory per K tile.
  struct Copy {
    llvm::Value* valid = nullptr;      // the thread has this chunk (nullptr: always)
    llvm::Value* smem_off = nullptr;   // byte offset within the operand's tile
    llvm::Value* base = nullptr;       // element offset of the chunk for K tile 0
    llvm::Value* kk = nullptr;         // k within the tile of the chunk's first element
    bool k_in_row = false;             // the chunk runs along k (a k-contiguous tile)
    llvm::Value* other_ok = nullptr;   // k_in_row: its row (m or n) is in bounds
    llvm::Value* other_bytes = nullptr;  // !k_in_row: bytes of the chunk inside M or N
    int64_t kstride = 0;               // element stride of k in the operand
  };

  // Chunk e = tid + l * threads of a tile walks the tile's rows in order, 16 bytes
  // at a time: consecutive threads read consecutive global addresses.
  void plan_copies() {
    auto plan = [&](bool is_a) {
      const SmemTile& tile = is_a ? t_.a : t_.b;
      const bool kc = is_a ? t_.a_kc : t_.b_kc;
      const int64_t s_outer = is_a ? p_.sam : p_.sbn, s_k = is_a ? p_.sak : p_.sbk;
      const int64_t outer_n = is_a ? p_.M : p_.N;
      llvm::Value* outer0 = is_a ? m0_ : n0_;
      llvm::Value* boff = is_a ? bi_.a_off : bi_.b_off;
      const int per = tile.per_chunk();
      const int64_t cpr = tile.cols / per, total = int64_t{tile.rows} * cpr;
      std::vector<Copy> out;
      for (int64_t l = 0; l * t_.threads < total; ++l) {
        Copy cp;
        llvm::Value* e = add(tid_, k(l * t_.threads));
        if ((l + 1) * t_.threads > total) cp.valid = b_.CreateICmpULT(e, k(total));
        llvm::Value* r = b_.CreateLShr(e, k(log2i(cpr)));
        llvm::Value* col = b_.CreateShl(b_.CreateAnd(e, k(cpr - 1)), k(log2i(per)));
        cp.smem_off = tile_offset(tile, r, col);
        cp.k_in_row = kc;
        cp.kstride = s_k;
        if (kc) {  // rows are m (n), the chunk covers k col .. col+7
          llvm::Value* o = add(outer0, r);
          cp.other_ok = b_.CreateICmpSLT(o, k(outer_n));
          if (cp.valid) cp.other_ok = b_.CreateAnd(cp.other_ok, cp.valid);
          cp.kk = col;
          cp.base = add(boff, add(mul(o, s_outer), mul(col, s_k)));
        } else {  // rows are k, the chunk covers m (n) col .. col+7
          llvm::Value* o = add(outer0, col);
          llvm::Value* left = b_.CreateBinaryIntrinsic(
              llvm::Intrinsic::smax, b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateSub(k(outer_n), o), k(per)), k(0));
          cp.other_bytes = mul(left, tile.eb);
          if (cp.valid) cp.other_bytes = b_.CreateSelect(cp.valid, cp.other_bytes, k(0));
          cp.kk = r;
          cp.base = add(boff, add(mul(o, s_outer), mul(r, s_k)));
        }
        out.push_back(cp);
      }
      return out;
    };
    a_copy_ = plan(true);
    b_copy_ = plan(false);
  }

  // The chunks of the K tile at k0 into `stage`: cp.async.cg 16 bytes with a source
  // size of the bytes inside the operand (the rest zero-filled; 0 at a clamped
  // address when none is). The host simulation copies at once (zero-fill included),
  // one of the orders cp.async allows.
  void issue_tile(llvm::Value* k0, llvm::Value* stage) {
    k0 = add(kbase_, k0);
    llvm::Value* sbase = mul(stage, t_.stage_bytes);
    for (int which = 0; which < 2; ++which) {
      const MatmulOperand& op = which == 0 ? p_.a : p_.b;
      llvm::Value* tbase = which == 0 ? sbase : add(sbase, k(t_.a.bytes()));
      for (const Copy& cp : which == 0 ? a_copy_ : b_copy_) {
        llvm::BasicBlock* cont = nullptr;
        if (cp.valid) {
          llvm::BasicBlock* st = llvm::BasicBlock::Create(b_.getContext(), "cp", fn_);
          cont = llvm::BasicBlock::Create(b_.getContext(), "cp.done", fn_);
          b_.CreateCondBr(cp.valid, st, cont);
          b_.SetInsertPoint(st);
        }
        llvm::Value* kidx = add(k0, cp.kk);
        llvm::Value* bytes;
        if (cp.k_in_row) {
          llvm::Value* left = b_.CreateBinaryIntrinsic(
              llvm::Intrinsic::smax,
              b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateSub(k(p_.K), kidx), k(t_.a.per_chunk())), k(0));
          bytes = b_.CreateSelect(cp.other_ok, mul(left, t_.a.eb), k(0));
        } else {
          bytes = b_.CreateSelect(b_.CreateICmpSLT(kidx, k(p_.K)), cp.other_bytes, k(0));
        }
        llvm::Value* idx = add(cp.base, mul(k0, cp.kstride));
        idx = b_.CreateSelect(b_.CreateICmpSGT(bytes, k(0)), idx, k(0));
        llvm::Value* bytes32 = b_.CreateZExtOrTrunc(bytes, i32_);
        llvm::Value* src = b_.CreateInBoundsGEP(b_.getIntNTy(8 * static_cast<unsigned>(t_.a.eb)),
                                                in_[static_cast<size_t>(op.param)], idx);
        llvm::Value* dst = smem_at(add(tbase, cp.smem_off));
        if (sim_) {
          llvm::Type* ptr = b_.getPtrTy();
          auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32_, ptr, ptr, i32_}, false);
          b_.CreateCall(fty, hook_[5], {hook_[0], tid32_, dst, src, bytes32});
        } else {
          b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s, {}, {dst, src, bytes32});
        }
        if (cont) {
          b_.CreateBr(cont);
          b_.SetInsertPoint(cont);
        }
      }
    }
  }

  void load_tile(llvm::Value* k0, llvm::Value* stage) {
    if (t_.tma) issue_tile_tma(k0, stage);
    else issue_tile(k0, stage);
  }

  // ---- TMA (sm_90a wgmma kernel, KernelSpec::tma) ----
  // One mbarrier per stage, arrival count 1: thread 0's arrive.expect_tx of the
  // stage's bytes; the copies complete the transaction count, and every thread waits
  // for the phase (the instructions: matmul_mma_isa.h).

  void init_mbarriers() {
    if_thread0([&] {
      auto init = [&](llvm::Value* off, int count) {
        if (sim_) {
          sim_call(11, {smem_operand(off), b_.getInt32(static_cast<uint32_t>(count))});
          return;
        }
        mbar_init_ptx(b_, smem_operand(off), count);
      };
      for (int st = 0; st < t_.stages; ++st) {
        init(mbar(k(st)), 1);
        // One arrival per consumer warp; ping-pong: per warp of the one warpgroup
        // that multiplies the tile.
        // Clusters: the consumer warps of every block of the cluster (the stage is
        // written by every block's producer).
        if (t_.ws) init(empty_mbar(k(st)), (t_.pingpong ? 4 : t_.threads / 32) * t_.cluster);
      }
      // The initialisation visible to the async proxy (the copies complete on them)
      // and, with clusters, to the other blocks.
      asm_stmt("fence.mbarrier_init.release.cluster;");
    });
    // Clusters: no block copies into another's shared memory or arrives on its
    // mbarriers before that block has initialised them.
    if (t_.cluster > 1) cluster_sync();
    else barrier();
  }

  // Clusters: the producer thread, past its last item, waits until every stage's last
  // use has been released by the consumers of every block of the cluster, as it would
  // before refilling it. Those releases include the other blocks' arrivals on this
  // block's mbarriers, so the block (its shared memory) stays until the last of them
  // is in; and every copy into this block's shared memory is one its own consumers
  // wait for. `taken`: the items the block walked (a persistent walk: n =
  // ceil((items - first) / clusters); else 1).
  void producer_tail(llvm::Value* taken) {
    llvm::Value* total = mul(taken, t_.kt);
    gk0_ = k(0);
    for (int j = 0; j < t_.stages; ++j) {
      llvm::Value* g = add(total, k(j));
      mbar_wait_at(empty_mbar(stage_of(g)), b_.CreateXor(parity_of(g), k(1)));
    }
  }

  // Thread 0: the stage's mbarrier expects stage_bytes, then one bulk tensor copy per
  // 128-byte-wide panel of A's and B's tiles (OOB elements arrive as zeros).
  void issue_tile_tma(llvm::Value* k0, llvm::Value* stage) {
    if (t_.ws) {  // only the producer thread gets here
      tma_tile_body(k0, stage);
      return;
    }
    if_thread0([&] { tma_tile_body(k0, stage); });
  }

  void tma_tile_body(llvm::Value* k0, llvm::Value* stage) {
    k0 = add(kbase_, k0);
    {
      llvm::Value* bar = smem_operand(mbar(stage));
      llvm::Value* bytes = b_.getInt32(static_cast<uint32_t>(t_.stage_bytes));
      if (sim_) {
        sim_call(12, {bar, bytes});
      } else {
        mbar_expect_tx_ptx(b_, bar, bytes);
      }
      llvm::Value* sbase = mul(stage, t_.stage_bytes);
      const int64_t panel = 128 / t_.a.eb;
      for (int which = 0; which < 2; ++which) {
        const SmemTile& tile = which == 0 ? t_.a : t_.b;
        const bool kc = which == 0 ? t_.a_kc : t_.b_kc;
        llvm::Value* outer0 = which == 0 ? m0_ : n0_;
        llvm::Value* tbase = which == 0 ? sbase : add(sbase, k(t_.a.bytes()));
        const int panels = tile.cols / static_cast<int>(panel);
        // Clusters: the operand the blocks share, of which this block brings rows
        // rank * half .. of every box, into every block of the cluster.
        const bool shared = t_.cluster > 1 && (which == 1) == t_.cluster_shares_b;
        llvm::Value* half = shared ? mul(rank_, t_.half_rows()) : nullptr;
        for (int pi = 0; pi < panels; ++pi) {
          llvm::Value* inner = add(kc ? k0 : outer0, k(pi * panel));
          llvm::Value* row = kc ? outer0 : k0;
          llvm::Value* at = add(tbase, k(int64_t{pi} * tile.rows * 128));
          if (shared) {
            row = add(row, half);
            at = add(at, mul(half, 128));
          }
          llvm::Value* c0 = b_.CreateZExtOrTrunc(inner, i32_);
          llvm::Value* c1 = b_.CreateZExtOrTrunc(row, i32_);
          llvm::Value* dst = smem_operand(at);
          // Then the batch coordinates the operand's map steps through.
          std::vector<llvm::Value*> coords = {c0, c1};
          for (int e : t_.map_batch[static_cast<size_t>(which)])
            coords.push_back(b_.CreateZExtOrTrunc(bi_.coords[static_cast<size_t>(e)], i32_));
          if (shared) tma_load_multicast(tmap_[static_cast<size_t>(which)], dst, coords, bar, (1 << t_.cluster) - 1);
          else tma_load(tmap_[static_cast<size_t>(which)], dst, coords, bar);
        }
      }
    }
  }

  // The K loop's header, entered from the current block: kt from 0 and every
  // accumulator from 0.0 as phis, the builder inside it; `done` follows the loop.
  struct KLoop {
    llvm::BasicBlock *loop = nullptr, *done = nullptr;
    llvm::PHINode* kt = nullptr;
    std::vector<llvm::PHINode*> phis;
    std::vector<llvm::Value*> acc;
  };
  KLoop open_k_loop() {
    llvm::LLVMContext& c = m_.getContext();
    KLoop l;
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    l.loop = llvm::BasicBlock::Create(c, "k.loop", fn_);
    l.done = llvm::BasicBlock::Create(c, "k.done", fn_);
    b_.CreateBr(l.loop);
    b_.SetInsertPoint(l.loop);
    l.kt = b_.CreatePHI(it_, 2, "kt");
    l.kt->addIncoming(k(0), pre);
    for (int i = 0; i < t_.mi * t_.ni * 4; ++i) {
      llvm::PHINode* ph = b_.CreatePHI(f32_, 2, "acc");
      ph->addIncoming(llvm::ConstantFP::get(f32_, 0.0), pre);
      l.phis.push_back(ph);
      l.acc.push_back(ph);
    }
    return l;
  }

  // The loop's back edge from the current block (kt + 1 while below the K tiles, the
  // accumulators `acc`), then the builder after it, every wgmma group retired.
  // `issued`: code for the point where the last group is issued but not yet retired.
  void close_k_loop(KLoop& l, const std::vector<llvm::Value*>& acc, const std::function<void()>& issued = {}) {
    llvm::Value* next = add(l.kt, k(1));
    for (size_t i = 0; i < acc.size(); ++i) l.phis[i]->addIncoming(acc[i], b_.GetInsertBlock());
    l.kt->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, k(t_.kt)), l.loop, l.done);
    b_.SetInsertPoint(l.done);
    if (issued) issued();
    if (lag_ > 0) wgmma_wait(0);  // the last groups, before the epilogue reads the accumulators
  }

  // The item's K tile kt's stage, and the parity of its use of it (TMA: the mbarrier
  // phase number g / stages that tile's copies complete), g = gk0_ + kt the tile
  // counted over the block's life (a persistent block's earlier items included).
  llvm::Value* stage_of(llvm::Value* kt) {
    llvm::Value* g = add(gk0_, kt);
    return pow2(t_.stages) ? b_.CreateAnd(g, k(t_.stages - 1)) : b_.CreateURem(g, k(t_.stages));
  }
  llvm::Value* parity_of(llvm::Value* kt) { return b_.CreateAnd(b_.CreateUDiv(add(gk0_, kt), k(t_.stages)), k(1)); }

  // stages-1 tiles in flight; iteration kt waits for tile kt, syncs (every thread is
  // also past tile kt-1, whose stage the next copy overwrites), issues tile
  // kt+stages-1, computes tile kt. One commit group per iteration, empty past the end.
  std::vector<llvm::Value*> k_loop() {
    llvm::LLVMContext& c = m_.getContext();
    // `ahead` tiles are in flight; the wgmma kernel also keeps `lag_` wgmma groups in
    // flight, whose stages the copies must not overwrite: one fewer tile ahead.
    const int ahead_n = t_.stages - 1 - lag_;
    for (int st = 0; st < ahead_n; ++st) {
      if (st < t_.kt) load_tile(k(int64_t{st} * t_.bk), stage_of(k(st)));
      if (!t_.tma) commit();
    }
    KLoop kl = open_k_loop();
    llvm::PHINode* kt = kl.kt;
    if (!t_.tma) wait(ahead_n - 1);
    if (t_.wgmma && !t_.tma) proxy_fence();  // the copies, made by the generic proxy, become visible to wgmma's
    // Every thread is past tile kt-1's compute (mma.sync), or past the wait that
    // retired tile kt-1-lag's wgmma group: that tile's stage may be refilled.
    barrier();
    llvm::Value* ahead = add(kt, k(ahead_n));
    llvm::BasicBlock* issue = llvm::BasicBlock::Create(c, "k.issue", fn_);
    llvm::BasicBlock* issued = llvm::BasicBlock::Create(c, "k.issued", fn_);
    b_.CreateCondBr(b_.CreateICmpSLT(ahead, k(t_.kt)), issue, issued);
    b_.SetInsertPoint(issue);
    load_tile(mul(ahead, t_.bk), stage_of(ahead));
    b_.CreateBr(issued);
    b_.SetInsertPoint(issued);
    if (t_.tma) mbar_wait(stage_of(kt), parity_of(kt));
    else commit();
    std::vector<llvm::Value*> acc = t_.wgmma ? compute_wgmma(stage_of(kt), kl.acc) : compute(stage_of(kt), kl.acc);
    close_k_loop(kl, acc);
    return acc;
  }

  // Warp specialisation: after the mbarriers' initialisation (and the one barrier
  // every thread meets), the producer warpgroup's first thread walks the K tiles:
  // waits until the tile's stage is empty (its previous use released by every
  // consumer warpgroup; a fresh stage passes at once, the phase before the first
  // counting as done), arms the stage's full mbarrier and issues the copies; the
  // producer's other threads have nothing to do. The consumers wait for each tile's
  // full phase, multiply, and once wgmma.wait_group lag has retired the previous
  // tile's group, lane 0 of every consumer warp (past its own wait) arrives on that
  // tile's empty mbarrier. No barrier in the loop: the stages are handed over by
  // mbarriers only. The producer's threads then join the consumers' in the epilogue,
  // with zero accumulators they do not store (MmaEpilogueFrame::active).
  std::vector<llvm::Value*> k_loop_ws() {
    llvm::LLVMContext& c = m_.getContext();
    llvm::BasicBlock* producer = llvm::BasicBlock::Create(c, "ws.producer", fn_);
    llvm::BasicBlock* lead = llvm::BasicBlock::Create(c, "ws.lead", fn_);
    llvm::BasicBlock* consumer = llvm::BasicBlock::Create(c, "ws.consumer", fn_);
    llvm::BasicBlock* leave = llvm::BasicBlock::Create(c, "ws.leave", fn_);
    llvm::BasicBlock* join = llvm::BasicBlock::Create(c, "ws.join", fn_);
    b_.CreateCondBr(b_.CreateICmpUGE(tid_, k(t_.threads)), producer, consumer);
    b_.SetInsertPoint(producer);
    b_.CreateCondBr(b_.CreateICmpEQ(tid_, k(t_.threads)), lead, leave);
    b_.SetInsertPoint(lead);
    producer_loop();
    if (t_.cluster > 1) producer_tail(k(1));
    b_.CreateBr(leave);
    b_.SetInsertPoint(leave);
    b_.CreateBr(join);

    b_.SetInsertPoint(consumer);
    // Clusters: every stage released, the last too, for the producers' tails.
    std::vector<llvm::Value*> acc = consumer_loop(/*release_last=*/t_.cluster > 1);
    llvm::BasicBlock* done = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    for (llvm::Value*& v : acc) {
      llvm::PHINode* phi = b_.CreatePHI(f32_, 2);
      phi->addIncoming(llvm::ConstantFP::get(f32_, 0.0), leave);
      phi->addIncoming(v, done);
      v = phi;
    }
    return acc;
  }

  // The producer thread's K loop over the item's tiles; the builder after it.
  void producer_loop() {
    llvm::LLVMContext& c = m_.getContext();
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    llvm::BasicBlock* ploop = llvm::BasicBlock::Create(c, "ws.p.loop", fn_);
    llvm::BasicBlock* pdone = llvm::BasicBlock::Create(c, "ws.p.done", fn_);
    b_.CreateBr(ploop);
    b_.SetInsertPoint(ploop);
    llvm::PHINode* pk = b_.CreatePHI(it_, 2, "pkt");
    pk->addIncoming(k(0), pre);
    mbar_wait_at(empty_mbar(stage_of(pk)), b_.CreateXor(parity_of(pk), k(1)));
    issue_tile_tma(mul(pk, t_.bk), stage_of(pk));
    llvm::Value* pnext = add(pk, k(1));
    pk->addIncoming(pnext, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(pnext, k(t_.kt)), ploop, pdone);
    b_.SetInsertPoint(pdone);
  }

  // The consumers' K loop; the builder after it, every wgmma group retired.
  // `release_last`: also release the stage of the item's last tile, whose group only
  // the final wait retired (a persistent producer reuses it for a later item).
  // `issued`: as close_k_loop's.
  std::vector<llvm::Value*> consumer_loop(bool release_last, const std::function<void()>& issued = {}) {
    llvm::LLVMContext& c = m_.getContext();
    KLoop kl = open_k_loop();
    llvm::PHINode* kt = kl.kt;
    mbar_wait(stage_of(kt), parity_of(kt));
    std::vector<llvm::Value*> acc = compute_wgmma(stage_of(kt), kl.acc);  // ends with wgmma.wait_group lag
    // The tile whose group that wait retired (kt - lag) releases its stage.
    llvm::Value* retired = b_.CreateSub(kt, k(lag_));
    auto release = [&](llvm::Value* when, llvm::Value* tile) {
      llvm::BasicBlock* rel = llvm::BasicBlock::Create(c, "ws.release", fn_);
      llvm::BasicBlock* cont = llvm::BasicBlock::Create(c, "ws.released", fn_);
      // Clusters: lane r arrives on block r's mbarrier (both blocks' producers write
      // the stage), else lane 0 on the block's own.
      b_.CreateCondBr(b_.CreateAnd(when, b_.CreateICmpULT(lane_, k(t_.cluster))), rel, cont);
      b_.SetInsertPoint(rel);
      if (t_.cluster > 1) mbar_arrive_cluster(empty_mbar(stage_of(tile)), lane_);
      else mbar_arrive(empty_mbar(stage_of(tile)));
      b_.CreateBr(cont);
      b_.SetInsertPoint(cont);
    };
    release(b_.CreateICmpSGE(retired, k(0)), retired);
    close_k_loop(kl, acc, issued);
    if (release_last && lag_ > 0) release(b_.getTrue(), k(t_.kt - 1));
    return acc;
  }

  // `exit`: where the epilogue ends (nullptr: the kernel returns); `producer_joins`:
  // the warp-specialised producer's threads pass it too, storing nothing.
  Result<void> epilogue(const std::vector<llvm::Value*>& acc, llvm::BasicBlock* exit, bool producer_joins = true) {
    MmaEpilogueFrame f;
    f.b = &b_;
    f.fn = fn_;
    f.g = &g_;
    f.p = &p_;
    f.t = &t_;
    f.cg = &*cg_;
    f.in = in_;
    f.out = out_;
    f.it = it_;
    f.smem = smem_;
    f.m0 = m0_;
    f.n0 = n0_;
    f.wm0 = wm0_;
    f.wn0 = wn0_;
    f.lane = lane_;
    f.warp = warp_;
    f.zbase = zbase_;
    f.batch_coords = bi_.coords;
    // The producer warpgroup holds no accumulators but meets the epilogue's barriers.
    if (t_.ws && producer_joins) f.active = b_.CreateICmpULT(tid_, k(t_.threads));
    f.barrier = [this] { barrier(); };
    // Staged in chunks (MmaTiling::chunk_off): warp w's lanes meet on named barrier 4 + w.
    if (t_.chunk_off >= 0) f.warp_barrier = [this] { named_barrier(add(warp_, k(4)), 32, /*sync=*/true); };
    if (t_.tma_store) {
      f.out_maps.assign(tmap_.begin() + 2, tmap_.end());
      f.batch = bz_;
      f.tma_store = [this](llvm::Value* map, llvm::Value* src, const std::vector<llvm::Value*>& coords) {
        tma_store(map, src, coords);
      };
      f.bulk_commit = [this] { bulk_commit(); };
      f.bulk_wait = [this](int pending, bool read) { bulk_wait(pending, read); };
      f.store_fence = [this] { store_fence(); };
    }
    f.exit = exit;
    if (t_.split_ws) {
      f.ws = ws_;
      f.item = item_;
      f.tid = tid_;
      f.flag = smem_at(k(t_.flag_off));
      // The persistent warp-specialised consumers meet without the producer, whose
      // thread is issuing the next items' copies: named barrier 3 (ping-pong, which
      // takes 1 and 2, has no split-K).
      if (t_.ws && !producer_joins) f.split_barrier = [this] { named_barrier(k(3), t_.threads, /*sync=*/true); };
      else f.split_barrier = [this] { barrier(); };
      f.host = sim_;
    }
    return emit_mma_epilogue(f, acc);
  }

  const KernelSpec& spec_;
  const Graph& g_;
  const llvmb::Target& target_;
  std::vector<llvm::Value*> in_, out_;
  std::optional<ElementCodegen> cg_;
  llvm::Value* warp_ = nullptr;
  llvm::Value *m0_ = nullptr, *n0_ = nullptr, *zbase_ = nullptr;
  llvm::Value* wg_ = nullptr;
  std::vector<llvm::Value*> tmap_;  // TMA: A's and B's tensor maps, then the outputs' (TMA stores)
  llvm::Value* bz_ = nullptr;        // the batch index (grid y)
  llvm::Value* kbase_ = nullptr;     // split-K: the first K element of this block's share (grid z)
  llvm::Value* gk0_ = nullptr;       // the item's first K tile over the block's life (persistent grid)
  llvm::Value* grid_ = nullptr;      // persistent: the launch's blocks (gridDim.x)
  llvm::Value* rank_ = nullptr;      // clusters: the block's rank in its cluster (0 without)
  llvm::Value* walk_first_ = nullptr;  // persistent: the first item (the block's or cluster's index)
  llvm::Value* walk_grid_ = nullptr;   // persistent: items between two taken (blocks, or clusters)
  llvm::Value* ws_ = nullptr;        // split-K: the workspace (MmaTiling::split_ws)
  llvm::Value* item_ = nullptr;      // the work item: batch * tiles + tile, its counter's index
  BatchIndex bi_;
  std::vector<Copy> a_copy_, b_copy_;
};

}  // namespace

Result<LaunchShape> build_mma_kernel(const KernelSpec& spec, const MatmulGroup& p, const KernelConfig& c, int sm,
                                     bool wgmma_arch, const llvmb::Target& target, llvm::Module& m, bool sim) {
  Result<MmaTiling> t = mma_tiling(p, c, sm, wgmma_arch);
  if (!t) return t.error();
  const std::string no_chunks = mma_chunk_area(spec.group, p, *t, max_shared_bytes(sm));
  if (t->want_tma_store && !t->tma_store)
    return diag("tma_store = 1 cannot store this kernel's outputs: " + no_chunks);
  if (Result<void> g = check_matmul_grid(p, t->bm, t->bn); !g) return g.error();
  Result<void> built = MmaKernel(spec, p, *t, target, m, sim).build();
  if (!built) return built.error();
  LaunchShape l = matmul_launch_shape(p, t->bm, t->bn, t->launch_threads(), t->shared_bytes, t->split);
  if (t->cluster > 1) {  // blocks 2i and 2i + 1 take pair i
    l.grid[0] = t->grid_x();
    l.cluster = t->cluster;
  }
  if (t->persistent) {
    l.grid = {t->grid_x(), 1, t->split};
    l.persistent = true;
    l.cluster = t->cluster;
  }
  l.tensor_maps = t->maps;
  return l;
}

}  // namespace sf::matmul_detail
