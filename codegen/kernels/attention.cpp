#include "codegen/kernels/attention.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "autotune/space.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/mma_layout.h"

namespace sf {

namespace {

using kernels::Elem;
using kernels::ElementCodegen;
using kernels::GroupValues;
using kernels::emit_loop;

Diag fail(std::string msg) { return Diag{"", {}, "attention emitter: " + std::move(msg)}; }

// How the kernel is built: plain loops on the host; threads of a block on NVPTX, the
// two products in FMA (Simt) or on the tensor cores (Mma: mma.sync m16n8k16); or the
// Mma kernel built for the host with each thread a call and the warp instructions and
// barriers calls to MmaSimHooks (MmaSim: the tests' simulation).
enum class Mode { Host, Simt, Mma, MmaSim };

// One coordinate of an mma fragment element as an affine function of the lane's group
// (lane / 4) and thread-in-group (lane % 4): base + g * by_g + tig * by_tig, read off
// mma_layout.h's maps (tested against the PTX ISA's figures) at lanes 0, 4 and 1.
struct Affine {
  int base = 0, by_g = 0, by_tig = 0;
};
template <class F>
std::pair<Affine, Affine> fragment_map(F elem, int i) {
  const kernels::RowCol l0 = elem(0, i), l4 = elem(4, i), l1 = elem(1, i);
  return {Affine{l0.row, l4.row - l0.row, l1.row - l0.row}, Affine{l0.col, l4.col - l0.col, l1.col - l0.col}};
}

// The f32 tiles of one block, as offsets (in floats) into the block's buffer.
// `regs`: the register-resident tensor-core form keeps the scores, accumulators and
// row statistics in registers, and shared memory holds q, k and v only.
struct Tiles {
  int64_t bm = 0, bn = 0, e = 0, ev = 0;
  int64_t q = 0, k = 0, v = 0, s = 0, acc = 0, m = 0, l = 0, alpha = 0, floats = 0;
  // The register-resident form's tiles hold the operands as the tensor cores take
  // them, 16-bit, rows along the head dim: q [bm][e], k [bn][e] and v [bn][ev] at these
  // byte offsets, each row padded (qs, ks, vs: the strides) to an odd number of 16-byte
  // chunks, so that the 8 rows an ldmatrix phase reads fall in 8 distinct 16-byte
  // slots of a 128-byte line: one wavefront (rows of a multiple of 64 elements would
  // all start in one bank, an 8-way conflict).
  bool regs = false;
  int64_t q16 = 0, k16 = 0, v16 = 0, qs = 0, ks = 0, vs = 0;
  Tiles(int64_t bm_, int64_t bn_, int64_t e_, int64_t ev_, bool regs_ = false)
      : bm(bm_), bn(bn_), e(e_), ev(ev_), regs(regs_) {
    k = q + bm * e;
    v = k + bn * e;
    s = v + bn * ev;
    acc = s + bm * bn;
    m = acc + bm * ev;
    l = m + bm;
    alpha = l + bm;
    floats = alpha + bm;
    qs = padded(e);
    ks = padded(e);
    vs = padded(ev);
    k16 = q16 + 2 * bm * qs;
    v16 = k16 + 2 * bn * ks;
  }
  // n (a multiple of 8) plus 8 or 16 elements: an odd number of 16-byte chunks.
  static int64_t padded(int64_t n) { return n + ((n / 8) % 2 == 0 ? 8 : 16); }
  int64_t bytes() const { return regs ? v16 + 2 * bn * vs : floats * 4; }
};

class AttentionCode {
 public:
  AttentionCode(const KernelSpec& spec, const AttentionKernelInfo& info, const Tiles& t, Mode mode,
                llvm::IRBuilderBase& b, ElementCodegen& cg)
      : spec_(spec), info_(info), m_(info.match), t_(t), mode_(mode), b_(b), cg_(cg) {}

  // MmaSim: the hooks table (MmaSimHooks: ctx, barrier, ldmatrix_x4, mma, ...) and
  // the thread's index as the hooks take it.
  // Index 4 here is MmaSimHooks' shfl_bfly (its 17th pointer).
  void sim_hooks(llvm::Value* hooks, llvm::Value* tid32) {
    for (int i = 0; i < 5; ++i)
      hook_[i] = b_.CreateAlignedLoad(b_.getPtrTy(),
                                      b_.CreateConstInBoundsGEP1_64(b_.getPtrTy(), hooks, static_cast<uint64_t>(i < 4 ? i : 16)),
                                      llvm::Align(8));
    tid32_ = tid32;
  }
  // The register-resident form (tensor cores, block_m = 16 x warps): each warp keeps
  // its 16 rows' scores, probabilities, output accumulators and row statistics in
  // mma fragments, FlashAttention-2's layout.
  void set_registers(bool on) { regs_ = on; }

  // The whole kernel body for block `bid` (an i64 below blocks()).
  Result<void> block(llvm::Value* bid, llvm::Value* buf, llvm::Value* tid, llvm::Value* nthreads,
                     const std::vector<llvm::Value*>& in, llvm::Value* out) {
    buf_ = buf;
    tid_ = tid;
    nthreads_ = nthreads;
    out_ = out;
    if (mode_ == Mode::Mma || mode_ == Mode::MmaSim) {
      warp_ = b_.CreateUDiv(tid, c(32), "warp");
      warps_ = b_.CreateUDiv(nthreads, c(32));
      llvm::Value* lane = b_.CreateURem(tid, c(32), "lane");
      g_ = b_.CreateUDiv(lane, c(4), "group");
      tig_ = b_.CreateURem(lane, c(4), "tig");
    }
    GroupValues gv(spec_.group, cg_, in);
    gv_ = &gv;
    in_ = in;
    if (regs_) plan_vector_loads();
    // Block bid takes the group of query heads (batch index) b .. b + G - 1 and rows
    // q0 .. q0 + rph - 1 of each; block row r is head b + r / rph, row q0 + r % rph.
    const int64_t qtiles = query_tiles();
    llvm::Value* b = b_.CreateMul(b_.CreateUDiv(bid, c(qtiles)), c(group_), "batch");
    llvm::Value* q0 = b_.CreateMul(b_.CreateURem(bid, c(qtiles)), c(rph_), "q0");
    b0_ = b;
    q0_ = q0;
    llvm::Value* ninf = llvm::ConstantFP::getInfinity(b_.getFloatTy(), true);
    llvm::Value* zero = llvm::ConstantFP::get(b_.getFloatTy(), 0.0);

    // Accumulators (in registers in the register-resident form) and the q tile.
    if (!regs_) {
      SF_TRY(par(t_.bm * t_.ev, "init_acc", [&](llvm::Value* i) { put(t_.acc, i, zero); return ok(); }));
      SF_TRY(par(t_.bm, "init_rows", [&](llvm::Value* i) {
        put(t_.m, i, ninf);
        put(t_.l, i, zero);
        return ok();
      }));
    }
    if (regs_) {
      // q [bm][E]: block row r is row row_of(r) of head head_of(r).
      SF_TRY(load16(m_.q, t_.bm, t_.e, "load_q", [&](llvm::Value* r) {
        llvm::Value* row = row_of(r);
        return std::pair{b_.CreateMul(b_.CreateAdd(b_.CreateMul(head_of(r), c(m_.l)), row), c(m_.e)),
                         b_.CreateICmpSLT(row, c(m_.l))};
      }, [&](llvm::Value* r, llvm::Value* c0, const std::vector<llvm::Value*>& lanes) {
        store16x8(t_.q16, b_.CreateAdd(b_.CreateMul(r, c(t_.qs)), c0), lanes);
      }));
    } else {
      SF_TRY(par(t_.bm * t_.e, "load_q", [&](llvm::Value* i) -> Result<void> {
        llvm::Value* r = b_.CreateUDiv(i, c(t_.e));
        llvm::Value* e = b_.CreateURem(i, c(t_.e));
        llvm::Value* row = row_of(r);
        Result<llvm::Value*> x = guarded(b_.CreateICmpSLT(row, c(m_.l)), [&]() {
          return operand(m_.q, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(head_of(r), c(m_.l)), row), c(m_.e)), e));
        });
        if (!x) return x.error();
        put(t_.q, i, *x);
        return ok();
      }));
    }

    // The keys any row of the block can see: all, or (causal) up to the last row's
    // diagonal, q0 + bm - 1 + d, clamped to [0, S].
    llvm::Value* kv_end = c(m_.s);
    if (m_.causal_diagonal) {
      llvm::Value* last = b_.CreateAdd(q0, c(rph_ + *m_.causal_diagonal));
      last = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, last, c(0));
      kv_end = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, last, c(m_.s), nullptr, "kv_end");
    }
    if (regs_) return warp_rows(b, kv_end);
    SF_TRY(emit_loop(b_, c(0), kv_end, c(t_.bn), "kv", [&](llvm::Value* kv0) -> Result<void> {
      return key_tile(b, kv0);
    }));

    // out = acc / l, through the output's strides.
    return par(t_.bm * t_.ev, "store", [&](llvm::Value* i) -> Result<void> {
      llvm::Value* r = b_.CreateUDiv(i, c(t_.ev));
      llvm::Value* col = b_.CreateURem(i, c(t_.ev));
      llvm::Value* row = row_of(r);
      return when(b_.CreateICmpSLT(row, c(m_.l)), [&]() -> Result<void> {
        llvm::Value* y = b_.CreateFDiv(get(t_.acc, i), get(t_.l, r));
        cg_.store(Elem{y, out_dtype()}, out_, store_offset(head_of(r), row, col));
        return ok();
      });
    });
  }

  int64_t query_tiles() const { return std::max<int64_t>((m_.l + rph_ - 1) / rph_, 1); }
  int64_t blocks() const { return info_.batches / group_ * (m_.l > 0 ? (m_.l + rph_ - 1) / rph_ : 0); }
  // G query heads of one kv head per block, rph rows of each (G * rph = the tile's rows).
  void set_groups(int64_t group, int64_t rows_per_head) {
    group_ = group;
    rph_ = rows_per_head;
  }

 private:
  static Result<void> ok() { return {}; }
  // Whether the block's work is spread over threads (every mode but the host's loops).
  bool threaded() const { return mode_ != Mode::Host; }
  // Block row r's query row and batch index (its head): q0 + r % rph, b + r / rph.
  llvm::Value* row_of(llvm::Value* r) {
    return b_.CreateAdd(q0_, group_ == 1 ? r : b_.CreateURem(r, c(rph_)));
  }
  llvm::Value* head_of(llvm::Value* r) { return group_ == 1 ? b0_ : b_.CreateAdd(b0_, b_.CreateUDiv(r, c(rph_))); }
  llvm::Value* c(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }
  DType out_dtype() const { return spec_.group.node(m_.out).type.dtype; }

  // The block's buffer, float `base + i`.
  llvm::Value* at(int64_t base, llvm::Value* i) {
    return b_.CreateInBoundsGEP(b_.getFloatTy(), buf_, b_.CreateAdd(c(base), i));
  }
  // A float variable in the entry block (promoted to a register by mem2reg; an alloca
  // inside a loop would take stack on every iteration).
  llvm::Value* slot(llvm::Type* t = nullptr) {
    llvm::BasicBlock& entry = b_.GetInsertBlock()->getParent()->getEntryBlock();
    llvm::IRBuilder<> e(&entry, entry.getFirstInsertionPt());
    return e.CreateAlloca(t ? t : b_.getFloatTy());
  }
  llvm::Value* get(int64_t base, llvm::Value* i) { return b_.CreateLoad(b_.getFloatTy(), at(base, i)); }
  // The register-resident form's 16-bit tiles: element i of the tile at byte `base`
  // stored rounded to the operand dtype.
  void put16(int64_t base, llvm::Value* i, llvm::Value* x) { store16(base, i, to16(x)); }
  // 16-bit bits `bits` (an i16) at element i of the tile at byte `base`.
  void store16(int64_t base, llvm::Value* i, llvm::Value* bits) {
    b_.CreateAlignedStore(bits, b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_, b_.CreateAdd(c(base), b_.CreateMul(i, c(2)))),
                          llvm::Align(2));
  }
  // Eight of them at elements i .. i + 7 (i a multiple of 8, the tile 16-byte aligned):
  // one 16-byte store.
  void store16x8(int64_t base, llvm::Value* i, const std::vector<llvm::Value*>& bits) {
    llvm::Value* v = llvm::UndefValue::get(llvm::FixedVectorType::get(b_.getInt16Ty(), 8));
    for (size_t l = 0; l < 8; ++l) v = b_.CreateInsertElement(v, bits[l], static_cast<uint64_t>(l));
    b_.CreateAlignedStore(v, b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_, b_.CreateAdd(c(base), b_.CreateMul(i, c(2)))),
                          llvm::Align(16));
  }
  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 from `lane_row` (this lane's row
  // address, mma_layout.h's ldmatrix_x4_*_addr) plus `off` bytes: four registers.
  std::vector<llvm::Value*> ldsm_x4(llvm::Value* lane_row, int64_t off, bool trans = false) {
    llvm::Value* p = b_.CreateConstInBoundsGEP1_64(b_.getInt8Ty(), lane_row, static_cast<uint64_t>(off));
    std::vector<llvm::Value*> r;
    if (mode_ == Mode::Mma) {
      llvm::Value* v = b_.CreateIntrinsic(trans ? llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16
                                                : llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16,
                                          {p->getType()}, {p});
      for (unsigned i = 0; i < 4; ++i) r.push_back(b_.CreateExtractValue(v, {i}));
      return r;
    }
    llvm::Type* i32 = b_.getInt32Ty();
    llvm::Value* out = slot(llvm::ArrayType::get(i32, 4));
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32, b_.getPtrTy(), i32, b_.getPtrTy()}, false);
    b_.CreateCall(fty, hook_[2], {hook_[0], tid32_, p, b_.getInt32(trans ? 1 : 0), out});
    for (unsigned i = 0; i < 4; ++i) r.push_back(b_.CreateLoad(i32, b_.CreateConstInBoundsGEP1_32(i32, out, i)));
    return r;
  }

  // Whether every element of `elem` (n of them) moves with the lane as element 0 does.
  template <class F>
  static bool same_lane_terms(F elem, int n) {
    auto [r0, c0] = fragment_map(elem, 0);
    for (int i = 1; i < n; ++i) {
      auto [r, col] = fragment_map(elem, i);
      if (r.by_g != r0.by_g || r.by_tig != r0.by_tig || col.by_g != c0.by_g || col.by_tig != c0.by_tig) return false;
    }
    return true;
  }
  void put(int64_t base, llvm::Value* i, llvm::Value* v) { b_.CreateStore(v, at(base, i)); }

  // for (i = 0; i < n; ++i) body(i), spread over the block's threads (a block apart)
  // with a barrier after it on NVPTX; a plain loop on the host.
  Result<void> par(int64_t n, const std::string& name, const std::function<Result<void>(llvm::Value*)>& body) {
    Result<void> r = threaded() ? emit_loop(b_, tid_, c(n), nthreads_, name, body) : emit_loop(b_, c(0), c(n), c(1), name, body);
    if (!r) return r;
    if (threaded()) barrier();
    return r;
  }
  void barrier() {
    if (mode_ == Mode::MmaSim) {
      b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy()}, false), hook_[1], {hook_[0]});
      return;
    }
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  }

  // ---- the tensor-core products (Mode::Mma, MmaSim) ------------------------------

  bool f16() const { return score_in_dtype() == DType::F16; }
  DType score_in_dtype() const { return spec_.group.node(m_.q).type.dtype == DType::F16 ? DType::F16 : DType::BF16; }
  // f32 x, y rounded to the operand dtype and packed in one .b32, x in the low half.
  llvm::Value* pack(llvm::Value* x, llvm::Value* y) {
    auto bits = [&](llvm::Value* v) {
      llvm::Value* n = cg_.narrow(score_in_dtype(), v);  // i16 (bf16) or half (f16)
      if (n->getType()->isHalfTy()) n = b_.CreateBitCast(n, b_.getInt16Ty());
      return b_.CreateZExt(n, b_.getInt32Ty());
    };
    return b_.CreateOr(bits(x), b_.CreateShl(bits(y), 16));
  }
  llvm::Value* coord(const Affine& a, llvm::Value* g, llvm::Value* tig) {
    return b_.CreateAdd(c(a.base), b_.CreateAdd(b_.CreateMul(g, c(a.by_g)), b_.CreateMul(tig, c(a.by_tig))));
  }
  // The A fragment (16 x 16) at (m0, k0) of the f32 tile at `base` with rows of `stride`.
  std::vector<llvm::Value*> frag_a(int64_t base, int64_t stride, llvm::Value* m0, llvm::Value* k0) {
    std::vector<llvm::Value*> e;
    for (int i = 0; i < 8; ++i) {
      auto [r, col] = fragment_map(kernels::mma_a_elem, i);
      llvm::Value* row = b_.CreateAdd(m0, coord(r, g_, tig_));
      e.push_back(get(base, b_.CreateAdd(b_.CreateMul(row, c(stride)), b_.CreateAdd(k0, coord(col, g_, tig_)))));
    }
    return {pack(e[0], e[1]), pack(e[2], e[3]), pack(e[4], e[5]), pack(e[6], e[7])};
  }
  // The B fragment (16 x 8) at (k0, n0): element (k, n) from the f32 tile at `base`,
  // at (k0 + k) * k_stride + (n0 + n) * n_stride.
  std::vector<llvm::Value*> frag_b(int64_t base, int64_t k_stride, int64_t n_stride, llvm::Value* k0, llvm::Value* n0) {
    std::vector<llvm::Value*> e;
    for (int i = 0; i < 4; ++i) {
      auto [r, col] = fragment_map(kernels::mma_b_elem, i);
      llvm::Value* k = b_.CreateAdd(k0, coord(r, g_, tig_));
      llvm::Value* n = b_.CreateAdd(n0, coord(col, g_, tig_));
      e.push_back(get(base, b_.CreateAdd(b_.CreateMul(k, c(k_stride)), b_.CreateMul(n, c(n_stride)))));
    }
    return {pack(e[0], e[1]), pack(e[2], e[3])};
  }
  // Where C/D element i (16 x 8 at (m0, n0)) lies in a tile with rows of `stride`.
  llvm::Value* c_index(int i, llvm::Value* m0, llvm::Value* n0, int64_t stride, llvm::Value** row_out = nullptr) {
    auto [r, col] = fragment_map(kernels::mma_c_elem, i);
    llvm::Value* row = b_.CreateAdd(m0, coord(r, g_, tig_));
    if (row_out) *row_out = row;
    return b_.CreateAdd(b_.CreateMul(row, c(stride)), b_.CreateAdd(n0, coord(col, g_, tig_)));
  }
  // D = A B + C, mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32.
  std::vector<llvm::Value*> mma(const std::vector<llvm::Value*>& a, const std::vector<llvm::Value*>& bf,
                                const std::vector<llvm::Value*>& cf) {
    std::vector<llvm::Value*> d;
    llvm::Type* i32 = b_.getInt32Ty();
    llvm::Type* f32 = b_.getFloatTy();
    if (mode_ == Mode::Mma) {
      std::vector<llvm::Value*> args;
      llvm::Type* h2 = llvm::FixedVectorType::get(b_.getHalfTy(), 2);
      for (llvm::Value* v : a) args.push_back(f16() ? b_.CreateBitCast(v, h2) : v);
      for (llvm::Value* v : bf) args.push_back(f16() ? b_.CreateBitCast(v, h2) : v);
      for (llvm::Value* v : cf) args.push_back(v);
      llvm::Value* v = b_.CreateIntrinsic(
          f16() ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32 : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16, {},
          args);
      for (unsigned i = 0; i < 4; ++i) d.push_back(b_.CreateExtractValue(v, {i}));
      return d;
    }
    llvm::Value* av = slot(llvm::ArrayType::get(i32, 4));
    llvm::Value* bv = slot(llvm::ArrayType::get(i32, 2));
    llvm::Value* cv = slot(llvm::ArrayType::get(f32, 4));
    for (unsigned i = 0; i < 4; ++i) b_.CreateStore(a[i], b_.CreateConstInBoundsGEP1_32(i32, av, i));
    for (unsigned i = 0; i < 2; ++i) b_.CreateStore(bf[i], b_.CreateConstInBoundsGEP1_32(i32, bv, i));
    for (unsigned i = 0; i < 4; ++i) b_.CreateStore(cf[i], b_.CreateConstInBoundsGEP1_32(f32, cv, i));
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32, i32, b_.getPtrTy(), b_.getPtrTy(), b_.getPtrTy()}, false);
    b_.CreateCall(fty, hook_[3], {hook_[0], tid32_, b_.getInt32(f16() ? 1 : 0), av, bv, cv});
    for (unsigned i = 0; i < 4; ++i) d.push_back(b_.CreateLoad(f32, b_.CreateConstInBoundsGEP1_32(f32, cv, i)));
    return d;
  }
  // for (tile = warp; tile < tiles; tile += warps): warp-uniform, as mma.sync needs.
  Result<void> per_warp_tile(int64_t tiles, const std::string& name, const std::function<Result<void>(llvm::Value*)>& body) {
    Result<void> r = emit_loop(b_, warp_, c(tiles), warps_, name, body);
    if (!r) return r;
    barrier();
    return r;
  }
  // `k_steps` products accumulated on `acc` (4 f32 slots), one per k0 = 0, 16, ...
  Result<void> accumulate(llvm::Value* acc, int64_t k, const std::string& name,
                          const std::function<void(llvm::Value* k0, std::vector<llvm::Value*>&, std::vector<llvm::Value*>&)>& frags) {
    return emit_loop(b_, c(0), c(k), c(16), name, [&](llvm::Value* k0) -> Result<void> {
      std::vector<llvm::Value*> a, bf, cf;
      frags(k0, a, bf);
      for (unsigned i = 0; i < 4; ++i) cf.push_back(b_.CreateLoad(b_.getFloatTy(), b_.CreateConstInBoundsGEP1_32(b_.getFloatTy(), acc, i)));
      std::vector<llvm::Value*> d = mma(a, bf, cf);
      for (unsigned i = 0; i < 4; ++i) b_.CreateStore(d[i], b_.CreateConstInBoundsGEP1_32(b_.getFloatTy(), acc, i));
      return ok();
    });
  }

  // `body` where `cond` holds.
  Result<void> when(llvm::Value* cond, const std::function<Result<void>()>& body) {
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    auto* then = llvm::BasicBlock::Create(b_.getContext(), "then", fn);
    auto* done = llvm::BasicBlock::Create(b_.getContext(), "done", fn);
    b_.CreateCondBr(cond, then, done);
    b_.SetInsertPoint(then);
    Result<void> r = body();
    if (!r) return r;
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    return r;
  }
  // body() where `cond` holds, else `other` (0 by default): an f32.
  Result<llvm::Value*> guarded(llvm::Value* cond, const std::function<Result<llvm::Value*>()>& body,
                               llvm::Value* other = nullptr) {
    if (!other) other = llvm::ConstantFP::get(b_.getFloatTy(), 0.0);
    llvm::BasicBlock* from = b_.GetInsertBlock();
    llvm::Function* fn = from->getParent();
    auto* then = llvm::BasicBlock::Create(b_.getContext(), "then", fn);
    auto* done = llvm::BasicBlock::Create(b_.getContext(), "done", fn);
    b_.CreateCondBr(cond, then, done);
    b_.SetInsertPoint(then);
    Result<llvm::Value*> v = body();
    if (!v) return v;
    llvm::BasicBlock* then_end = b_.GetInsertBlock();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    llvm::PHINode* phi = b_.CreatePHI(b_.getFloatTy(), 2);
    phi->addIncoming(*v, then_end);
    phi->addIncoming(other, from);
    return static_cast<llvm::Value*>(phi);
  }

  // Value `v` (q, kt or v: a float tensor of the group) at flat index `flat` of its
  // own shape, through its prologue, as f32.
  // `coords`: v's coordinates at `flat`, when known (generators such as a causal
  // mask's tril then read them instead of dividing the flat index).
  Result<llvm::Value*> operand(int v, llvm::Value* flat, GroupValues::Hook hook = {},
                               std::vector<llvm::Value*> coords = {}) {
    gv_->at_index(flat, std::move(hook));
    if (!coords.empty()) gv_->known_coordinates(spec_.group.node(v).type.shape, std::move(coords));
    Result<Elem> x = gv_->value(v, kernels::dense_index(spec_.group.node(v).type.shape));
    if (!x) return x.error();
    if (!is_float(x->dtype)) return fail("operand " + spec_.group.node(v).type.str() + " is not a float tensor");
    return x->value;  // f32/f16/bf16 compute as float
  }

  // The chain's logit at block row r and key `col` from the raw dot product `raw()`
  // (called only inside the rows and keys); -inf outside them.
  Result<llvm::Value*> logit(llvm::Value* r, llvm::Value* col, const std::function<Result<llvm::Value*>()>& raw) {
    llvm::Value* row = row_of(r);
    llvm::Value* inside = b_.CreateAnd(b_.CreateICmpSLT(row, c(m_.l)), b_.CreateICmpSLT(col, c(m_.s)));
    return guarded(
        inside,
        [&]() -> Result<llvm::Value*> {
          Result<llvm::Value*> rv = raw();
          if (!rv) return rv;
          llvm::Value* dot = cg_.node_result(score_dtype(), *rv);
          const int scores = m_.scores;
          const DType sd = score_dtype();
          llvm::Value* head = head_of(r);
          llvm::Value* flat = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(head, c(m_.l)), row), c(m_.s)), col);
          std::vector<llvm::Value*> coords = batch_coords(head);
          coords.push_back(row);
          coords.push_back(col);
          return operand(
              m_.logits, flat,
              [scores, sd, dot](ValueId v, const kernels::ValueIndex&) -> std::optional<Elem> {
                if (v == scores) return Elem{dot, sd};
                return std::nullopt;
              },
              std::move(coords));
        },
        llvm::ConstantFP::getInfinity(b_.getFloatTy(), true));
  }

  Result<void> key_tile(llvm::Value* b, llvm::Value* kv0) {
    SF_TRY(load_kv(b, kv0));
    return products(kv0);
  }

  // k [bn, E] from kt [.., E, S]; v [bn, Ev] from v [.., S, Ev], through their
  // prologues, zero past the keys.
  Result<void> load_kv(llvm::Value* b, llvm::Value* kv0) {
    if (regs_) return load_kv16(b, kv0);
    SF_TRY(par(t_.bn * t_.e, "load_k", [&](llvm::Value* i) -> Result<void> {
      llvm::Value* j = b_.CreateUDiv(i, c(t_.e));
      llvm::Value* e = b_.CreateURem(i, c(t_.e));
      llvm::Value* col = b_.CreateAdd(kv0, j);
      Result<llvm::Value*> x = guarded(b_.CreateICmpSLT(col, c(m_.s)), [&]() {
        return operand(m_.kt, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.e)), e), c(m_.s)), col));
      });
      if (!x) return x.error();
      put(t_.k, i, *x);
      return ok();
    }));
    SF_TRY(par(t_.bn * t_.ev, "load_v", [&](llvm::Value* i) -> Result<void> {
      llvm::Value* j = b_.CreateUDiv(i, c(t_.ev));
      llvm::Value* col = b_.CreateURem(i, c(t_.ev));
      llvm::Value* key = b_.CreateAdd(kv0, j);
      Result<llvm::Value*> x = guarded(b_.CreateICmpSLT(key, c(m_.s)), [&]() {
        return operand(m_.v, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.s)), key), c(m_.ev)), col));
      });
      if (!x) return x.error();
      put(t_.v, i, *x);
      return ok();
    }));
    return ok();
  }

  // The shared-memory forms' products and softmax over the loaded k and v tiles.
  Result<void> products(llvm::Value* kv0) {
    // Scores through the chain; -inf outside the rows and keys.
    const bool tc = mode_ == Mode::Mma || mode_ == Mode::MmaSim;
    if (tc) {
      // q k^T on the tensor cores into the score tile: B(k, n) = k tile (n, k).
      const int64_t tn = t_.bn / 8;
      SF_TRY(per_warp_tile(t_.bm / 16 * tn, "qk_tiles", [&](llvm::Value* tile) -> Result<void> {
        llvm::Value* m0 = b_.CreateMul(b_.CreateUDiv(tile, c(tn)), c(16));
        llvm::Value* n0 = b_.CreateMul(b_.CreateURem(tile, c(tn)), c(8));
        llvm::Value* acc = slot(llvm::ArrayType::get(b_.getFloatTy(), 4));
        for (unsigned i = 0; i < 4; ++i)
          b_.CreateStore(llvm::ConstantFP::get(b_.getFloatTy(), 0.0), b_.CreateConstInBoundsGEP1_32(b_.getFloatTy(), acc, i));
        SF_TRY(accumulate(acc, t_.e, "qk_k", [&](llvm::Value* k0, std::vector<llvm::Value*>& a, std::vector<llvm::Value*>& bf) {
          a = frag_a(t_.q, t_.e, m0, k0);
          bf = frag_b(t_.k, 1, t_.e, k0, n0);
        }));
        for (int i = 0; i < 4; ++i)
          put(t_.s, c_index(i, m0, n0, t_.bn),
              b_.CreateLoad(b_.getFloatTy(), b_.CreateConstInBoundsGEP1_32(b_.getFloatTy(), acc, static_cast<unsigned>(i))));
        return ok();
      }));
    }
    SF_TRY(par(t_.bm * t_.bn, "scores", [&](llvm::Value* i) -> Result<void> {
      llvm::Value* r = b_.CreateUDiv(i, c(t_.bn));
      llvm::Value* j = b_.CreateURem(i, c(t_.bn));
      llvm::Value* col = b_.CreateAdd(kv0, j);
      Result<llvm::Value*> s = logit(r, col, [&]() -> Result<llvm::Value*> {
            llvm::Value* raw = nullptr;
            if (tc) {
              raw = get(t_.s, i);  // the tensor cores' dot product
            } else {
              llvm::Value* acc = slot();
              b_.CreateStore(llvm::ConstantFP::get(b_.getFloatTy(), 0.0), acc);
              // On the host the sum may be split into vector lanes (the loop hint allows
              // LLVM to reorder it): one SIMD dot product per score.
              SF_TRY(emit_loop(
                  b_, c(0), c(t_.e), c(1), "dot",
                  [&](llvm::Value* e) -> Result<void> {
                    llvm::Value* p = b_.CreateFMul(get(t_.q, b_.CreateAdd(b_.CreateMul(r, c(t_.e)), e)),
                                                   get(t_.k, b_.CreateAdd(b_.CreateMul(j, c(t_.e)), e)));
                    b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(b_.getFloatTy(), acc), p), acc);
                    return ok();
                  },
                  host_hints()));
              raw = b_.CreateLoad(b_.getFloatTy(), acc);
            }
            return raw;
          });
      if (!s) return s.error();
      put(t_.s, i, *s);
      return ok();
    }));
    // Online softmax per row.
    SF_TRY(par(t_.bm, "softmax", [&](llvm::Value* r) -> Result<void> {
      llvm::Value* row = b_.CreateMul(r, c(t_.bn));
      llvm::Value* best = slot();
      llvm::Value* m_old = get(t_.m, r);
      b_.CreateStore(m_old, best);
      SF_TRY(emit_loop(b_, c(0), c(t_.bn), c(1), "max", [&](llvm::Value* j) -> Result<void> {
        llvm::Value* s = get(t_.s, b_.CreateAdd(row, j));
        llvm::Value* cur = b_.CreateLoad(b_.getFloatTy(), best);
        b_.CreateStore(b_.CreateSelect(b_.CreateFCmpOGT(s, cur), s, cur), best);
        return ok();
      }));
      llvm::Value* m_new = b_.CreateLoad(b_.getFloatTy(), best);
      // A row that has seen only -inf keeps subtracting 0: exp(-inf - 0) = 0, no NaN.
      llvm::Value* m_safe = b_.CreateSelect(b_.CreateFCmpOEQ(m_new, llvm::ConstantFP::getInfinity(b_.getFloatTy(), true)),
                                            llvm::ConstantFP::get(b_.getFloatTy(), 0.0), m_new);
      llvm::Value* alpha = cg_.math(kernels::MathFn::Exp, b_.CreateFSub(m_old, m_safe));
      llvm::Value* sum = slot();
      b_.CreateStore(llvm::ConstantFP::get(b_.getFloatTy(), 0.0), sum);
      SF_TRY(emit_loop(b_, c(0), c(t_.bn), c(1), "exp", [&](llvm::Value* j) -> Result<void> {
        llvm::Value* idx = b_.CreateAdd(row, j);
        llvm::Value* p = cg_.math(kernels::MathFn::Exp, b_.CreateFSub(get(t_.s, idx), m_safe));
        put(t_.s, idx, p);
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(b_.getFloatTy(), sum), p), sum);
        return ok();
      }));
      put(t_.l, r, b_.CreateFAdd(b_.CreateFMul(get(t_.l, r), alpha), b_.CreateLoad(b_.getFloatTy(), sum)));
      put(t_.m, r, m_new);
      put(t_.alpha, r, alpha);
      return ok();
    }));
    // acc = acc * alpha + p v.
    if (tc) {
      const int64_t tn = t_.ev / 8;
      return per_warp_tile(t_.bm / 16 * tn, "pv_tiles", [&](llvm::Value* tile) -> Result<void> {
        llvm::Value* m0 = b_.CreateMul(b_.CreateUDiv(tile, c(tn)), c(16));
        llvm::Value* n0 = b_.CreateMul(b_.CreateURem(tile, c(tn)), c(8));
        llvm::Value* acc = slot(llvm::ArrayType::get(b_.getFloatTy(), 4));
        std::vector<llvm::Value*> at(4);
        for (int i = 0; i < 4; ++i) {
          llvm::Value* row = nullptr;
          at[static_cast<size_t>(i)] = c_index(i, m0, n0, t_.ev, &row);
          b_.CreateStore(b_.CreateFMul(get(t_.acc, at[static_cast<size_t>(i)]), get(t_.alpha, row)),
                         b_.CreateConstInBoundsGEP1_32(b_.getFloatTy(), acc, static_cast<unsigned>(i)));
        }
        SF_TRY(accumulate(acc, t_.bn, "pv_k", [&](llvm::Value* k0, std::vector<llvm::Value*>& a, std::vector<llvm::Value*>& bf) {
          a = frag_a(t_.s, t_.bn, m0, k0);
          bf = frag_b(t_.v, t_.ev, 1, k0, n0);
        }));
        for (int i = 0; i < 4; ++i)
          put(t_.acc, at[static_cast<size_t>(i)],
              b_.CreateLoad(b_.getFloatTy(), b_.CreateConstInBoundsGEP1_32(b_.getFloatTy(), acc, static_cast<unsigned>(i))));
        return ok();
      });
    }
    if (!threaded()) {
      // The host takes a row at a time, the output columns innermost: acc[r, :] +=
      // p[r, j] * v[j, :] is a vector update with no sum to reorder.
      return par(t_.bm, "pv_rows", [&](llvm::Value* r) -> Result<void> {
        llvm::Value* row = b_.CreateMul(r, c(t_.ev));
        llvm::Value* alpha = get(t_.alpha, r);
        SF_TRY(emit_loop(b_, c(0), c(t_.ev), c(1), "rescale", [&](llvm::Value* col) -> Result<void> {
          llvm::Value* i = b_.CreateAdd(row, col);
          put(t_.acc, i, b_.CreateFMul(get(t_.acc, i), alpha));
          return ok();
        }));
        return emit_loop(b_, c(0), c(t_.bn), c(1), "key", [&](llvm::Value* j) -> Result<void> {
          llvm::Value* p = get(t_.s, b_.CreateAdd(b_.CreateMul(r, c(t_.bn)), j));
          llvm::Value* vrow = b_.CreateMul(j, c(t_.ev));
          return emit_loop(b_, c(0), c(t_.ev), c(1), "col", [&](llvm::Value* col) -> Result<void> {
            llvm::Value* i = b_.CreateAdd(row, col);
            put(t_.acc, i, b_.CreateFAdd(get(t_.acc, i), b_.CreateFMul(p, get(t_.v, b_.CreateAdd(vrow, col)))));
            return ok();
          });
        });
      });
    }
    return par(t_.bm * t_.ev, "pv", [&](llvm::Value* i) -> Result<void> {
      llvm::Value* r = b_.CreateUDiv(i, c(t_.ev));
      llvm::Value* col = b_.CreateURem(i, c(t_.ev));
      llvm::Value* acc = slot();
      b_.CreateStore(b_.CreateFMul(get(t_.acc, i), get(t_.alpha, r)), acc);
      SF_TRY(emit_loop(b_, c(0), c(t_.bn), c(1), "key", [&](llvm::Value* j) -> Result<void> {
        llvm::Value* p = b_.CreateFMul(get(t_.s, b_.CreateAdd(b_.CreateMul(r, c(t_.bn)), j)),
                                       get(t_.v, b_.CreateAdd(b_.CreateMul(j, c(t_.ev)), col)));
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(b_.getFloatTy(), acc), p), acc);
        return ok();
      }));
      put(t_.acc, i, b_.CreateLoad(b_.getFloatTy(), acc));
      return ok();
    });
  }

  // ---- the register-resident form's loads -----------------------------------------
  // The 16-bit tiles are filled 8 elements along the head dim at a time. Where a
  // param reaches the operand through views only, in runs of 8 dense elements (the
  // projections' heads, GQA's repeat, a transpose's input), its 8 elements are one
  // 16-byte load when every such param is 16-byte aligned (checked once per block,
  // else element by element); arithmetic in the prologue (RoPE) runs per element
  // on the loaded lanes. k's rows are read from its transpose's input, [.., S, E],
  // whose head dim is contiguous.

  // The node k's rows are read from: kt's input where kt = transpose(k, -2, -1).
  int k_rows_node() const {
    const Node& n = spec_.group.node(m_.kt);
    if (n.op != OpKind::Transpose || n.inputs.size() != 1) return -1;
    const Shape& in = spec_.group.node(n.inputs[0]).type.shape;
    const Shape& kt = n.type.shape;
    const size_t r = kt.size();
    if (in.size() != r || r < 2 || in[r - 1] != kt[r - 2] || in[r - 2] != kt[r - 1]) return -1;
    const int64_t d0 = n.attrs.get_int("dim0"), d1 = n.attrs.get_int("dim1");
    auto norm = [&](int64_t d) { return d < 0 ? d + static_cast<int64_t>(r) : d; };
    const int64_t a = norm(d0), bb = norm(d1);
    if (std::min(a, bb) != static_cast<int64_t>(r) - 2 || std::max(a, bb) != static_cast<int64_t>(r) - 1) return -1;
    return n.inputs[0];
  }

  // Which params q, k's rows and v read in dense runs of 8, and whether all of them
  // are 16-byte aligned here (aligned_).
  void plan_vector_loads() {
    vec_params_.clear();
    const int kr = k_rows_node();
    for (int v : {m_.q, kr, m_.v}) {
      if (v < 0) continue;
      for (auto& [p, map] : gv_->reads(v, kernels::dense_index(spec_.group.node(v).type.shape)))
        if (kernels::dense_runs(map, 8)) vec_params_.insert(p);
    }
    llvm::Value* bits = b_.getInt64(0);
    for (int p : vec_params_)
      bits = b_.CreateOr(bits, b_.CreateAnd(b_.CreatePtrToInt(in_[static_cast<size_t>(p)], b_.getInt64Ty()), b_.getInt64(15)));
    aligned_ = b_.CreateICmpEQ(bits, b_.getInt64(0), "aligned16");
  }

  // Elements index .. index + 7 of `ptr` (dtype t, 16-byte aligned there), widened. On
  // NVPTX each 16 bytes is one ld.global.nc.v4 (llvm.nvvm.ldg): a plain vector load
  // whose lanes are only extracted is split into scalar loads by LLVM's vector
  // combining, which the lanes' per-element arithmetic invites here.
  std::vector<Elem> load8(DType t, llvm::Value* ptr, llvm::Value* index) {
    llvm::Type* st = kernels::storage_type(b_.getContext(), t);
    const int64_t size = dtype_size(t), total = 8 * size, piece = std::min<int64_t>(16, total), per = piece / size;
    llvm::Type* words = llvm::FixedVectorType::get(b_.getInt32Ty(), static_cast<unsigned>(piece / 4));
    llvm::Type* lanes = llvm::FixedVectorType::get(st, static_cast<unsigned>(per));
    llvm::Type* global = llvm::PointerType::get(b_.getContext(), 1);
    std::vector<Elem> out;
    for (int64_t k = 0; k < total / piece; ++k) {
      llvm::Value* at = b_.CreateInBoundsGEP(st, ptr, b_.CreateAdd(index, llvm::ConstantInt::get(index->getType(), static_cast<uint64_t>(k * per))));
      // The simulation (host) reads the same words with a plain load.
      llvm::Value* w = nullptr;
      if (mode_ == Mode::Mma)
        w = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ldg_global_i, {words, global},
                               {b_.CreateAddrSpaceCast(at, global), b_.getInt32(static_cast<uint32_t>(piece))});
      else
        w = b_.CreateAlignedLoad(words, at, llvm::Align(static_cast<uint64_t>(piece)));
      llvm::Value* v = b_.CreateBitCast(w, lanes);
      for (int64_t l = 0; l < per; ++l) {
        llvm::Value* raw = b_.CreateExtractElement(v, static_cast<uint64_t>(l));
        out.push_back({cg_.widen(t, raw), t});
        if (t == score_in_dtype()) raw_[out.back().value] = raw->getType()->isHalfTy() ? b_.CreateBitCast(raw, b_.getInt16Ty()) : raw;
      }
    }
    return out;
  }
  // v rounded to the tiles' 16-bit dtype, as stored: a lane load8 read and nothing
  // changed is its loaded bits (no rounding code for a plain copy).
  llvm::Value* to16(llvm::Value* v) {
    if (auto it = raw_.find(v); it != raw_.end()) return it->second;
    llvm::Value* n = cg_.narrow(score_in_dtype(), v);
    return n->getType()->isHalfTy() ? b_.CreateBitCast(n, b_.getInt16Ty()) : n;
  }

  // Elements c0 .. c0 + 7 of `node` from flat index `flat` (c0 a multiple of 8 along
  // its contiguous last dim), through its prologue, as the tiles store them (to16).
  // `vector`: the dense params come in 16-byte loads.
  Result<std::vector<llvm::Value*>> lanes8(int node, llvm::Value* flat, bool vector) {
    std::map<std::string, std::vector<Elem>> loaded;
    std::vector<llvm::Value*> out;
    for (int l = 0; l < 8; ++l) {
      llvm::Value* f = l == 0 ? flat : b_.CreateAdd(flat, c(l));
      GroupValues::Hook hook;
      if (vector)
        hook = [&, l](ValueId v, const kernels::ValueIndex& at) -> std::optional<Elem> {
          const Node& n = spec_.group.node(v);
          if (n.op != OpKind::Param) return std::nullopt;
          const kernels::IndexMap map = kernels::offset_map(at, n.type.shape);
          if (!kernels::dense_runs(map, 8)) return std::nullopt;
          const int p = gv_->param_slot(v);
          const std::string key = std::to_string(p) + "#" + map.str();
          auto it = loaded.find(key);
          if (it == loaded.end())
            it = loaded.emplace(key, load8(n.type.dtype, in_[static_cast<size_t>(p)], kernels::emit_index_map(b_, flat, map)))
                     .first;
          return it->second[static_cast<size_t>(l)];
        };
      Result<llvm::Value*> x = operand(node, f, hook);
      if (!x) return x.error();
      out.push_back(to16(*x));
    }
    return out;
  }

  // For each of `rows` tile rows and chunk of 8 of its `cols`: `row_base(r)` gives the
  // node's flat index of (r, 0) and whether the row exists (else zeros), `store` puts
  // the 8 values; spread over the block's threads, a barrier after.
  Result<void> load16(int node, int64_t rows, int64_t cols, const std::string& name,
                      const std::function<std::pair<llvm::Value*, llvm::Value*>(llvm::Value*)>& row_base,
                      const std::function<void(llvm::Value*, llvm::Value*, const std::vector<llvm::Value*>&)>& store) {
    const int64_t chunks = cols / 8;
    return par(rows * chunks, name, [&](llvm::Value* i) -> Result<void> {
      llvm::Value* r = b_.CreateUDiv(i, c(chunks));
      llvm::Value* c0 = b_.CreateMul(b_.CreateURem(i, c(chunks)), c(8));
      auto [base, exists] = row_base(r);
      llvm::Value* flat = b_.CreateAdd(base, c0);
      llvm::Function* fn = b_.GetInsertBlock()->getParent();
      llvm::LLVMContext& ctx = b_.getContext();
      auto* vec = llvm::BasicBlock::Create(ctx, name + ".vec", fn);
      auto* elem = llvm::BasicBlock::Create(ctx, name + ".elem", fn);
      auto* done = llvm::BasicBlock::Create(ctx, name + ".done", fn);
      llvm::BasicBlock* from = b_.GetInsertBlock();
      b_.CreateCondBr(exists, vec, done);
      // Two bodies, the vector one where every dense param is aligned.
      b_.SetInsertPoint(vec);
      auto* vec_body = llvm::BasicBlock::Create(ctx, name + ".v", fn);
      b_.CreateCondBr(aligned_, vec_body, elem);
      b_.SetInsertPoint(vec_body);
      Result<std::vector<llvm::Value*>> a = lanes8(node, flat, true);
      if (!a) return a.error();
      llvm::BasicBlock* a_end = b_.GetInsertBlock();
      b_.CreateBr(done);
      b_.SetInsertPoint(elem);
      Result<std::vector<llvm::Value*>> e = lanes8(node, flat, false);
      if (!e) return e.error();
      llvm::BasicBlock* e_end = b_.GetInsertBlock();
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
      std::vector<llvm::Value*> lanes;
      for (size_t l = 0; l < 8; ++l) {
        llvm::PHINode* phi = b_.CreatePHI(b_.getInt16Ty(), 3);
        phi->addIncoming((*a)[l], a_end);
        phi->addIncoming((*e)[l], e_end);
        phi->addIncoming(b_.getInt16(0), from);  // +0.0 in bf16 and f16
        lanes.push_back(phi);
      }
      store(r, c0, lanes);
      return ok();
    });
  }

  // k [bn][E] and v [bn][Ev] (rows: keys kv0 + j).
  Result<void> load_kv16(llvm::Value* b, llvm::Value* kv0) {
    const int kr = k_rows_node();
    if (kr >= 0) {
      SF_TRY(load16(kr, t_.bn, t_.e, "load_k", [&](llvm::Value* j) {
        llvm::Value* key = b_.CreateAdd(kv0, j);
        return std::pair{b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.s)), key), c(m_.e)), b_.CreateICmpSLT(key, c(m_.s))};
      }, [&](llvm::Value* j, llvm::Value* c0, const std::vector<llvm::Value*>& lanes) {
        store16x8(t_.k16, b_.CreateAdd(b_.CreateMul(j, c(t_.ks)), c0), lanes);
      }));
    } else {  // kt is not a transpose: element by element from kt [.., E, S]
      SF_TRY(par(t_.bn * t_.e, "load_k", [&](llvm::Value* i) -> Result<void> {
        llvm::Value* j = b_.CreateUDiv(i, c(t_.e));
        llvm::Value* e = b_.CreateURem(i, c(t_.e));
        llvm::Value* col = b_.CreateAdd(kv0, j);
        Result<llvm::Value*> x = guarded(b_.CreateICmpSLT(col, c(m_.s)), [&]() {
          return operand(m_.kt, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.e)), e), c(m_.s)), col));
        });
        if (!x) return x.error();
        put16(t_.k16, b_.CreateAdd(b_.CreateMul(j, c(t_.ks)), e), *x);
        return ok();
      }));
    }
    return load16(m_.v, t_.bn, t_.ev, "load_v", [&](llvm::Value* j) {
      llvm::Value* key = b_.CreateAdd(kv0, j);
      return std::pair{b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.s)), key), c(m_.ev)), b_.CreateICmpSLT(key, c(m_.s))};
    }, [&](llvm::Value* j, llvm::Value* c0, const std::vector<llvm::Value*>& lanes) {
      store16x8(t_.v16, b_.CreateAdd(b_.CreateMul(j, c(t_.vs)), c0), lanes);
    });
  }

  // ---- the register-resident tensor-core form (regs_) -------------------------------
  // Warp w owns block rows 16w .. 16w + 15. Per key tile it computes its 16 x bn scores as bn / 8 mma C fragments (4 f32 a thread:
  // rows g and g + 8 of the warp's 16, columns 2 tig and 2 tig + 1 of each 8), runs the
  // chain and the online softmax on them in registers (a row's max over the 4 threads
  // of its quad by two butterfly shuffles; its sum kept per thread and added over the
  // quad once at the end, the rescaling being the same for the 4), turns the
  // probabilities into mma A fragments without leaving registers (C elements of key
  // columns 16kk .. 16kk + 15 are exactly the A elements of that k step, read off
  // mma_layout.h), and multiplies them by v into output accumulators that stay in
  // registers until the store. Shared memory holds q, k and v only.

  // v exchanged with the lane `mask` away (shfl.sync.bfly), every lane of the warp.
  llvm::Value* shfl_xor(llvm::Value* v, int mask) {
    if (mode_ == Mode::Mma)
      return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_shfl_sync_bfly_f32, {},
                                {b_.getInt32(0xffffffffu), v, b_.getInt32(static_cast<uint32_t>(mask)), b_.getInt32(0x1f)});
    auto* fty = llvm::FunctionType::get(b_.getFloatTy(), {b_.getPtrTy(), b_.getInt32Ty(), b_.getFloatTy(), b_.getInt32Ty()}, false);
    return b_.CreateCall(fty, hook_[4], {hook_[0], tid32_, v, b_.getInt32(static_cast<uint32_t>(mask))});
  }
  // exp(x) for x <= 0 whose result is rounded to 16 bits before use (p for the second
  // product) or scales such values (alpha): 2^(x log2 e), one ex2.approx.ftz on the
  // GPU (relative error 2^-22, against libdevice's expf's eight or so instructions),
  // as FlashAttention's exp2f. A denormal result flushes to 0, below anything a
  // 16-bit p keeps next to the row's largest, which is 1.
  llvm::Value* exp_rounded(llvm::Value* x) {
    llvm::Value* y = b_.CreateFMul(x, llvm::ConstantFP::get(b_.getFloatTy(), 1.4426950408889634));
    if (mode_ == Mode::Mma) return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {y});
    return b_.CreateUnaryIntrinsic(llvm::Intrinsic::exp2, y);
  }
  llvm::Value* fmax_keep(llvm::Value* a, llvm::Value* x) { return b_.CreateSelect(b_.CreateFCmpOGT(x, a), x, a); }

  // Where A element e (0..7) of a 16 x 16 k step lies among the C fragments of its two
  // 16 x 8 column tiles: (tile 0 or 1, C element), from mma_layout.h's maps.
  static std::pair<int, int> a_from_c(int e) {
    auto [ar, ac] = fragment_map(kernels::mma_a_elem, e);
    for (int tile = 0; tile < 2; ++tile)
      for (int i = 0; i < 4; ++i) {
        auto [cr, cc] = fragment_map(kernels::mma_c_elem, i);
        if (cr.base == ar.base && cr.by_g == ar.by_g && cr.by_tig == ar.by_tig && cc.base + 8 * tile == ac.base &&
            cc.by_g == ac.by_g && cc.by_tig == ac.by_tig)
          return {tile, i};
      }
    return {-1, -1};
  }

  Result<void> warp_rows(llvm::Value* b, llvm::Value* kv_end) {
    llvm::Type* f32 = b_.getFloatTy();
    for (int e = 0; e < 8; ++e)
      if (a_from_c(e).first < 0) return fail("internal: an A fragment element is no C fragment element");
    // frag16's words: elements 2r and 2r + 1 of A (row m, col k) and B (row k, col n)
    // are neighbours along k.
    for (int lane : {0, 5, 31})
      for (int i = 0; i < 8; i += 2) {
        const kernels::RowCol a0 = kernels::mma_a_elem(lane, i), a1 = kernels::mma_a_elem(lane, i + 1);
        if (a1.row != a0.row || a1.col != a0.col + 1) return fail("internal: A fragment pairs do not run along k");
        if (i >= 4) continue;
        const kernels::RowCol b0 = kernels::mma_b_elem(lane, i), b1 = kernels::mma_b_elem(lane, i + 1);
        if (b1.col != b0.col || b1.row != b0.row + 1) return fail("internal: B fragment pairs do not run along k");
      }
    if (!same_lane_terms(kernels::mma_a_elem, 8) || !same_lane_terms(kernels::mma_b_elem, 4) ||
        !same_lane_terms(kernels::mma_c_elem, 4))
      return fail("internal: an mma map whose elements move with the lane differently");
    m0w_ = b_.CreateMul(warp_, c(16), "m0w");
    // ldmatrix.x4's row addresses (mma_layout.h): A stored m x k, lane l points at
    // (l % 16, 8 (l / 16)): registers a0a1 .. a6a7; B stored n x k (k's tile), lane l
    // at (l % 8 + 8 (l / 16), 8 ((l / 8) % 2)): registers b0b1, b2b3 of two n8 tiles;
    // B stored k x n (v's tile, rows keys), read with .trans, at A's addresses.
    for (int l = 0; l < 32; ++l)
      if (kernels::ldmatrix_x4_a_addr(l) != kernels::RowCol{l % 16, 8 * (l / 16)} ||
          kernels::ldmatrix_x4_b_addr(l, kernels::SmemB::NxK) != kernels::RowCol{l % 8 + 8 * (l / 16), 8 * ((l / 8) % 2)} ||
          kernels::ldmatrix_x4_b_addr(l, kernels::SmemB::KxN) != kernels::RowCol{l % 16, 8 * (l / 16)} ||
          !kernels::ldmatrix_b_trans(kernels::SmemB::KxN) || kernels::ldmatrix_b_trans(kernels::SmemB::NxK))
        return fail("internal: ldmatrix row addresses differ from mma_layout.h's");
    {
      llvm::Value* lane = b_.CreateURem(tid_, c(32));
      llvm::Value* l16 = b_.CreateURem(lane, c(16));
      llvm::Value* hi = b_.CreateUDiv(lane, c(16));
      llvm::Value* l8 = b_.CreateAdd(b_.CreateURem(lane, c(8)), b_.CreateMul(hi, c(8)));
      llvm::Value* mid = b_.CreateURem(b_.CreateUDiv(lane, c(8)), c(2));
      auto row_ptr = [&](int64_t base, int64_t stride, llvm::Value* row, llvm::Value* col) {
        return b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_,
                                    b_.CreateAdd(c(base), b_.CreateMul(b_.CreateAdd(b_.CreateMul(row, c(stride)), col), c(2))));
      };
      qrow_ = row_ptr(t_.q16, t_.qs, b_.CreateAdd(m0w_, l16), b_.CreateMul(hi, c(8)));
      krow_ = row_ptr(t_.k16, t_.ks, l8, b_.CreateMul(mid, c(8)));
      vrow_ = row_ptr(t_.v16, t_.vs, l16, b_.CreateMul(hi, c(8)));
    }
    // Every ldmatrix phase is one wavefront: its 8 rows in 8 distinct 16-byte slots
    // of a 128-byte line (the rows' padding).
    for (int64_t stride : {t_.qs, t_.ks, t_.vs}) {
      std::vector<int64_t> slots;
      for (int64_t r = 0; r < 8; ++r) slots.push_back(r * stride * 2 % 128 / 16);
      std::sort(slots.begin(), slots.end());
      if (std::adjacent_find(slots.begin(), slots.end()) != slots.end())
        return fail("internal: an ldmatrix phase over rows of " + std::to_string(stride) + " elements hits a bank twice");
    }
    o_.clear();
    for (int64_t i = 0; i < t_.ev / 8 * 4; ++i) {
      o_.push_back(slot());
      b_.CreateStore(llvm::ConstantFP::get(f32, 0.0), o_.back());
    }
    for (int h = 0; h < 2; ++h) {
      mrow_[h] = slot();
      lrow_[h] = slot();
      b_.CreateStore(llvm::ConstantFP::getInfinity(f32, true), mrow_[h]);
      b_.CreateStore(llvm::ConstantFP::get(f32, 0.0), lrow_[h]);
    }
    SF_TRY(emit_loop(b_, c(0), kv_end, c(t_.bn), "kv", [&](llvm::Value* kv0) -> Result<void> {
      SF_TRY(load_kv(b, kv0));
      SF_TRY(key_tile_regs(kv0));
      barrier();  // every warp is done with this k and v before the next tile's loads
      return ok();
    }));
    // Each row's sum over its quad; out = acc / sum, rows g and g + 8 of the warp.
    // One division a row (the output is rounded to 16 bits: 1 / l then a product is
    // within its tolerance); 1 / 0 = inf keeps a fully masked row's 0 * inf = NaN.
    llvm::Value* l[2];
    for (int h = 0; h < 2; ++h) {
      llvm::Value* x = b_.CreateLoad(f32, lrow_[h]);
      x = b_.CreateFAdd(x, shfl_xor(x, 1));
      l[h] = b_.CreateFDiv(llvm::ConstantFP::get(f32, 1.0), b_.CreateFAdd(x, shfl_xor(x, 2)));
    }
    for (int64_t t = 0; t < t_.ev / 8; ++t)
      for (int i = 0; i < 4; ++i) {
        auto [cr, cc] = fragment_map(kernels::mma_c_elem, i);
        llvm::Value* rr = b_.CreateAdd(m0w_, coord(cr, g_, tig_));
        llvm::Value* cl = b_.CreateAdd(c(8 * t), coord(cc, g_, tig_));
        llvm::Value* row = row_of(rr);
        llvm::Value* y = b_.CreateFMul(b_.CreateLoad(f32, o_[static_cast<size_t>(t * 4 + i)]), l[i / 2]);
        SF_TRY(when(b_.CreateICmpSLT(row, c(m_.l)), [&]() -> Result<void> {
          cg_.store(Elem{y, out_dtype()}, out_, store_offset(head_of(rr), row, cl));
          return ok();
        }));
      }
    return ok();
  }

  Result<void> key_tile_regs(llvm::Value* kv0) {
    llvm::Type* f32 = b_.getFloatTy();
    const int64_t nt = t_.bn / 8;
    // S = q k^T: B(k, n) = the k tile (n, k).
    // Each k step's q fragment is read from shared memory once per key tile (holding
    // all E / 16 of them across the loop took 32 registers a thread more, which the
    // E = 128 kernel spilled).
    std::vector<std::vector<llvm::Value*>> sc(static_cast<size_t>(nt), std::vector<llvm::Value*>(4, llvm::ConstantFP::get(f32, 0.0)));
    // Fragments by ldmatrix.x4: q's A fragment per k step, k's B fragments two n8
    // tiles at a time (bn / 8 is even: bn is a multiple of 16).
    for (int64_t k0 = 0; k0 < t_.e; k0 += 16) {
      std::vector<llvm::Value*> qa = ldsm_x4(qrow_, k0 * 2);
      for (int64_t j = 0; j < nt; j += 2) {
        std::vector<llvm::Value*> kb = ldsm_x4(krow_, (8 * j * t_.ks + k0) * 2);
        sc[static_cast<size_t>(j)] = mma(qa, {kb[0], kb[1]}, sc[static_cast<size_t>(j)]);
        sc[static_cast<size_t>(j + 1)] = mma(qa, {kb[2], kb[3]}, sc[static_cast<size_t>(j + 1)]);
      }
    }
    // The chain on every element (row, key): -inf outside the rows and keys.
    for (int64_t j = 0; j < nt; ++j)
      for (int i = 0; i < 4; ++i) {
        auto [cr, cc] = fragment_map(kernels::mma_c_elem, i);
        llvm::Value* r = b_.CreateAdd(m0w_, coord(cr, g_, tig_));
        llvm::Value* col = b_.CreateAdd(kv0, b_.CreateAdd(c(8 * j), coord(cc, g_, tig_)));
        llvm::Value* raw = sc[static_cast<size_t>(j)][static_cast<size_t>(i)];
        Result<llvm::Value*> v = logit(r, col, [&]() -> Result<llvm::Value*> { return raw; });
        if (!v) return v.error();
        sc[static_cast<size_t>(j)][static_cast<size_t>(i)] = *v;
      }
    // Online softmax per row half h (C elements 2h and 2h + 1: rows g and g + 8).
    llvm::Value* alpha[2];
    for (int h = 0; h < 2; ++h) {
      llvm::Value* mx = b_.CreateLoad(f32, mrow_[h]);
      llvm::Value* m_old = mx;
      for (int64_t j = 0; j < nt; ++j)
        for (int e = 0; e < 2; ++e) mx = fmax_keep(mx, sc[static_cast<size_t>(j)][static_cast<size_t>(2 * h + e)]);
      mx = fmax_keep(mx, shfl_xor(mx, 1));
      mx = fmax_keep(mx, shfl_xor(mx, 2));
      // A row that has seen only -inf keeps subtracting 0: exp(-inf - 0) = 0, no NaN.
      llvm::Value* m_safe = b_.CreateSelect(b_.CreateFCmpOEQ(mx, llvm::ConstantFP::getInfinity(f32, true)),
                                            llvm::ConstantFP::get(f32, 0.0), mx);
      alpha[h] = exp_rounded(b_.CreateFSub(m_old, m_safe));
      llvm::Value* sum = llvm::ConstantFP::get(f32, 0.0);
      for (int64_t j = 0; j < nt; ++j)
        for (int e = 0; e < 2; ++e) {
          llvm::Value*& x = sc[static_cast<size_t>(j)][static_cast<size_t>(2 * h + e)];
          x = exp_rounded(b_.CreateFSub(x, m_safe));
          sum = b_.CreateFAdd(sum, x);
        }
      b_.CreateStore(b_.CreateFAdd(b_.CreateFMul(b_.CreateLoad(f32, lrow_[h]), alpha[h]), sum), lrow_[h]);
      b_.CreateStore(mx, mrow_[h]);
    }
    // acc = acc * alpha + p v, p's A fragments straight from the C fragments.
    std::vector<std::vector<llvm::Value*>> o(static_cast<size_t>(t_.ev / 8));
    for (int64_t t = 0; t < t_.ev / 8; ++t)
      for (int i = 0; i < 4; ++i)
        o[static_cast<size_t>(t)].push_back(b_.CreateFMul(b_.CreateLoad(f32, o_[static_cast<size_t>(t * 4 + i)]), alpha[i / 2]));
    for (int64_t kk = 0; kk < t_.bn / 16; ++kk) {
      llvm::Value* el[8];
      for (int e = 0; e < 8; ++e) {
        auto [tile, i] = a_from_c(e);
        el[e] = sc[static_cast<size_t>(2 * kk + tile)][static_cast<size_t>(i)];
      }
      std::vector<llvm::Value*> a = {pack(el[0], el[1]), pack(el[2], el[3]), pack(el[4], el[5]), pack(el[6], el[7])};
      // v's B fragments two n8 tiles at a time by ldmatrix.x4.trans (rows are keys);
      // an odd last tile (Ev / 8 odd) reads 8 columns of the row's padding into
      // registers it does not use.
      for (int64_t t = 0; t < t_.ev / 8; t += 2) {
        std::vector<llvm::Value*> vb = ldsm_x4(vrow_, (16 * kk * t_.vs + 8 * t) * 2, /*trans=*/true);
        o[static_cast<size_t>(t)] = mma(a, {vb[0], vb[1]}, o[static_cast<size_t>(t)]);
        if (t + 1 < t_.ev / 8) o[static_cast<size_t>(t + 1)] = mma(a, {vb[2], vb[3]}, o[static_cast<size_t>(t + 1)]);
      }
    }
    for (int64_t t = 0; t < t_.ev / 8; ++t)
      for (int i = 0; i < 4; ++i) b_.CreateStore(o[static_cast<size_t>(t)][static_cast<size_t>(i)], o_[static_cast<size_t>(t * 4 + i)]);
    return ok();
  }

  DType score_dtype() const { return spec_.group.node(m_.scores).type.dtype; }
  // The host's dot products: 8 lanes, 2 partial sums (a reordered f32 sum, as the
  // host matmul's); none on NVPTX, where a thread's sum stays in order.
  kernels::LoopHints host_hints() const { return threaded() ? kernels::LoopHints{} : kernels::LoopHints{8, 2}; }

  // The batch dims' coordinates of flat batch index b, outermost first.
  std::vector<llvm::Value*> batch_coords(llvm::Value* b) {
    const size_t nb = m_.batch.size();
    std::vector<llvm::Value*> out(nb);
    int64_t inner = 1;
    for (size_t d = nb; d-- > 0;) {
      out[d] = b_.CreateURem(b_.CreateUDiv(b, c(inner)), c(std::max<int64_t>(m_.batch[d], 1)));
      inner *= std::max<int64_t>(m_.batch[d], 1);
    }
    return out;
  }

  // The element offset of (batch b, row, col) of the attention's result in the output.
  llvm::Value* store_offset(llvm::Value* b, llvm::Value* row, llvm::Value* col) {
    const std::vector<int64_t>& st = info_.out_strides;
    const size_t nb = m_.batch.size();
    llvm::Value* off = b_.CreateAdd(b_.CreateMul(row, c(st[nb])), b_.CreateMul(col, c(st[nb + 1])));
    std::vector<llvm::Value*> coords = batch_coords(b);
    for (size_t d = 0; d < nb; ++d) off = b_.CreateAdd(off, b_.CreateMul(coords[d], c(st[d])));
    return off;
  }

  const KernelSpec& spec_;
  const AttentionKernelInfo& info_;
  const AttentionMatch& m_;
  const Tiles& t_;
  Mode mode_;
  llvm::Value* hook_[5] = {};
  bool regs_ = false;
  // The register-resident form: the warp's first row, its output accumulators (ev / 8
  // C fragments) and its rows' running max and partial sum (rows g and g + 8), as
  // entry-block slots mem2reg promotes.
  llvm::Value* m0w_ = nullptr;
  llvm::Value *qrow_ = nullptr, *krow_ = nullptr, *vrow_ = nullptr;     // ldmatrix.x4 row addresses
  std::vector<llvm::Value*> in_;     // the kernel's inputs
  std::set<int> vec_params_;         // params read in dense runs of 8 (plan_vector_loads)
  llvm::Value* aligned_ = nullptr;   // every one of them 16-byte aligned
  std::map<llvm::Value*, llvm::Value*> raw_;  // load8's widened lanes -> their loaded 16-bit bits
  std::vector<llvm::Value*> o_;
  llvm::Value* mrow_[2] = {};
  llvm::Value* lrow_[2] = {};
  llvm::Value* tid32_ = nullptr;
  llvm::Value *warp_ = nullptr, *warps_ = nullptr, *g_ = nullptr, *tig_ = nullptr;
  int64_t group_ = 1, rph_ = 1;
  llvm::Value *b0_ = nullptr, *q0_ = nullptr;
  llvm::IRBuilderBase& b_;
  ElementCodegen& cg_;
  GroupValues* gv_ = nullptr;
  llvm::Value *buf_ = nullptr, *tid_ = nullptr, *nthreads_ = nullptr, *out_ = nullptr;
};

class AttentionEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_attention(spec, config, target);
  }
};

}  // namespace


namespace {

Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target, Mode mode) {
  Result<AttentionKernelInfo> info = attention_info(spec.group);
  if (!info) return info.error();
  const AttentionMatch& m = info->match;
  if (config.block_m < 1 || config.block_m > 256 || config.block_n < 1 || config.block_n > 256)
    return fail("block_m and block_n must be 1..256, got " + std::to_string(config.block_m) + ", " +
                std::to_string(config.block_n));
  if (mode != Mode::Host && (config.warps < 1 || config.warps > 32))
    return fail("warps must be 1..32, got " + std::to_string(config.warps));
  const bool tc = mode == Mode::Mma || mode == Mode::MmaSim;
  const AttentionBlockShape shape = attention_block_shape(*info, config, tc);
  const int64_t group = shape.group, rph = shape.rows_per_head;
  const bool regs = shape.registers;
  const Tiles t(shape.bm, shape.bn, m.e, m.ev, regs);
  const int64_t bytes = t.bytes();
  const llvmb::Target budget_target = mode == Mode::MmaSim ? llvmb::Target::nvptx("sm_90a") : target;
  if (bytes > attention_tile_budget(budget_target))
    return fail("block_m " + std::to_string(t.bm) + " x block_n " + std::to_string(t.bn) + " tiles take " +
                std::to_string(bytes) + " bytes, over the " + std::to_string(attention_tile_budget(budget_target)) +
                " a block may hold on " + budget_target.str());

  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  llvm::IRBuilder<> b(*k.context);
  ElementCodegen cg(b, *k.module, target, spec.precision);
  const int threads = config.warps * 32;
  const size_t np = spec.group.params().size();
  AttentionCode code(spec, *info, t, mode, b, cg);
  code.set_groups(group, rph);
  code.set_registers(regs);
  const int64_t blocks = code.blocks();
  Result<void> r;
  if (mode == Mode::Simt || mode == Mode::Mma) {
    kernels::KernelEntry ke = kernels::begin_nvptx_kernel(*k.module, b, spec.entry, np, 1, threads);
    auto* arr = llvm::ArrayType::get(b.getInt8Ty(), 0);
    auto* smem = new llvm::GlobalVariable(*k.module, arr, false, llvm::GlobalValue::ExternalLinkage, nullptr, "sf_smem",
                                          nullptr, llvm::GlobalValue::NotThreadLocal, 3);
    smem->setAlignment(llvm::Align(16));
    auto sreg = [&](llvm::Intrinsic::ID id) { return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), b.getInt64Ty()); };
    llvm::Value* tid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
    llvm::Value* bid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
    llvm::Function* fn = b.GetInsertBlock()->getParent();
    auto* body = llvm::BasicBlock::Create(*k.context, "block", fn);
    auto* exit = llvm::BasicBlock::Create(*k.context, "exit", fn);
    b.CreateCondBr(b.CreateICmpULT(bid, b.getInt64(static_cast<uint64_t>(blocks))), body, exit);
    b.SetInsertPoint(body);
    r = code.block(bid, smem, tid, b.getInt64(static_cast<uint64_t>(threads)), ke.in, ke.out[0]);
    if (!r) return r.error();
    b.CreateBr(exit);
    b.SetInsertPoint(exit);
  } else if (mode == Mode::MmaSim) {
    // void entry(ptr args, i32 blockIdx.x, i32 blockIdx.y, i32 threadIdx.x, ptr smem, ptr hooks,
    // i32 blockIdx.z): the tensor-core matmul's simulation ABI (matmul.h).
    llvm::Type* i32 = b.getInt32Ty();
    kernels::KernelEntry ke = kernels::begin_host_kernel(*k.module, b, spec.entry, np, 1, {i32, i32, i32, b.getPtrTy(), b.getPtrTy(), i32});
    llvm::Function* fn = ke.fn;
    code.sim_hooks(fn->getArg(5), fn->getArg(3));
    llvm::Value* bid = b.CreateZExt(fn->getArg(1), b.getInt64Ty());
    llvm::Value* tid = b.CreateZExt(fn->getArg(3), b.getInt64Ty());
    r = code.block(bid, fn->getArg(4), tid, b.getInt64(static_cast<uint64_t>(threads)), ke.in, ke.out[0]);
    if (!r) return r.error();
  } else {
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return fail(*e);
    kernels::KernelEntry ke = kernels::begin_host_kernel(*k.module, b, spec.entry, np, 1);
    llvm::Value* buf = b.CreateAlloca(b.getFloatTy(), b.getInt64(static_cast<uint64_t>(t.floats)), "tiles");
    llvm::cast<llvm::AllocaInst>(buf)->setAlignment(llvm::Align(16));
    r = emit_loop(b, b.getInt64(0), b.getInt64(static_cast<uint64_t>(blocks)), b.getInt64(1), "block",
                  [&](llvm::Value* bid) { return code.block(bid, buf, nullptr, nullptr, ke.in, ke.out[0]); });
    if (!r) return r.error();
  }
  if (mode != Mode::Host) {
    k.launch.grid = {std::max<int64_t>(blocks, 1), 1, 1};
    k.launch.block = {threads, 1, 1};
    k.launch.shared_bytes = static_cast<int>(bytes);
  }
  b.CreateRetVoid();
  if (auto err = llvmb::verify(*k.module)) return fail("internal: invalid module: " + *err);
  return k;
}

}  // namespace

AttentionBlockShape attention_block_shape(const AttentionKernelInfo& info, const KernelConfig& config, bool tensor_cores) {
  const AttentionMatch& m = info.match;
  // A tile past the rows or keys there are holds only padding: it is cut to them
  // (rounded up to 16 for the tensor cores' tiles), so a default tile costs a short
  // sequence nothing.
  auto fit = [&](int64_t tile, int64_t extent) {
    int64_t want = std::max<int64_t>(extent, 1);
    if (tensor_cores) want = (want + 15) / 16 * 16;
    return std::min(tile, want);
  };
  AttentionBlockShape s;
  // GQA: a block takes a whole group's rows, block_m / G of each head.
  s.group = info.heads_per_kv;
  if (config.block_m % s.group != 0) s.group = 1;
  s.rows_per_head = config.block_m / s.group;
  int64_t want = std::max<int64_t>(m.l, 1);
  const int64_t step = tensor_cores ? 16 / std::gcd<int64_t>(16, s.group) : 1;  // G * rph stays a multiple of 16
  want = (want + step - 1) / step * step;
  s.rows_per_head = std::min(s.rows_per_head, want);
  s.bm = s.rows_per_head * s.group;
  s.bn = fit(config.block_n, m.s);
  // The register-resident form where each warp gets 16 rows of the (cut) tile.
  s.registers = tensor_cores && s.bm == 16 * int64_t{config.warps};
  return s;
}

bool attention_uses_tensor_cores(const KernelSpec& spec, const KernelConfig& config, const std::string& arch) {
  std::optional<int> sm = kernels::sm_version(arch);
  return sm && *sm >= 80 && !attention_mma_unfit(spec.group, config);
}

Result<EmittedKernel> emit_attention(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target) {
  if (target.kind == llvmb::Target::Kind::Host) return emit(spec, config, target, Mode::Host);
  return emit(spec, config, target, attention_uses_tensor_cores(spec, config, target.arch) ? Mode::Mma : Mode::Simt);
}

Result<EmittedKernel> emit_attention_block_on_host(const KernelSpec& spec, const KernelConfig& config) {
  if (std::optional<std::string> why = attention_mma_unfit(spec.group, config)) return fail("no tensor-core kernel: " + *why);
  return emit(spec, config, llvmb::Target::host(), Mode::MmaSim);
}

const Emitter& attention_emitter() {
  static const AttentionEmitter e;
  return e;
}

}  // namespace sf
