// Element strides through views, with torch.Tensor.view's rule: a view keeps one stride
// per dim of its result, so a chain of transposes, permutes, expands and reshapes over a
// buffer can be read in place by a kernel that takes strided operands (the matmul).
// Fusion asks this whether a chain of views may join the matmul that reads it
// (codegen/fusion/fuse.cpp); the matmul emitter finds the same strides from its index maps.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codegen/ir/graph.h"

namespace sf {

// The strides of view `n`'s result, given its operand's shape and strides; nullopt
// when the result has no stride per dim (a reshape that merges dims which do not lie
// one after the other in memory, which torch's view refuses), or when `n` is not a
// transpose, permute, expand or reshape.
std::optional<std::vector<int64_t>> view_strides(const Node& n, const Shape& operand,
                                                 const std::vector<int64_t>& strides);

// The other way round: where view `n`'s operand (of shape `operand`) lies when the
// view's result is stored with `result_strides`, so a kernel that produces the operand
// can write it straight into the result's buffer (an attention's output, permuted and
// reshaped into [b, s, h * d]). For transpose, permute and reshape; nullopt for other
// ops, or for a reshape whose operand has no stride per dim in that layout.
std::optional<std::vector<int64_t>> operand_strides(const Node& n, const Shape& operand,
                                                    const std::vector<int64_t>& result_strides);

// The strides a reshape from `from` (with `strides`) to `to` has, or nullopt (above).
std::optional<std::vector<int64_t>> reshape_strides(const Shape& from, const std::vector<int64_t>& strides,
                                                    const Shape& to);

}  // namespace sf
