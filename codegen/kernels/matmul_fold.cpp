// Folding a matmul's batch dims into its rows, as torch.matmul does for a batched
// [b..., M, K] times a shared [K, N] (at::matmul's "fold" path): matmul_group.h.
#include <algorithm>
#include <functional>
#include <set>

#include "codegen/ir/builder.h"
#include "codegen/kernels/matmul_group.h"

namespace sf::matmul_detail {

namespace {

// The nodes `v` depends on, `v` included.
std::set<ValueId> ancestors(const Graph& g, ValueId v) {
  std::set<ValueId> out;
  std::function<void(ValueId)> walk = [&](ValueId u) {
    if (!out.insert(u).second) return;
    for (ValueId w : g.node(u).inputs) walk(w);
  };
  walk(v);
  return out;
}

}  // namespace

std::optional<Graph> fold_batch_into_rows(const Graph& g) {
  ValueId mm = -1;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].op == OpKind::Matmul) {
      if (mm >= 0) return std::nullopt;
      mm = static_cast<ValueId>(i);
    }
  if (mm < 0) return std::nullopt;
  const Node& m = g.node(mm);
  const Shape& o = m.type.shape;
  const size_t r = o.size();
  if (r < 3) return std::nullopt;
  const Shape rows_of_o(o.begin(), o.end() - 1);  // [batch..., M]
  const int64_t rows = numel(rows_of_o);
  if (rows == o[r - 2]) return std::nullopt;  // no batch dim above 1: nothing to fold
  // A: a param of the whole [batch..., M, K], read in place (so its rows are dense
  // across the batch).
  const ValueId a = m.inputs[0];
  const Node& an = g.node(a);
  if (an.op != OpKind::Param || an.type.shape.size() != r ||
      !std::equal(rows_of_o.begin(), rows_of_o.end(), an.type.shape.begin()))
    return std::nullopt;
  // B: [K, N] (no batch dims), computed only from what nothing else reads.
  const ValueId b = m.inputs[1];
  if (g.node(b).type.shape.size() != 2) return std::nullopt;
  const std::set<ValueId> bside = ancestors(g, b);
  if (bside.count(a)) return std::nullopt;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const auto v = static_cast<ValueId>(i);
    if (bside.count(v) || v == mm) continue;
    for (ValueId u : g.nodes()[i].inputs)
      if (bside.count(u)) return std::nullopt;
  }
  for (const Output& out : g.outputs())
    if (bside.count(out.value)) return std::nullopt;
  // Everything else: params, literals and elementwise ops, each either over all of
  // O's rows (folded to [rows, last dim]) or over none of them (size 1 there: a bias).
  std::vector<std::optional<Shape>> shape(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const auto v = static_cast<ValueId>(i);
    if (bside.count(v)) continue;
    const Node& n = g.nodes()[i];
    if (v != mm && n.op != OpKind::Param && n.op != OpKind::Constant && !kernels::is_elementwise(n.op))
      return std::nullopt;
    const Shape& s = n.type.shape;
    if (s.size() == r && std::equal(rows_of_o.begin(), rows_of_o.end(), s.begin())) {
      shape[i] = Shape{rows, s.back()};
    } else if (s.size() <= r && std::all_of(s.begin(), s.end() - std::min<size_t>(s.size(), 1),
                                            [](int64_t d) { return d == 1; })) {
      shape[i] = s.size() <= 1 ? s : Shape{1, s.back()};
    } else {
      return std::nullopt;
    }
  }
  // The same graph over the folded shapes: params in their order (the kernel's
  // arguments), then every other node in order.
  GraphBuilder gb(g.name());
  std::vector<std::optional<Value>> val(g.nodes().size());
  for (ValueId p : g.params()) {
    const Node& n = g.node(p);
    const Shape& s = shape[static_cast<size_t>(p)] ? *shape[static_cast<size_t>(p)] : n.type.shape;
    val[static_cast<size_t>(p)] = gb.param(n.name, n.type.dtype, s, std::nullopt, n.loc);
  }
  try {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (n.op == OpKind::Param) continue;
      if (n.op == OpKind::Constant) {
        val[i] = gb.constant(n.attrs.get_float("value"), n.attrs.get_dtype("dtype"), n.loc);
        continue;
      }
      std::vector<Value> in;
      for (ValueId u : n.inputs) in.push_back(*val[static_cast<size_t>(u)]);
      val[i] = gb.op(n.op, in, {}, n.attrs.items, n.loc);
    }
    for (const Output& out : g.outputs()) gb.ret(*val[static_cast<size_t>(out.value)]);
  } catch (const DiagError&) {
    return std::nullopt;  // an op the folded shapes do not suit: keep the batch
  }
  Result<Graph> folded = gb.finish();
  if (!folded) return std::nullopt;
  return std::move(folded).value();
}

KernelSpec fold_batch_into_rows(const KernelSpec& spec) {
  if (spec.kind != KernelKind::Matmul) return spec;
  std::optional<Graph> g = fold_batch_into_rows(spec.group);
  if (!g) return spec;
  KernelSpec s = spec;
  s.group = std::move(*g);
  return s;
}

}  // namespace sf::matmul_detail
