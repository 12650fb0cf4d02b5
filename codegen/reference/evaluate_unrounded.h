// A second reference for results computed with fewer roundings than eager PyTorch:
// the graph with every f16/bf16 value computed and kept in f32, each output rounded
// once to its dtype at the end. Under --precision fused (the default) a generated
// kernel keeps f16/bf16 intermediates in f32 and rounds at its stores, so its results
// lie between the eager reference (evaluate(): rounded at every op) and this one;
// `run --check` accepts an output of f16/bf16 origin that misses the first within
// tolerance if it meets this one (docs/kernels.md, "Checks").
#pragma once

#include <vector>

#include "codegen/ir/graph.h"
#include "runtime/core/diag.h"
#include "runtime/core/tensor.h"

namespace sf {

// `g` with every f16/bf16 param, cast, creation dtype and inferred type f32 instead
// (integer and bool values as they are); names, placements and outputs kept.
Result<Graph> widen_16bit(const Graph& g);

// evaluate() of widen_16bit(g) on `inputs` widened exactly to f32 where 16-bit, its
// outputs rounded once to g's output dtypes.
Result<std::vector<Tensor>> evaluate_unrounded(const Graph& g, const std::vector<Tensor>& inputs);

}  // namespace sf
