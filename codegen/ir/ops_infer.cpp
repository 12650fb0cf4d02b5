// Shape and type inference: infer_type, the one shape rule per op of ops.def (the ops
// with files of their own, index ops, losses, attention and dropout, keep their rules
// there). Moved out of ops.cpp, which keeps the op table, attributes and helpers.
#include "codegen/ir/ops.h"

#include "codegen/ir/attention.h"
#include "codegen/ir/dropout.h"
#include "codegen/ir/limits.h"
#include "codegen/ir/ops_index.h"
#include "codegen/ir/ops_loss.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace sf {

namespace {

using V = std::vector<int64_t>;

[[noreturn]] void fail(std::string msg) { throw OpError{std::move(msg)}; }

std::string op_str(OpKind k) { return std::string(op_name(k)); }
int dim_or_fail(OpKind k, std::string_view what, int64_t d, int rank) {
  auto n = normalize_dim(d, rank);
  if (!n)
    fail(op_str(k) + ": " + std::string(what) + " " + std::to_string(d) +
         " is out of range for a rank-" + std::to_string(rank) + " operand (expected " +
         std::to_string(-rank) + ".." + std::to_string(rank - 1) + ")");
  return *n;
}

void need_float(OpKind k, const TensorType& t) {
  if (!is_float(t.dtype))
    fail(op_str(k) + " expects a floating-point operand, got " + t.str() +
         " (cast it first)");
}

void need_numeric(OpKind k, const TensorType& t) {
  if (t.dtype == DType::Bool) fail(op_str(k) + " does not take bool operands, got " + t.str());
}

int mesh_dim_or_fail(OpKind k, const Attrs& a, const Mesh& mesh) {
  const std::string& name = a.get_ident("mesh_dim");
  auto i = mesh.find(name);
  if (!i) fail(op_str(k) + ": unknown mesh dimension '" + name + "' (the mesh is '" + mesh.str() + "')");
  return *i;
}

// Dim d of t times n (a gather over n ranks), checked: the product is a new size
// the user never wrote, so it must not wrap.
int64_t grow_or_fail(OpKind k, const TensorType& t, int d, int64_t n) {
  std::optional<int64_t> r = checked_mul(t.shape[static_cast<size_t>(d)], n);
  if (!r)
    fail(op_str(k) + ": dim " + std::to_string(d) + " of " + t.str() + " times " + std::to_string(n) +
         " ranks does not fit in 64 bits");
  return *r;
}

Shape broadcast_or_fail(OpKind k, const Shape& a, const Shape& b) {
  auto s = broadcast_shapes(a, b);
  if (!s) fail(op_str(k) + ": shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
  return *s;
}

// torch.cumsum: the operand's shape; integer and bool operands sum into i64 (as
// torch.cumsum without a dtype). torch.argmax/argmin: i64 indices with `dim` removed
// (kept as size 1 under keepdim). A rank-0 operand is refused (torch accepts it as one
// row of one element; a graph can reshape it to [1]); argmax over an empty dim has no
// answer (torch raises too), and bool has no order here (torch refuses it too).
TensorType infer_along(OpKind k, const TensorType& x, const Attrs& a) {
  if (x.rank() == 0) fail(op_str(k) + " expects an operand of rank >= 1, got " + x.str() + " (reshape it to [1])");
  const int d = dim_or_fail(k, "dim", a.get_int("dim"), x.rank());
  if (k == OpKind::Cumsum) return {is_float(x.dtype) ? x.dtype : DType::I64, x.shape};
  need_numeric(k, x);
  if (x.shape[static_cast<size_t>(d)] == 0)
    fail(op_str(k) + ": dim " + std::to_string(d) + " of " + x.str() + " is empty (no element to pick, as torch says)");
  Shape out;
  for (int i = 0; i < x.rank(); ++i)
    if (i != d) out.push_back(x.shape[static_cast<size_t>(i)]);
    else if (a.get_bool("keepdim")) out.push_back(1);
  return {DType::I64, out};
}

TensorType infer_reduce(OpKind k, const TensorType& x, const Attrs& a) {
  const auto& dims = a.get_ints("dims");
  bool keep = a.get_bool("keepdim");
  std::vector<bool> reduced(x.rank(), dims.empty());
  for (int64_t d : dims) {
    int n = dim_or_fail(k, "dim", d, x.rank());
    if (reduced[n]) fail(op_str(k) + ": dim " + std::to_string(d) + " is listed twice");
    reduced[n] = true;
  }
  Shape out;
  for (int i = 0; i < x.rank(); ++i) {
    if (!reduced[i]) out.push_back(x.shape[i]);
    else if (keep) out.push_back(1);
  }
  DType dt = x.dtype;
  if (k == OpKind::Mean) {
    need_float(k, x);
    if (a.get_int("count") < 0) fail("mean: count " + std::to_string(a.get_int("count")) + " is negative (0: the elements reduced)");
  }
  if (k == OpKind::Sum && !is_float(dt)) dt = DType::I64;  // torch sums integers into int64
  if ((k == OpKind::Max || k == OpKind::Min) && dt == DType::Bool) need_numeric(k, x);
  return {dt, out};
}

TensorType infer_matmul(const TensorType& a, const TensorType& b) {
  constexpr OpKind k = OpKind::Matmul;
  if (a.rank() < 2 || b.rank() < 2)
    fail("matmul expects operands of rank >= 2, got " + a.str() + " and " + b.str());
  if (a.dtype != b.dtype)
    fail("matmul expects operands of one dtype, got " + a.str() + " and " + b.str() +
         " (cast one of them)");
  need_numeric(k, a);
  int64_t m = a.shape[a.rank() - 2], ka = a.shape[a.rank() - 1];
  int64_t kb = b.shape[b.rank() - 2], n = b.shape[b.rank() - 1];
  if (ka != kb)
    fail("matmul: contraction dims differ: " + a.str() + " has " + std::to_string(ka) +
         " columns but " + b.str() + " has " + std::to_string(kb) + " rows");
  Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  auto batch = broadcast_shapes(ba, bb);
  if (!batch)
    fail("matmul: batch dims " + shape_str(ba) + " and " + shape_str(bb) + " do not broadcast");
  Shape out = *batch;
  out.push_back(m);
  out.push_back(n);
  return {a.dtype, out};
}

TensorType infer_reshape(const TensorType& x, const V& shape) {
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) fail("reshape: only one dimension may be -1, got " + shape_str(shape));
      infer_at = static_cast<int>(i);
    } else if (shape[i] < 0) {
      fail("reshape: dimension " + std::to_string(shape[i]) + " is negative in " + shape_str(shape));
    } else {
      // Checked: [2^62, 4, 0] would wrap to 0 and pass for an empty x.
      std::optional<int64_t> k = checked_mul(known, shape[i]);
      if (!k) fail("reshape: " + shape_str(shape) + " has more elements than fit in 64 bits");
      known = *k;
    }
  }
  Shape out = shape;
  int64_t total = numel(x.shape);
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0)
      fail("reshape: cannot infer -1 in " + shape_str(shape) + " for " + x.str() + " (" +
           std::to_string(total) + " elements)");
    out[infer_at] = total / known;
  } else if (known != total) {
    fail("reshape: " + x.str() + " has " + std::to_string(total) + " elements but " +
         shape_str(shape) + " has " + std::to_string(known));
  }
  return {x.dtype, out};
}

TensorType infer_expand(const TensorType& x, const V& shape) {
  if (static_cast<int>(shape.size()) < x.rank())
    fail("expand: target " + shape_str(shape) + " has fewer dims than " + x.str());
  Shape out(shape.size());
  size_t lead = shape.size() - x.rank();
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t want = shape[i];
    if (i < lead) {
      if (want < 0) fail("expand: new leading dim " + std::to_string(want) + " must be >= 0");
      out[i] = want;
      continue;
    }
    int64_t have = x.shape[i - lead];
    if (want == -1) want = have;
    if (want < 0) fail("expand: dimension " + std::to_string(want) + " is negative");
    if (have != want && have != 1)
      fail("expand: cannot expand dim " + std::to_string(i - lead) + " of " + x.str() + " from " +
           std::to_string(have) + " to " + std::to_string(want) + " (only size-1 dims expand)");
    out[i] = want;
  }
  return {x.dtype, out};
}

TensorType infer_slice(const TensorType& x, const Attrs& a) {
  if (x.rank() == 0) fail("slice expects an operand of rank >= 1, got " + x.str() + " (a scalar has no dim to slice)");
  int d = dim_or_fail(OpKind::Slice, "dim", a.get_int("dim"), x.rank());
  int64_t step = a.get_int("step");
  if (step <= 0) fail("slice: step must be positive, got " + std::to_string(step) + " (as in torch)");
  Shape s = x.shape;
  auto sd = static_cast<size_t>(d);
  s[sd] = slice_range(x.shape[sd], a.get_int("start"), a.get_int("end"), step).length;
  return {x.dtype, s};
}

// torch.cat without type promotion: one dtype, one rank, equal sizes but on `dim`.
TensorType infer_concat(const std::vector<Operand>& in, const Attrs& a) {
  auto which = [&](size_t i) { return "operand " + std::to_string(i + 1) + " " + in[i].type.str(); };
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].weak)
      fail("concat: operand " + std::to_string(i + 1) +
           " is a number literal; concat joins tensors (the dim is an attribute: dim=1)");
    if (in[i].type.rank() == 0)
      fail("concat: " + which(i) + " is a scalar (rank 0); concat needs rank >= 1, as torch.cat");
  }
  const TensorType& first = in[0].type;
  int d = dim_or_fail(OpKind::Concat, "dim", a.get_int("dim"), first.rank());
  int64_t total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorType& t = in[i].type;
    if (t.rank() != first.rank())
      fail("concat: " + which(i) + " has rank " + std::to_string(t.rank()) + " but " + which(0) + " has rank " +
           std::to_string(first.rank()) + " (every operand needs the same rank)");
    if (t.dtype != first.dtype)
      fail("concat: " + which(i) + " and " + which(0) + " differ in dtype; concat takes one dtype (cast first)");
    for (size_t e = 0; e < t.shape.size(); ++e)
      if (static_cast<int>(e) != d && t.shape[e] != first.shape[e])
        fail("concat: " + which(i) + " differs from " + which(0) + " in dim " + std::to_string(e) + " (" +
             std::to_string(t.shape[e]) + " vs " + std::to_string(first.shape[e]) + "); only dim " +
             std::to_string(d) + ", the concat dim, may differ");
    std::optional<int64_t> sum = checked_add(total, t.shape[static_cast<size_t>(d)]);
    if (!sum) fail("concat: the sizes along dim " + std::to_string(d) + " add up to more than fits in 64 bits");
    total = *sum;
  }
  Shape s = first.shape;
  s[static_cast<size_t>(d)] = total;
  return {first.dtype, s};
}

void check_norm_params(OpKind k, const TensorType& x, const TensorType& w, const char* wname) {
  need_float(k, x);
  need_float(k, w);
  if (w.rank() < 1 || w.rank() > x.rank())
    fail(op_str(k) + ": " + wname + " " + w.str() + " must have rank 1.." + std::to_string(x.rank()) +
         " (the normalised trailing dims of " + x.str() + ")");
  Shape tail(x.shape.end() - w.rank(), x.shape.end());
  if (tail != w.shape)
    fail(op_str(k) + ": " + wname + " " + w.str() + " does not match the trailing dims " +
         shape_str(tail) + " of " + x.str());
}


// torch.arange over integers: ceil((end - start) / step) values start, start + step,
// ..., computed exactly (every value lies between start and end, so in int64) and
// converted to dtype once, as a cast does.
TensorType infer_arange(const Attrs& a) {
  const int64_t end = a.get_int("end"), start = a.get_int("start"), step = a.get_int("step");
  const DType dt = a.get_dtype("dtype");
  const std::string range = "start=" + std::to_string(start) + ", end=" + std::to_string(end) +
                            ", step=" + std::to_string(step);
  if (dt == DType::Bool) fail("arange: dtype bool is not supported (as in torch); make i64 values and compare them");
  if (step == 0) fail("arange: step must be nonzero (" + range + ")");
  if ((step > 0 && end < start) || (step < 0 && end > start))
    fail("arange: upper bound and lower bound are inconsistent with the step's sign (" + range + ")");
  // |end - start| and |step| as unsigned 64-bit: exact for every int64 pair.
  const uint64_t span = step > 0 ? static_cast<uint64_t>(end) - static_cast<uint64_t>(start)
                                 : static_cast<uint64_t>(start) - static_cast<uint64_t>(end);
  const uint64_t ustep = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
  const uint64_t len = span / ustep + (span % ustep != 0 ? 1 : 0);
  if (len > static_cast<uint64_t>(kMaxElements))
    fail("arange: " + range + " gives " + std::to_string(len) +
         " elements, above the limit of 2^40 elements per tensor");
  if (dt == DType::I32 && len > 0) {
    // The last value start + (len - 1) * step lies between start and end: no overflow.
    const auto last = static_cast<int64_t>(static_cast<uint64_t>(start) + (len - 1) * static_cast<uint64_t>(step));
    for (int64_t v : {start, last})
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail("arange: value " + std::to_string(v) + " of " + range + " does not fit in i32 (use i64)");
  }
  return {dt, {static_cast<int64_t>(len)}};
}

// torch.full: `value` in every element. An integer or bool tensor takes an integral
// value in its range (a fractional or out-of-range one is refused rather than cut).
TensorType infer_full(const Attrs& a) {
  const V& shape = a.get_ints("shape");
  const DType dt = a.get_dtype("dtype");
  const double v = a.get_float("value");
  for (int64_t d : shape)
    if (d < 0) fail("full: dimension " + std::to_string(d) + " is negative in shape " + shape_str(shape));
  if (is_integer(dt)) {
    const double bound = dt == DType::I32 ? 0x1p31 : 0x1p63;  // values in [-bound, bound)
    if (!std::isfinite(v) || v != std::trunc(v) || v < -bound || v >= bound)
      fail("full: value " + attr_value_str(AttrValue(v), Mesh{}) + " is not an integer in the range of " +
           std::string(dtype_name(dt)) + " (give an integral value, or a float dtype)");
  }
  return {dt, shape};
}
}  // namespace

TensorType infer_type(OpKind k, const std::vector<Operand>& in, const Attrs& a, const Mesh& mesh) {
  const OpInfo& info = op_info(k);
  if (!arity_ok(info, in.size()))
    fail(op_str(k) + " expects " + arity_str(info) + " operand(s), got " + std::to_string(in.size()));
  switch (k) {
    case OpKind::Param:
    case OpKind::Constant: fail("internal: leaves have no shape rule");

    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::Relu: need_numeric(k, in[0].type); return in[0].type;
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Silu:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Reciprocal:
    case OpKind::Erf:
    case OpKind::Gelu:
    case OpKind::GeluTanh: need_float(k, in[0].type); return in[0].type;
    case OpKind::Cast: return {a.get_dtype("dtype"), in[0].type.shape};

    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Pow: {
      need_numeric(k, in[0].type);
      need_numeric(k, in[1].type);
      Shape s = broadcast_or_fail(k, in[0].type.shape, in[1].type.shape);
      DType dt = binary_result_dtype(in[0], in[1]);
      if (k == OpKind::Div && !is_float(dt)) dt = DType::F32;  // true division, as torch.div
      return {dt, s};
    }
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
      return {DType::Bool, broadcast_or_fail(k, in[0].type.shape, in[1].type.shape)};
    case OpKind::Where: {
      if (in[0].type.dtype != DType::Bool)
        fail("where expects a bool condition, got " + in[0].type.str() + " (compare first)");
      Shape s = broadcast_or_fail(k, in[0].type.shape, in[1].type.shape);
      s = broadcast_or_fail(k, s, in[2].type.shape);
      return {binary_result_dtype(in[1], in[2]), s};
    }

    case OpKind::Sum:
    case OpKind::Max:
    case OpKind::Min:
    case OpKind::Mean: return infer_reduce(k, in[0].type, a);

    case OpKind::Matmul: return infer_matmul(in[0].type, in[1].type);

    case OpKind::Transpose: {
      const TensorType& x = in[0].type;
      int d0 = dim_or_fail(k, "dim0", a.get_int("dim0"), x.rank());
      int d1 = dim_or_fail(k, "dim1", a.get_int("dim1"), x.rank());
      Shape s = x.shape;
      std::swap(s[d0], s[d1]);
      return {x.dtype, s};
    }
    case OpKind::Permute: {
      const TensorType& x = in[0].type;
      const auto& dims = a.get_ints("dims");
      if (static_cast<int>(dims.size()) != x.rank())
        fail("permute: dims " + shape_str(dims) + " must list each of the " +
             std::to_string(x.rank()) + " dims of " + x.str() + " once");
      std::vector<bool> seen(x.rank());
      Shape s;
      for (int64_t d : dims) {
        int n = dim_or_fail(k, "dim", d, x.rank());
        if (seen[n]) fail("permute: dim " + std::to_string(d) + " appears twice in " + shape_str(dims));
        seen[n] = true;
        s.push_back(x.shape[n]);
      }
      return {x.dtype, s};
    }
    case OpKind::Reshape: return infer_reshape(in[0].type, a.get_ints("shape"));
    case OpKind::Expand: return infer_expand(in[0].type, a.get_ints("shape"));
    case OpKind::Slice: return infer_slice(in[0].type, a);
    case OpKind::Concat: return infer_concat(in, a);
    case OpKind::Gather:
    case OpKind::IndexSelect:
    case OpKind::ScatterAdd:
    case OpKind::Embedding: return infer_index_op(k, in, a);

    case OpKind::Softmax:
      need_float(k, in[0].type);
      dim_or_fail(k, "dim", a.get_int("dim"), in[0].type.rank());
      return in[0].type;
    case OpKind::LayerNorm:
      check_norm_params(k, in[0].type, in[1].type, "weight");
      check_norm_params(k, in[0].type, in[2].type, "bias");
      if (!(in[1].type == in[2].type))
        fail("layer_norm: weight " + in[1].type.str() + " and bias " + in[2].type.str() +
             " must have the same type");
      return in[0].type;
    case OpKind::RmsNorm: check_norm_params(k, in[0].type, in[1].type, "weight"); return in[0].type;
    case OpKind::LogSoftmax:
      need_float(k, in[0].type);
      dim_or_fail(k, "dim", a.get_int("dim"), in[0].type.rank());
      return in[0].type;
    case OpKind::CrossEntropy: return infer_cross_entropy(in, a);
    case OpKind::ScaledDotProductAttention: return infer_attention(in, a);

    case OpKind::AllGather: {
      int md = mesh_dim_or_fail(k, a, mesh);
      TensorType t = in[0].type;
      int d = dim_or_fail(k, "dim", a.get_int("dim"), t.rank());
      t.shape[d] = grow_or_fail(k, t, d, mesh.dims[md].size);
      return t;
    }
    case OpKind::ReduceScatter: {
      int md = mesh_dim_or_fail(k, a, mesh);
      if (!parse_reduce_op(a.get_ident("op")))
        fail("reduce_scatter: op '" + a.get_ident("op") + "' is not one of sum, max, min, avg");
      TensorType t = in[0].type;
      int d = dim_or_fail(k, "dim", a.get_int("dim"), t.rank());
      int64_t n = mesh.dims[md].size;
      if (t.shape[d] % n != 0)
        fail("reduce_scatter: dim " + std::to_string(d) + " of " + t.str() +
             " is not divisible by the " + std::to_string(n) + " ranks of mesh dim '" +
             mesh.dims[md].name + "'");
      t.shape[d] /= n;
      return t;
    }
    case OpKind::AllReduce:
      mesh_dim_or_fail(k, a, mesh);
      if (!parse_reduce_op(a.get_ident("op")))
        fail("all_reduce: op '" + a.get_ident("op") + "' is not one of sum, max, min, avg");
      return in[0].type;
    case OpKind::AllToAll: {
      int md = mesh_dim_or_fail(k, a, mesh);
      TensorType t = in[0].type;
      int sd = dim_or_fail(k, "split_dim", a.get_int("split_dim"), t.rank());
      int cd = dim_or_fail(k, "concat_dim", a.get_int("concat_dim"), t.rank());
      int64_t n = mesh.dims[md].size;
      if (t.shape[sd] % n != 0)
        fail("all_to_all: split dim " + std::to_string(sd) + " of " + t.str() +
             " is not divisible by " + std::to_string(n) + " ranks");
      t.shape[sd] /= n;
      t.shape[cd] = grow_or_fail(k, t, cd, n);
      return t;
    }
    case OpKind::Redistribute: {
      const PlacementSpec& spec = a.get_placements("placements");
      if (spec.per_dim.size() != mesh.dims.size())
        fail("redistribute: " + std::to_string(spec.per_dim.size()) + " placements for a mesh of " +
             std::to_string(mesh.dims.size()) + " dims");
      for (const Placement& p : spec.per_dim)
        if (p.is_shard()) dim_or_fail(k, "shard dim", p.dim, in[0].type.rank());
      return in[0].type;
    }

    case OpKind::Arange: return infer_arange(a);
    case OpKind::Full: return infer_full(a);
    case OpKind::Tril:
    case OpKind::Triu:
      if (in[0].type.rank() < 2)
        fail(op_str(k) + " expects an operand of rank >= 2 (it masks the last two dims), got " + in[0].type.str());
      return in[0].type;
    case OpKind::Cumsum:
    case OpKind::Argmax:
    case OpKind::Argmin: return infer_along(k, in[0].type, a);
    case OpKind::Dropout: return infer_dropout(in[0].type, a);
  }
  fail("internal: unknown op");
}

}  // namespace sf
