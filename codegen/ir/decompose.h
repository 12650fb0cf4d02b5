// Decomposition of composite ops into primitives, run after verification and before
// sharding propagation and fusion (DESIGN.md, "Data flow"), so that later stages see
// only ops a fusion group can hold (elementwise, reductions, matmul, movement).
#pragma once

#include "codegen/ir/graph.h"

namespace sf {

// Rebuilds `g` with every composite (gelu, gelu_tanh, softmax, log_softmax, layer_norm, rms_norm,
// scatter_add, cross_entropy, scaled_dot_product_attention) replaced by primitives:
//   gelu(x)        = 0.5 * x * (1 + erf(x * 1/sqrt(2)))
//   gelu_tanh(x)   = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x*x*x)))
//   softmax(x, d)  = e / sum(e, [d], keepdim)  with e = exp(x - max(x, [d], keepdim))
//   log_softmax(x, d) = s - log(sum(exp(s), [d], keepdim))  with s = x - max(x, [d], keepdim)
//   layer_norm     = (x - m) * rsqrt(mean((x - m)^2) + eps) * w + b,  m = mean(x)
//   rms_norm       = x * rsqrt(mean(x * x) + eps) * w
//   cross_entropy  = where(target != ignore_index, log(sum(exp(s), c)) - gather(s, target, c), 0)
//                    with s = x - max(x, [c], keepdim), c the class dim; then the sum,
//                    or the sum / the count of targets not ignored (mean)
//   scaled_dot_product_attention(q, k, v[, mask])
//                  = matmul(softmax(matmul(q, k^T) * scale [+ mask], -1), v), a bool or
//                    causal mask as where(mask, scores, -inf), k and v repeated to the
//                    query heads they serve (codegen/ir/attention.h)
// (means over the trailing w.rank() dims, keepdim). f16/bf16 operands are cast to f32,
// computed in f32 and the result cast back, as PyTorch's kernels compute these ops in
// float for half types. Every other node is kept with its name, attributes, location,
// param placement and sharding constraint; a composite's name and constraint move to
// the node that now produces its value; outputs keep their names and placements.
// A graph without composites is returned unchanged (a copy of `g`).
Graph decompose(const Graph& g);

// Whether op k is decomposed on the global graph, before sharding propagation:
// cross_entropy, whose per-row statistics (a max, a sum of exps, the target's logit)
// then travel instead of the logits when the class dim is sharded (vocabulary
// parallel), which a composite decomposed per rank, after propagation, could not do.
bool decomposes_before_sharding(OpKind k);
// `g` with those ops decomposed (as decompose does) and every other op kept; `g`
// unchanged when it has none. Params and outputs keep their order, names and
// placements, so a plan for the result runs the inputs and outputs of `g`. Every
// command propagates this graph (compile_plan, explain, simulate, tune, dump); the
// reference evaluator evaluates `g` itself.
Graph decompose_for_sharding(const Graph& g);

}  // namespace sf
