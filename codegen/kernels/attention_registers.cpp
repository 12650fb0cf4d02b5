// The fused attention's register-resident tensor-core form (FlashAttention-2's
// layout; docs/fusion.md, "Attention"): AttentionCode's 16-bit tile loads, and each
// warp's scores, softmax and output kept in mma fragments across the key loop (the
// wgmma form's products, pipelined loop and TMA: attention_wgmma.cpp).
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/kernels/attention_code.h"

namespace sf::attention_detail {

void AttentionCode::store16(int64_t base, llvm::Value* i, llvm::Value* bits) {
  b_.CreateAlignedStore(bits, b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_, b_.CreateAdd(c(base), b_.CreateMul(i, c(2)))),
                        llvm::Align(2));
}

void AttentionCode::store16x8(int64_t base, llvm::Value* i, const std::vector<llvm::Value*>& bits) {
  llvm::Value* v = llvm::UndefValue::get(llvm::FixedVectorType::get(b_.getInt16Ty(), 8));
  for (size_t l = 0; l < 8; ++l) v = b_.CreateInsertElement(v, bits[l], static_cast<uint64_t>(l));
  b_.CreateAlignedStore(v, b_.CreateInBoundsGEP(b_.getInt8Ty(), buf_, b_.CreateAdd(c(base), b_.CreateMul(i, c(2)))),
                        llvm::Align(16));
}

std::vector<llvm::Value*> AttentionCode::ldsm_x4(llvm::Value* lane_row, int64_t off, bool trans) {
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

int AttentionCode::k_rows_node() const {
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

void AttentionCode::plan_vector_loads() {
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

std::vector<Elem> AttentionCode::load8(DType t, llvm::Value* ptr, llvm::Value* index) {
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

llvm::Value* AttentionCode::to16(llvm::Value* v) {
  if (auto it = raw_.find(v); it != raw_.end()) return it->second;
  llvm::Value* n = cg_.narrow(score_in_dtype(), v);
  return n->getType()->isHalfTy() ? b_.CreateBitCast(n, b_.getInt16Ty()) : n;
}

Result<std::vector<llvm::Value*>> AttentionCode::lanes8(int node, llvm::Value* flat, bool vector) {
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

Result<void> AttentionCode::load16(int node, int64_t rows, int64_t cols, const std::string& name,
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

std::optional<std::pair<int, kernels::IndexMap>> AttentionCode::copy_source(int node, bool runs) const {
  if (node < 0 || mode_ == Mode::Host || mode_ == Mode::Simt) return std::nullopt;
  const DType t = score_in_dtype();
  for (int at = node;;) {
    const Node& n = spec_.group.node(at);
    if (n.type.dtype != t) return std::nullopt;
    if (n.op == OpKind::Param) break;
    const bool view = n.op == OpKind::Transpose || n.op == OpKind::Permute || n.op == OpKind::Reshape ||
                      n.op == OpKind::Expand || n.op == OpKind::Slice;
    if (!view || n.inputs.size() != 1) return std::nullopt;
    at = n.inputs[0];
  }
  std::vector<std::pair<int, kernels::IndexMap>> r = gv_->reads(node, kernels::dense_index(spec_.group.node(node).type.shape));
  if (r.size() != 1 || r[0].first < 0 || (runs && !kernels::dense_runs(r[0].second, 8))) return std::nullopt;
  return r[0];
}

void AttentionCode::cp_commit() {
  if (mode_ == Mode::MmaSim) {
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt32Ty()}, false), hook_[6],
                  {hook_[0], tid32_});
    return;
  }
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {}, {});
}

void AttentionCode::cp_wait(int pending) {
  if (mode_ == Mode::MmaSim) {
    b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt32Ty(), b_.getInt32Ty()}, false),
                  hook_[7], {hook_[0], tid32_, b_.getInt32(static_cast<uint32_t>(pending))});
    return;
  }
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {}, {b_.getInt32(static_cast<uint32_t>(pending))});
}

Result<void> AttentionCode::copy16(const std::pair<int, kernels::IndexMap>& src, int64_t rows, int64_t cols,
                                   const std::string& name, int64_t base, int64_t stride, llvm::Value* bufe,
                                   const std::function<std::pair<llvm::Value*, llvm::Value*>(llvm::Value*)>& row_base) {
  const int64_t chunks = cols / 8;
  llvm::Type* st = kernels::storage_type(b_.getContext(), score_in_dtype());
  llvm::Value* param = in_[static_cast<size_t>(src.first)];
  return emit_loop(b_, tid_, c(rows * chunks), nthreads_, name, [&](llvm::Value* i) -> Result<void> {
    llvm::Value* r = b_.CreateUDiv(i, c(chunks));
    llvm::Value* c0 = b_.CreateMul(b_.CreateURem(i, c(chunks)), c(8));
    auto [row0, exists] = row_base(r);
    // A row past the keys reads nothing (source size 0: the 16 bytes are zeroed) from
    // the param's first element, an address that exists.
    llvm::Value* off = b_.CreateSelect(exists, kernels::emit_index_map(b_, b_.CreateAdd(row0, c0), src.second), c(0));
    llvm::Value* from = b_.CreateInBoundsGEP(st, param, off);
    llvm::Value* to = b_.CreateInBoundsGEP(
        b_.getInt8Ty(), buf_, b_.CreateAdd(c(base), b_.CreateMul(b_.CreateAdd(bufe, tile_index(r, c0, stride, rows)), c(2))));
    llvm::Value* bytes = b_.CreateSelect(exists, b_.getInt32(16), b_.getInt32(0));
    if (mode_ == Mode::MmaSim) {
      llvm::Type* ptr = b_.getPtrTy();
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, b_.getInt32Ty(), ptr, ptr, b_.getInt32Ty()}, false);
      b_.CreateCall(fty, hook_[5], {hook_[0], tid32_, to, from, bytes});
    } else {
      llvm::Type* global = llvm::PointerType::get(b_.getContext(), 1);
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s, {},
                         {to, b_.CreateAddrSpaceCast(from, global), bytes});
    }
    return ok();
  });
}

Result<void> AttentionCode::copy_or_load(const std::optional<std::pair<int, kernels::IndexMap>>& src,
                                         const std::function<Result<void>()>& copy,
                                         const std::function<Result<void>()>& load) {
  if (!src) return load();
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  llvm::LLVMContext& ctx = b_.getContext();
  auto* yes = llvm::BasicBlock::Create(ctx, "copy", fn);
  auto* no = llvm::BasicBlock::Create(ctx, "load", fn);
  auto* done = llvm::BasicBlock::Create(ctx, "loaded", fn);
  b_.CreateCondBr(aligned_, yes, no);
  b_.SetInsertPoint(yes);
  SF_TRY(copy());
  b_.CreateBr(done);
  b_.SetInsertPoint(no);
  SF_TRY(load());
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
  return ok();
}

llvm::Value* AttentionCode::tile_index(llvm::Value* j, llvm::Value* col, int64_t stride, int64_t rows) {
  if (stride > 0) return b_.CreateAdd(b_.CreateMul(j, c(stride)), col);
  // Panel col / 64 of `rows` rows of 64 elements, chunk (col % 64) / 8 of row j at
  // chunk ((col % 64) / 8) ^ (j % 8): the 128-byte swizzle.
  llvm::Value* chunk = b_.CreateXor(b_.CreateUDiv(b_.CreateURem(col, c(64)), c(8)), b_.CreateURem(j, c(8)));
  llvm::Value* r = b_.CreateAdd(b_.CreateMul(b_.CreateUDiv(col, c(64)), c(rows * 64)), b_.CreateMul(j, c(64)));
  return b_.CreateAdd(b_.CreateAdd(r, b_.CreateMul(chunk, c(8))), b_.CreateURem(col, c(8)));
}

Result<void> AttentionCode::load_kv16(llvm::Value* b, llvm::Value* kv0, llvm::Value* bufe) {
  const int kr = k_rows_node();
  const int64_t kstride = t_.wgmma ? 0 : t_.ks, vstride = t_.wgmma ? 0 : t_.vs;
  auto k_row = [&](llvm::Value* j) {
    llvm::Value* key = b_.CreateAdd(kv0, j);
    return std::pair{b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.s)), key), c(m_.e)), b_.CreateICmpSLT(key, c(m_.s))};
  };
  auto v_row = [&](llvm::Value* j) {
    llvm::Value* key = b_.CreateAdd(kv0, j);
    return std::pair{b_.CreateMul(b_.CreateAdd(b_.CreateMul(b, c(m_.s)), key), c(m_.ev)), b_.CreateICmpSLT(key, c(m_.s))};
  };
  auto sync_k = [&]() -> Result<void> {
    if (kr >= 0)
      return load16(kr, t_.bn, t_.e, "load_k", k_row, [&](llvm::Value* j, llvm::Value* c0, const std::vector<llvm::Value*>& lanes) {
        store16x8(t_.k16, b_.CreateAdd(bufe, tile_index(j, c0, kstride, t_.bn)), lanes);
      });
    // kt is not a transpose: element by element from kt [.., E, S]
    return load_k_elements(b, kv0, [&](llvm::Value*, llvm::Value* j, llvm::Value* e, llvm::Value* x) {
      put16(t_.k16, b_.CreateAdd(bufe, tile_index(j, e, kstride, t_.bn)), x);
    });
  };
  auto sync_v = [&]() -> Result<void> {
    return load16(m_.v, t_.bn, t_.ev, "load_v", v_row, [&](llvm::Value* j, llvm::Value* c0, const std::vector<llvm::Value*>& lanes) {
      store16x8(t_.v16, b_.CreateAdd(bufe, tile_index(j, c0, vstride, t_.bn)), lanes);
    });
  };
  // Each operand copied where it can be (aligned, a plain view), else loaded.
  const std::optional<std::pair<int, kernels::IndexMap>> ksrc = kr >= 0 ? copy_source(kr) : std::nullopt,
                                                         vsrc = copy_source(m_.v);
  SF_TRY(copy_or_load(ksrc, [&]() { return copy16(*ksrc, t_.bn, t_.e, "copy_k", t_.k16, kstride, bufe, k_row); }, sync_k));
  return copy_or_load(vsrc, [&]() { return copy16(*vsrc, t_.bn, t_.ev, "copy_v", t_.v16, vstride, bufe, v_row); }, sync_v);
}

llvm::Value* AttentionCode::shfl_xor(llvm::Value* v, int mask) {
  if (mode_ == Mode::Mma)
    return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_shfl_sync_bfly_f32, {},
                              {b_.getInt32(0xffffffffu), v, b_.getInt32(static_cast<uint32_t>(mask)), b_.getInt32(0x1f)});
  auto* fty = llvm::FunctionType::get(b_.getFloatTy(), {b_.getPtrTy(), b_.getInt32Ty(), b_.getFloatTy(), b_.getInt32Ty()}, false);
  return b_.CreateCall(fty, hook_[4], {hook_[0], tid32_, v, b_.getInt32(static_cast<uint32_t>(mask))});
}

llvm::Value* AttentionCode::exp_rounded(llvm::Value* x) {
  llvm::Value* y = b_.CreateFMul(x, llvm::ConstantFP::get(b_.getFloatTy(), 1.4426950408889634));
  if (mode_ == Mode::Mma) return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {y});
  return b_.CreateUnaryIntrinsic(llvm::Intrinsic::exp2, y);
}

llvm::Value* AttentionCode::exp_minus(llvm::Value* x, llvm::Value* neg_m_log2e, double log2e) {
  llvm::Value* y = b_.CreateIntrinsic(llvm::Intrinsic::fma, {b_.getFloatTy()},
                                      {x, llvm::ConstantFP::get(b_.getFloatTy(), log2e), neg_m_log2e});
  if (mode_ == Mode::Mma) return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {y});
  return b_.CreateUnaryIntrinsic(llvm::Intrinsic::exp2, y);
}

std::pair<int, int> AttentionCode::a_from_c(int e) {
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

Result<void> AttentionCode::warp_rows(llvm::Value* b, llvm::Value* kv_end) {
  llvm::Type* f32 = b_.getFloatTy();
  for (int e = 0; e < 8; ++e)
    if (a_from_c(e).first < 0) return fail("internal: an A fragment element is no C fragment element");
  if (mtiles_ != 1 && mtiles_ != 2) return fail("internal: " + std::to_string(mtiles_) + " mma tiles a warp");
  const auto T = static_cast<size_t>(mtiles_);
  m0w_ = b_.CreateMul(warp_, c(16 * mtiles_), "m0w");
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
    // The warp's first mma tile; the second's rows are 16 q rows (a constant) on.
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
  o_.assign(T, {});
  mrow_.assign(T, {});
  lrow_.assign(T, {});
  for (size_t mt = 0; mt < T; ++mt) {
    for (int64_t i = 0; i < t_.ev / 8 * 4; ++i) {
      o_[mt].push_back(slot());
      b_.CreateStore(llvm::ConstantFP::get(f32, 0.0), o_[mt].back());
    }
    for (int h = 0; h < 2; ++h) {
      mrow_[mt][static_cast<size_t>(h)] = slot();
      lrow_[mt][static_cast<size_t>(h)] = slot();
      b_.CreateStore(llvm::ConstantFP::getInfinity(f32, true), mrow_[mt][static_cast<size_t>(h)]);
      b_.CreateStore(llvm::ConstantFP::get(f32, 0.0), lrow_[mt][static_cast<size_t>(h)]);
    }
  }
  // Key tile t is read from k/v buffer t % 2 while tile t + 1 is copied into the
  // other: at the top of iteration t this thread waits for its copies of tile t, the
  // barrier publishes everyone's and tells that every warp is done with tile t - 1,
  // whose buffer then takes tile t + 1's copies, which run during tile t's products.
  if (tma_src_ && !ws_) tma_init();  // (with a producer warpgroup: before its branch)
  if (wg_pipe_) {
    SF_TRY(key_loop_pipelined(b, kv_end));
  } else if (tma_src_) {
    // TMA over n = kv_buffers buffers (the config's stages): thread 0 brings each
    // tile (use u of buffer t % n completes its full mbarrier's phase u) once every
    // warp released the buffer's previous use (its empty mbarrier), and every thread
    // waits for the full phase: no barrier in the key loop, so the warpgroups need not
    // keep in step. Tiles 0 .. n - 2 before the loop, and at the top of iteration t
    // tile t + n - 1 into the buffer of tile t - 1, so the copies run n - 1 tiles
    // ahead. q's copies are published once, before it.
    const int64_t n = t_.kv_buffers;
    for (int64_t i = 0; i + 1 < n; ++i) tma_fetch(b, c(i * t_.bn), kv_end, n);
    cp_commit();
    cp_wait(0);
    proxy_fence();
    barrier();
    SF_TRY(emit_loop(b_, c(0), kv_end, c(t_.bn), "kv", [&](llvm::Value* kv0) -> Result<void> {
      llvm::Value* tile = b_.CreateUDiv(kv0, c(t_.bn));
      llvm::Value* buf = b_.CreateURem(tile, c(n));
      tma_wait(buf, b_.CreateAnd(b_.CreateUDiv(tile, c(n)), c(1)));
      tma_fetch(b, b_.CreateAdd(kv0, c((n - 1) * t_.bn)), kv_end, n);
      SF_TRY(key_tile_regs(kv0, b_.CreateMul(buf, c(t_.kv_bytes()))));
      tma_release(buf);  // its products retired (wait_group 0) in key_tile_regs
      return ok();
    }));
  } else {
    SF_TRY(load_kv16(b, c(0), c(0)));
    cp_commit();
    SF_TRY(emit_loop(b_, c(0), kv_end, c(t_.bn), "kv", [&](llvm::Value* kv0) -> Result<void> {
      llvm::Value* odd = b_.CreateAnd(b_.CreateUDiv(kv0, c(t_.bn)), c(1));
      cp_wait(0);
      // wgmma reads k and v through the async proxy: each thread's copies and stores
      // into them (the generic proxy's) made visible to it before the barrier.
      if (wg_) proxy_fence();
      barrier();
      llvm::Value* next = b_.CreateAdd(kv0, c(t_.bn));
      SF_TRY(when(b_.CreateICmpSLT(next, kv_end), [&]() -> Result<void> {
        return load_kv16(b, next, b_.CreateMul(b_.CreateSub(c(1), odd), c(t_.kv_bytes() / 2)));
      }));
      cp_commit();
      return key_tile_regs(kv0, b_.CreateMul(odd, c(t_.kv_bytes())));
    }));
  }
  cp_wait(0);  // no copy outlives the loop (tile 0's, where there was no key tile)
  // Each row's sum over its quad; out = acc / sum, rows g and g + 8 of each mma tile.
  // One division a row (the output is rounded to 16 bits: 1 / l then a product is
  // within its tolerance); 1 / 0 = inf keeps a fully masked row's 0 * inf = NaN.
  for (size_t mt = 0; mt < T; ++mt) {
    llvm::Value* l[2];
    for (int h = 0; h < 2; ++h) {
      llvm::Value* x = b_.CreateLoad(f32, lrow_[mt][static_cast<size_t>(h)]);
      x = b_.CreateFAdd(x, shfl_xor(x, 1));
      l[h] = b_.CreateFDiv(llvm::ConstantFP::get(f32, 1.0), b_.CreateFAdd(x, shfl_xor(x, 2)));
    }
    for (int64_t t = 0; t < t_.ev / 8; ++t)
      for (int i = 0; i < 4; ++i) {
        auto [cr, cc] = fragment_map(kernels::mma_c_elem, i);
        llvm::Value* rr = b_.CreateAdd(m0w_, b_.CreateAdd(c(16 * static_cast<int64_t>(mt)), coord(cr, g_, tig_)));
        llvm::Value* cl = b_.CreateAdd(c(8 * t), coord(cc, g_, tig_));
        llvm::Value* row = row_of(rr);
        llvm::Value* y = b_.CreateFMul(b_.CreateLoad(f32, o_[mt][static_cast<size_t>(t * 4 + i)]), l[i / 2]);
        SF_TRY(when(b_.CreateICmpSLT(row, c(m_.l)), [&]() -> Result<void> {
          cg_.store(Elem{y, out_dtype()}, out_, store_offset(head_of(rr), row, cl));
          return ok();
        }));
      }
  }
  return ok();
}

Result<std::vector<std::array<llvm::Value*, 2>>> AttentionCode::softmax_tile(llvm::Value* kv0, std::vector<Frags>& sc) {
  llvm::Type* f32 = b_.getFloatTy();
  const int64_t nt = t_.bn / 8;
  const auto T = static_cast<size_t>(mtiles_);
  // The chain on every element (row, key): -inf outside the rows and keys. A tile
  // whose rows and keys all exist and, causal, lie wholly on or below every row's
  // diagonal (key kv0 + bn - 1 <= the block's first row q0 + d) takes a second copy of
  // this code with neither the bounds test nor the mask (FlashAttention masks only
  // the diagonal tiles): the block-uniform branch picks one.
  auto chain = [&](bool inside) -> Result<std::vector<Frags>> {
    std::vector<Frags> out = sc;
    for (size_t mt = 0; mt < T; ++mt)
      for (int64_t j = 0; j < nt; ++j)
        for (int i = 0; i < 4; ++i) {
          auto [cr, cc] = fragment_map(kernels::mma_c_elem, i);
          llvm::Value* r = b_.CreateAdd(m0w_, b_.CreateAdd(c(16 * static_cast<int64_t>(mt)), coord(cr, g_, tig_)));
          llvm::Value* col = b_.CreateAdd(kv0, b_.CreateAdd(c(8 * j), coord(cc, g_, tig_)));
          llvm::Value* raw = sc[mt][static_cast<size_t>(j)][static_cast<size_t>(i)];
          Result<llvm::Value*> v =
              inside ? logit_inside(r, col, raw) : logit(r, col, [&]() -> Result<llvm::Value*> { return raw; });
          if (!v) return v.error();
          out[mt][static_cast<size_t>(j)][static_cast<size_t>(i)] = *v;
        }
    return out;
  };
  if (unmasked_node() < 0) {
    Result<std::vector<Frags>> all = chain(false);
    if (!all) return all.error();
    sc = std::move(*all);
  } else {
    llvm::Value* last_key = b_.CreateAdd(kv0, c(t_.bn));  // one past the tile's last key
    llvm::Value* inside = b_.CreateAnd(b_.CreateICmpSLE(last_key, c(m_.s)), b_.CreateICmpSLE(b_.CreateAdd(q0_, c(rph_)), c(m_.l)));
    if (m_.causal_diagonal) inside = b_.CreateAnd(inside, b_.CreateICmpSLE(last_key, b_.CreateAdd(q0_, c(*m_.causal_diagonal + 1))));
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    auto* fast = llvm::BasicBlock::Create(b_.getContext(), "tile_inside", fn);
    auto* edge = llvm::BasicBlock::Create(b_.getContext(), "tile_edge", fn);
    auto* join = llvm::BasicBlock::Create(b_.getContext(), "tile_logits", fn);
    b_.CreateCondBr(inside, fast, edge);
    b_.SetInsertPoint(fast);
    Result<std::vector<Frags>> f = chain(true);
    if (!f) return f.error();
    llvm::BasicBlock* fast_end = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(edge);
    Result<std::vector<Frags>> e = chain(false);
    if (!e) return e.error();
    llvm::BasicBlock* edge_end = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    for (size_t mt = 0; mt < T; ++mt)
      for (int64_t j = 0; j < nt; ++j)
        for (int i = 0; i < 4; ++i) {
          llvm::PHINode* phi = b_.CreatePHI(f32, 2);
          phi->addIncoming((*f)[mt][static_cast<size_t>(j)][static_cast<size_t>(i)], fast_end);
          phi->addIncoming((*e)[mt][static_cast<size_t>(j)][static_cast<size_t>(i)], edge_end);
          sc[mt][static_cast<size_t>(j)][static_cast<size_t>(i)] = phi;
        }
  }
  // Online softmax per mma tile and row half h (C elements 2h and 2h + 1: rows g and
  // g + 8).
  std::vector<std::array<llvm::Value*, 2>> alpha(T);
  for (size_t mt = 0; mt < T; ++mt)
    for (int h = 0; h < 2; ++h) {
      llvm::Value* mx = b_.CreateLoad(f32, mrow_[mt][static_cast<size_t>(h)]);
      llvm::Value* m_old = mx;
      for (int64_t j = 0; j < nt; ++j)
        for (int e = 0; e < 2; ++e) mx = fmax_keep(mx, sc[mt][static_cast<size_t>(j)][static_cast<size_t>(2 * h + e)]);
      mx = fmax_keep(mx, shfl_xor(mx, 1));
      mx = fmax_keep(mx, shfl_xor(mx, 2));
      // A row that has seen only -inf keeps subtracting 0: exp(-inf - 0) = 0, no NaN.
      llvm::Value* m_safe = b_.CreateSelect(b_.CreateFCmpOEQ(mx, llvm::ConstantFP::getInfinity(f32, true)),
                                            llvm::ConstantFP::get(f32, 0.0), mx);
      // With the scale folded (scale_fold), the maxima and the scores are c times
      // smaller than the logits: alpha = exp(c (m_old - m)), p = 2^(s c log2 e - m c log2 e).
      llvm::Value* dm = b_.CreateFSub(m_old, m_safe);
      if (fold_ > 0) dm = b_.CreateFMul(dm, llvm::ConstantFP::get(f32, fold_));
      alpha[mt][static_cast<size_t>(h)] = exp_rounded(dm);
      const double log2e = 1.4426950408889634 * (fold_ > 0 ? fold_ : 1.0);
      llvm::Value* neg_ml = b_.CreateFMul(m_safe, llvm::ConstantFP::get(f32, -log2e));
      llvm::Value* sum = llvm::ConstantFP::get(f32, 0.0);
      for (int64_t j = 0; j < nt; ++j)
        for (int e = 0; e < 2; ++e) {
          llvm::Value*& x = sc[mt][static_cast<size_t>(j)][static_cast<size_t>(2 * h + e)];
          x = exp_minus(x, neg_ml, log2e);
          sum = b_.CreateFAdd(sum, x);
        }
      llvm::Value* lslot = lrow_[mt][static_cast<size_t>(h)];
      b_.CreateStore(b_.CreateFAdd(b_.CreateFMul(b_.CreateLoad(f32, lslot), alpha[mt][static_cast<size_t>(h)]), sum), lslot);
      b_.CreateStore(mx, mrow_[mt][static_cast<size_t>(h)]);
    }
  return alpha;
}

Result<void> AttentionCode::key_tile_regs(llvm::Value* kv0, llvm::Value* kvoff) {
  llvm::Type* f32 = b_.getFloatTy();
  llvm::Value* krow = b_.CreateInBoundsGEP(b_.getInt8Ty(), krow_, kvoff);
  llvm::Value* vrow = b_.CreateInBoundsGEP(b_.getInt8Ty(), vrow_, kvoff);
  const int64_t nt = t_.bn / 8;
  const auto T = static_cast<size_t>(mtiles_);
  // S = q k^T: B(k, n) = the k tile (n, k), per mma tile mt.
  // Each k step's q fragment is read from shared memory once per key tile (holding
  // all E / 16 of them across the loop took 32 registers a thread more, which the
  // E = 128 kernel spilled).
  std::vector<Frags> sc(T, Frags(static_cast<size_t>(nt), std::vector<llvm::Value*>(4, llvm::ConstantFP::get(f32, 0.0))));
  if (wg_) {
    wgmma_fence();
    std::vector<llvm::Value*> d = scores_wgmma(kvoff, zeros(t_.bn / 2));
    wgmma_commit();
    wgmma_wait(0);
    sc[0] = fragments(d);
  }
  // Fragments by ldmatrix.x4: q's A fragment per k step and mma tile, k's B fragments
  // two n8 tiles at a time (bn / 8 is even: bn is a multiple of 16), each feeding
  // every mma tile.
  for (int64_t k0 = 0; k0 < (wg_ ? 0 : t_.e); k0 += 16) {
    std::vector<std::vector<llvm::Value*>> qa;
    for (size_t mt = 0; mt < T; ++mt) qa.push_back(ldsm_x4(qrow_, (static_cast<int64_t>(mt) * 16 * t_.qs + k0) * 2));
    for (int64_t j = 0; j < nt; j += 2) {
      std::vector<llvm::Value*> kb = ldsm_x4(krow, (8 * j * t_.ks + k0) * 2);
      for (size_t mt = 0; mt < T; ++mt) {
        sc[mt][static_cast<size_t>(j)] = mma(qa[mt], {kb[0], kb[1]}, sc[mt][static_cast<size_t>(j)]);
        sc[mt][static_cast<size_t>(j + 1)] = mma(qa[mt], {kb[2], kb[3]}, sc[mt][static_cast<size_t>(j + 1)]);
      }
    }
  }
  std::vector<std::array<llvm::Value*, 2>> alpha;
  if (Result<std::vector<std::array<llvm::Value*, 2>>> a = softmax_tile(kv0, sc); a) alpha = std::move(*a);
  else return a.error();
  // acc = acc * alpha + p v, p's A fragments straight from the C fragments.
  std::vector<Frags> o(T, Frags(static_cast<size_t>(t_.ev / 8)));
  for (size_t mt = 0; mt < T; ++mt)
    for (int64_t t = 0; t < t_.ev / 8; ++t)
      for (int i = 0; i < 4; ++i)
        o[mt][static_cast<size_t>(t)].push_back(
            b_.CreateFMul(b_.CreateLoad(f32, o_[mt][static_cast<size_t>(t * 4 + i)]), alpha[mt][static_cast<size_t>(i / 2)]));
  if (wg_) {
    // p's A fragments first, then one wgmma.fence (the accumulators were just
    // rescaled, p packed, by ordinary instructions).
    const std::vector<std::vector<llvm::Value*>> a = p_fragments(sc[0]);
    std::vector<llvm::Value*> d = flat(o[0]);
    wgmma_fence();
    d = output_wgmma(a, kvoff, std::move(d));
    wgmma_commit();
    wgmma_wait(0);
    o[0] = fragments(d);
  }
  for (int64_t kk = 0; kk < (wg_ ? 0 : t_.bn / 16); ++kk) {
    std::vector<std::vector<llvm::Value*>> a;
    for (size_t mt = 0; mt < T; ++mt) {
      llvm::Value* el[8];
      for (int e = 0; e < 8; ++e) {
        auto [tile, i] = a_from_c(e);
        el[e] = sc[mt][static_cast<size_t>(2 * kk + tile)][static_cast<size_t>(i)];
      }
      a.push_back({pack(el[0], el[1]), pack(el[2], el[3]), pack(el[4], el[5]), pack(el[6], el[7])});
    }
    // v's B fragments two n8 tiles at a time by ldmatrix.x4.trans (rows are keys),
    // each feeding every mma tile; an odd last tile (Ev / 8 odd) reads 8 columns of
    // the row's padding into registers it does not use.
    for (int64_t t = 0; t < t_.ev / 8; t += 2) {
      std::vector<llvm::Value*> vb = ldsm_x4(vrow, (16 * kk * t_.vs + 8 * t) * 2, /*trans=*/true);
      for (size_t mt = 0; mt < T; ++mt) {
        o[mt][static_cast<size_t>(t)] = mma(a[mt], {vb[0], vb[1]}, o[mt][static_cast<size_t>(t)]);
        if (t + 1 < t_.ev / 8)
          o[mt][static_cast<size_t>(t + 1)] = mma(a[mt], {vb[2], vb[3]}, o[mt][static_cast<size_t>(t + 1)]);
      }
    }
  }
  for (size_t mt = 0; mt < T; ++mt)
    for (int64_t t = 0; t < t_.ev / 8; ++t)
      for (int i = 0; i < 4; ++i)
        b_.CreateStore(o[mt][static_cast<size_t>(t)][static_cast<size_t>(i)], o_[mt][static_cast<size_t>(t * 4 + i)]);
  return ok();
}

}  // namespace sf::attention_detail
