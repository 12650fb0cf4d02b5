// The reference without 16-bit rounding: evaluate_unrounded.h.
#include "codegen/reference/evaluate_unrounded.h"

#include <variant>

#include "codegen/ir/builder.h"
#include "codegen/ir/ops.h"
#include "codegen/reference/evaluate.h"

namespace sf {

namespace {

bool is_16bit(DType t) { return t == DType::F16 || t == DType::BF16; }
DType widen(DType t) { return is_16bit(t) ? DType::F32 : t; }

}  // namespace

Result<Graph> widen_16bit(const Graph& g) {
  // A param's dtype and every dtype attribute (a constant's, cast's target, full's and
  // arange's dtype) widened; the shape rules then infer f32 wherever f16/bf16 would
  // have been.
  return rebuild(g, g.mesh(), [](Node& n) {
    n.type.dtype = widen(n.type.dtype);
    for (auto& [name, value] : n.attrs.items)
      if (const DType* t = std::get_if<DType>(&value)) value = widen(*t);
  });
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
