#include "runtime/core/host_collectives.h"

#include <cmath>
#include <stdexcept>

#include "runtime/core/shard.h"

namespace sf {

Tensor concat(const std::vector<Tensor>& parts, int dim) {
  if (parts.empty()) throw std::invalid_argument("concat of nothing");
  Shape s = parts[0].shape();
  s[static_cast<size_t>(dim)] = 0;
  for (const Tensor& p : parts) s[static_cast<size_t>(dim)] += p.shape()[static_cast<size_t>(dim)];
  Tensor out(parts[0].dtype(), s);
  std::vector<int64_t> off(s.size(), 0);
  for (const Tensor& p : parts) {
    place_block(out, p, off);
    off[static_cast<size_t>(dim)] += p.shape()[static_cast<size_t>(dim)];
  }
  return out;
}

std::vector<Tensor> split(const Tensor& t, int dim, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  std::vector<int64_t> off(t.shape().size(), 0);
  for (int64_t n : sizes) {
    Shape s = t.shape();
    s[static_cast<size_t>(dim)] = n;
    out.push_back(slice_block(t, off, s));
    off[static_cast<size_t>(dim)] += n;
  }
  if (off.empty() ? false : off[static_cast<size_t>(dim)] != t.shape()[static_cast<size_t>(dim)])
    throw std::invalid_argument("split sizes do not add up to the extent");
  return out;
}

Tensor reduce(const std::vector<Tensor>& parts, ReduceOp op) {
  Tensor out(parts[0].dtype(), parts[0].shape());
  bool ints = !is_float(out.dtype());
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (ints) {
      int64_t acc = parts[0].get_int(i);
      for (size_t k = 1; k < parts.size(); ++k) {
        int64_t v = parts[k].get_int(i);
        switch (op) {
          case ReduceOp::Sum:
          case ReduceOp::Avg: acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v)); break;
          case ReduceOp::Max: acc = std::max(acc, v); break;
          case ReduceOp::Min: acc = std::min(acc, v); break;
        }
      }
      if (op == ReduceOp::Avg) acc /= static_cast<int64_t>(parts.size());
      out.set_int(i, acc);
    } else {
      double acc = parts[0].get(i);
      for (size_t k = 1; k < parts.size(); ++k) {
        double v = parts[k].get(i);
        switch (op) {
          case ReduceOp::Sum:
          case ReduceOp::Avg: acc += v; break;
          case ReduceOp::Max: acc = std::isnan(acc) || acc >= v ? acc : v; break;
          case ReduceOp::Min: acc = std::isnan(acc) || acc <= v ? acc : v; break;
        }
      }
      if (op == ReduceOp::Avg) acc /= static_cast<double>(parts.size());
      out.set(i, acc);
    }
  }
  return out;
}

std::vector<Tensor> host_all_gather(const std::vector<Tensor>& locals, int dim) {
  return std::vector<Tensor>(locals.size(), concat(locals, dim));
}

std::vector<Tensor> host_all_reduce(const std::vector<Tensor>& locals, ReduceOp op) {
  return std::vector<Tensor>(locals.size(), reduce(locals, op));
}

std::vector<Tensor> host_reduce_scatter(const std::vector<Tensor>& locals, int dim,
                                        const std::vector<int64_t>& sizes, ReduceOp op) {
  return split(reduce(locals, op), dim, sizes);
}

std::vector<Tensor> host_all_to_all(const std::vector<Tensor>& locals, int split_dim,
                                    const std::vector<std::vector<int64_t>>& send_sizes, int concat_dim) {
  size_t n = locals.size();
  std::vector<std::vector<Tensor>> pieces;
  for (size_t j = 0; j < n; ++j) pieces.push_back(split(locals[j], split_dim, send_sizes[j]));
  std::vector<Tensor> out;
  for (size_t k = 0; k < n; ++k) {
    std::vector<Tensor> recv;
    for (size_t j = 0; j < n; ++j) recv.push_back(pieces[j][k]);
    out.push_back(concat(recv, concat_dim));
  }
  return out;
}

}  // namespace sf
