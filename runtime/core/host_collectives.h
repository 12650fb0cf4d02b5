// Collectives computed on the host over every member's local tensor at once: the
// definitions the Gloo and NCCL backends must agree with. Used by the lockstep
// simulator of per-rank programs and by tests as the oracle.
#pragma once

#include <vector>

#include "runtime/core/mesh.h"
#include "runtime/core/tensor.h"

namespace sf {

// Concatenation along `dim` (all other dims equal).
Tensor concat(const std::vector<Tensor>& parts, int dim);
// Splits along `dim` into consecutive pieces of the given extents (sum = extent).
std::vector<Tensor> split(const Tensor& t, int dim, const std::vector<int64_t>& sizes);
// Elementwise reduction of same-shaped tensors: floats in double rounded once,
// integers in int64 (sum wraps), avg = sum / count.
Tensor reduce(const std::vector<Tensor>& parts, ReduceOp op);

// One result per member, in member order.
std::vector<Tensor> host_all_gather(const std::vector<Tensor>& locals, int dim);
std::vector<Tensor> host_all_reduce(const std::vector<Tensor>& locals, ReduceOp op);
// Member k keeps extent sizes[k] along dim of the reduction.
std::vector<Tensor> host_reduce_scatter(const std::vector<Tensor>& locals, int dim,
                                        const std::vector<int64_t>& sizes, ReduceOp op);
// Member j splits its tensor along split_dim by send_sizes[j] (one extent per
// receiver); member k concatenates what it receives along concat_dim.
std::vector<Tensor> host_all_to_all(const std::vector<Tensor>& locals, int split_dim,
                                    const std::vector<std::vector<int64_t>>& send_sizes, int concat_dim);

}  // namespace sf
