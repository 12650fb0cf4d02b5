// Finds attention written out as ops, the computation a fused (flash) attention
// kernel replaces:
//
//   scores = matmul(q, kt)                  q [..., L, E], kt [..., E, S]
//   logits = f(scores, ...)                 elementwise ops of the scores' shape: a
//                                           scale, an additive mask, a where-mask
//   probs  = softmax(logits, -1)            as decompose writes it (codegen/ir/decompose.h):
//            [cast f32,] max, sub, exp, sum, div[, cast]
//   out    = matmul(probs, v)               v [..., S, Ev]
//
// scaled_dot_product_attention decomposes to exactly this (its causal mask a
// where(tril(full(true), d), scores, -inf), GQA's kv heads picked by views of k and
// v), and so does a block that writes it out (transformer_block.sf's
// matmul -> mul -> softmax -> matmul). Fusion (codegen/fusion/fuse.cpp) makes one
// attention kernel of every match, and the attention emitter (codegen/kernels/
// attention.h) finds the same match in its group graph, so both agree on what the
// kernel computes. Structural only: no LLVM, no kernels.
//
// The batch dims of q, kt, v and the scores must be equal (no broadcasting between
// them, which attention never needs: views in front of them do the repeating).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "codegen/ir/graph.h"

namespace sf {

// A dataflow graph as the matcher sees it: fusion's per-rank program (values are
// local value ids) or a kernel's group graph (values are ValueIds).
struct AttentionFlow {
  // The op computing value v (local types and attributes), or nullptr when v is not
  // computed by an op of this graph (a param, a collective's result).
  std::function<const Node*(int)> node;
  // v's type (any value).
  std::function<const TensorType&(int)> type;
  // v's operands, in order (only called where node(v) is not null).
  std::function<std::vector<int>(int)> operands;
  // The values whose ops read v, one entry per reading op.
  std::function<std::vector<int>(int)> users;
  // Whether v leaves the graph (returned).
  std::function<bool(int)> returned;
};

struct AttentionMatch {
  int q = -1, kt = -1, v = -1;  // the operands: scores = matmul(q, kt), out = matmul(probs, v)
  int scores = -1;              // matmul(q, kt)
  int logits = -1;              // softmax's operand (the scores after the chain)
  int probs = -1;               // softmax's result, matmul's first operand
  int out = -1;                 // matmul(probs, v)
  // The values computed from the scores on the way to the logits (elementwise, of the
  // scores' shape; the logits among them unless they are the scores).
  std::vector<int> chain;
  // The decomposed softmax's values, in order.
  std::vector<int> softmax;
  // The chain holds where(tril(full(true), diagonal=d), x, -inf): key j of query row i
  // is masked (to -inf) wherever j > i + d, so a kernel may skip key tiles that lie
  // wholly beyond every row's diagonal (SDPA's is_causal, with d its query_offset).
  std::optional<int64_t> causal_diagonal;
  Shape batch;                  // the batch dims
  int64_t l = 0, s = 0, e = 0, ev = 0;
};

// The attention whose result is value `out` (a matmul), or nullopt when the values
// around it are not the pattern above, or when an intermediate (the scores, a chain
// value, a softmax value) is returned or read by anything outside the pattern.
std::optional<AttentionMatch> match_attention(const AttentionFlow& f, int out);

// The flow of a kernel's group graph (ValueIds; users from the nodes' inputs).
AttentionFlow graph_flow(const Graph& g);

// The share of (query row, key) pairs a match computes: 1, or with a causal diagonal
// d the pairs with key j <= row i + d (FlashAttention's convention for a causal
// attention's flops: the kernel skips the key tiles past every row's diagonal).
double visible_fraction(const AttentionMatch& m);
// The same for the one attention of a kernel's group graph (1 when it holds none).
double attention_visible_fraction(const Graph& group);

// The widest head dim (E or Ev) a fused attention kernel holds in its tiles; a match
// with a wider one stays as separate kernels.
inline constexpr int64_t kMaxFusedHeadDim = 256;

}  // namespace sf
