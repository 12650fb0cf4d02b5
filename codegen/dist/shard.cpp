#include "codegen/dist/shard.h"

#include <cmath>
#include <cstring>

namespace sf {

namespace {

// Calls f(src_flat, dst_flat, run) for every contiguous innermost run of a block of
// `shape` at `offset` inside a tensor of shape `outer`; blk is the block's own C-order
// flat index.
template <class F>
void for_each_run(const Shape& outer, const std::vector<int64_t>& offset, const Shape& shape, F f) {
  if (numel(shape) == 0) return;
  size_t r = shape.size();
  if (r == 0) {
    f(0, 0, 1);
    return;
  }
  std::vector<int64_t> ost = contiguous_strides(outer);
  int64_t run = shape[r - 1];
  int64_t rows = numel(shape) / run;
  std::vector<int64_t> idx(r, 0);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t o = 0;
    for (size_t d = 0; d < r; ++d) o += (offset[d] + idx[d]) * ost[d];
    f(o, row * run, run);
    for (size_t d = r - 1; d-- > 0;) {  // advance the row index, innermost first
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor slice_block(const Tensor& t, const std::vector<int64_t>& offset, const Shape& shape) {
  Tensor out(t.dtype(), shape);
  int64_t es = dtype_size(t.dtype());
  for_each_run(t.shape(), offset, shape, [&](int64_t src, int64_t dst, int64_t n) {
    std::memcpy(out.data() + dst * es, t.data() + src * es, static_cast<size_t>(n * es));
  });
  return out;
}

void place_block(Tensor& dst, const Tensor& block, const std::vector<int64_t>& offset) {
  int64_t es = dtype_size(dst.dtype());
  for_each_run(dst.shape(), offset, block.shape(), [&](int64_t d, int64_t s, int64_t n) {
    std::memcpy(dst.data() + d * es, block.data() + s * es, static_cast<size_t>(n * es));
  });
}

Tensor shard_tensor(const Tensor& global, const PlacementSpec& spec, const DeviceMesh& mesh, int rank) {
  LocalShard ls = local_shard(global.shape(), spec, mesh, rank);
  Tensor local = slice_block(global, ls.offset, ls.shape);
  std::vector<int64_t> c = mesh.coord(rank);
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = spec.per_dim[static_cast<size_t>(i)];
    if (p.is_partial() && p.op == ReduceOp::Sum && c[static_cast<size_t>(i)] != 0)
      return Tensor(local.dtype(), local.shape());  // zeros: rank 0 of the group holds the value
  }
  return local;
}

namespace {

void combine(Tensor& acc, const Tensor& x, ReduceOp op) {
  bool ints = !is_float(acc.dtype());
  for (int64_t i = 0; i < acc.numel(); ++i) {
    if (ints) {
      int64_t a = acc.get_int(i), b = x.get_int(i);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc.set_int(i, static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b))); break;
        case ReduceOp::Max: acc.set_int(i, std::max(a, b)); break;
        case ReduceOp::Min: acc.set_int(i, std::min(a, b)); break;
      }
    } else {
      double a = acc.get(i), b = x.get(i);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc.set(i, a + b); break;
        case ReduceOp::Max: acc.set(i, std::isnan(a) || a >= b ? a : b); break;
        case ReduceOp::Min: acc.set(i, std::isnan(a) || a <= b ? a : b); break;
      }
    }
  }
}

}  // namespace

Result<Tensor> unshard_tensor(const std::vector<Tensor>& locals, const TensorType& global,
                              const PlacementSpec& spec, const DeviceMesh& mesh) {
  if (static_cast<int>(locals.size()) != mesh.world())
    return Diag{"", {}, "unshard: " + std::to_string(locals.size()) + " locals for " + std::to_string(mesh.world()) + " ranks"};
  for (int r = 0; r < mesh.world(); ++r) {
    LocalShard ls = local_shard(global.shape, spec, mesh, r);
    if (!(locals[static_cast<size_t>(r)].type() == TensorType{global.dtype, ls.shape}))
      return Diag{"", {}, "unshard: rank " + std::to_string(r) + " holds " + locals[static_cast<size_t>(r)].type().str() +
                              ", expected " + TensorType{global.dtype, ls.shape}.str()};
  }
  // Reduce Partial mesh dims, innermost first: afterwards the rank with coordinate 0
  // on every Partial dim holds the reduced local.
  std::vector<Tensor> cur = locals;
  for (int i = mesh.ndim() - 1; i >= 0; --i) {
    const Placement& p = spec.per_dim[static_cast<size_t>(i)];
    if (!p.is_partial()) continue;
    for (const std::vector<int>& g : mesh.groups(i)) {
      Tensor acc = cur[static_cast<size_t>(g[0])];
      for (size_t k = 1; k < g.size(); ++k) combine(acc, cur[static_cast<size_t>(g[k])], p.op);
      if (p.op == ReduceOp::Avg) {
        auto n = static_cast<int64_t>(g.size());
        for (int64_t e = 0; e < acc.numel(); ++e) {
          if (is_float(acc.dtype())) acc.set(e, acc.get(e) / static_cast<double>(n));
          else acc.set_int(e, acc.get_int(e) / n);
        }
      }
      cur[static_cast<size_t>(g[0])] = std::move(acc);
    }
  }
  Tensor out(global.dtype, global.shape);
  for (int r = 0; r < mesh.world(); ++r) {
    std::vector<int64_t> c = mesh.coord(r);
    bool representative = true;  // coordinate 0 on every non-Shard mesh dim
    for (int i = 0; i < mesh.ndim(); ++i)
      if (!spec.per_dim[static_cast<size_t>(i)].is_shard() && c[static_cast<size_t>(i)] != 0) representative = false;
    if (!representative) continue;
    place_block(out, cur[static_cast<size_t>(r)], local_shard(global.shape, spec, mesh, r).offset);
  }
  return out;
}

}  // namespace sf
