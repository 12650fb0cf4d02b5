// The reference evaluator's cross_entropy (evaluate.cpp calls it), written from
// F.cross_entropy's definition in float64, not from the decomposition the pipeline
// runs: per target position, loss = logsumexp over the classes - the target's logit,
// 0 and not counted where the target is ignore_index. A target outside [0, C) that
// is not ignore_index counts as picking the row's max logit (its max-shifted logit
// reads 0), so its loss is logsumexp - max (PyTorch raises there; the gather the
// pipeline runs on the max-shifted logits reads 0, docs/graph-format.md).
#pragma once

#include "codegen/ir/graph.h"
#include "runtime/core/tensor.h"

namespace sf {

Tensor eval_cross_entropy(const Node& n, const Tensor& logits, const Tensor& target);

}  // namespace sf
