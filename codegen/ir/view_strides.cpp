#include "codegen/ir/view_strides.h"

#include "runtime/core/tensor.h"

namespace sf {

std::optional<std::vector<int64_t>> reshape_strides(const Shape& from, const std::vector<int64_t>& strides,
                                                    const Shape& to) {
  if (numel(from) != numel(to) || strides.size() != from.size()) return std::nullopt;
  if (numel(to) == 0) return contiguous_strides(to);  // nothing is read: any strides do
  // Size-1 dims carry no stride. The others, from the innermost out, form runs in which
  // each dim's stride is the next one's times its size (memory one after the other);
  // each run must be covered by whole dims of `to`, which then step through it.
  std::vector<int> dims;  // `from`'s dims of size > 1
  for (size_t d = 0; d < from.size(); ++d)
    if (from[d] != 1) dims.push_back(static_cast<int>(d));
  std::vector<int64_t> out(to.size(), 0);
  int t = static_cast<int>(to.size()) - 1;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0;) {
    // The run ending at dims[i]: its elements, and its innermost stride.
    const int64_t base = strides[static_cast<size_t>(dims[static_cast<size_t>(i)])];
    int64_t run = 1;
    int j = i;
    for (;;) {
      const size_t d = static_cast<size_t>(dims[static_cast<size_t>(j)]);
      run *= from[d];
      if (j == 0) break;
      const size_t outer = static_cast<size_t>(dims[static_cast<size_t>(j - 1)]);
      if (strides[outer] != strides[d] * from[d]) break;
      --j;
    }
    // `to`'s dims from t outwards take the run, innermost first.
    int64_t covered = 1;
    while (covered < run) {
      if (t < 0) return std::nullopt;
      const int64_t n = to[static_cast<size_t>(t)];
      if (n != 1) {
        if (run % (covered * n) != 0) return std::nullopt;
        out[static_cast<size_t>(t)] = base * covered;
        covered *= n;
      }
      --t;
    }
    i = j - 1;
  }
  // What is left of `to` is dims of size 1.
  for (; t >= 0; --t)
    if (to[static_cast<size_t>(t)] != 1) return std::nullopt;
  return out;
}

std::optional<std::vector<int64_t>> view_strides(const Node& n, const Shape& operand,
                                                 const std::vector<int64_t>& strides) {
  const Shape& to = n.type.shape;
  const int rank = static_cast<int>(operand.size());
  if (strides.size() != operand.size()) return std::nullopt;
  switch (n.op) {
    case OpKind::Transpose: {
      std::optional<int> a = normalize_dim(n.attrs.get_int("dim0"), rank);
      std::optional<int> b = normalize_dim(n.attrs.get_int("dim1"), rank);
      if (!a || !b) return std::nullopt;
      std::vector<int64_t> out = strides;
      std::swap(out[static_cast<size_t>(*a)], out[static_cast<size_t>(*b)]);
      return out;
    }
    case OpKind::Permute: {
      const std::vector<int64_t>& dims = n.attrs.get_ints("dims");
      if (static_cast<int>(dims.size()) != rank) return std::nullopt;
      std::vector<int64_t> out;
      for (int64_t d : dims) {
        std::optional<int> nd = normalize_dim(d, rank);
        if (!nd) return std::nullopt;
        out.push_back(strides[static_cast<size_t>(*nd)]);
      }
      return out;
    }
    case OpKind::Expand: {
      // Right-aligned, as broadcasting: new leading dims and expanded size-1 dims read
      // the same element (stride 0).
      if (to.size() < operand.size()) return std::nullopt;
      const size_t lead = to.size() - operand.size();
      std::vector<int64_t> out(to.size(), 0);
      for (size_t d = 0; d < operand.size(); ++d)
        out[lead + d] = operand[d] == to[lead + d] ? strides[d] : 0;
      return out;
    }
    case OpKind::Reshape: return reshape_strides(operand, strides, to);
    default: return std::nullopt;
  }
}

std::optional<std::vector<int64_t>> operand_strides(const Node& n, const Shape& operand,
                                                    const std::vector<int64_t>& result_strides) {
  const Shape& result = n.type.shape;
  const int rank = static_cast<int>(operand.size());
  if (result_strides.size() != result.size()) return std::nullopt;
  switch (n.op) {
    case OpKind::Transpose: {
      std::optional<int> a = normalize_dim(n.attrs.get_int("dim0"), rank);
      std::optional<int> b = normalize_dim(n.attrs.get_int("dim1"), rank);
      if (!a || !b || result.size() != operand.size()) return std::nullopt;
      std::vector<int64_t> s = result_strides;
      std::swap(s[static_cast<size_t>(*a)], s[static_cast<size_t>(*b)]);
      return s;
    }
    case OpKind::Permute: {
      const std::vector<int64_t>& dims = n.attrs.get_ints("dims");
      if (dims.size() != operand.size() || result.size() != operand.size()) return std::nullopt;
      std::vector<int64_t> s(operand.size(), 0);
      for (size_t d = 0; d < dims.size(); ++d) {
        std::optional<int> from = normalize_dim(dims[d], rank);
        if (!from) return std::nullopt;
        s[static_cast<size_t>(*from)] = result_strides[d];  // result dim d is operand dim dims[d]
      }
      return s;
    }
    case OpKind::Reshape: return reshape_strides(result, result_strides, operand);
    default: return std::nullopt;
  }
}

}  // namespace sf
