#include "codegen/fusion/gather_views.h"

#include <map>
#include <optional>

#include "runtime/core/tensor.h"

namespace sf {

namespace {

// Result dim d of transpose/permute node `n` is operand dim perm[d].
std::optional<std::vector<int>> permutation(const Node& n, int rank) {
  std::vector<int> perm(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) perm[static_cast<size_t>(d)] = d;
  if (n.op == OpKind::Transpose) {
    std::optional<int> a = normalize_dim(n.attrs.get_int("dim0"), rank);
    std::optional<int> b = normalize_dim(n.attrs.get_int("dim1"), rank);
    if (!a || !b) return std::nullopt;
    std::swap(perm[static_cast<size_t>(*a)], perm[static_cast<size_t>(*b)]);
    return perm;
  }
  if (n.op == OpKind::Permute) {
    const std::vector<int64_t>& dims = n.attrs.get_ints("dims");
    if (static_cast<int>(dims.size()) != rank) return std::nullopt;
    for (int d = 0; d < rank; ++d) {
      std::optional<int> from = normalize_dim(dims[static_cast<size_t>(d)], rank);
      if (!from) return std::nullopt;
      perm[static_cast<size_t>(d)] = *from;
    }
    return perm;
  }
  return std::nullopt;
}

}  // namespace

LocalProgram gather_before_views(LocalProgram p) {
  std::map<int, size_t> producer;
  std::map<int, int> readers;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const LocalStep& s = p.steps[i];
    if (s.out >= 0) producer[s.out] = i;
    for (int v : s.outs) producer[v] = i;
    for (int v : s.in) ++readers[v];
  }
  for (int v : p.output_values) ++readers[v];
  std::vector<bool> drop(p.steps.size(), false);
  std::map<size_t, LocalStep> after;  // a Wait's index -> the view that now follows it
  for (size_t i = 0; i < p.steps.size(); ++i) {
    LocalStep& s = p.steps[i];
    if (s.kind != LocalStep::Kind::Start || s.collective != CollectiveKind::AllGather || s.in.size() != 1) continue;
    auto pr = producer.find(s.in[0]);
    if (pr == producer.end() || readers[s.in[0]] != 1) continue;
    const LocalStep& view = p.steps[pr->second];
    if (view.kind != LocalStep::Kind::Compute) continue;
    const int x = view.in.at(0);
    std::optional<std::vector<int>> perm = permutation(view.node, p.types[static_cast<size_t>(x)].rank());
    if (!perm || s.dim < 0 || s.dim >= static_cast<int>(perm->size())) continue;
    size_t w = i + 1;
    while (w < p.steps.size() && !(p.steps[w].kind == LocalStep::Kind::Wait && p.steps[w].handle == s.handle)) ++w;
    if (w == p.steps.size()) continue;
    // Gather x along the dim that becomes the gathered one, then the view.
    const int gathered = p.steps[w].out;
    const int from = (*perm)[static_cast<size_t>(s.dim)];
    TensorType t = p.types[static_cast<size_t>(x)];
    t.shape[static_cast<size_t>(from)] = p.types[static_cast<size_t>(gathered)].shape[static_cast<size_t>(s.dim)];
    p.types.push_back(t);
    p.names.push_back(p.names[static_cast<size_t>(gathered)] + "_pre");
    const int pre = static_cast<int>(p.types.size()) - 1;
    s.in = {x};
    s.dim = from;
    p.steps[w].out = pre;
    LocalStep moved = view;
    moved.in = {pre};
    moved.out = gathered;
    moved.node.type = p.types[static_cast<size_t>(gathered)];
    after[w] = std::move(moved);
    drop[pr->second] = true;
  }
  if (after.empty()) return p;
  std::vector<LocalStep> out;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (drop[i]) continue;
    out.push_back(std::move(p.steps[i]));
    if (auto a = after.find(i); a != after.end()) out.push_back(std::move(a->second));
  }
  p.steps = std::move(out);
  return p;
}

}  // namespace sf
