// GroupValues (element.h): a fused group's value at an element, computed through its
// ops from loads of its params: element code, coordinates for generators and
// positional ops (dropout's global index), and a concat's select between its operands.
#include "codegen/kernels/element.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <optional>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Intrinsics.h>

#include "codegen/ir/dropout.h"

namespace sf::kernels {

// ---- group values --------------------------------------------------------------------------

GroupValues::GroupValues(const Graph& g, ElementCodegen& cg, std::vector<llvm::Value*> inputs)
    : g_(g), cg_(cg), inputs_(std::move(inputs)), param_slot_(g.nodes().size(), -1), rounded16_(rounded_to_16bit(g)) {
  for (size_t i = 0; i < g.params().size(); ++i) param_slot_[static_cast<size_t>(g.params()[i])] = static_cast<int>(i);
}

void GroupValues::at_index(llvm::Value* flat, Hook hook) {
  flat_ = flat;
  hook_ = std::move(hook);
  coords_.clear();
  memo_.clear();
  computed_.clear();
  evaluated_ = 0;
}

Result<Elem> GroupValues::value(ValueId v, const ValueIndex& at) {
  std::string key = std::to_string(v) + "#" + at.key();
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  const Node& n = g_.node(v);
  // Concats nested in one group read every operand of each at its own index: the
  // values per element grow as the product of their arities (18 nested concats of a
  // value with itself: 2^18). A Diag rather than a module that never finishes; the
  // fusion pass then gives those ops kernels of their own.
  if (++evaluated_ > kMaxValuesPerElement)
    return Diag{"", n.loc, "the element code needs more than " + std::to_string(kMaxValuesPerElement) +
                               " values per element (concats nested in one kernel?)"};
  std::optional<Elem> hooked = hook_ ? hook_(v, at) : std::nullopt;
  Elem e;
  if (hooked) {
    e = *hooked;
  } else if (n.op == OpKind::Param) {
    IndexMap map = offset_map(at, n.type.shape);
    llvm::Value* from = index_value(map.base);
    if (!from) return Diag{"", n.loc, "internal: a read at an index no concat computed"};
    e = cg_.load(n.type.dtype, inputs_[static_cast<size_t>(param_slot(v))], emit_index_map(cg_.builder(), from, map));
  } else if (n.op == OpKind::Gather || n.op == OpKind::IndexSelect) {
    Result<Elem> r = lookup_value(v, at);
    if (!r) return r;
    e = *r;
  } else if (n.op == OpKind::Concat) {
    Result<Elem> r = concat_value(v, at);
    if (!r) return r;
    e = *r;
  } else if (n.op == OpKind::Constant) {
    e = cg_.constant(n.attrs.get_float("value"), n.type.dtype);  // an immediate
  } else if (is_coordinate_op(n.op)) {
    Result<Elem> r = coordinate_value(v, at);
    if (!r) return r;
    e = *r;
  } else if (std::optional<ValueId> x = gelu_operand(v)) {
    // GELU's product x/2 (1 + erf(x / sqrt 2)), rounded to 16 bits: computed from x at
    // once (the half, the erf and the add are then dead here).
    std::optional<ValueIndex> xi = operand_index(n, at, g_.node(*x).type.shape);
    if (!xi) return Diag{"", n.loc, "internal: no index for GELU's operand"};
    Result<Elem> xv = value(*x, *xi);
    if (!xv) return xv;
    e = cg_.gelu_for_16bit(*xv, n.type.dtype);
  } else if (std::optional<ValueId> erf = one_plus_erf_operand(v)) {
    // 1 + erf(z) (GELU's), rounded to 16 bits: erfc(-z) at once, without the
    // cancellation of 1 + erf or the erf itself (the erf node's code is then dead).
    const Node& en = g_.node(*erf);
    std::optional<ValueIndex> ei = operand_index(n, at, en.type.shape);
    std::optional<ValueIndex> zi = ei ? operand_index(en, *ei, g_.node(en.inputs[0]).type.shape) : std::nullopt;
    if (!zi) return Diag{"", n.loc, "internal: no index for erf's operand"};
    Result<Elem> z = value(en.inputs[0], *zi);
    if (!z) return z;
    e = cg_.one_plus_erf_for_16bit(*z, n.type.dtype);
  } else {
    std::vector<Elem> args;
    for (ValueId u : n.inputs) {
      std::optional<ValueIndex> ui = operand_index(n, at, g_.node(u).type.shape);
      if (!ui) return Diag{"", n.loc, std::string(op_name(n.op)) + " is neither elementwise nor a view"};
      Result<Elem> a = value(u, *ui);
      if (!a) return a;
      args.push_back(*a);
    }
    if (is_view(n.op)) {
      e = args[0];  // a view only changes which element is read
    } else {
      Result<Elem> r = cg_.elementwise(n.op, args, n.type.dtype, rounded16_[static_cast<size_t>(v)]);
      if (!r) return Diag{"", n.loc, r.error().message};
      e = *r;
    }
  }
  memo_.emplace(std::move(key), e);
  return e;
}

std::optional<ValueId> GroupValues::one_plus_erf_operand(ValueId v) const {
  const Node& n = g_.node(v);
  if (!fold_erfc_ || n.op != OpKind::Add || !is_float(n.type.dtype) || cg_.precision() != Precision::Fused)
    return std::nullopt;
  for (int i = 0; i < 2; ++i) {
    const ValueId e = n.inputs[static_cast<size_t>(i)], c = n.inputs[static_cast<size_t>(1 - i)];
    const Node& en = g_.node(e);
    const Node& cn = g_.node(c);
    // The erf takes its 16-bit form (ElementCodegen::elementwise's condition).
    const bool erf16 = en.op == OpKind::Erf &&
                       (en.type.dtype == DType::BF16 || en.type.dtype == DType::F16 || rounded16_[static_cast<size_t>(e)]);
    if (erf16 && cn.op == OpKind::Constant && cn.attrs.get_float("value") == 1.0 && en.type.dtype == n.type.dtype &&
        cn.type.shape.empty())
      return e;
  }
  return std::nullopt;
}

std::optional<ValueId> GroupValues::gelu_operand(ValueId v) const {
  const Node& n = g_.node(v);
  if (!fold_gelu_ || n.op != OpKind::Mul || n.type.dtype != DType::F32 || cg_.precision() != Precision::Fused ||
      !rounded16_[static_cast<size_t>(v)])
    return std::nullopt;
  // Every node of the pattern is an f32 of n's shape (no broadcast on the way), and
  // every literal a scalar whose f32 value is the one the kernel would multiply by.
  auto same = [&](ValueId u) { return g_.node(u).type.dtype == DType::F32 && g_.node(u).type.shape == n.type.shape; };
  auto literal = [&](ValueId u, double want) {
    const Node& c = g_.node(u);
    if (c.op != OpKind::Constant || !c.type.shape.empty()) return false;
    // A literal past the float range (a graph may hold 1e300) is none of these; the
    // conversion of such a double to float would be undefined.
    const double v = c.attrs.get_float("value");
    return std::abs(v) <= std::numeric_limits<float>::max() && static_cast<float>(v) == static_cast<float>(want);
  };
  // `u` is op(k, other) in either order: k's operand `other`.
  auto with_literal = [&](ValueId u, OpKind op, double k) -> std::optional<ValueId> {
    const Node& un = g_.node(u);
    if (un.op != op || !same(u)) return std::nullopt;
    for (int i = 0; i < 2; ++i)
      if (literal(un.inputs[static_cast<size_t>(i)], k)) return un.inputs[static_cast<size_t>(1 - i)];
    return std::nullopt;
  };
  for (int i = 0; i < 2; ++i) {
    // n = mul(mul(x, 0.5), add(erf(mul(x, 1/sqrt 2)), 1)), every product and sum in
    // either order: the decomposed gelu (codegen/ir/decompose.cpp) and the same
    // written out.
    std::optional<ValueId> x = with_literal(n.inputs[static_cast<size_t>(i)], OpKind::Mul, 0.5);
    std::optional<ValueId> erf = with_literal(n.inputs[static_cast<size_t>(1 - i)], OpKind::Add, 1.0);
    if (!x || !erf || g_.node(*erf).op != OpKind::Erf || !same(*erf) || !same(*x)) continue;
    std::optional<ValueId> z = with_literal(g_.node(*erf).inputs[0], OpKind::Mul, 1.0 / std::numbers::sqrt2);
    if (z && *z == *x) return x;
  }
  return std::nullopt;
}

Result<Elem> GroupValues::output_value(ValueId v, const ValueIndex& at) {
  // A cast to f16/bf16 from a float, as stored: its operand unrounded, tagged with the
  // 16-bit dtype. The store rounds it (once, to nearest even: round(round(x)) is
  // round(x)), which spares the rounding the cast would do, the widening back to f32
  // and, where stores convert pairs (cvt.rn.bf16x2.f32), a conversion per element.
  const Node& n = g_.node(v);
  if (n.op == OpKind::Cast && (n.type.dtype == DType::BF16 || n.type.dtype == DType::F16) &&
      is_float(g_.node(n.inputs[0]).type.dtype) && !(hook_ && hook_(v, at))) {
    std::optional<ValueIndex> ui = operand_index(n, at, g_.node(n.inputs[0]).type.shape);
    if (ui) {
      Result<Elem> u = value(n.inputs[0], *ui);
      if (!u) return u;
      return Elem{u->value, n.type.dtype};
    }
  }
  return value(v, at);
}

Result<Elem> GroupValues::coordinate_value(ValueId v, const ValueIndex& at) {
  const Node& n = g_.node(v);
  llvm::IRBuilderBase& b = cg_.builder();
  // Coordinates are below 2^40: as i64 they take any arithmetic below without overflow.
  // A value read at a computed index (a concat's operand) counts from that index.
  llvm::Value* from = index_value(at.prefix.base);
  if (!from) return Diag{"", n.loc, "internal: a coordinate read at an index no concat computed"};
  auto coord = [&](int d) {
    const int src = at.src[static_cast<size_t>(d)];
    const bool known = src >= 0 && !coords_.empty() && at.prefix.contiguous() && at.unshifted() && at.space == coord_space_;
    if (known) return b.CreateZExt(coords_[static_cast<size_t>(src)], b.getInt64Ty());
    return b.CreateZExt(emit_coordinate(b, from, at, d), b.getInt64Ty());
  };
  switch (n.op) {
    case OpKind::Arange: {
      // start + i * step lies between start and end: exact in i64, then converted to
      // the dtype once, as the reference does.
      llvm::Value* i = b.CreateMul(coord(0), b.getInt64(static_cast<uint64_t>(n.attrs.get_int("step"))));
      llvm::Value* x = b.CreateAdd(b.getInt64(static_cast<uint64_t>(n.attrs.get_int("start"))), i);
      return cg_.convert(Elem{x, DType::I64}, n.type.dtype);
    }
    case OpKind::Full: return cg_.constant(n.attrs.get_float("value"), n.type.dtype);
    case OpKind::Tril:
    case OpKind::Triu: {
      const ValueId u = n.inputs[0];
      std::optional<ValueIndex> ui = operand_index(n, at, g_.node(u).type.shape);
      Result<Elem> x = value(u, *ui);
      if (!x) return x;
      const int r = n.type.rank();
      llvm::Value* diff = b.CreateSub(coord(r - 1), coord(r - 2));  // j - i
      llvm::Value* diagonal = b.getInt64(static_cast<uint64_t>(n.attrs.get_int("diagonal")));
      llvm::Value* keep = n.op == OpKind::Tril ? b.CreateICmpSLE(diff, diagonal) : b.CreateICmpSGE(diff, diagonal);
      return Elem{b.CreateSelect(keep, x->value, cg_.constant(0.0, n.type.dtype).value), n.type.dtype};
    }
    case OpKind::Dropout: {
      const ValueId u = n.inputs[0];
      std::optional<ValueIndex> ui = operand_index(n, at, g_.node(u).type.shape);
      Result<Elem> x = value(u, *ui);
      if (!x) return x;
      // The element's global index: base + sum(c[d] * global stride[d]), below 2^40.
      const DropoutIndex di = dropout_index(n.type.shape, n.attrs);
      llvm::Value* index = b.getInt64(static_cast<uint64_t>(di.base));
      for (int d = 0; d < n.type.rank(); ++d)
        if (n.type.shape[static_cast<size_t>(d)] > 1)  // a size-1 dim's coordinate is 0
          index = b.CreateAdd(index, b.CreateMul(coord(d), b.getInt64(static_cast<uint64_t>(di.strides[static_cast<size_t>(d)]))));
      Result<Elem> r = emit_dropout(cg_, n, *x, index, rounded16_[static_cast<size_t>(v)]);
      if (!r) return Diag{"", n.loc, r.error().message};
      return r;
    }
    default: return Diag{"", n.loc, std::string(op_name(n.op)) + " is not computed from coordinates"};
  }
}

llvm::Value* GroupValues::index_value(int base) const {
  if (base == kIterationIndex) return flat_;
  if (base < 1 || static_cast<size_t>(base) > computed_.size()) return nullptr;
  return computed_[static_cast<size_t>(base) - 1];
}

Result<Elem> GroupValues::concat_value(ValueId v, const ValueIndex& at) {
  const Node& n = g_.node(v);
  const Shape& s = n.type.shape;
  if (numel(s) == 0) return cg_.constant(0.0, n.type.dtype);  // never read: no element to select
  llvm::IRBuilderBase& b = cg_.builder();
  const auto d = static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), n.type.rank()));
  const int64_t total = s[d];
  int64_t outer = 1, inner = 1;
  for (size_t e = 0; e < d; ++e) outer *= s[e];
  for (size_t e = d + 1; e < s.size(); ++e) inner *= s[e];
  // The concat's own C-order flat index, split into (o, c, r): the dims before the
  // concat dim, the coordinate along it, the dims after it.
  IndexMap own = offset_map(at, s);
  llvm::Value* from = index_value(own.base);
  if (!from) return Diag{"", n.loc, "internal: a concat read at an index no concat computed"};
  llvm::Value* flat = emit_index_map(b, from, own);
  llvm::Type* ty = flat->getType();
  auto k = [ty](int64_t x) { return llvm::ConstantInt::get(ty, static_cast<uint64_t>(x)); };
  llvm::Value* c = inner > 1 ? b.CreateUDiv(flat, k(inner)) : flat;
  llvm::Value* o = outer > 1 ? b.CreateUDiv(c, k(total)) : nullptr;
  if (o) c = b.CreateURem(c, k(total));
  llvm::Value* r = inner > 1 ? b.CreateURem(flat, k(inner)) : nullptr;
  // Every operand is read at its element (o, clamp(c - lo), r), so no load leaves it
  // whichever operand the coordinate falls in: c - lo wraps to a huge unsigned value
  // below the operand's range, and umin takes it to the operand's last element.
  std::vector<std::pair<int64_t, Elem>> parts;  // (the operand's end along the dim, its element)
  int64_t lo = 0;
  for (ValueId u : n.inputs) {
    const Shape& us = g_.node(u).type.shape;
    const int64_t size = us[d];
    if (size == 0) continue;  // no element of it is ever selected
    llvm::Value* cu = b.CreateBinaryIntrinsic(llvm::Intrinsic::umin, lo ? b.CreateSub(c, k(lo)) : c, k(size - 1));
    if (o) cu = b.CreateAdd(b.CreateMul(o, k(size), "", true, true), cu, "", true, true);
    if (r) cu = b.CreateAdd(b.CreateMul(cu, k(inner), "", true, true), r, "", true, true);
    computed_.push_back(cu);
    ValueIndex ui = dense_index(us);
    ui.prefix.base = static_cast<int>(computed_.size());
    Result<Elem> e = value(u, ui);
    if (!e) return e;
    lo += size;
    parts.emplace_back(lo, *e);
  }
  Elem out = parts.back().second;
  for (size_t j = parts.size() - 1; j-- > 0;)
    out.value = b.CreateSelect(b.CreateICmpULT(c, k(parts[j].first)), parts[j].second.value, out.value);
  out.dtype = n.type.dtype;
  return out;
}

Result<Elem> GroupValues::lookup_value(ValueId v, const ValueIndex& at) {
  const Node& n = g_.node(v);
  const Shape& s = n.type.shape;
  const ValueId xv = n.inputs[0], iv = n.inputs[1];
  const Shape& xs = g_.node(xv).type.shape;
  const auto dim = static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), static_cast<int>(xs.size())));
  // Nothing to read: no element, or a dim with no rows (every index is out of range).
  if (numel(s) == 0 || xs[dim] == 0) return cg_.constant(0.0, n.type.dtype);
  llvm::IRBuilderBase& b = cg_.builder();
  IndexMap own = offset_map(at, s);
  llvm::Value* from = index_value(own.base);
  if (!from) return Diag{"", n.loc, "internal: a lookup read at an index no concat computed"};
  llvm::Value* flat = emit_index_map(b, from, own);
  llvm::Type* ty = flat->getType();
  auto k = [ty](int64_t x) { return llvm::ConstantInt::get(ty, static_cast<uint64_t>(x)); };
  // The result's coordinates (below 2^40, so in the index type of the group).
  std::vector<llvm::Value*> c(s.size());
  int64_t inner = 1;
  for (size_t d = s.size(); d-- > 0;) {
    llvm::Value* q = inner > 1 ? b.CreateUDiv(flat, k(inner)) : flat;
    c[d] = d > 0 ? b.CreateURem(q, k(s[d])) : q;
    inner *= s[d];
  }
  // gather's index has the result's shape; index_select's is read at the coordinate along dim.
  computed_.push_back(n.op == OpKind::Gather ? flat : c[dim]);
  ValueIndex ii = dense_index(g_.node(iv).type.shape);
  ii.prefix.base = static_cast<int>(computed_.size());
  Result<Elem> idx = value(iv, ii);
  if (!idx) return idx;
  const int64_t offset = n.attrs.get_int("offset");  // x's first row along dim (vocabulary parallel)
  MaskedRow row = masked_row(b, cg_.convert(*idx, DType::I64).value, offset, xs[dim]);
  // x's element: the result's coordinates with the row along dim (gather's index is no
  // larger than x on the other dims, index_select keeps them), C order.
  llvm::Value* xf = nullptr;
  for (size_t d = 0; d < xs.size(); ++d) {
    llvm::Value* cd = d == dim ? b.CreateZExtOrTrunc(row.row, ty) : c[d];
    xf = xf ? b.CreateAdd(b.CreateMul(xf, k(xs[d]), "", true, true), cd, "", true, true) : cd;
  }
  computed_.push_back(xf);
  ValueIndex xi = dense_index(xs);
  xi.prefix.base = static_cast<int>(computed_.size());
  Result<Elem> x = value(xv, xi);
  if (!x) return x;
  Elem zero = cg_.constant(0.0, x->dtype);
  return Elem{b.CreateSelect(row.in_range, x->value, zero.value), x->dtype};
}

std::vector<std::pair<int, IndexMap>> GroupValues::reads(ValueId v0, const ValueIndex& at0) const {
  std::vector<std::pair<int, IndexMap>> out;
  std::set<std::string> seen;
  std::function<void(ValueId, const ValueIndex&)> walk = [&](ValueId v, const ValueIndex& at) {
    if (!seen.insert(std::to_string(v) + "#" + at.key()).second) return;
    const Node& n = g_.node(v);
    if (n.op == OpKind::Param) {
      out.emplace_back(param_slot(v), offset_map(at, n.type.shape));
      return;
    }
    for (ValueId u : n.inputs)
      if (auto ui = operand_index(n, at, g_.node(u).type.shape)) walk(u, *ui);
  };
  walk(v0, at0);
  return out;
}

}  // namespace sf::kernels
