// The reference evaluator's index ops (evaluate.cpp calls them): gather, index_select,
// embedding and scatter_add, element by element. An index that names no element of the
// indexed dim (after the lookup's `offset`) reads 0, and scatter_add adds such a src
// element nowhere: PyTorch raises there; shardfuse gives the masked result that the
// kernels give and a vocabulary-parallel rank needs (docs/graph-format.md).
#pragma once

#include <cstdint>
#include <optional>

#include "codegen/ir/graph.h"
#include "runtime/core/tensor.h"

namespace sf {

// The row that index `idx` names in a dim of `rows` rows starting at `offset`
// (idx - offset when that is in [0, rows)), computed without overflow for any int64s.
std::optional<int64_t> lookup_row(int64_t idx, int64_t offset, int64_t rows);

Tensor eval_gather(const Node& n, const Tensor& x, const Tensor& index);
Tensor eval_index_select(const Node& n, const Tensor& x, const Tensor& index);
Tensor eval_embedding(const Node& n, const Tensor& indices, const Tensor& weight);
Tensor eval_scatter_add(const Node& n, const Tensor& x, const Tensor& index, const Tensor& src);

}  // namespace sf
