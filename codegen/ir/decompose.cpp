#include "codegen/ir/decompose.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <vector>

#include "codegen/ir/attention.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/ops_loss.h"

namespace sf {

namespace {

bool is_composite(OpKind k) { return op_info(k).category == OpCategory::Composite; }

// Emits the primitives of one composite, each at the composite's source location so a
// Diag about any of them points at the line the user wrote.
struct Emitter {
  GraphBuilder& b;
  SourceLoc loc;

  Value op(OpKind k, std::vector<Value> in, std::vector<AttrValue> attrs = {}) {
    return b.op(k, in, attrs, {}, loc);
  }
  // An f32 literal: weak, so it never widens the tensor it meets.
  Value lit(double v) { return b.constant(v, DType::F32, loc); }
  Value reduce(OpKind k, Value x, const std::vector<int64_t>& dims) {
    return op(k, {x}, {AttrValue(dims), AttrValue(true)});
  }
  // Half types compute in f32 (PyTorch's opmath type for f16/bf16) and round once at
  // the end.
  Value up(Value x) { return x.type().dtype == DType::F32 ? x : op(OpKind::Cast, {x}, {DType::F32}); }
  Value down(Value y, DType t) { return y.type().dtype == t ? y : op(OpKind::Cast, {y}, {t}); }

  Value gelu(Value x0, bool tanh_approx) {
    Value x = up(x0);
    Value inner;
    if (tanh_approx) {
      Value cube = op(OpKind::Mul, {op(OpKind::Mul, {x, x}), x});
      Value poly = op(OpKind::Add, {x, op(OpKind::Mul, {lit(0.044715), cube})});
      inner = op(OpKind::Tanh, {op(OpKind::Mul, {lit(std::sqrt(2.0 / std::numbers::pi)), poly})});
    } else {
      inner = op(OpKind::Erf, {op(OpKind::Mul, {x, lit(1.0 / std::numbers::sqrt2)})});
    }
    Value half_x = op(OpKind::Mul, {lit(0.5), x});
    return down(op(OpKind::Mul, {half_x, op(OpKind::Add, {lit(1.0), inner})}), x0.type().dtype);
  }

  // Over an empty softmax dim there is nothing to compute, and a max over it has no
  // value (the evaluator rejects it), so the result is the empty input, copied. Only
  // the dim's own extent decides: a shard that is empty along another dim (uneven
  // sharding) decomposes like every other rank's, so ranks' programs stay alike.
  bool empty_along(Value x0, int64_t dim) {
    return x0.type().shape[static_cast<size_t>(*normalize_dim(dim, x0.type().rank()))] == 0;
  }

  Value softmax(Value x0, int64_t dim) {
    if (empty_along(x0, dim)) return op(OpKind::Cast, {x0}, {x0.type().dtype});
    Value x = up(x0);
    Value e = op(OpKind::Exp, {op(OpKind::Sub, {x, reduce(OpKind::Max, x, {dim})})});
    return down(op(OpKind::Div, {e, reduce(OpKind::Sum, e, {dim})}), x0.type().dtype);
  }

  // (x - max) - log(sum(exp(x - max))): exp only inside the sum, so the reduction
  // kernel computes it once per element; the output needs x - max, not exp again.
  Value log_softmax(Value x0, int64_t dim) {
    if (empty_along(x0, dim)) return op(OpKind::Cast, {x0}, {x0.type().dtype});
    Value x = up(x0);
    Value shifted = op(OpKind::Sub, {x, reduce(OpKind::Max, x, {dim})});
    Value lse = op(OpKind::Log, {reduce(OpKind::Sum, op(OpKind::Exp, {shifted}), {dim})});
    return down(op(OpKind::Sub, {shifted, lse}), x0.type().dtype);
  }

  // k or v [..., Hkv, S, D] -> [..., Hq, S, D]: query head h's slice is kv head
  // (offset + h) / group (attention_heads). Which ops are emitted depends only on
  // attributes and shapes every rank has alike (a rank's program must have the same ops
  // as every other's; only their attributes differ; the head counts are the global ones
  // unless the heads are cut, and then gqa_group is set): none without GQA and per-rank
  // heads; one slice of kv heads [offset, offset + Hq) with a per-rank head_offset and
  // group 1;
  // with GQA, the kv heads the query heads use, each repeated `group` times (torch's
  // repeat_interleave, as reshape + expand + reshape), then the query heads' run of
  // that. Views only: fusion folds them into index arithmetic.
  Value repeat_heads(Value x, int64_t hq, const AttentionHeads& heads, bool per_rank) {
    const Shape& s = x.type().shape;
    const size_t r = s.size();
    if (heads.group == 1 && !per_rank && hq == s[r - 3]) return x;  // (no query heads: GQA's group is 1)
    if (heads.group == 1) return op(OpKind::Slice, {x}, {int64_t{-3}, heads.offset, heads.offset + hq});
    // A rank without query heads takes no kv heads, through the same ops.
    const int64_t lo = hq > 0 ? heads.kv_head(0) : 0, hi = hq > 0 ? heads.kv_head(hq - 1) + 1 : 0;
    std::vector<int64_t> one(s.begin(), s.end());
    one[r - 3] = hi - lo;
    one.insert(one.begin() + static_cast<std::ptrdiff_t>(r - 2), 1);  // [..., n, 1, S, D]
    std::vector<int64_t> wide = one;
    wide[r - 2] = heads.group;                                       // [..., n, group, S, D]
    std::vector<int64_t> flat(s.begin(), s.end());
    flat[r - 3] = (hi - lo) * heads.group;                           // [..., n * group, S, D]
    x = op(OpKind::Slice, {x}, {int64_t{-3}, lo, hi});
    x = op(OpKind::Reshape, {op(OpKind::Expand, {op(OpKind::Reshape, {x}, {one})}, {wide})}, {flat});
    const int64_t first = hq > 0 ? heads.offset - lo * heads.group : 0;  // query head 0's row of the repeat
    return op(OpKind::Slice, {x}, {int64_t{-3}, first, first + hq});
  }

  // F.scaled_dot_product_attention as torch's math backend computes it:
  //   softmax(q k^T * scale + mask) v
  // with a bool mask (or the causal one) as where(mask, scores, -inf) and a float mask
  // added. The matmuls run in q's dtype (f32 accumulation, as every matmul here) and
  // the softmax in f32 for half types (its own decomposition). A row whose every key is
  // masked is NaN, the softmax of a row of -inf (torch's kernels differ there: some give
  // NaN, its newer math backend 0; docs/graph-format.md). The causal mask keeps key j
  // for query row i when j <= i + query_offset: a rank holding query rows from
  // query_offset on masks by their global index.
  // Kept in one function: a fused attention kernel replaces exactly this.
  Value attention(Value q, Value k, Value v, std::optional<Value> mask, const Attrs& a) {
    const Shape& qs = q.type().shape;
    const size_t r = qs.size();
    const int64_t hq = qs[r - 3], l = qs[r - 2], e = qs[r - 1];
    const int64_t s = k.type().shape[r - 2];
    const AttentionHeads heads = attention_heads(a, hq, k.type().shape[r - 3]);
    const bool per_rank = a.get_int("gqa_group") != 0;  // local_node's heads (attention.h)
    Value kq = repeat_heads(k, hq, heads, per_rank), vq = repeat_heads(v, hq, heads, per_rank);
    Value scores = op(OpKind::Mul, {op(OpKind::Matmul, {q, op(OpKind::Transpose, {kq}, {int64_t{-2}, int64_t{-1}})}),
                                    lit(attention_scale(a, e))});
    const Value ninf = lit(-std::numeric_limits<double>::infinity());
    if (mask && mask->type().dtype == DType::Bool) scores = op(OpKind::Where, {*mask, scores, ninf});
    else if (mask) scores = op(OpKind::Add, {scores, *mask});
    if (a.get_bool("is_causal")) {
      Value ones = op(OpKind::Full, {}, {std::vector<int64_t>{l, s}, 1.0, DType::Bool});
      Value keep = op(OpKind::Tril, {ones}, {a.get_int("query_offset")});
      scores = op(OpKind::Where, {keep, scores, ninf});
    }
    return op(OpKind::Matmul, {softmax(scores, -1), vq});
  }

  // layer_norm (center, with bias) or rms_norm (no centring, no bias).
  Value norm(Value x0, Value w, std::optional<Value> bias, double eps, bool center) {
    std::vector<int64_t> dims;
    for (int64_t d = -w.type().rank(); d < 0; ++d) dims.push_back(d);
    Value x = up(x0);
    if (center) x = op(OpKind::Sub, {x, reduce(OpKind::Mean, x, dims)});
    Value var = reduce(OpKind::Mean, op(OpKind::Mul, {x, x}), dims);
    Value inv = op(OpKind::Rsqrt, {op(OpKind::Add, {var, lit(eps)})});
    Value y = op(OpKind::Mul, {op(OpKind::Mul, {x, inv}), up(w)});
    if (bias) y = op(OpKind::Add, {y, up(*bias)});
    return down(y, x0.type().dtype);
  }

  // torch.scatter_add(x, dim, index, src) without atomics: out[..., n, ...] = x[..., n, ...]
  // + the sum over k of src[..., k, ...] where index[..., k, ...] == n, as a mask over a
  // new axis of the K index positions, placed after `dim` and summed away: one
  // deterministic reduction over K per output element (O(N * K) per row; docs/kernels.md).
  // What it does depends only on the dims that no strategy shards (dim, and dims where
  // index is smaller than x or src), so every rank of a sharded program builds the same ops.
  Value scatter_add(Value x0, Value index, Value src, int64_t dim0) {
    const Shape xs = x0.type().shape, is = index.type().shape, ss = src.type().shape;
    const int r = static_cast<int>(xs.size());
    const auto d = static_cast<size_t>(*normalize_dim(dim0, r));
    const int64_t k = is[d], n = xs[d];
    if (k == 0) return op(OpKind::Cast, {x0}, {x0.type().dtype});  // nothing is added
    for (size_t e = 0; e < ss.size(); ++e)  // only src's part that index covers counts
      if (ss[e] > is[e]) src = op(OpKind::Slice, {src}, {AttrValue(static_cast<int64_t>(e)), AttrValue(int64_t{0}), AttrValue(is[e])});
    std::vector<int64_t> with_k(is.begin(), is.end());
    with_k.insert(with_k.begin() + static_cast<std::ptrdiff_t>(d), 1);  // [..., 1, K, ...]
    Value idx = op(OpKind::Reshape, {index}, {AttrValue(with_k)});
    Value part = op(OpKind::Reshape, {is_float(src.type().dtype) ? up(src) : src}, {AttrValue(with_k)});
    std::vector<int64_t> pos_shape(static_cast<size_t>(r) - d + 1, 1);  // [N, 1, ...]: broadcast from dim d on
    pos_shape[0] = n;
    Value pos = op(OpKind::Reshape, {b.op(OpKind::Arange, {}, {AttrValue(n)}, {}, loc)}, {AttrValue(pos_shape)});
    Value hit = op(OpKind::Where, {op(OpKind::Eq, {idx, pos}), part, b.constant(0.0, DType::I64, loc)});
    Value added = op(OpKind::Sum, {hit}, {AttrValue(std::vector<int64_t>{static_cast<int64_t>(d) + 1}), AttrValue(false)});
    // Where index is smaller than x (a dim other than `dim`), x's further elements get nothing.
    for (size_t e = 0; e < xs.size(); ++e)
      if (e != d && is[e] < xs[e]) {
        std::vector<int64_t> pad(added.type().shape.begin(), added.type().shape.end());
        pad[e] = xs[e] - is[e];
        Value zeros = b.op(OpKind::Full, {}, {AttrValue(pad), AttrValue(0.0), AttrValue(added.type().dtype)}, {}, loc);
        added = b.op(OpKind::Concat, {added, zeros}, {}, {{"dim", AttrValue(static_cast<int64_t>(e))}}, loc);
      }
    return down(op(OpKind::Add, {is_float(x0.type().dtype) ? up(x0) : x0, added}), x0.type().dtype);
  }

  // F.cross_entropy(logits, target) with class indices, in f32 (f16/bf16 logits are
  // read as f32 and the result rounded once), every loss from per-row statistics of
  // the logits shifted by their row max (logsumexp - x[t] = log(sum(exp(x - m))) -
  // (x[t] - m), without cancelling a large m):
  //   s      = x - m,  m = max(x, class dim)
  //   picked = gather(s, target with a size-1 class dim, class dim)
  //   loss   = log(sum(exp(s), class dim)) - picked where target != ignore_index, else 0
  // then none (the losses), sum, or mean (the sum over the count of targets that are
  // not ignore_index; 0 / 0 = NaN when every target is ignored, as torch). Decomposed
  // on the global graph, so with the class dim sharded, the max and the sum leave
  // Partials (max, sum) and the gather a masked Partial(sum): only [N]-sized statistics
  // travel, and m only once (s is each rank's own classes, shifted). A target outside
  // [0, C) that is not ignore_index reads 0 from the gather (the index ops' rule), so
  // its loss is log(sum(exp(x - m))), the loss of a target at the row max.
  Value cross_entropy(Value x0, Value target, LossReduction red, int64_t ignore_index) {
    const Shape xs = x0.type().shape;
    const int64_t cd = class_dim(static_cast<int>(xs.size()));
    Value x = up(x0);
    Value shifted = op(OpKind::Sub, {x, reduce(OpKind::Max, x, {cd})});
    Value lse = op(OpKind::Log, {reduce(OpKind::Sum, op(OpKind::Exp, {shifted}), {cd})});
    std::vector<int64_t> with_class(xs.begin(), xs.end());
    with_class[static_cast<size_t>(cd)] = 1;  // [N, 1, d1, ...]
    Value idx = op(OpKind::Reshape, {target}, {AttrValue(with_class)});
    Value picked = op(OpKind::Gather, {shifted, idx}, {AttrValue(cd)});
    const Shape ts = target.type().shape;
    Value loss = op(OpKind::Reshape, {op(OpKind::Sub, {lse, picked})}, {AttrValue(std::vector<int64_t>(ts.begin(), ts.end()))});
    // ignore_index is within +-2^53 (the shape rule), so the literal is exact; the
    // target is compared as i64 so an i32 target meets it unconverted.
    Value i64 = target.type().dtype == DType::I64 ? target : op(OpKind::Cast, {target}, {DType::I64});
    Value keep = op(OpKind::Ne, {i64, b.constant(static_cast<double>(ignore_index), DType::I64, loc)});
    loss = op(OpKind::Where, {keep, loss, lit(0.0)});
    const DType dt = x0.type().dtype;
    if (red == LossReduction::None) return down(loss, dt);
    auto total = [&](Value v) {  // over every dim; a 0-d value (unbatched logits) is its own total
      return v.type().rank() == 0 ? v : op(OpKind::Sum, {v}, {AttrValue(std::vector<int64_t>{}), AttrValue(false)});
    };
    Value sum = total(loss);
    if (red == LossReduction::Sum) return down(sum, dt);
    // The count sums bools into i64 (exact); the division rounds it to f32 once.
    Value count = keep.type().rank() == 0 ? op(OpKind::Cast, {keep}, {DType::I64}) : total(keep);
    return down(op(OpKind::Div, {sum, count}), dt);
  }
};

// Rebuilds `g` with the composites `which` selects decomposed.
Graph decompose_selected(const Graph& g, bool (*which)(OpKind)) {
  bool any = false;
  for (const Node& n : g.nodes()) any = any || which(n.op);
  if (!any) return g;

  GraphBuilder b(g.name(), g.mesh());
  std::vector<Value> map(g.nodes().size());
  try {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      std::vector<Value> in;
      for (ValueId v : n.inputs) in.push_back(map[static_cast<size_t>(v)]);
      Value v;
      if (!which(n.op) && n.op != OpKind::Param && n.op != OpKind::Constant) {
        v = b.op(n.op, in, {}, n.attrs.items, n.loc);  // a composite decomposed later, kept
        if (!n.name.empty()) b.name(v, n.name, n.loc);
        if (n.placement) b.constrain(v, *n.placement, n.loc);
        map[i] = v;
        continue;
      }
      switch (n.op) {
        case OpKind::Param:
          map[i] = b.param(n.name, n.type.dtype, n.type.shape, n.placement, n.loc);
          continue;
        case OpKind::Constant:
          v = b.constant(n.attrs.get_float("value"), n.attrs.get_dtype("dtype"), n.loc);
          break;
        case OpKind::Gelu: v = Emitter{b, n.loc}.gelu(in[0], false); break;
        case OpKind::GeluTanh: v = Emitter{b, n.loc}.gelu(in[0], true); break;
        case OpKind::Softmax: v = Emitter{b, n.loc}.softmax(in[0], n.attrs.get_int("dim")); break;
        case OpKind::LogSoftmax: v = Emitter{b, n.loc}.log_softmax(in[0], n.attrs.get_int("dim")); break;
        case OpKind::LayerNorm:
          v = Emitter{b, n.loc}.norm(in[0], in[1], in[2], n.attrs.get_float("eps"), true);
          break;
        case OpKind::RmsNorm:
          v = Emitter{b, n.loc}.norm(in[0], in[1], std::nullopt, n.attrs.get_float("eps"), false);
          break;
        case OpKind::ScatterAdd: v = Emitter{b, n.loc}.scatter_add(in[0], in[1], in[2], n.attrs.get_int("dim")); break;
        case OpKind::CrossEntropy:
          v = Emitter{b, n.loc}.cross_entropy(in[0], in[1], *parse_loss_reduction(n.attrs.get_ident("reduction")),
                                              n.attrs.get_int("ignore_index"));
          break;
        case OpKind::ScaledDotProductAttention:
          v = Emitter{b, n.loc}.attention(in[0], in[1], in[2], in.size() == 4 ? std::optional<Value>(in[3]) : std::nullopt,
                                          n.attrs);
          break;
        // Primitives are copied as they are. Listed one by one so that a new op in
        // ops.def must be classified here (-Werror=switch).
        case OpKind::Neg:
        case OpKind::Abs:
        case OpKind::Exp:
        case OpKind::Log:
        case OpKind::Sqrt:
        case OpKind::Rsqrt:
        case OpKind::Tanh:
        case OpKind::Sigmoid:
        case OpKind::Relu:
        case OpKind::Silu:
        case OpKind::Sin:
        case OpKind::Cos:
        case OpKind::Reciprocal:
        case OpKind::Erf:
        case OpKind::Cast:
        case OpKind::Add:
        case OpKind::Sub:
        case OpKind::Mul:
        case OpKind::Div:
        case OpKind::Maximum:
        case OpKind::Minimum:
        case OpKind::Pow:
        case OpKind::Eq:
        case OpKind::Ne:
        case OpKind::Lt:
        case OpKind::Le:
        case OpKind::Gt:
        case OpKind::Ge:
        case OpKind::Where:
        case OpKind::Sum:
        case OpKind::Max:
        case OpKind::Min:
        case OpKind::Mean:
        case OpKind::Matmul:
        case OpKind::Transpose:
        case OpKind::Permute:
        case OpKind::Reshape:
        case OpKind::Expand:
        case OpKind::Slice:
        case OpKind::Concat:
        case OpKind::Gather:
        case OpKind::IndexSelect:
        case OpKind::Embedding:
        case OpKind::AllGather:
        case OpKind::ReduceScatter:
        case OpKind::AllReduce:
        case OpKind::AllToAll:
        case OpKind::Redistribute:
        case OpKind::Arange:
        case OpKind::Full:
        case OpKind::Tril:
        case OpKind::Triu:
        case OpKind::Cumsum:
        case OpKind::Argmax:
        case OpKind::Argmin: v = b.op(n.op, in, {}, n.attrs.items, n.loc); break;
        case OpKind::Dropout: v = b.op(n.op, in, {}, n.attrs.items, n.loc); break;
      }
      if (!n.name.empty()) b.name(v, n.name, n.loc);
      if (n.placement) b.constrain(v, *n.placement, n.loc);
      map[i] = v;
    }
    for (const Output& o : g.outputs()) b.ret(map[static_cast<size_t>(o.value)], o.placement, o.loc);
  } catch (const DiagError& e) {
    // The input passed the verifier, so a rejected rebuild is a bug in this file.
    throw std::logic_error("internal error in decompose: " + e.diag.str());
  }
  Result<Graph> r = b.finish();
  if (!r) throw std::logic_error("internal error in decompose: " + r.error().str());
  return std::move(r).value();
}

}  // namespace

bool decomposes_before_sharding(OpKind k) { return k == OpKind::CrossEntropy; }

Graph decompose(const Graph& g) { return decompose_selected(g, is_composite); }

Graph decompose_for_sharding(const Graph& g) { return decompose_selected(g, decomposes_before_sharding); }

}  // namespace sf
