#include "codegen/reference/evaluate_along.h"

#include <cmath>
#include <cstdint>

namespace sf::reference_detail {

namespace {

// x viewed as [outer, len, inner] around `dim`: row r = (o, i) starts at
// o * len * inner + i and steps by inner.
struct Rows {
  int64_t outer = 1, len = 1, inner = 1;
  int64_t start(int64_t r) const { return (r / inner) * len * inner + r % inner; }
  int64_t count() const { return outer * inner; }
};

Rows rows_of(const Shape& shape, int dim) {
  Rows r;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t s = shape[d];
    if (static_cast<int>(d) < dim) r.outer *= s;
    else if (static_cast<int>(d) == dim) r.len = s;
    else r.inner *= s;
  }
  return r;
}

int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// torch.argmax/argmin: the first index of the extreme; a NaN is the extreme (the
// first NaN wins, as torch's comparators treat NaN as greater than everything for
// max and smaller than everything for min).
bool replaces(bool is_max, double v, double best) {
  if (std::isnan(best)) return false;
  if (std::isnan(v)) return true;
  return is_max ? v > best : v < best;
}

}  // namespace

Tensor evaluate_along(const Node& n, const Tensor& x) {
  const int dim = *normalize_dim(n.attrs.get_int("dim"), x.type().rank());
  const Rows rows = rows_of(x.shape(), dim);
  Tensor out(n.type.dtype, n.type.shape);
  for (int64_t r = 0; r < rows.count(); ++r) {
    const int64_t base = rows.start(r);
    if (n.op == OpKind::Cumsum) {
      if (is_float(n.type.dtype)) {
        double acc = 0;
        for (int64_t k = 0; k < rows.len; ++k) {
          acc += x.get(base + k * rows.inner);
          out.set(base + k * rows.inner, acc);
        }
      } else {
        int64_t acc = 0;
        for (int64_t k = 0; k < rows.len; ++k) {
          acc = wrap_add(acc, x.get_int(base + k * rows.inner));
          out.set_int(base + k * rows.inner, acc);
        }
      }
      continue;
    }
    const bool is_max = n.op == OpKind::Argmax;
    int64_t best_k = 0;
    if (is_float(x.dtype())) {
      double best = x.get(base);
      for (int64_t k = 1; k < rows.len; ++k) {
        const double v = x.get(base + k * rows.inner);
        if (replaces(is_max, v, best)) best = v, best_k = k;
      }
    } else {
      int64_t best = x.get_int(base);
      for (int64_t k = 1; k < rows.len; ++k) {
        const int64_t v = x.get_int(base + k * rows.inner);
        if (is_max ? v > best : v < best) best = v, best_k = k;
      }
    }
    out.set_int(r, best_k);  // the result's flat index is the row's (dim removed or size 1)
  }
  return out;
}

}  // namespace sf::reference_detail
