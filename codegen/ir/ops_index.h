// Shape rules of the index ops (ops.cpp's infer_type calls them): gather,
// index_select, scatter_add and embedding. Each throws OpError naming what it expected.
#pragma once

#include <vector>

#include "codegen/ir/ops.h"

namespace sf {

// k is one of Gather, IndexSelect, ScatterAdd, Embedding; `in` has its arity.
TensorType infer_index_op(OpKind k, const std::vector<Operand>& in, const Attrs& a);

}  // namespace sf
