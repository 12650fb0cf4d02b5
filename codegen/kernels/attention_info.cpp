// The fused attention emitter's analysis of its group (codegen/kernels/attention.h):
// which attention it holds, where its result is stored, whether blocks take a GQA
// group, how much memory a block's tiles may take, and whether the tensor-core form
// applies. No IR is built here.
#include "codegen/kernels/attention.h"

#include <algorithm>

#include "codegen/ir/view_strides.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/matmul_group.h"
#include "runtime/core/tensor.h"

namespace sf {

namespace {

Diag fail(std::string msg) { return Diag{"", {}, "attention emitter: " + std::move(msg)}; }

}  // namespace

namespace {

// The GQA repeat on the way to k or v (after kt's transpose): slice(reshape(expand(
// reshape(x)))) along the head dim, as codegen/ir/decompose.cpp's repeat_heads writes
// it: the query heads' run [first, first + Hq) of the kv heads each repeated `group`
// times. {group, first}, or nullopt for any other chain.
std::optional<std::pair<int64_t, int64_t>> repeat_of(const Graph& g, ValueId v, bool transposed) {
  const Node* n = &g.node(v);
  const int r = n->type.rank();
  if (transposed) {
    if (n->op != OpKind::Transpose) return std::nullopt;
    std::optional<int> a = normalize_dim(n->attrs.get_int("dim0"), r), b = normalize_dim(n->attrs.get_int("dim1"), r);
    if (!a || !b || std::min(*a, *b) != r - 2 || std::max(*a, *b) != r - 1) return std::nullopt;
    n = &g.node(n->inputs[0]);
  }
  if (n->op != OpKind::Slice || r < 3) return std::nullopt;
  const Node& flat = g.node(n->inputs[0]);
  auto [dim, range] = slice_of(n->attrs, flat.type.shape);
  if (dim != r - 3 || range.step != 1 || flat.op != OpKind::Reshape) return std::nullopt;
  const Node& wide = g.node(flat.inputs[0]);
  if (wide.op != OpKind::Expand || wide.type.rank() != r + 1) return std::nullopt;
  const Node& one = g.node(wide.inputs[0]);
  const Shape &ws = wide.type.shape, &os = one.type.shape;
  if (os.size() != ws.size() || os[static_cast<size_t>(r - 2)] != 1) return std::nullopt;
  for (int d = 0; d <= r; ++d)
    if (d != r - 2 && os[static_cast<size_t>(d)] != ws[static_cast<size_t>(d)]) return std::nullopt;
  return std::pair<int64_t, int64_t>{ws[static_cast<size_t>(r - 2)], range.start};
}

}  // namespace

Result<AttentionKernelInfo> attention_info(const Graph& g) {
  AttentionFlow flow = graph_flow(g);
  std::optional<AttentionMatch> found;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].op != OpKind::Matmul) continue;
    if (std::optional<AttentionMatch> m = match_attention(flow, static_cast<int>(i))) {
      if (found) return fail("the group holds more than one attention");
      found = std::move(m);
    }
  }
  if (!found) return fail("the group holds no attention (matmul -> softmax -> matmul)");
  AttentionKernelInfo info;
  info.match = *found;
  for (int64_t d : found->batch) info.batches *= d;
  if (!is_float(g.node(found->scores).type.dtype)) return fail("the scores must be a float tensor");
  if (found->e > kMaxFusedHeadDim || found->ev > kMaxFusedHeadDim)
    return fail("head dims " + std::to_string(found->e) + ", " + std::to_string(found->ev) + " are over " +
                std::to_string(kMaxFusedHeadDim));
  if (g.outputs().size() != 1) return fail("the group must have one output, the attention's (or a view of it)");
  // The output: the attention's result, or views of it each read only by the next.
  const ValueId result = g.outputs()[0].value;
  std::vector<ValueId> chain{result};
  while (chain.back() != found->out) {
    const Node& n = g.node(chain.back());
    if (n.inputs.size() != 1 || n.op == OpKind::Param) return fail("the group's output is not a view of the attention");
    chain.push_back(n.inputs[0]);
  }
  std::vector<int64_t> strides = contiguous_strides(g.node(result).type.shape);
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    const Node& view = g.node(chain[i]);
    std::optional<std::vector<int64_t>> s = operand_strides(view, g.node(chain[i + 1]).type.shape, strides);
    if (!s) return fail("the output view " + std::string(op_name(view.op)) + " cannot be stored through");
    strides = std::move(*s);
  }
  info.out_strides = std::move(strides);
  // Whole groups of query heads per block where k and v repeat kv heads alike and the
  // groups line up with the heads the kernel sees.
  std::optional<std::pair<int64_t, int64_t>> rk = repeat_of(g, found->kt, true), rv = repeat_of(g, found->v, false);
  if (rk && rv && *rk == *rv && rk->first > 1 && !found->batch.empty()) {
    const int64_t group = rk->first, hq = found->batch.back();
    if (hq % group == 0 && rk->second % group == 0) info.heads_per_kv = group;
  }
  return info;
}

int64_t attention_tile_budget(const llvmb::Target& target) {
  if (target.kind == llvmb::Target::Kind::Host) return int64_t{1} << 20;
  std::optional<int> sm = kernels::sm_version(target.arch);
  return matmul_detail::max_shared_bytes(sm.value_or(0));
}

std::optional<std::string> attention_mma_unfit(const Graph& group, const KernelConfig& c) {
  Result<AttentionKernelInfo> info = attention_info(group);
  if (!info) return info.error().message;
  const AttentionMatch& m = info->match;
  const DType q = group.node(m.q).type.dtype;
  auto s = [](int64_t v) { return std::to_string(v); };
  for (int v : {m.q, m.kt, m.v})
    if (group.node(v).type.dtype != q || (q != DType::F16 && q != DType::BF16))
      return "q, k and v are " + std::string(dtype_name(q)) + ", not one 16-bit dtype (f16 or bf16)";
  if (c.block_m % 16 != 0 || c.block_n % 16 != 0)
    return "block_m " + s(c.block_m) + " and block_n " + s(c.block_n) + " must be multiples of 16";
  if (m.e % 16 != 0 || m.ev % 8 != 0) return "head dims " + s(m.e) + ", " + s(m.ev) + " must be multiples of 16 and 8";
  return std::nullopt;
}

}  // namespace sf
