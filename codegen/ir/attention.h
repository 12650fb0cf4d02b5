// scaled_dot_product_attention's schema, shape rule and head mapping: what the op
// table (ops.cpp), the decomposition, the reference evaluator and the sharding
// strategies share, so that they cannot disagree about which kv head a query head
// reads or where a query row lies for the causal mask.
//
// torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=None,
// is_causal=False, scale=None, enable_gqa=False):
//   q [..., Hq, L, E], k [..., Hkv, S, E], v [..., Hkv, S, Ev] -> [..., Hq, L, Ev]
//   out = softmax(q k^T * scale + mask) v, scale = 1/sqrt(E) by default.
//
// Three attributes beyond torch's describe where a rank's block lies in the global
// op (codegen/dist/strategy.cpp's local_node sets them; a graph leaves them at 0):
//   query_offset  the global index of q's first row: the causal mask keeps key j for
//                 query row i when j <= i + query_offset (torch's top-left alignment
//                 at 0);
//   head_offset   query head h reads kv head (head_offset + h) / group;
//   gqa_group     that group; 0: Hq / Hkv with enable_gqa, else 1.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codegen/ir/ops.h"

namespace sf {

std::span<const AttrSpec> attention_attrs();

// How query heads read kv heads: query head h reads kv head (offset + h) / group.
struct AttentionHeads {
  int64_t group = 1;
  int64_t offset = 0;
  int64_t kv_head(int64_t h) const { return (offset + h) / group; }
};
// For a node that passed the shape rule, with Hq query heads and Hkv kv heads.
AttentionHeads attention_heads(const Attrs& a, int64_t hq, int64_t hkv);

// The scale a node uses: its `scale`, or 1/sqrt(E) where it was not given (NaN; the
// builder fills it in, see fill_operand_defaults). For E = 0 the scores are sums of
// nothing (0) whatever the scale, and torch scales q and k before their product, so
// 1.0 stands in for 1/sqrt(0) (an infinite scale times 0 would be NaN).
double attention_scale(const Attrs& a, int64_t e);

// The shape rule (throws OpError).
TensorType infer_attention(const std::vector<Operand>& in, const Attrs& a);

}  // namespace sf
