#include "codegen/reference/evaluate_index.h"

#include <cstring>
#include <vector>

namespace sf {

namespace {

void copy_elem(const Tensor& src, int64_t i, Tensor& dst, int64_t j) {
  const int64_t size = dtype_size(src.dtype());
  std::memcpy(dst.data() + j * size, src.data() + i * size, static_cast<size_t>(size));
}

// The C-order flat offset of coordinates `c` in a tensor of `shape`.
int64_t flat_of(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + c[d];
  return f;
}

// The coordinates of C-order flat index `f` in `shape`.
std::vector<int64_t> coords_of(int64_t f, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = f % shape[d];
    f /= shape[d];
  }
  return c;
}

size_t dim_of(const Node& n, const Tensor& x) {
  return static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), static_cast<int>(x.shape().size())));
}

}  // namespace

std::optional<int64_t> lookup_row(int64_t idx, int64_t offset, int64_t rows) {
  if (idx < offset) return std::nullopt;
  // idx >= offset: the unsigned difference is exact (at most 2^64 - 1).
  const uint64_t row = static_cast<uint64_t>(idx) - static_cast<uint64_t>(offset);
  if (row >= static_cast<uint64_t>(rows)) return std::nullopt;
  return static_cast<int64_t>(row);
}

// out[c] = x[c with c[dim] = index[c] - offset] (torch.gather); out has index's shape.
Tensor eval_gather(const Node& n, const Tensor& x, const Tensor& index) {
  const size_t dim = dim_of(n, x);
  const int64_t offset = n.attrs.get_int("offset");
  Tensor out(n.type.dtype, n.type.shape);  // zeros
  for (int64_t e = 0; e < out.numel(); ++e) {
    std::vector<int64_t> c = coords_of(e, out.shape());
    std::optional<int64_t> row = lookup_row(index.get_int(e), offset, x.shape()[dim]);
    if (!row) continue;
    c[dim] = *row;
    copy_elem(x, flat_of(c, x.shape()), out, e);
  }
  return out;
}

// out[..., j, ...] = x[..., index[j] - offset, ...] along dim (torch.index_select).
Tensor eval_index_select(const Node& n, const Tensor& x, const Tensor& index) {
  const size_t dim = dim_of(n, x);
  const int64_t offset = n.attrs.get_int("offset");
  Tensor out(n.type.dtype, n.type.shape);
  for (int64_t e = 0; e < out.numel(); ++e) {
    std::vector<int64_t> c = coords_of(e, out.shape());
    std::optional<int64_t> row = lookup_row(index.get_int(c[dim]), offset, x.shape()[dim]);
    if (!row) continue;
    c[dim] = *row;
    copy_elem(x, flat_of(c, x.shape()), out, e);
  }
  return out;
}

// out[i, c] = weight[indices[i] - offset, c] (F.embedding).
Tensor eval_embedding(const Node& n, const Tensor& indices, const Tensor& w) {
  const int64_t rows = w.shape()[0], cols = w.shape()[1], offset = n.attrs.get_int("offset");
  Tensor out(n.type.dtype, n.type.shape);
  for (int64_t i = 0; i < indices.numel(); ++i) {
    std::optional<int64_t> row = lookup_row(indices.get_int(i), offset, rows);
    if (!row) continue;
    for (int64_t c = 0; c < cols; ++c) copy_elem(w, *row * cols + c, out, i * cols + c);
  }
  return out;
}

// out = x; out[c with c[dim] = index[c]] += src[c] for every c of index's shape
// (torch.scatter_add). Floats add in double and round once; integers wrap in int64
// (then to the dtype, as a cast does).
Tensor eval_scatter_add(const Node& n, const Tensor& x, const Tensor& index, const Tensor& src) {
  const size_t dim = dim_of(n, x);
  const bool fl = is_float(x.dtype());
  std::vector<double> acc(static_cast<size_t>(x.numel()));
  std::vector<uint64_t> iacc(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (fl) acc[static_cast<size_t>(i)] = x.get(i);
    else iacc[static_cast<size_t>(i)] = static_cast<uint64_t>(x.get_int(i));
  }
  for (int64_t e = 0; e < index.numel(); ++e) {
    std::vector<int64_t> c = coords_of(e, index.shape());
    const int64_t s = flat_of(c, src.shape());
    std::optional<int64_t> row = lookup_row(index.get_int(e), 0, x.shape()[dim]);
    if (!row) continue;  // added nowhere
    c[dim] = *row;
    const auto t = static_cast<size_t>(flat_of(c, x.shape()));
    if (fl) acc[t] += src.get(s);
    else iacc[t] += static_cast<uint64_t>(src.get_int(s));
  }
  Tensor out(n.type.dtype, n.type.shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (fl) out.set(i, acc[static_cast<size_t>(i)]);
    else out.set_int(i, static_cast<int64_t>(iacc[static_cast<size_t>(i)]));
  }
  return out;
}

}  // namespace sf
