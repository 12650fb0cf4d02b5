#include "codegen/ir/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "codegen/ir/limits.h"

namespace sf {

namespace {

const AttrSpec kAttentionAttrs[] = {
    {"is_causal", AttrType::Bool, AttrValue(false)},
    // NaN: not given (torch's scale=None); fill_operand_defaults replaces it.
    {"scale", AttrType::Float, AttrValue(std::numeric_limits<double>::quiet_NaN())},
    {"enable_gqa", AttrType::Bool, AttrValue(false)},
    {"query_offset", AttrType::Int, AttrValue(int64_t{0})},
    {"head_offset", AttrType::Int, AttrValue(int64_t{0})},
    {"gqa_group", AttrType::Int, AttrValue(int64_t{0})},
};

constexpr const char* kOp = "scaled_dot_product_attention";

[[noreturn]] void fail(const std::string& msg) { throw OpError{std::string(kOp) + ": " + msg}; }

std::string types_str(const std::vector<Operand>& in) {
  return "q " + in[0].type.str() + ", k " + in[1].type.str() + ", v " + in[2].type.str();
}

int64_t dim_from_end(const TensorType& t, int back) { return t.shape[t.shape.size() - static_cast<size_t>(back)]; }

}  // namespace

std::span<const AttrSpec> attention_attrs() { return kAttentionAttrs; }

AttentionHeads attention_heads(const Attrs& a, int64_t hq, int64_t hkv) {
  AttentionHeads h;
  h.offset = a.get_int("head_offset");
  if (int64_t g = a.get_int("gqa_group"); g > 0) h.group = g;
  else if (a.get_bool("enable_gqa") && hkv > 0 && hq > 0) h.group = hq / hkv;  // >= 1: Hq is a multiple
  return h;
}

double attention_scale(const Attrs& a, int64_t e) {
  const double s = a.get_float("scale");
  if (!std::isnan(s)) return s;
  return e > 0 ? 1.0 / std::sqrt(static_cast<double>(e)) : 1.0;
}

TensorType infer_attention(const std::vector<Operand>& in, const Attrs& a) {
  const TensorType& q = in[0].type;
  const TensorType& k = in[1].type;
  const TensorType& v = in[2].type;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].weak) fail("operand " + std::to_string(i + 1) + " is a number; q, k, v and attn_mask are tensors");
  if (!is_float(q.dtype) || q.dtype != k.dtype || q.dtype != v.dtype)
    fail("q, k and v must have one floating-point dtype, got " + types_str(in));
  const int r = q.rank();
  if (r < 3 || k.rank() != r || v.rank() != r)
    fail("expects q [..., Hq, L, E], k [..., Hkv, S, E] and v [..., Hkv, S, Ev] of one rank >= 3, got " +
         types_str(in));
  for (int d = 0; d < r - 3; ++d)
    if (k.shape[static_cast<size_t>(d)] != q.shape[static_cast<size_t>(d)] ||
        v.shape[static_cast<size_t>(d)] != q.shape[static_cast<size_t>(d)])
      fail("batch dim " + std::to_string(d) + " differs between " + types_str(in) +
           " (q, k and v must have the same batch dims)");
  const int64_t hq = dim_from_end(q, 3), l = dim_from_end(q, 2), e = dim_from_end(q, 1);
  const int64_t hkv = dim_from_end(k, 3), s = dim_from_end(k, 2), ev = dim_from_end(v, 1);
  if (dim_from_end(k, 1) != e)
    fail("q's last dim E=" + std::to_string(e) + " differs from k's " + std::to_string(dim_from_end(k, 1)) + " (" +
         types_str(in) + ")");
  if (dim_from_end(v, 2) != s || dim_from_end(v, 3) != hkv)
    fail("k [..., Hkv, S, E] and v [..., Hkv, S, Ev] must agree on Hkv and S, got " + types_str(in));

  // The per-rank attributes: bounded so that no index sum below can overflow.
  const int64_t qoff = a.get_int("query_offset"), hoff = a.get_int("head_offset"), group = a.get_int("gqa_group");
  if (qoff < -kMaxElements || qoff > kMaxElements)
    fail("query_offset " + std::to_string(qoff) + " is outside -2^40..2^40");
  if (hoff < 0 || hoff > kMaxElements) fail("head_offset " + std::to_string(hoff) + " is outside 0..2^40");
  if (group < 0 || group > kMaxElements) fail("gqa_group " + std::to_string(group) + " is outside 0..2^40");
  if (group == 0) {
    if (!a.get_bool("enable_gqa") && hq != hkv)
      fail("q has " + std::to_string(hq) + " heads and k, v have " + std::to_string(hkv) +
           " (" + types_str(in) + "); different head counts need enable_gqa=true");
    if (a.get_bool("enable_gqa") && (hkv == 0 || hq % hkv != 0))
      fail("with enable_gqa, q's " + std::to_string(hq) + " heads must be a multiple of k's and v's " +
           std::to_string(hkv) + " (" + types_str(in) + ")");
  }
  const AttentionHeads heads = attention_heads(a, hq, hkv);
  if (hq > 0 && heads.kv_head(hq - 1) >= hkv)
    fail("query head " + std::to_string(hq - 1) + " reads kv head " + std::to_string(heads.kv_head(hq - 1)) +
         " (head_offset " + std::to_string(hoff) + ", group " + std::to_string(heads.group) + "), but k and v have " +
         std::to_string(hkv));

  Shape batch(q.shape.begin(), q.shape.end() - 3);
  Shape scores = batch;
  scores.insert(scores.end(), {hq, l, s});
  if (in.size() == 4) {
    const TensorType& m = in[3].type;
    if (m.dtype != DType::Bool && m.dtype != q.dtype)
      fail("attn_mask must be bool (true: takes part) or q's dtype " + std::string(dtype_name(q.dtype)) +
           " (added to the scores), got " + m.str());
    std::optional<Shape> b = broadcast_shapes(m.shape, scores);
    if (!b || *b != scores)
      fail("attn_mask " + m.str() + " does not broadcast to the scores' shape " + shape_str(scores) +
           " [..., Hq, L, S]");
    if (a.get_bool("is_causal"))
      fail("is_causal=true together with an attn_mask is an error, as in torch (give one of them)");
  }
  // The decomposition materialises the scores (in f32 for half types: softmax computes
  // in f32) and k and v repeated to the query heads they serve; both must be within
  // the limits every value is held to.
  const DType wide = DType::F32;
  if (auto why = check_type_limits({wide, scores})) fail("its scores " + *why);
  if (hq > 0) {
    const int64_t used = heads.kv_head(hq - 1) - heads.kv_head(0) + 1;
    Shape rep = batch;
    std::optional<int64_t> n = checked_mul(used, heads.group);
    if (!n) fail("k and v repeated to its query heads do not fit in 64 bits");
    rep.insert(rep.end(), {*n, s, std::max(e, ev)});
    if (auto why = check_type_limits({wide, rep})) fail("k and v repeated to its query heads: " + *why);
  }
  Shape out = batch;
  out.insert(out.end(), {hq, l, ev});
  return {q.dtype, out};
}

}  // namespace sf
