// The reference evaluator: runs the global (unsharded) graph on the host, element by
// element, with PyTorch's semantics. It is the correctness oracle every sharded plan
// and every generated kernel is compared against (DESIGN.md, "Correctness principle"),
// so it is written to be obviously right, not fast: float math in double with one
// rounding to the node's dtype, integer math in int64 with two's-complement wrap.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/diag.h"
#include "codegen/ir/graph.h"
#include "runtime/core/tensor.h"

namespace sf {

// Evaluates the global graph `g`. `inputs` has one tensor per g.params(), in that
// order, each of exactly the param's TensorType. Returns one tensor per g.outputs(),
// in order, of the output value's type.
//
// A Diag (at the offending node's location) when: the inputs do not match the params
// (count, or a param's type: the Diag names the param, the expected and found type);
// max/min reduce over empty dims; an integer
// pow has a negative exponent; or a per-rank collective (all_gather, reduce_scatter,
// all_reduce, all_to_all) runs over a mesh dim of size > 1, which has no global
// meaning. Over a size-1 mesh dim those are the identity; redistribute always is.
// An index of embedding, gather, index_select or scatter_add that names no element
// is not an error: it reads 0 (or adds nothing), as the kernels do (evaluate_index.h).
Result<std::vector<Tensor>> evaluate(const Graph& g, const std::vector<Tensor>& inputs);

// Evaluates one node on the given operand tensors (one per n.inputs, of the types
// the node was inferred for). Per-rank programs use it to run an op on local shards:
// the node then carries local shapes and attributes. Params cannot be evaluated.
Result<Tensor> evaluate_node(const Node& n, const std::vector<const Tensor*>& inputs);

// Seeded random inputs for every param of `g`, deterministic per seed on every
// platform (std::mt19937_64 read directly, no std:: distributions, whose algorithms
// differ between standard libraries): floats uniform in [-1, 1) rounded to the dtype,
// bools fair coin flips, integer params that feed an embedding's indices (directly or
// through movement ops, integer casts and redistributes) uniform in [0, rows) of the
// smallest such weight (gather, index_select, scatter_add: the indexed dim's size;
// cross_entropy's target: the logits' classes), other integers uniform in [0, 8) (runtime/core's
// random_tensors with random_input_bounds).
std::vector<Tensor> random_inputs(const Graph& g, uint64_t seed);
// The integer bound random_inputs uses for each param of `g`.
std::vector<int64_t> random_input_bounds(const Graph& g);

}  // namespace sf
