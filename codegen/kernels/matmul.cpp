#include "codegen/kernels/matmul.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <numeric>
#include <optional>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/element.h"
#include "codegen/kernels/matmul_group.h"
#include "codegen/kernels/matmul_mma_epilogue.h"
#include "codegen/kernels/matmul_split_k.h"

namespace sf {

namespace {

using kernels::emit_loop;
using kernels::is_c_identifier;
using namespace matmul_detail;

// ---- NVPTX: the tiled kernel --------------------------------------------------------------------
// How a block's threads cover its tile, and where the tiles sit in shared memory.
struct Tiling {
  int bm = 0, bn = 0, bk = 0, threads = 0, stages = 0, group_m = 0;
  int tm = 0, tn = 0;  // the threads as a tm x tn grid over the tile
  int rm = 0, rn = 0;  // each thread's register tile: rm rows x rn columns, contiguous
  // Shared memory holds f32 tiles As[stage][k][m] and Bs[stage][k][n] (k-major, so a
  // thread's rm (rn) values for one k are adjacent: vector loads). Rows are padded by
  // 4 floats where the global loads walk k, whose stores would otherwise hit one bank.
  int lda = 0, ldb = 0;
  bool a_kfast = false, b_kfast = false;  // the global load order of each tile
  int va = 1, vb = 1;                      // widths of the shared vector loads
  int64_t stage_floats = 0;
  int64_t shared_bytes = 0;
  int64_t kt = 0;  // K tiles one block walks (all of them unless split-K)
  int split = 1;   // split-K: blocks (grid z) that each sum kt of the K tiles
  // Split-K of anything but a bare f32 matmul: the partial sums meet in the workspace
  // (matmul_split_k.h); `flag_off` is the shared word that marks the last block.
  bool split_ws = false;
  int64_t flag_off = 0;
  // Copies by cp.async (PTX ISA 7.0, sm_80+) straight into shared memory, no
  // registers on the way: f32 only, where shared memory holds the storage type.
  bool async = false;
};

Result<Tiling> make_tiling(const KernelConfig& c, const MatmulGroup& p, int sm) {
  auto bad = [](const std::string& s) -> Result<Tiling> { return diag(s); };
  auto num = [](int64_t v) { return std::to_string(v); };
  if (std::optional<std::string> why = split_k_unfit(p, c)) return bad(*why);
  if (!pow2(c.block_m) || c.block_m > 256) return bad("block_m = " + num(c.block_m) + " is not a power of two in 1..256");
  if (!pow2(c.block_n) || c.block_n > 256) return bad("block_n = " + num(c.block_n) + " is not a power of two in 1..256");
  if (!pow2(c.block_k) || c.block_k > 128) return bad("block_k = " + num(c.block_k) + " is not a power of two in 1..128");
  if (!pow2(c.warps) || c.warps > 32)
    return bad("warps = " + num(c.warps) + " is not a power of two in 1..32 (at most 1024 threads)");
  if (c.stages < 1 || c.stages > 8) return bad("stages = " + num(c.stages) + " is outside 1..8");
  if (c.group_m < 1) return bad("group_m = " + num(c.group_m) + " must be positive");
  Tiling t;
  t.bm = c.block_m;
  t.bn = c.block_n;
  t.bk = c.block_k;
  t.threads = c.warps * 32;
  t.stages = c.stages;
  t.group_m = c.group_m;
  // The threads as a tm x tn grid (both powers of two dividing the tile's sides),
  // choosing the squarest register tile: rm + rn shared loads feed rm * rn FMAs.
  for (int tn = 1; tn <= t.threads; tn *= 2) {
    int tm = t.threads / tn;
    if (tn > t.bn || tm > t.bm) continue;
    int rm = t.bm / tm, rn = t.bn / tn;
    if (t.tm == 0 || rm + rn < t.rm + t.rn || (rm + rn == t.rm + t.rn && rn > t.rn)) {
      t.tm = tm;
      t.tn = tn;
      t.rm = rm;
      t.rn = rn;
    }
  }
  if (t.tm == 0)
    return bad("a " + num(t.bm) + "x" + num(t.bn) + " tile has fewer elements than warps * 32 = " + num(t.threads) +
               " threads (each thread needs at least one)");
  // A thread has at most 255 registers; 128 accumulators plus the A/B fragments,
  // the prefetched tile and the addresses are already about all of them.
  if (t.rm * t.rn > 128)
    return bad("each thread would hold " + num(t.rm * t.rn) + " accumulators (" + num(t.bm) + "x" + num(t.bn) + " / " +
               num(t.threads) + " threads); at most 128 fit in registers");
  // Coalesced global loads: consecutive threads walk the operand's unit-stride dim.
  t.a_kfast = !(p.sam == 1 && p.sak != 1);
  t.b_kfast = p.sbk == 1 && p.sbn != 1;
  t.lda = t.bm + (t.a_kfast ? 4 : 0);
  t.ldb = t.bn + (t.b_kfast ? 4 : 0);
  t.stage_floats = int64_t{t.bk} * (t.lda + t.ldb);
  t.shared_bytes = t.stage_floats * t.stages * 4;
  t.split_ws = c.split_k > 1 && split_k_uses_workspace(p);
  if (t.split_ws) {
    t.flag_off = t.shared_bytes;  // a multiple of 4
    t.shared_bytes += 16;
  }
  auto gcd4 = [](std::initializer_list<int64_t> v) {
    int64_t g = 4;
    for (int64_t x : v) g = std::gcd(g, x);
    return static_cast<int>(g);
  };
  t.va = gcd4({t.rm, t.lda, t.stage_floats});
  t.vb = gcd4({t.rn, t.ldb, t.stage_floats, int64_t{t.bk} * t.lda});
  if (sm > 0 && t.shared_bytes > max_shared_bytes(sm))
    return bad("the tiles need " + num(t.shared_bytes) + " bytes of shared memory (" + num(t.stages) + " stages of " +
               num(t.bm) + "x" + num(t.bk) + " and " + num(t.bk) + "x" + num(t.bn) + " f32), more than sm_" + num(sm) +
               "'s " + num(max_shared_bytes(sm)) + " per block");
  t.split = c.split_k;
  t.kt = ceil_div(p.K, t.bk) / t.split;
  t.async = sm >= 80 && t.stages >= 2 && p.dtype == DType::F32;
  return t;
}

LaunchShape matmul_launch(const MatmulGroup& p, const Tiling& t) {
  return matmul_launch_shape(p, t.bm, t.bn, t.threads, t.shared_bytes, t.split);
}

Result<void> check_grid(const MatmulGroup& p, const Tiling& t) { return check_matmul_grid(p, t.bm, t.bn); }

// Whether every index the kernel forms fits i32 (half the registers and cheaper
// arithmetic than i64): the operands' offsets over tiles padded past M, N and one K
// tile past K (the last prefetch), and every tensor's size.
bool fits_i32(const Graph& g, const MatmulGroup& p, const Tiling& t) {
  const int64_t lim = int64_t{1} << 31;
  int64_t mp = ceil_div(p.M, t.bm) * t.bm + t.bm, np = ceil_div(p.N, t.bn) * t.bn + t.bn, kp = (t.kt * t.split + 1) * t.bk;
  auto span = [&](const std::vector<int64_t>& bs, int64_t r, int64_t sr, int64_t c, int64_t sc) {
    int64_t s = (r - 1) * sr + (c - 1) * sc + 1;
    for (size_t e = 0; e < bs.size(); ++e) s += (p.batch[e] - 1) * bs[e];
    return s;
  };
  int64_t worst = std::max({span(p.a_bstride, mp, p.sam, kp, p.sak), span(p.b_bstride, kp, p.sbk, np, p.sbn),
                            p.nbatch * mp * np, mp + t.bm + t.threads, np + t.bn + t.threads, kp + t.bk + t.threads,
                            t.stage_floats * t.stages});
  for (const Node& n : g.nodes()) worst = std::max(worst, numel(n.type.shape));
  return worst < lim / 2;
}

class TiledKernel {
 public:
  // `sim`: the same kernel as a host function running one thread of one block (see
  // emit_matmul_block_on_host); `target` is then the host.
  TiledKernel(const KernelSpec& spec, const MatmulGroup& plan, const Tiling& t, const llvmb::Target& target, llvm::Module& m,
              bool sim, bool wide = false)
      : spec_(spec), g_(spec.group), p_(plan), t_(t), target_(target), m_(m), b_(m.getContext()), sim_(sim),
        wide_(wide) {}

  Result<void> build() {
    const size_t np = g_.params().size(), no = g_.outputs().size();
    it_ = !wide_ && fits_i32(g_, p_, t_) ? b_.getInt32Ty() : b_.getInt64Ty();
    f32_ = b_.getFloatTy();
    llvm::Value *bx = nullptr, *by = nullptr, *bz = nullptr;
    if (!sim_) {
      NvptxEntry e = begin_nvptx_matmul(m_, b_, spec_, t_.threads, 16, t_.split_ws ? 1 : 0);
      fn_ = e.fn;
      in_ = e.in;
      out_ = e.out;
      if (t_.split_ws) ws_ = e.extra[0];
      smem_ = e.smem;
      tid_ = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, it_);
      bx = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, it_);
      by = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y, it_);
      if (t_.split > 1) bz = nvptx_sreg(b_, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z, it_);
    } else {
      llvm::Type* i32 = b_.getInt32Ty();
      llvm::Type* ptr = b_.getPtrTy();
      // void entry(ptr args, i32 blockIdx.x, i32 blockIdx.y, i32 threadIdx.x, ptr smem,
      //            ptr barrier, ptr barrier_ctx, i32 blockIdx.z); args: inputs, outputs,
      // then (split-K in a workspace) the workspace.
      kernels::KernelEntry e = kernels::begin_host_kernel(m_, b_, spec_.entry, np, no, {i32, i32, i32, ptr, ptr, ptr, i32},
                                                          t_.split_ws ? 1 : 0);
      fn_ = e.fn;
      in_ = e.in;
      out_ = e.out;
      if (t_.split_ws) ws_ = e.extra[0];
      bx = b_.CreateZExt(fn_->getArg(1), it_);
      by = b_.CreateZExt(fn_->getArg(2), it_);
      tid_ = b_.CreateZExt(fn_->getArg(3), it_);
      smem_ = fn_->getArg(4);
      if (t_.split > 1) bz = b_.CreateZExt(fn_->getArg(7), it_);
    }
    fn_->setDoesNotThrow();
    cg_.emplace(b_, m_, target_, spec_.precision);
    if (numel(p_.out) == 0) {  // nothing to compute; the launch still has one block
      b_.CreateRetVoid();
      return {};
    }

    TileOrigin o = group_m_tile(b_, p_, bx, t_.bm, t_.bn, t_.group_m);
    m0_ = o.m0;
    n0_ = o.n0;
    bi_ = batch_index(b_, p_, by);
    zbase_ = b_.CreateMul(by, k(p_.M * p_.N), "zbase", true, true);
    // The workspace counter's index: the batch's tiles (grid x) before it, then this one.
    item_ = b_.CreateAdd(b_.CreateMul(by, k(ceil_div(p_.M, t_.bm) * ceil_div(p_.N, t_.bn)), "", true, true), bx, "item",
                         true, true);
    llvm::Value* tm = b_.CreateUDiv(tid_, k(t_.tn), "tm");
    llvm::Value* tn = b_.CreateURem(tid_, k(t_.tn), "tn");
    a_read_ = b_.CreateMul(tm, k(t_.rm), "", true, true);
    b_read_ = b_.CreateAdd(k(int64_t{t_.bk} * t_.lda), b_.CreateMul(tn, k(t_.rn), "", true, true), "", true, true);
    row0_ = b_.CreateAdd(m0_, a_read_, "row0", true, true);
    col0_ = b_.CreateAdd(n0_, b_.CreateMul(tn, k(t_.rn), "", true, true), "col0", true, true);
    plan_loads();
    // Split-K: this block sums K tiles [bz * kt, (bz + 1) * kt).
    if (bz) kbase_ = b_.CreateMul(bz, k(t_.kt * t_.bk), "kbase", true, true);

    std::vector<llvm::Value*> acc(static_cast<size_t>(t_.rm * t_.rn), llvm::ConstantFP::get(f32_, 0.0));
    if (t_.kt > 0) acc = k_loop();
    return epilogue(acc);
  }

 private:
  llvm::Value* k(int64_t v) { return llvm::ConstantInt::get(it_, static_cast<uint64_t>(v)); }

  // One element a thread copies from global to shared memory per K tile: loop
  // invariants found once.
  struct Copy {
    llvm::Value* kk = nullptr;     // k within the tile
    llvm::Value* base = nullptr;   // the element offset with k = 0
    llvm::Value* ok = nullptr;     // row/column in bounds (and the thread has this slot)
    llvm::Value* slot = nullptr;   // the shared offset within a stage
    llvm::Value* valid = nullptr;  // the thread has this slot at all (nullptr: always)
  };

  // The elements thread tid copies of a rows x bk (A) or bk x cols (B) tile: slots
  // e = tid + l * threads, e walking the operand's unit-stride dim first.
  void plan_loads() {
    auto plan = [&](bool is_a) {
      const int64_t other = is_a ? t_.bm : t_.bn;  // the tile's M (or N) side
      const int64_t total = other * t_.bk;
      const bool kfast = is_a ? t_.a_kfast : t_.b_kfast;
      const int64_t ld = is_a ? t_.lda : t_.ldb;
      std::vector<Copy> out;
      for (int64_t l = 0; l * t_.threads < total; ++l) {
        Copy cp;
        llvm::Value* e = b_.CreateAdd(tid_, k(l * t_.threads), "", true, true);
        if ((l + 1) * t_.threads > total) cp.valid = b_.CreateICmpULT(e, k(total));
        llvm::Value* kk = kfast ? b_.CreateURem(e, k(t_.bk)) : b_.CreateUDiv(e, k(other));
        llvm::Value* mn = kfast ? b_.CreateUDiv(e, k(t_.bk)) : b_.CreateURem(e, k(other));
        cp.kk = kk;
        llvm::Value* g = b_.CreateAdd(is_a ? m0_ : n0_, mn, "", true, true);
        cp.ok = b_.CreateICmpSLT(g, k(is_a ? p_.M : p_.N));
        if (cp.valid) cp.ok = b_.CreateAnd(cp.ok, cp.valid);
        cp.base = b_.CreateAdd(is_a ? bi_.a_off : bi_.b_off, b_.CreateMul(g, k(is_a ? p_.sam : p_.sbn), "", true, true), "",
                               true, true);
        cp.slot = b_.CreateAdd(b_.CreateMul(kk, k(ld), "", true, true), mn, "", true, true);
        if (!is_a) cp.slot = b_.CreateAdd(cp.slot, k(int64_t{t_.bk} * t_.lda), "", true, true);
        out.push_back(cp);
      }
      return out;
    };
    a_copy_ = plan(true);
    b_copy_ = plan(false);
  }

  // The f32 values of the thread's slots of the K tile starting at k0, 0 outside the
  // operands (so the edge tiles need no other checks: 0 * 0 adds nothing). An
  // address outside is clamped to element 0, which exists whenever a tile does.
  std::vector<llvm::Value*> load_tile(llvm::Value* k0) {
    if (kbase_) k0 = b_.CreateAdd(k0, kbase_, "", true, true);
    std::vector<llvm::Value*> vals;
    for (int which = 0; which < 2; ++which) {
      const MatmulOperand& op = which == 0 ? p_.a : p_.b;
      const int64_t sk = which == 0 ? p_.sak : p_.sbk;
      for (const Copy& cp : which == 0 ? a_copy_ : b_copy_) {
        llvm::Value* kidx = b_.CreateAdd(k0, cp.kk, "", true, true);
        llvm::Value* ok = b_.CreateAnd(cp.ok, b_.CreateICmpSLT(kidx, k(p_.K)));
        llvm::Value* idx = b_.CreateAdd(cp.base, b_.CreateMul(kidx, k(sk), "", true, true), "", true, true);
        idx = b_.CreateSelect(ok, idx, k(0));
        Elem v = cg_->load(op.dtype, in_[static_cast<size_t>(op.param)], idx);
        vals.push_back(b_.CreateSelect(ok, v.value, llvm::ConstantFP::get(f32_, 0.0)));
      }
    }
    return vals;
  }

  llvm::Value* smem_ptr(llvm::Value* off) { return b_.CreateInBoundsGEP(f32_, smem_, off); }

  void store_tile(const std::vector<llvm::Value*>& vals, llvm::Value* stage) {
    llvm::Value* base = b_.CreateMul(stage, k(t_.stage_floats), "", true, true);
    size_t i = 0;
    for (const std::vector<Copy>* copies : {&a_copy_, &b_copy_}) {
      for (const Copy& cp : *copies) {
        llvm::Value* v = vals[i++];
        llvm::BasicBlock* cont = nullptr;
        if (cp.valid) {  // a slot past the tile: this thread has none
          llvm::BasicBlock* st = llvm::BasicBlock::Create(b_.getContext(), "st", fn_);
          cont = llvm::BasicBlock::Create(b_.getContext(), "st.done", fn_);
          b_.CreateCondBr(cp.valid, st, cont);
          b_.SetInsertPoint(st);
        }
        b_.CreateAlignedStore(v, smem_ptr(b_.CreateAdd(base, cp.slot, "", true, true)), llvm::Align(4));
        if (cont) {
          b_.CreateBr(cont);
          b_.SetInsertPoint(cont);
        }
      }
    }
  }

  // The thread's slots of the K tile starting at k0 copied into `stage` by cp.async
  // (4 bytes each, zero-filled outside the operands by a source size of 0, from a
  // clamped address). Simulated on the host by a plain copy: it completes before the
  // wait, which is one of the orders cp.async allows.
  void issue_tile(llvm::Value* k0, llvm::Value* stage) {
    if (sim_) {
      store_tile(load_tile(k0), stage);  // load_tile adds kbase_
      return;
    }
    if (kbase_) k0 = b_.CreateAdd(k0, kbase_, "", true, true);
    llvm::Value* base = b_.CreateMul(stage, k(t_.stage_floats), "", true, true);
    for (int which = 0; which < 2; ++which) {
      const MatmulOperand& op = which == 0 ? p_.a : p_.b;
      const int64_t sk = which == 0 ? p_.sak : p_.sbk;
      for (const Copy& cp : which == 0 ? a_copy_ : b_copy_) {
        llvm::BasicBlock* cont = nullptr;
        if (cp.valid) {
          llvm::BasicBlock* st = llvm::BasicBlock::Create(b_.getContext(), "cp", fn_);
          cont = llvm::BasicBlock::Create(b_.getContext(), "cp.done", fn_);
          b_.CreateCondBr(cp.valid, st, cont);
          b_.SetInsertPoint(st);
        }
        llvm::Value* kidx = b_.CreateAdd(k0, cp.kk, "", true, true);
        llvm::Value* ok = b_.CreateAnd(cp.ok, b_.CreateICmpSLT(kidx, k(p_.K)));
        llvm::Value* idx = b_.CreateAdd(cp.base, b_.CreateMul(kidx, k(sk), "", true, true), "", true, true);
        llvm::Value* src = b_.CreateInBoundsGEP(f32_, in_[static_cast<size_t>(op.param)], b_.CreateSelect(ok, idx, k(0)));
        llvm::Value* dst = smem_ptr(b_.CreateAdd(base, cp.slot, "", true, true));
        llvm::Value* bytes = b_.CreateSelect(ok, b_.getInt32(4), b_.getInt32(0));
        b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_ca_shared_global_4_s, {}, {dst, src, bytes});
        if (cont) {
          b_.CreateBr(cont);
          b_.SetInsertPoint(cont);
        }
      }
    }
  }

  void commit() {
    if (!sim_) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {}, {});
  }
  void wait(int pending) {
    if (!sim_) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {}, {b_.getInt32(static_cast<uint32_t>(pending))});
  }

  void barrier() {
    if (!sim_) {
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});  // bar.sync 0
      return;
    }
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy()}, false);
    b_.CreateCall(fty, fn_->getArg(5), {fn_->getArg(6)});
  }

  // acc[r][c] += A[r][kk] * B[kk][c] for the bk values of one stage, from shared memory.
  std::vector<llvm::Value*> compute(llvm::Value* stage, std::vector<llvm::Value*> acc) {
    llvm::Value* base = b_.CreateMul(stage, k(t_.stage_floats), "", true, true);
    llvm::Value* a0 = b_.CreateAdd(base, a_read_, "", true, true);
    llvm::Value* b0 = b_.CreateAdd(base, b_read_, "", true, true);
    auto read = [&](llvm::Value* start, int n, int v) {
      std::vector<llvm::Value*> out;
      for (int i = 0; i < n; i += v) {
        llvm::Value* p = smem_ptr(b_.CreateAdd(start, k(i), "", true, true));
        if (v == 1) {
          out.push_back(b_.CreateAlignedLoad(f32_, p, llvm::Align(4)));
          continue;
        }
        llvm::Value* vec = b_.CreateAlignedLoad(llvm::FixedVectorType::get(f32_, static_cast<unsigned>(v)), p,
                                                llvm::Align(static_cast<uint64_t>(v) * 4));
        for (int l = 0; l < v; ++l) out.push_back(b_.CreateExtractElement(vec, static_cast<uint64_t>(l)));
      }
      return out;
    };
    for (int kk = 0; kk < t_.bk; ++kk) {
      std::vector<llvm::Value*> a = read(b_.CreateAdd(a0, k(int64_t{kk} * t_.lda), "", true, true), t_.rm, t_.va);
      std::vector<llvm::Value*> bv = read(b_.CreateAdd(b0, k(int64_t{kk} * t_.ldb), "", true, true), t_.rn, t_.vb);
      for (int r = 0; r < t_.rm; ++r)
        for (int c = 0; c < t_.rn; ++c) {
          size_t i = static_cast<size_t>(r * t_.rn + c);
          acc[i] = b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {f32_}, {a[static_cast<size_t>(r)], bv[static_cast<size_t>(c)], acc[i]});
        }
    }
    return acc;
  }

  // The K loop, one barrier per tile where stages >= 2.
  //  - async (cp.async): stages-1 tiles in flight; each iteration waits for tile kt,
  //    syncs, issues tile kt+stages-1 into the stage tile kt-1 used, computes tile kt.
  //  - stages >= 2 otherwise: the loads of tile kt+1 are issued before tile kt is
  //    computed and stored to the next stage after it (register-staged double
  //    buffering): stage (kt+1) % stages was last read in iteration kt+1-stages <=
  //    kt-1, which every thread has left.
  //  - stages == 1: load, barrier, compute, barrier.
  std::vector<llvm::Value*> k_loop() {
    llvm::LLVMContext& c = m_.getContext();
    const bool prefetch = t_.stages >= 2;
    const size_t nacc = static_cast<size_t>(t_.rm * t_.rn);
    auto stage_of = [&](llvm::Value* kt) {
      return pow2(t_.stages) ? b_.CreateAnd(kt, k(t_.stages - 1)) : b_.CreateURem(kt, k(t_.stages));
    };
    if (t_.async) {
      // stages-1 tiles in flight before the loop, one commit group each.
      for (int st = 0; st + 1 < t_.stages; ++st) {
        if (st < t_.kt) issue_tile(k(int64_t{st} * t_.bk), k(st));
        commit();
      }
    } else if (prefetch) {
      store_tile(load_tile(k(0)), k(0));
      barrier();
    }
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    llvm::BasicBlock* loop = llvm::BasicBlock::Create(c, "k.loop", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "k.done", fn_);
    b_.CreateBr(loop);
    b_.SetInsertPoint(loop);
    llvm::PHINode* kt = b_.CreatePHI(it_, 2, "kt");
    kt->addIncoming(k(0), pre);
    std::vector<llvm::PHINode*> phis;
    std::vector<llvm::Value*> acc;
    for (size_t i = 0; i < nacc; ++i) {
      llvm::PHINode* ph = b_.CreatePHI(f32_, 2, "acc");
      ph->addIncoming(llvm::ConstantFP::get(f32_, 0.0), pre);
      phis.push_back(ph);
      acc.push_back(ph);
    }
    llvm::Value* next = b_.CreateAdd(kt, k(1), "kt.next", true, true);
    if (t_.async) {
      // Tile kt landed (at most stages-2 younger groups pending) and every thread is
      // past computing kt-1, whose stage the copy of tile kt+stages-1 overwrites.
      wait(t_.stages - 2);
      barrier();
      llvm::Value* ahead = b_.CreateAdd(kt, k(t_.stages - 1), "", true, true);
      llvm::BasicBlock* issue = llvm::BasicBlock::Create(c, "k.issue", fn_);
      llvm::BasicBlock* issued = llvm::BasicBlock::Create(c, "k.issued", fn_);
      b_.CreateCondBr(b_.CreateICmpSLT(ahead, k(t_.kt)), issue, issued);
      b_.SetInsertPoint(issue);
      issue_tile(b_.CreateMul(ahead, k(t_.bk), "", true, true), stage_of(ahead));
      b_.CreateBr(issued);
      b_.SetInsertPoint(issued);
      commit();  // an empty group past the last tile keeps the count uniform
      acc = compute(stage_of(kt), acc);
    } else if (prefetch) {
      // On the last iteration this loads tile kt (all masked to 0): straight-line code
      // is worth more than the few wasted loads of element 0.
      std::vector<llvm::Value*> vals = t_.kt > 1 ? load_tile(b_.CreateMul(next, k(t_.bk), "", true, true))
                                                 : std::vector<llvm::Value*>{};
      acc = compute(stage_of(kt), acc);
      if (t_.kt > 1) {
        store_tile(vals, stage_of(next));
        barrier();
      }
    } else {
      store_tile(load_tile(b_.CreateMul(kt, k(t_.bk), "", true, true)), k(0));
      barrier();
      acc = compute(k(0), acc);
      barrier();
    }
    for (size_t i = 0; i < nacc; ++i) phis[i]->addIncoming(acc[i], b_.GetInsertBlock());
    kt->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, k(t_.kt)), loop, done);
    b_.SetInsertPoint(done);
    return acc;
  }

  // Each accumulator element's coordinates in O, flat index and bounds.
  struct AccElem {
    llvm::Value *row = nullptr, *col = nullptr, *ok = nullptr, *flat = nullptr;
  };
  void each_element(const std::function<void(size_t, const AccElem&)>& fn) {
    for (int r = 0; r < t_.rm; ++r) {
      llvm::Value* row = b_.CreateAdd(row0_, k(r), "row", true, true);
      llvm::Value* row_ok = b_.CreateICmpSLT(row, k(p_.M));
      llvm::Value* row_off = b_.CreateAdd(zbase_, b_.CreateMul(row, k(p_.N), "", true, true), "", true, true);
      for (int cc = 0; cc < t_.rn; ++cc) {
        AccElem e;
        e.row = row;
        e.col = b_.CreateAdd(col0_, k(cc), "col", true, true);
        e.ok = b_.CreateAnd(row_ok, b_.CreateICmpSLT(e.col, k(p_.N)));
        e.flat = b_.CreateAdd(row_off, e.col, "", true, true);
        fn(static_cast<size_t>(r * t_.rn + cc), e);
      }
    }
  }

  // Split-K in the workspace (matmul_split_k.h): the block's partial sums added, the
  // block counted in; the last block goes on with the totals, the others return.
  std::vector<llvm::Value*> arrive(const std::vector<llvm::Value*>& acc) {
    SplitKWorkspace w;
    w.b = &b_;
    w.fn = fn_;
    w.ws = ws_;
    w.sums = std::max<int64_t>(p_.nbatch, 1) * p_.M * p_.N;
    w.item = item_;
    w.tid = tid_;
    w.flag = b_.CreateInBoundsGEP(b_.getInt8Ty(), smem_, k(t_.flag_off));
    w.split = t_.split;
    w.host = sim_;
    w.barrier = [this] { barrier(); };
    w.leave = [this] { b_.CreateRetVoid(); };
    each_element([&](size_t i, const AccElem& e) { w.add(e.ok, e.flat, acc[i]); });
    w.arrive();
    std::vector<llvm::Value*> total(acc.size());
    each_element([&](size_t i, const AccElem& e) { total[i] = w.take(e.ok, e.flat); });
    return total;
  }

  // Each accumulator in bounds: the matmul's value rounded to its dtype, the epilogue,
  // the stores.
  Result<void> epilogue(const std::vector<llvm::Value*>& acc_in) {
    MatmulEpilogue epi(g_, p_, *cg_, in_);
    const std::vector<llvm::Value*> acc = t_.split_ws ? arrive(acc_in) : acc_in;
    std::vector<llvm::Value*> coords = bi_.coords;
    coords.push_back(nullptr);
    coords.push_back(nullptr);
    Result<void> status;
    each_element([&](size_t i, const AccElem& e) {
      if (!status) return;
      if (t_.split > 1 && !t_.split_ws) {
        // A bare f32 matmul's partial sum: added into the output, which the launch
        // zeroed (LaunchShape::zero_outputs).
        add_f32_atomic(b_, fn_, e.ok, out_[0], e.flat, acc[i]);
        return;
      }
      coords[coords.size() - 2] = e.row;
      coords.back() = e.col;
      status = epi.store_element(fn_, e.ok, coords, e.flat, acc[i], out_);
    });
    if (!status) return status.error();
    b_.CreateRetVoid();
    return {};
  }

  const KernelSpec& spec_;
  const Graph& g_;
  const MatmulGroup& p_;
  const Tiling& t_;
  const llvmb::Target& target_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  bool sim_ = false;
  bool wide_ = false;  // i64 indices even where i32 would do
  llvm::Function* fn_ = nullptr;
  std::vector<llvm::Value*> in_, out_;
  std::optional<ElementCodegen> cg_;
  llvm::Type* it_ = nullptr;
  llvm::Type* f32_ = nullptr;
  llvm::Value* smem_ = nullptr;
  llvm::Value* kbase_ = nullptr;  // split-K: the first K element of this block's share
  llvm::Value* ws_ = nullptr;     // split-K: the workspace (Tiling::split_ws)
  llvm::Value* item_ = nullptr;   // the work item: batch * tiles + tile, its counter's index
  llvm::Value *tid_ = nullptr, *m0_ = nullptr, *n0_ = nullptr, *zbase_ = nullptr;
  llvm::Value *a_read_ = nullptr, *b_read_ = nullptr, *row0_ = nullptr, *col0_ = nullptr;
  BatchIndex bi_;
  std::vector<Copy> a_copy_, b_copy_;
};

// ---- host ------------------------------------------------------------------------------------------

// Columns per accumulator row on the host when host_tile_n is 0: 64 f32 (256 bytes)
// stay in L1 with the row of B they meet, and the j loop over them is what LLVM
// vectorises.
constexpr int64_t kHostBlockN = 64;

// `void entry(ptr args)`: for each batch, row and block of TN columns (TN =
// host_tile_n, or kHostBlockN when 0), acc[j] += A[i][k] * B[k][j] with k outside j
// (unit-stride B rows vectorise), then the epilogue per element. The j loop carries
// host_vector / host_interleave as vectoriser hints (element.h LoopHints); each acc[j]
// is its own accumulator, so no hint reorders a sum. f32 accumulators for float
// dtypes; integers accumulate in i64 with wrap-around, as the reference (and torch) do.
Result<void> build_host(const KernelSpec& spec, const MatmulGroup& p, const KernelConfig& cfg, const llvmb::Target& target,
                        llvm::Module& m) {
  llvm::LLVMContext& c = m.getContext();
  const Graph& g = spec.group;
  llvm::IRBuilder<> b(c);
  const size_t np = g.params().size(), no = g.outputs().size();
  kernels::KernelEntry ke = kernels::begin_kernel(m, b, spec.entry, np, no, target);
  std::vector<llvm::Value*> in = ke.in, out = ke.out;
  const bool fl = is_float(p.dtype);
  llvm::Type* acc_ty = fl ? b.getFloatTy() : b.getInt64Ty();
  const int64_t TN = cfg.host_tile_n > 0 ? cfg.host_tile_n : kHostBlockN;
  llvm::Value* accbuf = b.CreateAlloca(llvm::ArrayType::get(acc_ty, static_cast<uint64_t>(TN)), nullptr, "acc");
  ElementCodegen cg(b, m, target, spec.precision);
  MatmulEpilogue epi(g, p, cg, in);
  auto k = [&](int64_t v) { return b.getInt64(static_cast<uint64_t>(v)); };
  auto mul = [&](llvm::Value* x, int64_t s) -> llvm::Value* {
    return s == 1 ? x : b.CreateMul(x, k(s), "", true, true);
  };
  auto add = [&](llvm::Value* x, llvm::Value* y) { return b.CreateAdd(x, y, "", true, true); };
  auto widen = [&](Elem e) -> llvm::Value* { return fl ? e.value : b.CreateSExt(e.value, b.getInt64Ty()); };
  auto slot = [&](llvm::Value* jj) { return b.CreateInBoundsGEP(acc_ty, accbuf, jj); };
  const llvm::Align acc_align(fl ? 4 : 8);
  llvm::Value* zero = fl ? static_cast<llvm::Value*>(llvm::ConstantFP::get(acc_ty, 0.0)) : k(0);

  Result<void> r = emit_loop(b, k(0), k(p.nbatch), k(1), "z", [&](llvm::Value* z) -> Result<void> {
    BatchIndex bi = batch_index(b, p, z);
    llvm::Value* zbase = mul(z, p.M * p.N);
    return emit_loop(b, k(0), k(p.M), k(1), "i", [&](llvm::Value* i) -> Result<void> {
      llvm::Value* arow = add(bi.a_off, mul(i, p.sam));
      llvm::Value* orow = add(zbase, mul(i, p.N));
      return emit_loop(b, k(0), k(p.N), k(TN), "j0", [&](llvm::Value* j0) -> Result<void> {
        llvm::Value* jn = b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b.CreateSub(k(p.N), j0), k(TN));
        Result<void> r1 = emit_loop(b, k(0), jn, k(1), "clr", [&](llvm::Value* jj) -> Result<void> {
          b.CreateAlignedStore(zero, slot(jj), acc_align);
          return {};
        });
        if (!r1) return r1;
        llvm::Value* bcol = add(bi.b_off, mul(j0, p.sbn));
        r1 = emit_loop(b, k(0), k(p.K), k(1), "k", [&](llvm::Value* kk) -> Result<void> {
          llvm::Value* a = widen(cg.load(p.a.dtype, in[static_cast<size_t>(p.a.param)], add(arow, mul(kk, p.sak))));
          llvm::Value* brow = add(bcol, mul(kk, p.sbk));
          return emit_loop(b, k(0), jn, k(1), "j", [&](llvm::Value* jj) -> Result<void> {
            llvm::Value* bv = widen(cg.load(p.b.dtype, in[static_cast<size_t>(p.b.param)], add(brow, mul(jj, p.sbn))));
            llvm::Value* s = slot(jj);
            llvm::Value* old = b.CreateAlignedLoad(acc_ty, s, acc_align);
            llvm::Value* nv = fl ? b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {acc_ty}, {a, bv, old})
                                 : b.CreateAdd(old, b.CreateMul(a, bv));  // wraps, as the reference's int64
            b.CreateAlignedStore(nv, s, acc_align);
            return {};
          }, kernels::host_loop_hints(cfg));
        });
        if (!r1) return r1;
        return emit_loop(b, k(0), jn, k(1), "epi", [&](llvm::Value* jj) -> Result<void> {
          llvm::Value* col = add(j0, jj);
          llvm::Value* v = b.CreateAlignedLoad(acc_ty, slot(jj), acc_align);
          Elem mm = fl ? Elem{cg.node_result(p.dtype, v), p.dtype}
                       : Elem{b.CreateTrunc(v, kernels::compute_type(c, p.dtype)), p.dtype};
          std::vector<llvm::Value*> coords = bi.coords;
          coords.push_back(i);
          coords.push_back(col);
          llvm::Value* flat = add(orow, col);
          Result<std::vector<Elem>> outs = epi.outputs(coords, flat, mm);
          if (!outs) return outs.error();
          for (size_t o = 0; o < no; ++o) cg.store((*outs)[o], out[o], flat);
          return {};
        });
      });
    });
  });
  if (!r) return r;
  b.CreateRetVoid();
  return {};
}

class MatmulEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_matmul(spec, config, target);
  }
};

}  // namespace

Result<EmittedKernel> emit_matmul(const KernelSpec& unfolded, const KernelConfig& config, const llvmb::Target& target) {
  const KernelSpec spec = fold_batch_into_rows(unfolded);
  Result<MatmulGroup> plan = analyse_matmul(spec);
  if (!plan) return plan.error();
  const bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  EmittedKernel k;
  if (gpu) {
    std::optional<int> sm = kernels::sm_version(target.arch);
    if (!sm) return diag("unknown NVPTX arch '" + target.arch + "' (expected sm_NN or sm_NNa)");
    if (!is_float(plan->dtype))
      return diag(std::string(dtype_name(plan->dtype)) +
                  " matmul is not supported on NVPTX (it would need i64 accumulators; the host kernel has them)");
    if (!mma_unsupported(*plan, config, *sm, has_wgmma(target.arch))) {
      k = new_matmul_kernel(spec, target);
      Result<LaunchShape> l =
          build_mma_kernel(spec, *plan, config, *sm, has_wgmma(target.arch), target, *k.module, /*sim=*/false);
      if (!l) return l.error();
      k.launch = *l;
    } else {
      Result<Tiling> t = make_tiling(config, *plan, *sm);
      if (!t) return t.error();
      if (Result<void> g = check_grid(*plan, *t); !g) return g.error();
      k = new_matmul_kernel(spec, target);
      Result<void> built = TiledKernel(spec, *plan, *t, target, *k.module, /*sim=*/false).build();
      if (!built) return built.error();
      k.launch = matmul_launch(*plan, *t);
    }
  } else {
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return diag(*e);
    k = new_matmul_kernel(spec, target);
    Result<void> built = build_host(spec, *plan, config, target, *k.module);
    if (!built) return built.error();
  }
  if (auto err = llvmb::verify(*k.module))  // an emitter bug, not a user error: say so
    return diag("internal: the emitted module does not verify: " + *err);
  return k;
}

Result<EmittedKernel> emit_matmul_block_on_host(const KernelSpec& unfolded, const KernelConfig& config, bool wide_index) {
  const KernelSpec spec = fold_batch_into_rows(unfolded);
  Result<MatmulGroup> plan = analyse_matmul(spec);
  if (!plan) return plan.error();
  if (!is_float(plan->dtype)) return diag(std::string(dtype_name(plan->dtype)) + " matmul has no tiled kernel");
  // Checked as for sm_90a: the same limits apply to the kernel being simulated.
  Result<Tiling> t = make_tiling(config, *plan, 90);
  if (!t) return t.error();
  if (Result<void> g = check_grid(*plan, *t); !g) return g.error();
  const llvmb::Target host = llvmb::Target::host();
  EmittedKernel k = new_matmul_kernel(spec, host);
  Result<void> built = TiledKernel(spec, *plan, *t, host, *k.module, /*sim=*/true, wide_index).build();
  if (!built) return built.error();
  if (auto err = llvmb::verify(*k.module)) return diag("internal: the emitted module does not verify: " + *err);
  k.launch = matmul_launch(*plan, *t);
  return k;
}

Result<EmittedKernel> emit_matmul_mma_block_on_host(const KernelSpec& unfolded, const KernelConfig& config, bool wgmma) {
  const KernelSpec spec = fold_batch_into_rows(unfolded);
  Result<MatmulGroup> plan = analyse_matmul(spec);
  if (!plan) return plan.error();
  MmaChoice choice = mma_choice(*plan, config, 90, wgmma);
  if (choice.unsupported) return diag("no tensor-core kernel: " + *choice.unsupported);
  if (wgmma && !choice.wgmma) return diag("no wgmma kernel: " + choice.not_wgmma);
  const llvmb::Target host = llvmb::Target::host();
  EmittedKernel k = new_matmul_kernel(spec, host);
  Result<LaunchShape> l = build_mma_kernel(spec, *plan, config, 90, wgmma, host, *k.module, /*sim=*/true);
  if (!l) return l.error();
  if (auto err = llvmb::verify(*k.module)) return diag("internal: the emitted module does not verify: " + *err);
  k.launch = *l;
  return k;
}

namespace {
std::string persistent(const KernelConfig& c) {
  return c.persistent ? ", persistent: " + std::to_string(c.persistent) + " blocks walk the output tiles" : std::string();
}
// Thread-block clusters (the wgmma kernel's only: mma_choice refuses them elsewhere).
std::string cluster(const KernelConfig& c) {
  if (c.cluster_m * c.cluster_n <= 1) return {};
  const bool m = c.cluster_m > 1;
  return std::string(", clusters of 2 blocks on tiles adjacent in ") + (m ? "M" : "N") + ", sharing " + (m ? "B" : "A") +
         "'s tile: each block brings half of it by TMA multicast into both";
}
// Split-K, on either kernel: into the zeroed output (a bare f32 matmul) or the workspace.
std::string split_k(const MatmulGroup& p, const KernelConfig& c) {
  if (c.split_k <= 1) return {};
  const std::string n = std::to_string(c.split_k);
  if (!split_k_uses_workspace(p)) return ", split-K " + n + ": partial sums added into the zeroed output";
  return ", split-K " + n + ": partial sums added into an f32 workspace, the last block of each tile runs the epilogue";
}
}  // namespace

Result<MatmulPath> matmul_path(const KernelSpec& unfolded, const KernelConfig& config, const std::string& arch) {
  const KernelSpec spec = fold_batch_into_rows(unfolded);
  Result<MatmulGroup> plan = analyse_matmul(spec);
  if (!plan) return plan.error();
  std::optional<int> sm = kernels::sm_version(arch);
  if (!sm) return diag("unknown NVPTX arch '" + arch + "' (expected sm_NN or sm_NNa)");
  MmaChoice choice = mma_choice(*plan, config, *sm, has_wgmma(arch));
  // Where fold_batch_into_rows folded the batch: said first, it explains the rest.
  std::string fold;
  for (const Node& n : unfolded.group.nodes())
    if (n.op == OpKind::Matmul && n.type.shape.size() > 2 && n.type.shape != plan->out)
      fold = "batch " + shape_str(Shape(n.type.shape.begin(), n.type.shape.end() - 2)) + " folded into " +
             std::to_string(plan->M) + " rows (B is shared), ";
  if (choice.unsupported) return MatmulPath{false, false, fold + *choice.unsupported + split_k(*plan, config)};
  const bool tf32 = plan->dtype == DType::F32;
  const std::string dt = tf32 ? "tf32" : std::string(dtype_name(plan->dtype)), stages = std::to_string(config.stages) + " stages";
  const std::string kk = tf32 ? "k8 " : "k16 ";
  if (choice.wgmma)
    return MatmulPath{true, true,
                      fold + "wgmma.mma_async m64n" + std::to_string(config.block_n) + kk + dt + " with f32 accumulators, " +
                          std::to_string(config.warps / 4) + " warpgroup(s), operands from 128-byte-swizzled shared tiles " +
                          (choice.tma ? std::string("filled by TMA (cp.async.bulk.tensor + mbarrier, ")
                                      : "filled by 16-byte cp.async (") + stages + ")" +
                          (config.warp_specialize ? ", warp-specialised: a producer warpgroup issues the copies"
                                                  : std::string()) +
                          persistent(config) + split_k(*plan, config) +
                          (config.pingpong ? ", ping-pong: each consumer warpgroup takes whole tiles in turn, its "
                                             "epilogue during the other's K loop"
                                           : std::string()) +
                          (config.setmaxnreg ? ", registers reallocated: the consumer warpgroups take " +
                                                   std::to_string(config.setmaxnreg) + " a thread (setmaxnreg)"
                                             : std::string()) +
                          cluster(config) + mma_epilogue_path(spec.group, *plan, config, *sm, true) +
                          (spec.tma && !choice.tma ? "; not TMA: " + choice.not_tma : std::string())};
  std::string why = fold + "mma.sync.m16n8" + kk + dt + " with f32 accumulators, ldmatrix, 16-byte cp.async (" + stages + ")";
  why += persistent(config) + split_k(*plan, config) + mma_epilogue_path(spec.group, *plan, config, *sm, has_wgmma(arch));
  if (has_wgmma(arch)) why += "; not wgmma: " + choice.not_wgmma;
  return MatmulPath{true, false, why};
}

const Emitter& matmul_emitter() {
  static const MatmulEmitter e;
  return e;
}

}  // namespace sf
