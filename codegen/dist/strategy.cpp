#include "codegen/dist/strategy.h"

#include "codegen/ir/ops_loss.h"
#include "codegen/ir/attention.h"
#include "codegen/ir/limits.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string_view>

namespace sf {

namespace {

using PKind = Placement::Kind;

Placement R() { return Placement::replicate(); }
Placement S(int d) { return Placement::shard(d); }
Placement P(ReduceOp op) { return Placement::partial(op); }

// A strategy for one mesh dim: a placement per operand and the result's.
// `carry`: a cumsum over the sharded dim (OpStrategy::carry).
struct DimStrategy {
  std::vector<Placement> inputs;
  Placement output;
  bool carry = false;
  bool operator==(const DimStrategy&) const = default;
};

// The single-mesh-dim strategies of one op, in the order they were added, without
// duplicates; all-Replicate always comes first.
class Rules {
 public:
  explicit Rules(size_t arity) { add(std::vector<Placement>(arity, R()), R()); }
  void add(std::vector<Placement> inputs, Placement output, bool carry = false) {
    DimStrategy s{std::move(inputs), output, carry};
    if (std::find(list_.begin(), list_.end(), s) == list_.end()) list_.push_back(std::move(s));
  }
  const std::vector<DimStrategy>& list() const { return list_; }

 private:
  std::vector<DimStrategy> list_;
};

// Reduce ops a Partial keeps through an op that is linear in that operand. Avg only for
// floats: an integer avg would have to round, and sum(x)/n != sum(round(x_i/n)).
std::vector<ReduceOp> linear_reduce_ops(DType t) {
  if (is_float(t)) return {ReduceOp::Sum, ReduceOp::Avg};
  return {ReduceOp::Sum};
}

// Reduce ops a Partial keeps through an op that only moves or copies elements
// (transpose, reshape, expand, a gather): every one of them.
std::vector<ReduceOp> movement_reduce_ops(DType t) {
  if (is_float(t)) return {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  return {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
}

// An operand may carry a Partial into the op only when it is a real tensor (a literal
// is one value, replicated) of the result's dtype: a Partial of another dtype would be
// converted rank by rank, and the conversion of a sum is not the sum of conversions
// (i32 partials that wrap, then widen to i64, for one).
bool may_be_partial(const Operand& o, const TensorType& out) {
  return !o.weak && o.type.dtype == out.dtype;
}

// Elementwise ops with NumPy broadcasting: the result sharded on any dim d, each
// operand sharded on its aligned dim when it has d at the result's full size, and
// replicated when it broadcasts along d (size 1 against a larger result, or missing).
void add_pointwise_shards(const std::vector<Operand>& in, const TensorType& out, Rules& r) {
  int rank = out.rank();
  for (int d = 0; d < rank; ++d) {
    std::vector<Placement> ins;
    for (const Operand& o : in) {
      int aligned = d - (rank - o.type.rank());
      bool full = !o.weak && aligned >= 0 && o.type.shape[static_cast<size_t>(aligned)] == out.shape[static_cast<size_t>(d)];
      ins.push_back(full ? S(aligned) : R());
    }
    r.add(std::move(ins), S(d));
  }
}

// Which input dims a reduction folds, and where every kept dim lands in the result.
struct ReduceMap {
  std::vector<bool> reduced;
  std::vector<int> out_dim;  // per input dim; -1 for a reduced dim without keepdim
};

ReduceMap reduce_map(const TensorType& x, const Attrs& attrs) {
  const auto& dims = attrs.get_ints("dims");
  bool keep = attrs.get_bool("keepdim");
  ReduceMap m{std::vector<bool>(static_cast<size_t>(x.rank()), dims.empty()), {}};
  for (int64_t d : dims) m.reduced[static_cast<size_t>(*normalize_dim(d, x.rank()))] = true;
  int pos = 0;
  for (int d = 0; d < x.rank(); ++d) {
    bool gone = m.reduced[static_cast<size_t>(d)] && !keep;
    m.out_dim.push_back(gone ? -1 : pos);
    if (!gone) ++pos;
  }
  return m;
}

void add_reduce(OpKind k, const Operand& x, const Attrs& attrs, const TensorType& out, Rules& r) {
  ReduceMap m = reduce_map(x.type, attrs);
  // What a reduction over a sharded dim leaves on each rank: its part of the result.
  // A mean's is its chunk's sum divided by the GLOBAL count (local_node sets mean's
  // `count`), so the parts add up to the mean even when torch.chunk's chunks are
  // uneven (5 on 4 ranks is 2, 2, 1, 0): Partial(sum), not Partial(avg).
  std::optional<ReduceOp> over_shard;
  switch (k) {
    case OpKind::Sum:
    case OpKind::Mean: over_shard = ReduceOp::Sum; break;
    case OpKind::Max: over_shard = ReduceOp::Max; break;
    case OpKind::Min: over_shard = ReduceOp::Min; break;
    default: break;
  }
  for (int d = 0; d < x.type.rank(); ++d) {
    if (!m.reduced[static_cast<size_t>(d)]) r.add({S(d)}, S(m.out_dim[static_cast<size_t>(d)]));
    else if (over_shard) r.add({S(d)}, P(*over_shard));
  }
  // Partial inputs: sum and mean are linear; max of maxima and min of minima too.
  std::vector<ReduceOp> keeps;
  if (k == OpKind::Sum || k == OpKind::Mean) keeps = linear_reduce_ops(out.dtype);
  if (k == OpKind::Max) keeps = {ReduceOp::Max};
  if (k == OpKind::Min) keeps = {ReduceOp::Min};
  if (may_be_partial(x, out))
    for (ReduceOp op : keeps) r.add({P(op)}, P(op));
}

// cumsum(x, dim): any other dim keeps its shard; cumsum is linear, so a Partial of
// sum or avg passes. The scanned dim itself may stay sharded with a carry (each rank
// adds the totals of the chunks before its own: OpStrategy::carry). argmax/argmin
// keep the shard of any other dim (moved as a sum's without keepdim) and take no
// Partial (the index of the max of a sum is not found from the parts); their dim is
// gathered first (DTensor's way).
void add_along(OpKind k, const Operand& x, const Attrs& attrs, const TensorType& out, Rules& r) {
  const int rank = x.type.rank();
  const int dim = *normalize_dim(attrs.get_int("dim"), rank);
  const bool drop = k != OpKind::Cumsum && !attrs.get_bool("keepdim");
  for (int d = 0; d < rank; ++d)
    if (d != dim) r.add({S(d)}, S(drop && d > dim ? d - 1 : d));
  if (k != OpKind::Cumsum) return;
  r.add({S(dim)}, S(dim), /*carry=*/true);
  if (may_be_partial(x, out))
    for (ReduceOp op : linear_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
}

// matmul [..., m, k] x [..., k, n] -> [batch..., m, n] with broadcast batch dims.
void add_matmul(const Operand& a, const Operand& b, const TensorType& out, Rules& r) {
  int ra = a.type.rank(), rb = b.type.rank(), ro = out.rank();
  int batch = ro - 2;
  for (int d = 0; d < batch; ++d) {
    auto side = [&](const Operand& o) {
      int aligned = d - (ro - o.type.rank());
      bool full = aligned >= 0 && o.type.shape[static_cast<size_t>(aligned)] == out.shape[static_cast<size_t>(d)];
      return full ? S(aligned) : R();
    };
    r.add({side(a), side(b)}, S(d));
  }
  r.add({S(ra - 2), R()}, S(ro - 2));         // rows of A
  r.add({R(), S(rb - 1)}, S(ro - 1));         // columns of B
  r.add({S(ra - 1), S(rb - 2)}, P(ReduceOp::Sum));  // the contraction: partial sums
  for (ReduceOp op : linear_reduce_ops(out.dtype)) {
    if (may_be_partial(a, out)) r.add({P(op), R()}, P(op));
    if (may_be_partial(b, out)) r.add({R(), P(op)}, P(op));
  }
}

// The vocabulary-parallel lookup (DTensor's MaskPartial): the table row-sharded, the
// indices whole; each rank looks up only the rows it holds (local_node gives it their
// offset), reads 0 for every other index, and the ranks' results sum to the lookup.
// Not for bool tables, which have no sum.
void add_vocab_parallel(const Operand& table, const TensorType& out, std::vector<Placement> ins, Rules& r) {
  if (!table.weak && out.dtype != DType::Bool) r.add(std::move(ins), P(ReduceOp::Sum));
}

// scaled_dot_product_attention(q, k, v[, mask]), q [..., Hq, L, E]: a batch dim sharded
// alike on q, k, v; the heads sharded alike on q, k and v (tensor-parallel attention),
// or on q alone with k and v whole (GQA with fewer kv heads than ranks, or chunks
// that do not line up: each rank's query heads read the kv heads they need); the
// query rows sharded with k and v whole (context-parallel queries). The mask follows
// the scores [..., Hq, L, S] where it has the dim, and is whole where it broadcasts.
// No Partial: the softmax between the matmuls is not linear. Whether the heads of q
// and of k, v line up on every rank is checked per full spec (valid_on_mesh).
void add_attention(const std::vector<Operand>& in, const TensorType& out, Rules& r) {
  const int rank = out.rank();
  auto mask = [&](int d) {  // the mask's placement when the scores' dim d is sharded
    if (in.size() < 4) return std::vector<Placement>{};
    const TensorType& m = in[3].type;
    const int aligned = d - (rank - m.rank());
    const bool full = aligned >= 0 && m.shape[static_cast<size_t>(aligned)] == in[0].type.shape[static_cast<size_t>(d)];
    return std::vector<Placement>{full ? S(aligned) : R()};
  };
  auto add = [&](std::vector<Placement> qkv, int d) {
    std::vector<Placement> m = mask(d);
    qkv.insert(qkv.end(), m.begin(), m.end());
    r.add(std::move(qkv), S(d));
  };
  for (int d = 0; d < rank - 3; ++d) add({S(d), S(d), S(d)}, d);
  add({S(rank - 3), S(rank - 3), S(rank - 3)}, rank - 3);
  add({S(rank - 3), R(), R()}, rank - 3);
  add({S(rank - 2), R(), R()}, rank - 2);
}

// A dim permutation (transpose, permute): out dim i is input dim perm[i].
void add_permutation(const Operand& x, const std::vector<int>& perm, const TensorType& out, Rules& r) {
  for (int i = 0; i < static_cast<int>(perm.size()); ++i) r.add({S(perm[static_cast<size_t>(i)])}, S(i));
  if (may_be_partial(x, out))
    for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
}

// How a reshape keeps a sharded dim (DTensor's view_groups, simplified): both shapes
// are cut into groups of dims with equal products. A dim alone in its group on both
// sides (same size) is untouched and keeps any shard. In a group that merges or splits,
// only the outermost input dim may stay sharded, as the outermost output dim, and only
// when both divide evenly by the ranks sharding them (checked per full spec, later).
struct ReshapeMap {
  std::vector<int> out_dim;   // per input dim: the output dim its shard becomes, or -1
  std::vector<bool> needs_even;  // per input dim: a merge/split group
};

ReshapeMap reshape_map(const Shape& in, const Shape& out) {
  size_t ni = in.size(), no = out.size();
  ReshapeMap m{std::vector<int>(ni, -1), std::vector<bool>(ni, false)};
  if (numel(in) == 0) {
    // No products to match: one group of everything (every local shard is empty on
    // both sides, so only the outermost dims' chunk counts must agree).
    if (ni > 0 && no > 0) {
      m.out_dim[0] = 0;
      m.needs_even[0] = !(ni == 1 && no == 1);
    }
    return m;
  }
  size_t i = 0, j = 0;
  while (i < ni || j < no) {
    bool in1 = i < ni && in[i] == 1, out1 = j < no && out[j] == 1;
    if (in1 && out1) {  // 1 -> 1: untouched
      m.out_dim[i++] = static_cast<int>(j++);
      continue;
    }
    if (in1 || j >= no) {  // an input size-1 dim the output drops
      ++i;
      continue;
    }
    if (out1 || i >= ni) {  // an output size-1 dim the reshape inserts
      ++j;
      continue;
    }
    size_t i0 = i, j0 = j;
    int64_t pi = in[i++], po = out[j++];
    while (pi != po) {
      if (pi < po) pi *= in[i++];
      else po *= out[j++];
    }
    m.out_dim[i0] = static_cast<int>(j0);
    m.needs_even[i0] = !(i - i0 == 1 && j - j0 == 1);
  }
  return m;
}

// The tensor dims `spec` shards, each with the product of the mesh sizes sharding it.
std::vector<int64_t> shard_factors(const PlacementSpec& spec, int rank, const DeviceMesh& mesh) {
  std::vector<int64_t> f(static_cast<size_t>(rank), 1);
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = spec.per_dim[static_cast<size_t>(i)];
    if (p.is_shard()) f[static_cast<size_t>(p.dim)] *= mesh.size(i);
  }
  return f;
}

// The checks that need the whole spec (see op_strategies).
bool valid_on_mesh(OpKind k, const std::vector<Operand>& in, const Attrs& attrs, const TensorType& out,
                   const DeviceMesh& mesh, const OpStrategy& s) {
  if (k == OpKind::Reshape) {
    const Shape& x = in[0].type.shape;
    ReshapeMap m = reshape_map(x, out.shape);
    std::vector<int64_t> f = shard_factors(s.inputs[0], in[0].type.rank(), mesh);
    for (size_t d = 0; d < x.size(); ++d) {
      if (f[d] == 1 || !m.needs_even[d]) continue;
      if (x[d] % f[d] != 0 || out.shape[static_cast<size_t>(m.out_dim[d])] % f[d] != 0) return false;
    }
  }
  if (k == OpKind::Max || k == OpKind::Min) {
    // torch.max over an empty dim raises (no identity); so would a rank whose chunk
    // of a reduced dim is empty while its part of the result is not.
    const TensorType& x = in[0].type;
    ReduceMap m = reduce_map(x, attrs);
    auto empty_fold = [&](const Shape& shape) {
      int64_t count = 1, kept = 1;
      for (size_t d = 0; d < shape.size(); ++d) (m.reduced[d] ? count : kept) *= shape[d];
      return count == 0 && kept > 0;
    };
    if (!empty_fold(x.shape))  // a global max over empty dims is an error whatever the sharding
      for (int rank = 0; rank < mesh.world(); ++rank)
        if (empty_fold(local_shard(x.shape, s.inputs[0], mesh, rank).shape)) return false;
  }
  if (k == OpKind::ScaledDotProductAttention) {
    // Every rank's query heads must read kv heads that rank holds: with heads split
    // unevenly, or GQA groups cut by the chunks, they may not.
    const TensorType &q = in[0].type, &kv = in[1].type;
    const size_t h = static_cast<size_t>(q.rank() - 3);
    const AttentionHeads global = attention_heads(attrs, q.shape[h], kv.shape[h]);
    for (int rank = 0; rank < mesh.world(); ++rank) {
      const LocalShard lq = local_shard(q.shape, s.inputs[0], mesh, rank);
      const LocalShard lk = local_shard(kv.shape, s.inputs[1], mesh, rank);
      if (lq.shape[h] == 0) continue;
      // group * offset may not fit (a graph's own gqa_group goes up to 2^40): checked.
      const std::optional<int64_t> back = checked_mul(global.group, lk.offset[h]);
      if (!back || *back > global.offset + lq.offset[h]) return false;
      const AttentionHeads local{global.group, global.offset + lq.offset[h] - *back};
      if (local.kv_head(lq.shape[h] - 1) >= lk.shape[h]) return false;
    }
  }
  return true;
}

// DTensor's expand_to_full_mesh_op_strategy: every choice of one single-dim strategy
// per mesh dim, mesh dim 0 varying slowest.
std::vector<OpStrategy> expand_to_mesh(const std::vector<DimStrategy>& dim, size_t arity, const DeviceMesh& mesh) {
  size_t nd = static_cast<size_t>(mesh.ndim());
  std::vector<OpStrategy> all;
  std::vector<size_t> pick(nd, 0);
  for (;;) {
    OpStrategy s{std::vector<PlacementSpec>(arity), PlacementSpec{}};
    for (size_t m = 0; m < nd; ++m) {
      const DimStrategy& d = dim[pick[m]];
      if (d.carry) s.carry.push_back(static_cast<int>(m));
      for (size_t a = 0; a < arity; ++a) s.inputs[a].per_dim.push_back(d.inputs[a]);
      s.output.per_dim.push_back(d.output);
    }
    all.push_back(std::move(s));
    size_t m = nd;
    while (m > 0 && ++pick[m - 1] == dim.size()) pick[--m] = 0;
    if (m == 0) break;
  }
  return all;
}

}  // namespace

std::vector<OpStrategy> op_strategies(OpKind k, const std::vector<Operand>& in, const Attrs& attrs,
                                      const TensorType& out, const DeviceMesh& mesh) {
  Rules r(in.size());
  switch (k) {
    case OpKind::Param:
    case OpKind::Constant: break;  // no operands: the value is whatever it is placed as

    // Unary elementwise. Only neg is linear; exp, relu, abs, cast, ... of a sum is not
    // the sum of the ranks' results, so they take no Partial.
    case OpKind::Neg:
      add_pointwise_shards(in, out, r);
      if (may_be_partial(in[0], out))
        for (ReduceOp op : linear_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
      break;
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
    case OpKind::Gelu:
    case OpKind::GeluTanh: add_pointwise_shards(in, out, r); break;

    // a + b of two partial sums (or averages) is the partial sum of a_i + b_i.
    case OpKind::Add:
    case OpKind::Sub:
      add_pointwise_shards(in, out, r);
      if (may_be_partial(in[0], out) && may_be_partial(in[1], out))
        for (ReduceOp op : linear_reduce_ops(out.dtype)) r.add({P(op), P(op)}, P(op));
      break;
    // Scaling a partial by a replicated factor scales every rank's part.
    case OpKind::Mul:
      add_pointwise_shards(in, out, r);
      for (ReduceOp op : linear_reduce_ops(out.dtype)) {
        if (may_be_partial(in[0], out)) r.add({P(op), R()}, P(op));
        if (may_be_partial(in[1], out)) r.add({R(), P(op)}, P(op));
      }
      break;
    case OpKind::Div:  // only the dividend: 1 / (a + b) != 1/a + 1/b
      add_pointwise_shards(in, out, r);
      if (may_be_partial(in[0], out))
        for (ReduceOp op : linear_reduce_ops(out.dtype)) r.add({P(op), R()}, P(op));
      break;
    // max(max_i a_i, max_i b_i) = max_i max(a_i, b_i); likewise min.
    case OpKind::Maximum:
    case OpKind::Minimum: {
      add_pointwise_shards(in, out, r);
      ReduceOp op = k == OpKind::Maximum ? ReduceOp::Max : ReduceOp::Min;
      if (may_be_partial(in[0], out) && may_be_partial(in[1], out)) r.add({P(op), P(op)}, P(op));
      break;
    }
    case OpKind::Pow:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::Where: add_pointwise_shards(in, out, r); break;

    case OpKind::Sum:
    case OpKind::Max:
    case OpKind::Min:
    case OpKind::Mean: add_reduce(k, in[0], attrs, out, r); break;

    case OpKind::Matmul: add_matmul(in[0], in[1], out, r); break;

    case OpKind::Transpose: {
      int rank = in[0].type.rank();
      std::vector<int> perm(static_cast<size_t>(rank));
      for (int d = 0; d < rank; ++d) perm[static_cast<size_t>(d)] = d;
      std::swap(perm[static_cast<size_t>(*normalize_dim(attrs.get_int("dim0"), rank))],
                perm[static_cast<size_t>(*normalize_dim(attrs.get_int("dim1"), rank))]);
      add_permutation(in[0], perm, out, r);
      break;
    }
    case OpKind::Permute: {
      std::vector<int> perm;
      for (int64_t d : attrs.get_ints("dims")) perm.push_back(*normalize_dim(d, in[0].type.rank()));
      add_permutation(in[0], perm, out, r);
      break;
    }
    case OpKind::Reshape: {
      ReshapeMap m = reshape_map(in[0].type.shape, out.shape);
      for (int d = 0; d < in[0].type.rank(); ++d)
        if (int o = m.out_dim[static_cast<size_t>(d)]; o >= 0) r.add({S(d)}, S(o));
      if (may_be_partial(in[0], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
      break;
    }
    case OpKind::Expand: {
      const Shape& x = in[0].type.shape;
      int lead = out.rank() - in[0].type.rank();
      for (int d = 0; d < out.rank(); ++d) {
        bool from_input = d >= lead && x[static_cast<size_t>(d - lead)] == out.shape[static_cast<size_t>(d)];
        // A dim the input has keeps its shard; a new or broadcast (1 -> N) dim is a
        // copy on every rank, so each rank may materialise just its chunk of it.
        r.add({from_input ? S(d - lead) : R()}, S(d));
      }
      if (may_be_partial(in[0], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
      break;
    }
    // Slice and concat (DTensor's slice and cat strategies): any other dim keeps its
    // shard, the sliced or joined dim must be whole on every rank (a rank's chunk of
    // it is not the chunk of the result), and they only move elements, so a Partial
    // of every operand is a Partial of the result.
    case OpKind::Slice:
    case OpKind::Concat: {
      int dim = *normalize_dim(attrs.get_int("dim"), out.rank());
      for (int d = 0; d < out.rank(); ++d)
        if (d != dim) r.add(std::vector<Placement>(in.size(), S(d)), S(d));
      if (std::all_of(in.begin(), in.end(), [&](const Operand& o) { return may_be_partial(o, out); }))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add(std::vector<Placement>(in.size(), P(op)), P(op));
      break;
    }
    case OpKind::Embedding: {
      int ri = in[0].type.rank();
      for (int d = 0; d < ri; ++d) r.add({S(d), R()}, S(d));  // a batch of lookups
      r.add({R(), S(1)}, S(ri));                              // columns of the table
      add_vocab_parallel(in[1], out, {R(), S(0)}, r);         // rows of the table
      if (may_be_partial(in[1], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({R(), P(op)}, P(op));
      break;
    }
    // torch.gather: x and index sharded alike on a dim they have at one size (each
    // rank gathers within its block), or the index sharded along `dim` with x whole.
    // Not the index sharded on another dim over a whole x: out[c] reads x at c's own
    // coordinates there, and a rank's block of c starts at its offset, not at 0.
    case OpKind::Gather: {
      const int dim = *normalize_dim(attrs.get_int("dim"), in[0].type.rank());
      for (int d = 0; d < out.rank(); ++d) {
        const auto u = static_cast<size_t>(d);
        if (d != dim && in[0].type.shape[u] == in[1].type.shape[u]) r.add({S(d), S(d)}, S(d));
      }
      r.add({R(), S(dim)}, S(dim));
      // x sharded along `dim`, the index whole: each rank reads the rows it holds
      // (local_node's offset) and 0 for the others, a Partial(sum) (the picked logit of
      // a vocabulary-parallel cross_entropy).
      add_vocab_parallel(in[0], out, {S(dim), R()}, r);
      if (may_be_partial(in[0], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op), R()}, P(op));
      break;
    }
    case OpKind::IndexSelect: {
      const int dim = *normalize_dim(attrs.get_int("dim"), in[0].type.rank());
      for (int d = 0; d < out.rank(); ++d)
        if (d != dim) r.add({S(d), R()}, S(d));
      r.add({R(), S(0)}, S(dim));                          // a chunk of the positions each
      add_vocab_parallel(in[0], out, {S(dim), R()}, r);    // the selected dim's rows each
      if (may_be_partial(in[0], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op), R()}, P(op));
      break;
    }
    // x, index and src sharded alike on another dim where all three have one size;
    // linear in x and src together, so their Partials pass with the index whole.
    case OpKind::ScatterAdd: {
      const int dim = *normalize_dim(attrs.get_int("dim"), in[0].type.rank());
      for (int d = 0; d < out.rank(); ++d) {
        const auto u = static_cast<size_t>(d);
        const int64_t size = in[0].type.shape[u];
        if (d != dim && in[1].type.shape[u] == size && in[2].type.shape[u] == size) r.add({S(d), S(d), S(d)}, S(d));
      }
      if (may_be_partial(in[0], out) && may_be_partial(in[2], out))
        for (ReduceOp op : linear_reduce_ops(out.dtype)) r.add({P(op), R(), P(op)}, P(op));
      break;
    }

    // Composites that normalise along some dims: any other dim may be sharded, and the
    // statistics they compute (max, sum, mean, variance) make every Partial invalid.
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      int dim = *normalize_dim(attrs.get_int("dim"), in[0].type.rank());
      for (int d = 0; d < in[0].type.rank(); ++d)
        if (d != dim) r.add({S(d)}, S(d));
      break;
    }
    // cross_entropy as one op (decompose_for_sharding expands it before propagation,
    // where the class dim may be sharded; these are for a graph propagated without
    // that): logits and target sharded alike on a batch or spatial dim. Each rank's
    // losses are its rows' (none), and their sums add up (sum); the mean is not offered
    // (each rank would divide by its own count of targets not ignored).
    case OpKind::CrossEntropy: {
      const int rank = in[0].type.rank(), cd = class_dim(rank);
      const LossReduction red = *parse_loss_reduction(attrs.get_ident("reduction"));
      for (int d = 0; d < rank; ++d) {
        if (d == cd || red == LossReduction::Mean) continue;
        const int t = d < cd ? d : d - 1;  // the target's dim
        r.add({S(d), S(t)}, red == LossReduction::None ? S(t) : P(ReduceOp::Sum));
      }
      break;
    }
    case OpKind::ScaledDotProductAttention: add_attention(in, out, r); break;
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: {
      int batch = in[0].type.rank() - in[1].type.rank();  // the dims before the normalised ones
      for (int d = 0; d < batch; ++d) {
        std::vector<Placement> ins(in.size(), R());
        ins[0] = S(d);
        r.add(std::move(ins), S(d));
      }
      break;
    }

    // Per-rank collectives already say what each rank holds; only all-R is offered
    // (they are not propagated through, they are the propagation's output).
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AllReduce:
    case OpKind::AllToAll: break;
    case OpKind::Redistribute: {
      PlacementSpec to = normalize_spec(attrs.get_placements("placements"), out.rank());
      return {OpStrategy{std::vector<PlacementSpec>(in.size(), to), to}};
    }

    // Generators: each rank may build the whole value (R, first) or only its chunk of
    // any dim, at no cost: local_node moves arange's start to the chunk's first
    // value, and full's shape is rewritten to the local one like every `shape`.
    case OpKind::Arange:
    case OpKind::Full:
      for (int d = 0; d < out.rank(); ++d) r.add({}, S(d));
      break;
    // Any dim may be sharded: on the last two, local_node shifts the diagonal by the
    // rank's row and column offsets. Zeroing an element commutes with every Partial
    // (a sum, average, max or min of zeros is zero), so Partials pass through.
    case OpKind::Tril:
    case OpKind::Triu:
      add_pointwise_shards(in, out, r);
      if (may_be_partial(in[0], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
      break;
    case OpKind::Cumsum:
    case OpKind::Argmax:
    case OpKind::Argmin: add_along(k, in[0], attrs, out, r); break;
    // For a fixed mask dropout is x * m with m in {0, 1/(1-p)} >= 0 per element, so it
    // is linear (Sum, Avg pass) and monotone (Max, Min pass), and each rank keeps its
    // chunk of any dim: local_node gives the node the rank's origin in the global
    // tensor, so every rank draws the mask of the global index (a Partial's ranks all
    // draw the same mask, their origin being the same).
    case OpKind::Dropout:
      add_pointwise_shards(in, out, r);
      if (may_be_partial(in[0], out))
        for (ReduceOp op : movement_reduce_ops(out.dtype)) r.add({P(op)}, P(op));
      break;
  }

  std::vector<OpStrategy> all = expand_to_mesh(r.list(), in.size(), mesh);
  std::vector<OpStrategy> valid;
  for (OpStrategy& s : all)
    if (valid_on_mesh(k, in, attrs, out, mesh, s)) valid.push_back(std::move(s));
  return valid;
}

RankShards rank_shards(const Shape& out, const PlacementSpec& out_spec, const std::vector<Shape>& in,
                       const std::vector<PlacementSpec>& in_specs, const DeviceMesh& mesh, int rank) {
  RankShards r{local_shard(out, out_spec, mesh, rank), {}, in, in_specs};
  for (size_t k = 0; k < in.size(); ++k) r.inputs.push_back(local_shard(in[k], in_specs[k], mesh, rank));
  return r;
}

namespace {

void set_attr(Node& n, std::string_view name, AttrValue v) {
  for (auto& [key, value] : n.attrs.items)
    if (key == name) value = std::move(v);
}

// arange's chunk [off, off + len) of its global values: start + off * step up to the
// next chunk's first value (the global end for the last chunk). Computed modulo 2^64:
// every bound used is one of the values, or the global end, so it fits in int64.
void local_arange(Node& l, const Node& n, const LocalShard& out) {
  const int64_t start = n.attrs.get_int("start"), step = n.attrs.get_int("step");
  const int64_t off = out.offset[0], len = out.shape[0], global = n.type.shape[0];
  auto value = [&](int64_t i) {
    return static_cast<int64_t>(static_cast<uint64_t>(start) + static_cast<uint64_t>(i) * static_cast<uint64_t>(step));
  };
  // An empty chunk (uneven sharding: 5 on 4 ranks leaves one) is arange(start, start).
  const int64_t first = len == 0 ? start : value(off);
  const int64_t end = len == 0 ? start : off + len == global ? n.attrs.get_int("end") : value(off + len);
  set_attr(l, "start", first);
  set_attr(l, "end", end);
}

// tril/triu keep x[i, j] by j - i against the diagonal; a rank holding the block at
// rows r0.., columns c0.. sees j - i = j_l - i_l + c0 - r0, so its diagonal is
// diagonal + r0 - c0. j - i is below 2^40 in size, so a diagonal beyond +-2^62 means
// what +-2^62 means, and clamping first keeps the sum in range.
void local_triangle(Node& l, const Node& n, const LocalShard& out) {
  const size_t r = out.offset.size();
  const int64_t shift = out.offset[r - 2] - out.offset[r - 1];
  if (shift == 0) return;
  constexpr int64_t kBound = int64_t{1} << 62;
  set_attr(l, "diagonal", std::clamp(n.attrs.get_int("diagonal"), -kBound, kBound) + shift);
}

// A mean whose reduced dims are cut (a rank holds a chunk of one): the rank's sum is
// divided by the global count of reduced elements, so the ranks' results add up to
// the mean (Partial(sum)). A count already set (a nested chunk's) stays.
void local_mean(Node& l, const Node& n, const RankShards& at) {
  if (n.attrs.get_int("count") > 0 || at.input_shapes.empty() || at.inputs.empty()) return;
  const Shape& global = at.input_shapes[0];
  const Shape& local = at.inputs[0].shape;
  bool cut = false;
  int64_t count = 1;
  for (int d : reduced_dims(n.attrs, static_cast<int>(global.size()))) {
    cut = cut || local[static_cast<size_t>(d)] != global[static_cast<size_t>(d)];
    count *= global[static_cast<size_t>(d)];  // a product of dims of one tensor: below 2^40
  }
  if (cut && count > 0) set_attr(l, "count", count);
}

// dropout draws element c's mask from its global index: a rank's block at offset
// `off` of the node's tensor lies at origin + off of the tensor the node's own
// origin and global_shape name (the node's own shape when it names none).
void local_dropout(Node& l, const Node& n, const LocalShard& out) {
  if (out.shape == n.type.shape) return;  // the whole tensor (replicated, or a Partial)
  std::vector<int64_t> origin = n.attrs.get_ints("origin");
  std::vector<int64_t> global = n.attrs.get_ints("global_shape");
  if (global.empty()) {
    global = n.type.shape;
    origin.assign(global.size(), 0);
  }
  for (size_t d = 0; d < origin.size(); ++d) origin[d] += out.offset[d];  // inside global: < 2^40
  set_attr(l, "origin", std::move(origin));
  set_attr(l, "global_shape", std::move(global));
}

// A rank's block of scaled_dot_product_attention: query rows from the chunk's first
// global row (the causal mask compares global indices); where the strategy cuts the
// heads (unless it cuts q's and kv's alike without GQA, where local head h reads local
// kv head h), local query head h is global head qo + h, which reads global kv head
// (head_offset + qo + h) / group, local kv head that minus the kv chunk's first ko:
// (head_offset + qo - group * ko + h) / group. Decided from the placements, not from
// the rank's chunk, so that every rank sets the same attributes (a rank whose chunk
// happens to be whole would otherwise decompose differently). Without the global
// shapes and placements (a hand-made RankShards) the heads are left as they are.
void local_attention(Node& l, const Node& n, const RankShards& at) {
  const LocalShard& q = at.inputs[0];
  const int rank = static_cast<int>(q.offset.size());
  const size_t r = q.offset.size();
  // Beyond +-2^40 (more than any L or S) the mask keeps every key or none, as at the
  // bound, so clamping keeps the meaning and the shape rule's range.
  if (q.offset[r - 2] != 0)
    set_attr(l, "query_offset", std::clamp(n.attrs.get_int("query_offset") + q.offset[r - 2], -kMaxElements, kMaxElements));
  if (at.input_shapes.size() < 2 || at.in_specs.size() < 2) return;
  auto cuts = [&](const PlacementSpec& p) {  // per mesh dim: does it cut the heads?
    std::vector<bool> c;
    for (const Placement& x : p.per_dim) c.push_back(x.is_shard() && normalize_dim(x.dim, rank) == rank - 3);
    return c;
  };
  const std::vector<bool> cq = cuts(at.in_specs[0]), ckv = cuts(at.in_specs[1]);
  const bool cut = std::find(cq.begin(), cq.end(), true) != cq.end() || std::find(ckv.begin(), ckv.end(), true) != ckv.end();
  const int64_t hq = at.input_shapes[0][r - 3], hkv = at.input_shapes[1][r - 3];
  const AttentionHeads g = attention_heads(n.attrs, hq, hkv);
  if (!cut || (g.group == 1 && g.offset == 0 && cq == ckv)) return;
  const LocalShard& kv = at.inputs[1];
  // A rank without query heads reads no kv head; its offset (negative where an empty
  // chunk of a nested cut starts before its kv chunk's groups) is then 0.
  const int64_t off = q.shape[r - 3] == 0 ? 0 : g.offset + q.offset[r - 3] - g.group * kv.offset[r - 3];
  set_attr(l, "head_offset", off);
  set_attr(l, "gqa_group", g.group);
}

}  // namespace

Node local_node(const Node& n, const RankShards& at) {
  Node l = n;
  l.type.shape = at.out.shape;
  // Reshape's, expand's and full's target shape; the schema calls every shape-valued
  // attribute `shape`, so a future op with one is covered too.
  for (auto& [name, value] : l.attrs.items)
    if (name == "shape") value = AttrValue(std::vector<int64_t>(at.out.shape));
  // Ops whose values depend on where the rank's block lies in the global tensor.
  if (n.op == OpKind::Arange) local_arange(l, n, at.out);
  if (n.op == OpKind::Tril || n.op == OpKind::Triu) local_triangle(l, n, at.out);
  // A row-sharded lookup table (vocabulary parallel): index i names the rank's local
  // row i - offset. |offset| <= 2^62 and a row offset is below 2^40: no overflow.
  if (n.op == OpKind::Embedding && !at.inputs[1].offset.empty())
    set_attr(l, "offset", n.attrs.get_int("offset") + at.inputs[1].offset[0]);
  if (n.op == OpKind::IndexSelect || n.op == OpKind::Gather) {
    const auto dim = static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), n.type.rank()));
    if (dim < at.inputs[0].offset.size()) set_attr(l, "offset", n.attrs.get_int("offset") + at.inputs[0].offset[dim]);
  }
  if (n.op == OpKind::Mean) local_mean(l, n, at);
  if (n.op == OpKind::Dropout) local_dropout(l, n, at.out);
  if (n.op == OpKind::ScaledDotProductAttention) local_attention(l, n, at);
  return l;
}

}  // namespace sf
