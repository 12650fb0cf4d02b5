// The reference evaluator's scaled_dot_product_attention (evaluate.cpp calls it), in
// a file of its own: a direct loop over query rows in double, independent of the
// decomposition into matmul / softmax primitives that the compiled programs run.
#pragma once

#include <vector>

#include "codegen/ir/graph.h"
#include "runtime/core/tensor.h"

namespace sf {

// softmax(q k^T * scale + mask) v for the node `n` (complete attributes, operand
// types as inferred) on its operands q, k, v and the optional mask.
Tensor evaluate_attention(const Node& n, const std::vector<const Tensor*>& args);

}  // namespace sf
