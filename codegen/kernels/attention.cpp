// The fused attention emitter (codegen/kernels/attention.h): the host loops, the SIMT
// kernel and the tensor-core kernel's shared-memory form, block by block through
// AttentionCode (attention_code.h; the register-resident form is in
// attention_registers.cpp), and the Emitter.
#include "codegen/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "autotune/space.h"
#include "codegen/kernels/attention_code.h"

namespace sf {

namespace attention_detail {

void AttentionCode::sim_hooks(llvm::Value* hooks, llvm::Value* tid32) {
  // hook_[i] = MmaSimHooks' pointer number field[i] (attention_code.h).
  static constexpr uint64_t field[19] = {0, 1, 2, 3, 16, 5, 6, 7, 18, 8, 9, 4, 10, 11, 12, 13, 14, 15, 17};
  for (int i = 0; i < 19; ++i)
    hook_[i] = b_.CreateAlignedLoad(b_.getPtrTy(), b_.CreateConstInBoundsGEP1_64(b_.getPtrTy(), hooks, field[i]),
                                    llvm::Align(8));
  tid32_ = tid32;
}

Result<void> AttentionCode::block(llvm::Value* bid, llvm::Value* buf, llvm::Value* tid, llvm::Value* nthreads,
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
  llvm::Value* kvg = b_.CreateUDiv(bid, c(qtiles));  // the block's kv-head group
  llvm::Value* tile = b_.CreateURem(bid, c(qtiles));  // its query tile
  if (lpt_width_ > 0) {
    // Longest first (set_order): section s holds groups s w .. s w + n - 1 (n = w but
    // in the last section, which takes what is left) and walks its query tiles from
    // the last (the rows that see the most keys) down, the section's groups side by
    // side at each tile.
    const int64_t groups = info_.batches / group_, w = std::min(lpt_width_, groups);
    llvm::Value* first = b_.CreateMul(b_.CreateUDiv(bid, c(w * qtiles)), c(w));
    llvm::Value* in = b_.CreateURem(bid, c(w * qtiles));
    llvm::Value* n = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateSub(c(groups), first), c(w));
    kvg = b_.CreateAdd(first, b_.CreateURem(in, n));
    tile = b_.CreateSub(c(qtiles - 1), b_.CreateUDiv(in, n));
  }
  llvm::Value* b = b_.CreateMul(kvg, c(group_), "batch");
  llvm::Value* q0 = b_.CreateMul(tile, c(rph_), "q0");
  b0_ = b;
  q0_ = q0;
  if (ws_) producer_branch(b, key_end(q0));
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
    // q [bm][E]: block row r is row row_of(r) of head head_of(r). A plain view of an
    // aligned param is copied by cp.async: its group is committed with key tile 0's,
    // and the key loop's first wait and barrier publish both.
    auto q_row = [&](llvm::Value* r) {
      llvm::Value* row = row_of(r);
      return std::pair{b_.CreateMul(b_.CreateAdd(b_.CreateMul(head_of(r), c(m_.l)), row), c(m_.e)),
                       b_.CreateICmpSLT(row, c(m_.l))};
    };
    std::optional<std::pair<int, kernels::IndexMap>> qsrc = copy_source(m_.q);
    const int64_t qstride = t_.wgmma ? 0 : t_.qs;
    SF_TRY(copy_or_load(qsrc, [&]() { return copy16(*qsrc, t_.bm, t_.e, "copy_q", t_.q16, qstride, c(0), q_row); }, [&]() {
      return load16(m_.q, t_.bm, t_.e, "load_q", q_row, [&](llvm::Value* r, llvm::Value* c0, const std::vector<llvm::Value*>& lanes) {
        store16x8(t_.q16, tile_index(r, c0, qstride, t_.bm), lanes);
      });
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

  llvm::Value* kv_end = key_end(q0);
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

llvm::Value* AttentionCode::key_end(llvm::Value* q0) {
  if (!m_.causal_diagonal) return c(m_.s);
  llvm::Value* last = b_.CreateAdd(q0, c(rph_ + *m_.causal_diagonal));
  last = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, last, c(0));
  return b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, last, c(m_.s), nullptr, "kv_end");
}

llvm::Value* AttentionCode::pack(llvm::Value* x, llvm::Value* y) {
  auto bits = [&](llvm::Value* v) {
    llvm::Value* n = cg_.narrow(score_in_dtype(), v);  // i16 (bf16) or half (f16)
    if (n->getType()->isHalfTy()) n = b_.CreateBitCast(n, b_.getInt16Ty());
    return b_.CreateZExt(n, b_.getInt32Ty());
  };
  return b_.CreateOr(bits(x), b_.CreateShl(bits(y), 16));
}

std::vector<llvm::Value*> AttentionCode::frag_a(int64_t base, int64_t stride, llvm::Value* m0, llvm::Value* k0) {
  std::vector<llvm::Value*> e;
  for (int i = 0; i < 8; ++i) {
    auto [r, col] = fragment_map(kernels::mma_a_elem, i);
    llvm::Value* row = b_.CreateAdd(m0, coord(r, g_, tig_));
    e.push_back(get(base, b_.CreateAdd(b_.CreateMul(row, c(stride)), b_.CreateAdd(k0, coord(col, g_, tig_)))));
  }
  return {pack(e[0], e[1]), pack(e[2], e[3]), pack(e[4], e[5]), pack(e[6], e[7])};
}

std::vector<llvm::Value*> AttentionCode::frag_b(int64_t base, int64_t k_stride, int64_t n_stride, llvm::Value* k0, llvm::Value* n0) {
  std::vector<llvm::Value*> e;
  for (int i = 0; i < 4; ++i) {
    auto [r, col] = fragment_map(kernels::mma_b_elem, i);
    llvm::Value* k = b_.CreateAdd(k0, coord(r, g_, tig_));
    llvm::Value* n = b_.CreateAdd(n0, coord(col, g_, tig_));
    e.push_back(get(base, b_.CreateAdd(b_.CreateMul(k, c(k_stride)), b_.CreateMul(n, c(n_stride)))));
  }
  return {pack(e[0], e[1]), pack(e[2], e[3])};
}

llvm::Value* AttentionCode::c_index(int i, llvm::Value* m0, llvm::Value* n0, int64_t stride, llvm::Value** row_out) {
  auto [r, col] = fragment_map(kernels::mma_c_elem, i);
  llvm::Value* row = b_.CreateAdd(m0, coord(r, g_, tig_));
  if (row_out) *row_out = row;
  return b_.CreateAdd(b_.CreateMul(row, c(stride)), b_.CreateAdd(n0, coord(col, g_, tig_)));
}

std::vector<llvm::Value*> AttentionCode::mma(const std::vector<llvm::Value*>& a, const std::vector<llvm::Value*>& bf,
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

Result<void> AttentionCode::per_warp_tile(int64_t tiles, const std::string& name, const std::function<Result<void>(llvm::Value*)>& body) {
  Result<void> r = emit_loop(b_, warp_, c(tiles), warps_, name, body);
  if (!r) return r;
  barrier();
  return r;
}

Result<void> AttentionCode::accumulate(llvm::Value* acc, int64_t k, const std::string& name,
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

Result<void> AttentionCode::when(llvm::Value* cond, const std::function<Result<void>()>& body) {
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

Result<llvm::Value*> AttentionCode::guarded(llvm::Value* cond, const std::function<Result<llvm::Value*>()>& body,
                             llvm::Value* other) {
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

Result<llvm::Value*> AttentionCode::operand(int v, llvm::Value* flat, GroupValues::Hook hook,
                             std::vector<llvm::Value*> coords) {
  gv_->at_index(flat, std::move(hook));
  if (!coords.empty()) gv_->known_coordinates(spec_.group.node(v).type.shape, std::move(coords));
  Result<Elem> x = gv_->value(v, kernels::dense_index(spec_.group.node(v).type.shape));
  if (!x) return x.error();
  if (!is_float(x->dtype)) return fail("operand " + spec_.group.node(v).type.str() + " is not a float tensor");
  return x->value;  // f32/f16/bf16 compute as float
}

Result<llvm::Value*> AttentionCode::chain_value(int node, llvm::Value* r, llvm::Value* col, llvm::Value* raw) {
  llvm::Value* row = row_of(r);
  llvm::Value* dot = cg_.node_result(score_dtype(), raw);
  const int scores = m_.scores;
  const DType sd = score_dtype();
  llvm::Value* head = head_of(r);
  llvm::Value* flat = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(head, c(m_.l)), row), c(m_.s)), col);
  std::vector<llvm::Value*> coords = batch_coords(head);
  coords.push_back(row);
  coords.push_back(col);
  const int folded = fold_node_;  // scale_fold's product, read as the raw scores
  return operand(
      node, flat,
      [scores, folded, sd, dot](ValueId v, const kernels::ValueIndex&) -> std::optional<Elem> {
        if (v == scores || v == folded) return Elem{dot, sd};
        return std::nullopt;
      },
      std::move(coords));
}

std::optional<std::pair<double, int>> AttentionCode::scale_fold() const {
  if (spec_.precision != Precision::Fused) return std::nullopt;
  const Graph& g = spec_.group;
  auto chained = [&](int v) { return std::find(m_.chain.begin(), m_.chain.end(), v) != m_.chain.end() || v == m_.scores; };
  auto scalar = [&](int v) -> std::optional<double> {
    const Node& n = g.node(v);
    if (n.op != OpKind::Constant || !n.type.shape.empty()) return std::nullopt;
    return n.attrs.get_float("value");
  };
  // Down from the logits through masks: where(cond, x, -inf), cond not read from the scores.
  int v = m_.logits;
  while (g.node(v).op == OpKind::Where) {
    const Node& w = g.node(v);
    if (w.inputs.size() != 3 || chained(w.inputs[0])) return std::nullopt;
    const std::optional<double> other = scalar(w.inputs[2]);
    if (!other || !(std::isinf(*other) && *other < 0)) return std::nullopt;
    if (g.node(w.inputs[1]).type.shape != w.type.shape) return std::nullopt;
    v = w.inputs[1];
  }
  // ... to the scores times a positive constant.
  const Node& mul = g.node(v);
  if (mul.op != OpKind::Mul || mul.inputs.size() != 2) return std::nullopt;
  const int other = mul.inputs[0] == m_.scores ? mul.inputs[1] : mul.inputs[1] == m_.scores ? mul.inputs[0] : -1;
  if (other < 0) return std::nullopt;
  const std::optional<double> c = scalar(other);
  if (!c || !(*c > 0) || !std::isfinite(*c) || mul.type.shape != g.node(m_.scores).type.shape) return std::nullopt;
  return std::pair{*c, v};
}

Result<llvm::Value*> AttentionCode::logit(llvm::Value* r, llvm::Value* col, const std::function<Result<llvm::Value*>()>& raw) {
  llvm::Value* inside = b_.CreateAnd(b_.CreateICmpSLT(row_of(r), c(m_.l)), b_.CreateICmpSLT(col, c(m_.s)));
  return guarded(
      inside,
      [&]() -> Result<llvm::Value*> {
        Result<llvm::Value*> rv = raw();
        if (!rv) return rv;
        return chain_value(m_.logits, r, col, *rv);
      },
      llvm::ConstantFP::getInfinity(b_.getFloatTy(), true));
}

int AttentionCode::unmasked_node() const {
  if (!m_.causal_diagonal) return m_.logits;
  const Node& w = spec_.group.node(m_.logits);
  if (w.op != OpKind::Where || w.inputs.size() != 3) return -1;
  const Node& kept = spec_.group.node(w.inputs[1]);
  return kept.type.shape == w.type.shape ? w.inputs[1] : -1;
}

Result<llvm::Value*> AttentionCode::logit_inside(llvm::Value* r, llvm::Value* col, llvm::Value* raw) {
  const int node = unmasked_node();
  if (node < 0) return fail("internal: no unmasked logits");
  return chain_value(node, r, col, raw);
}

Result<void> AttentionCode::key_tile(llvm::Value* b, llvm::Value* kv0) {
  SF_TRY(load_kv(b, kv0));
  return products(kv0);
}

Result<void> AttentionCode::load_k_elements(llvm::Value* b, llvm::Value* kv0,
                                            const std::function<void(llvm::Value*, llvm::Value*, llvm::Value*, llvm::Value*)>& store) {
  return par(t_.bn * t_.e, "load_k", [&](llvm::Value* i) -> Result<void> {
    llvm::Value* j = b_.CreateUDiv(i, c(t_.e));
    llvm::Value* e = b_.CreateURem(i, c(t_.e));
    llvm::Value* col = b_.CreateAdd(kv0, j);
    Result<llvm::Value*> x = guarded(b_.CreateICmpSLT(col, c(m_.s)), [&]() {
      return operand(m_.kt, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.e)), e), c(m_.s)), col));
    });
    if (!x) return x.error();
    store(i, j, e, *x);
    return ok();
  });
}

Result<void> AttentionCode::load_kv(llvm::Value* b, llvm::Value* kv0) {
  SF_TRY(load_k_elements(b, kv0, [&](llvm::Value* i, llvm::Value*, llvm::Value*, llvm::Value* x) { put(t_.k, i, x); }));
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

Result<void> AttentionCode::products(llvm::Value* kv0) {
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

std::vector<llvm::Value*> AttentionCode::batch_coords(llvm::Value* b) {
  const size_t nb = m_.batch.size();
  std::vector<llvm::Value*> out(nb);
  int64_t inner = 1;
  for (size_t d = nb; d-- > 0;) {
    out[d] = b_.CreateURem(b_.CreateUDiv(b, c(inner)), c(std::max<int64_t>(m_.batch[d], 1)));
    inner *= std::max<int64_t>(m_.batch[d], 1);
  }
  return out;
}

llvm::Value* AttentionCode::store_offset(llvm::Value* b, llvm::Value* row, llvm::Value* col) {
  const std::vector<int64_t>& st = info_.out_strides;
  const size_t nb = m_.batch.size();
  llvm::Value* off = b_.CreateAdd(b_.CreateMul(row, c(st[nb])), b_.CreateMul(col, c(st[nb + 1])));
  std::vector<llvm::Value*> coords = batch_coords(b);
  for (size_t d = 0; d < nb; ++d) off = b_.CreateAdd(off, b_.CreateMul(coords[d], c(st[d])));
  return off;
}

}  // namespace attention_detail

namespace {

using namespace attention_detail;

class AttentionEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_attention(spec, config, target);
  }
};

// Why a block's tiles do not fit the memory `target` gives a block, or nullopt.
std::optional<std::string> tiles_over_budget(const Tiles& t, const llvmb::Target& target) {
  const int64_t bytes = t.bytes();
  if (bytes <= attention_tile_budget(target)) return std::nullopt;
  return "block_m " + std::to_string(t.bm) + " x block_n " + std::to_string(t.bn) + " tiles take " +
         std::to_string(bytes) + " bytes, over the " + std::to_string(attention_tile_budget(target)) +
         " a block may hold on " + target.str();
}

// Why the register-resident form cannot multiply by wgmma under `config` on `arch`,
// or nullopt: wgmma is sm_90a's (the `a` features); each warpgroup of 4 warps takes
// 64 rows, 16 a warp; k's and v's tiles are read in 64-column panels of 128-byte
// rows, so both head dims are multiples of 64 (as the matmul's wgmma tiles' sides).
std::optional<std::string> wgmma_unfit(const Graph& group, const AttentionKernelInfo& info, const KernelConfig& config,
                                       const AttentionBlockShape& shape, bool tc, const std::string& arch) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (arch != "sm_90a") return "wgmma is sm_90a's, not " + (arch.empty() ? std::string("this target") : arch) + "'s";
  if (!tc) return "the tensor cores do not take this attention: " + attention_mma_unfit(group, config).value_or("internal");
  if (shape.mtiles != 1)
    return "the tile of " + s(shape.bm) + " rows on " + s(config.warps) + " warps is not 16 rows a warp";
  if (config.warps % 4 != 0) return s(config.warps) + " warps are not whole warpgroups of 4";
  if (info.match.e % 64 != 0 || info.match.ev % 64 != 0)
    return "head dims " + s(info.match.e) + " and " + s(info.match.ev) + " are not multiples of 64";
  return std::nullopt;
}

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
  // wgmma (config.wgmma): the register-resident form's products on sm_90a; the host
  // simulation builds as for sm_90a.
  const bool wg = config.wgmma != 0 && mode != Mode::Host;
  if (config.wgmma < 0 || config.wgmma > 2) return fail("wgmma must be 0, 1 or 2, got " + std::to_string(config.wgmma));
  if (wg) {
    const std::string arch = mode == Mode::MmaSim ? "sm_90a" : target.arch;
    if (std::optional<std::string> why = wgmma_unfit(spec.group, *info, config, shape, tc, arch))
      return fail("wgmma = " + std::to_string(config.wgmma) + ": " + *why);
  }
  if (config.group_heads < 0)
    return fail("group_heads must be 0 (as many as keep their k and v within 16 MiB) or positive, got " +
                std::to_string(config.group_heads));
  const bool pipelined = wg && config.wgmma == 2;
  // Ping-pong: the pipelined form's warpgroups in pairs (8 or 16 warps).
  if (config.pingpong < 0 || config.pingpong > 1)
    return fail("pingpong must be 0 or 1, got " + std::to_string(config.pingpong));
  if (mode != Mode::Host && config.pingpong == 1 && (!pipelined || config.warps % 8 != 0))
    return fail("pingpong = 1: the warpgroups take turns in pairs in the pipelined wgmma form: it needs wgmma = 2 and "
                "8 or 16 warps, not wgmma = " + std::to_string(config.wgmma) + " on " + std::to_string(config.warps) +
                " warps");
  // A producer warpgroup: the wgmma form's two consumer warpgroups, fed by TMA.
  if (config.warp_specialize < 0 || config.warp_specialize > 1)
    return fail("warp_specialize must be 0 or 1, got " + std::to_string(config.warp_specialize));
  const bool ws = mode != Mode::Host && config.warp_specialize == 1;
  if (ws && (!wg || config.warps != 8))
    return fail("warp_specialize = 1: a producer warpgroup brings k and v by TMA to two consumer warpgroups: it needs "
                "wgmma = 1 or 2 on 8 warps, not wgmma = " + std::to_string(config.wgmma) + " on " +
                std::to_string(config.warps) + " warps");
  // k/v buffers: stages for wgmma = 1 (its TMA pipeline), 3 pipelined, else 2.
  // (The host runs no copies: its config text has no stages.)
  if (mode != Mode::Host && (config.stages < 2 || config.stages > 4))
    return fail("stages must be 2..4 (k/v buffers), got " + std::to_string(config.stages));
  if (mode != Mode::Host && config.stages != 2 && (!wg || !regs || pipelined))
    return fail("stages = " + std::to_string(config.stages) +
                ": only the wgmma = 1 form (sm_90a, k and v by TMA) takes more than 2 k/v buffers");
  const int64_t kv_buffers = pipelined ? 3 : wg ? config.stages : 2;
  const Tiles t0(shape.bm, shape.bn, m.e, m.ev, regs, wg, kv_buffers);
  const llvmb::Target budget_target = mode == Mode::MmaSim ? llvmb::Target::nvptx("sm_90a") : target;
  if (std::optional<std::string> why = tiles_over_budget(t0, budget_target)) return fail(*why);

  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  llvm::IRBuilder<> b(*k.context);
  ElementCodegen cg(b, *k.module, target, spec.precision);
  const int threads = config.warps * 32;  // the threads that compute
  const int launch_threads = threads + (ws ? 128 : 0);
  const size_t np = spec.group.params().size();
  // TMA brings k and v where the spec allows it (sm_90a's default: KernelSpec::tma)
  // and both are views of params that a tensor map can describe (tma_source,
  // kv_tma_layout); `no_tma` says why not.
  std::optional<std::pair<AttentionCode::TmaSource, AttentionCode::TmaSource>> tma_src;
  std::string no_tma = "TMA is off";
  if (wg && spec.tma) tma_src = AttentionCode(spec, *info, t0, mode, b, cg).tma_sources(np, &no_tma);
  if (ws && !tma_src)
    return fail("warp_specialize = 1: its producer brings k and v by TMA, and here they do not come by TMA (" + no_tma + ")");
  if (wg && config.stages != 2 && !tma_src)
    return fail("stages = " + std::to_string(config.stages) + ": more than 2 k/v buffers need k and v brought by TMA (" +
                no_tma + ")");
  const Tiles t(shape.bm, shape.bn, m.e, m.ev, regs, wg, kv_buffers, tma_src.has_value());
  if (std::optional<std::string> why = tiles_over_budget(t, budget_target)) return fail(*why);
  AttentionCode code(spec, *info, t, mode, b, cg);
  code.set_groups(group, rph);
  code.set_registers(regs, shape.mtiles);
  if (regs) code.set_scale_fold(code.scale_fold());  // its softmax only (softmax_tile)
  code.set_wgmma(wg, pipelined);
  code.set_pingpong(mode != Mode::Host && config.pingpong == 1);
  if (ws) code.set_producer(threads);
  // The GPU's blocks longest first (the host runs them one after another).
  if (mode != Mode::Host) code.set_order(attention_block_order(spec.group, *info, config, shape).width);
  const int64_t blocks = code.blocks();
  Result<void> r;
  if (mode == Mode::Simt || mode == Mode::Mma) {
    kernels::KernelEntry ke = kernels::begin_nvptx_kernel(*k.module, b, spec.entry, np, 1, launch_threads, tma_src ? 2 : 0);
    if (tma_src) code.set_tma(*tma_src, ke.extra[0], ke.extra[1], config.warps);
    // Register reallocation: one block an SM, so ptxas gives every thread of the
    // launch 65536 / 384 = 168 registers, the pool setmaxnreg shares out.
    if (ws) llvmb::set_min_blocks_per_sm(*ke.fn, 1);
    auto* arr = llvm::ArrayType::get(b.getInt8Ty(), 0);
    auto* smem = new llvm::GlobalVariable(*k.module, arr, false, llvm::GlobalValue::ExternalLinkage, nullptr, "sf_smem",
                                          nullptr, llvm::GlobalValue::NotThreadLocal, 3);
    // wgmma's 128-byte swizzle repeats every 1024 bytes from a 1024-byte boundary.
    smem->setAlignment(llvm::Align(wg ? 1024 : 16));
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
    kernels::KernelEntry ke = kernels::begin_host_kernel(*k.module, b, spec.entry, np, 1,
                                                         {i32, i32, i32, b.getPtrTy(), b.getPtrTy(), i32}, tma_src ? 2 : 0);
    if (tma_src) code.set_tma(*tma_src, ke.extra[0], ke.extra[1], config.warps);
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
  if (mode == Mode::Mma && wg)
    k.form = tma_src ? "k and v by TMA (rank " + std::to_string(tma_src->first.layout.rank) + " and " +
                           std::to_string(tma_src->second.layout.rank) + " tensor maps)"
                     : "k and v by cp.async: " + no_tma;
  if (mode != Mode::Host) {
    k.launch.grid = {std::max<int64_t>(blocks, 1), 1, 1};
    k.launch.block = {launch_threads, 1, 1};
    k.launch.shared_bytes = static_cast<int>(t.bytes());
    // k's and v's maps: dims (cols, S, the head dims: kv_tma_layout), a box of 64
    // columns x bn keys of one head (128-byte swizzle, as the panels lie).
    if (tma_src)
      for (const AttentionCode::TmaSource& src : {tma_src->first, tma_src->second}) {
        const TensorType& param = spec.group.node(spec.group.params()[static_cast<size_t>(src.param)]).type;
        TensorMapSpec map;
        map.input = src.param;
        map.dtype = param.dtype;
        map.rank = src.layout.rank;
        map.dims = src.layout.dims;
        map.strides = src.layout.strides;
        map.box = {64, static_cast<int>(t.bn), 1, 1, 1};
        k.launch.tensor_maps.push_back(map);
      }
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
  // The register-resident form where each warp gets 16 or 32 rows of the (cut) tile.
  if (tensor_cores && s.bm == 16 * int64_t{config.warps}) s.mtiles = 1;
  if (tensor_cores && s.bm == 32 * int64_t{config.warps}) s.mtiles = 2;
  s.registers = s.mtiles > 0;
  return s;
}

AttentionBlockOrder attention_block_order(const Graph& group, const AttentionKernelInfo& info, const KernelConfig& config,
                                          const AttentionBlockShape& shape) {
  const AttentionMatch& m = info.match;
  AttentionBlockOrder o;
  o.groups = info.batches / shape.group;
  o.query_tiles = std::max<int64_t>((m.l + shape.rows_per_head - 1) / shape.rows_per_head, 1);
  // A section's k and v: every key of each of its kv heads.
  const int bytes = dtype_size(group.node(m.v).type.dtype);
  o.kv_bytes_per_group = m.s * (m.e + m.ev) * bytes;
  // Only where the tiles' costs differ: a causal mask over more than one query tile
  // (the tiles of later rows see more keys); every tile costs the same otherwise.
  if (!m.causal_diagonal || o.query_tiles < 2 || o.groups < 1 || config.group_heads < 0) return o;
  int64_t w = config.group_heads;
  if (w == 0) w = std::max<int64_t>(kAttentionL2Bytes / std::max<int64_t>(o.kv_bytes_per_group, 1), 1);
  o.width = std::min(w, o.groups);
  return o;
}

std::string attention_order_str(const AttentionBlockOrder& o) {
  if (o.width <= 0) return "";
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(o.width * o.kv_bytes_per_group) / (1 << 20));
  return "blocks: query tiles longest first, " + std::to_string(o.width) + " kv-head group(s) of " +
         std::to_string(o.groups) + " at a time (their k and v " + mib + " MiB)";
}

bool attention_tiles_fit(const Graph& group, const KernelConfig& config, const std::string& arch) {
  Result<AttentionKernelInfo> info = attention_info(group);
  if (!info) return false;
  KernelSpec spec{"sf_fit", KernelKind::Attention, group};
  const bool tc = attention_uses_tensor_cores(spec, config, arch);
  const AttentionBlockShape shape = attention_block_shape(*info, config, tc);
  // With TMA's mbarriers, as a wgmma kernel on sm_90a takes them by default: a tile
  // that fits with them fits without.
  const Tiles t(shape.bm, shape.bn, info->match.e, info->match.ev, shape.registers, config.wgmma != 0,
                config.wgmma == 2 ? 3 : config.wgmma ? config.stages : 2, /*tma=*/true);
  return !tiles_over_budget(t, llvmb::Target::nvptx(arch));
}

std::optional<std::string> attention_wgmma_unfit(const Graph& group, const KernelConfig& config, const std::string& arch) {
  Result<AttentionKernelInfo> info = attention_info(group);
  if (!info) return info.error().message;
  KernelSpec spec{"sf_fit", KernelKind::Attention, group};
  const bool tc = attention_uses_tensor_cores(spec, config, arch);
  return wgmma_unfit(group, *info, config, attention_block_shape(*info, config, tc), tc, arch);
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
