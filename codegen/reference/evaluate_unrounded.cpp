// The reference without 16-bit rounding: evaluate_unrounded.h.
#include "codegen/reference/evaluate_unrounded.h"

#include "codegen/ir/builder.h"
#include "codegen/ir/ops.h"
#include "codegen/reference/evaluate.h"

namespace sf {

namespace {

bool is_16bit(DType t) { return t == DType::F16 || t == DType::BF16; }
DType widen(DType t) { return is_16bit(t) ? DType::F32 : t; }

}  // namespace

bool has_16bit_values(const Graph& g) {
  for (const Node& n : g.nodes())
    if (is_16bit(n.type.dtype)) return true;
  return false;
}

Result<Graph> widen_16bit(const Graph& g) {
  try {
    GraphBuilder b(g.name(), g.mesh());
    std::vector<Value> v;
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::Param) {
        v.push_back(b.param(n.name, widen(n.type.dtype), n.type.shape, n.placement, n.loc));
        continue;
      }
      if (n.op == OpKind::Constant) {
        v.push_back(b.constant(n.attrs.get_float("value"), widen(n.attrs.get_dtype("dtype")), n.loc));
        continue;
      }
      // Every dtype attribute (cast's target, full's and arange's dtype) widened; the
      // shape rules then infer f32 wherever f16/bf16 would have been.
      std::vector<std::pair<std::string, AttrValue>> attrs = n.attrs.items;
      for (auto& [name, value] : attrs)
        if (const DType* t = std::get_if<DType>(&value)) value = widen(*t);
      std::vector<Value> in;
      for (ValueId i : n.inputs) in.push_back(v[static_cast<size_t>(i)]);
      Value out = b.op(n.op, in, {}, attrs, n.loc);
      if (!n.name.empty()) b.name(out, n.name, n.loc);
      if (n.placement) b.constrain(out, *n.placement, n.loc);
      v.push_back(out);
    }
    for (const Output& o : g.outputs()) b.ret(v[static_cast<size_t>(o.value)], o.placement, o.loc);
    return b.finish();
  } catch (const DiagError& e) {
    return e.diag;
  } catch (const OpError& e) {
    return Diag{"", {}, e.message};
  }
}

Result<std::vector<Tensor>> evaluate_unrounded(const Graph& g, const std::vector<Tensor>& inputs) {
  Result<Graph> wide = widen_16bit(g);
  if (!wide) return wide.error();
  std::vector<Tensor> in;
  in.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (!is_16bit(t.dtype())) {
      in.push_back(t);
      continue;
    }
    Tensor w(DType::F32, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) w.set(i, t.get(i));  // exact: every f16/bf16 value is an f32
    in.push_back(std::move(w));
  }
  Result<std::vector<Tensor>> out = evaluate(*wide, in);
  if (!out) return out.error();
  std::vector<Tensor> rounded;
  for (size_t o = 0; o < out->size(); ++o) {
    const DType want = g.node(g.outputs()[o].value).type.dtype;
    Tensor& t = (*out)[o];
    if (t.dtype() == want) {
      rounded.push_back(std::move(t));
      continue;
    }
    Tensor r(want, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));  // one rounding, to nearest even
    rounded.push_back(std::move(r));
  }
  return rounded;
}

}  // namespace sf
