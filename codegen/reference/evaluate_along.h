// The reference of the ops along one dim (cumsum, argmax, argmin), for evaluate.cpp:
// float64 arithmetic for floats, exact int64 (wrapping, as torch's) for integers.
#pragma once

#include "codegen/ir/graph.h"
#include "runtime/core/tensor.h"

namespace sf::reference_detail {

// `n` is a cumsum, argmax or argmin node whose operand is `x`.
Tensor evaluate_along(const Node& n, const Tensor& x);

}  // namespace sf::reference_detail
