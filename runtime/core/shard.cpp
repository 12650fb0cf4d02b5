#include "runtime/core/shard.h"

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

// One Partial group's reduction, in a wide accumulator (double for floats, int64
// for integers and bool) rounded once at the end, as the runtime's collectives do
// (runtime/comm/comm.cpp's wire types): summing bools in bool storage would saturate at
// true, and an avg of [true, true] would then truncate 1 / 2 to false.
Tensor reduce_group(const std::vector<const Tensor*>& members, ReduceOp op) {
  const Tensor& first = *members[0];
  Tensor out(first.dtype(), first.shape());
  const bool floats = is_float(first.dtype());
  const auto n = static_cast<int64_t>(members.size());
  for (int64_t i = 0; i < first.numel(); ++i) {
    if (floats) {
      double acc = first.get(i);
      for (size_t k = 1; k < members.size(); ++k) {
        double b = members[k]->get(i);
        switch (op) {
          case ReduceOp::Sum:
          case ReduceOp::Avg: acc += b; break;
          case ReduceOp::Max: acc = std::isnan(acc) || acc >= b ? acc : b; break;
          case ReduceOp::Min: acc = std::isnan(acc) || acc <= b ? acc : b; break;
        }
      }
      out.set(i, op == ReduceOp::Avg ? acc / static_cast<double>(n) : acc);
    } else {
      int64_t acc = first.get_int(i);
      for (size_t k = 1; k < members.size(); ++k) {
        int64_t b = members[k]->get_int(i);
        switch (op) {
          case ReduceOp::Sum:
          case ReduceOp::Avg: acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(b)); break;
          case ReduceOp::Max: acc = std::max(acc, b); break;
          case ReduceOp::Min: acc = std::min(acc, b); break;
        }
      }
      out.set_int(i, op == ReduceOp::Avg ? acc / n : acc);
    }
  }
  return out;
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
      std::vector<const Tensor*> members;
      for (int r : g) members.push_back(&cur[static_cast<size_t>(r)]);
      Tensor reduced = reduce_group(members, p.op);
      cur[static_cast<size_t>(g[0])] = std::move(reduced);
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
