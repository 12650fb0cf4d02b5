#include "codegen/ir/ops.h"

#include "codegen/ir/dropout.h"
#include "codegen/ir/attention.h"
#include "codegen/ir/limits.h"
#include "codegen/ir/ops_index.h"
#include "codegen/ir/ops_loss.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <charconv>
#include <cstdint>
#include <limits>

namespace sf {

namespace {

using V = std::vector<int64_t>;

// Attribute schemas. Required attributes (no default) come first so they can be
// written positionally: `transpose(w, 0, 1)`.
constexpr AttrSpec kNoAttrs[] = {{"", AttrType::Int, std::nullopt}};  // placeholder, unused
const AttrSpec kConstantAttrs[] = {{"value", AttrType::Float, std::nullopt},
                                   {"dtype", AttrType::DType, AttrValue(DType::F32)}};
const AttrSpec kCastAttrs[] = {{"dtype", AttrType::DType, std::nullopt}};
const AttrSpec kReduceAttrs[] = {{"dims", AttrType::IntList, AttrValue(V{})},
                                 {"keepdim", AttrType::Bool, AttrValue(false)}};
const AttrSpec kTransposeAttrs[] = {{"dim0", AttrType::Int, std::nullopt},
                                    {"dim1", AttrType::Int, std::nullopt}};
const AttrSpec kPermuteAttrs[] = {{"dims", AttrType::IntList, std::nullopt}};
const AttrSpec kShapeAttrs[] = {{"shape", AttrType::IntList, std::nullopt}};
const AttrSpec kSoftmaxAttrs[] = {{"dim", AttrType::Int, AttrValue(int64_t{-1})}};
const AttrSpec kLayerNormAttrs[] = {{"eps", AttrType::Float, AttrValue(1e-5)}};
const AttrSpec kRmsNormAttrs[] = {{"eps", AttrType::Float, AttrValue(1e-6)}};
const AttrSpec kAllGatherAttrs[] = {{"mesh_dim", AttrType::Ident, std::nullopt},
                                    {"dim", AttrType::Int, AttrValue(int64_t{0})}};
const AttrSpec kReduceScatterAttrs[] = {{"mesh_dim", AttrType::Ident, std::nullopt},
                                        {"dim", AttrType::Int, AttrValue(int64_t{0})},
                                        {"op", AttrType::Ident, AttrValue(std::string("sum"))}};
const AttrSpec kAllReduceAttrs[] = {{"mesh_dim", AttrType::Ident, std::nullopt},
                                    {"op", AttrType::Ident, AttrValue(std::string("sum"))}};
const AttrSpec kAllToAllAttrs[] = {{"mesh_dim", AttrType::Ident, std::nullopt},
                                   {"split_dim", AttrType::Int, AttrValue(int64_t{0})},
                                   {"concat_dim", AttrType::Int, AttrValue(int64_t{0})}};
const AttrSpec kRedistributeAttrs[] = {{"placements", AttrType::Placements, std::nullopt}};
const AttrSpec kArangeAttrs[] = {{"end", AttrType::Int, std::nullopt},
                                 {"start", AttrType::Int, AttrValue(int64_t{0})},
                                 {"step", AttrType::Int, AttrValue(int64_t{1})},
                                 {"dtype", AttrType::DType, AttrValue(DType::I64)}};
const AttrSpec kFullAttrs[] = {{"shape", AttrType::IntList, std::nullopt},
                               {"value", AttrType::Float, std::nullopt},
                               {"dtype", AttrType::DType, AttrValue(DType::F32)}};
const AttrSpec kTriangleAttrs[] = {{"diagonal", AttrType::Int, AttrValue(int64_t{0})}};
// aten::slice.Tensor's: start and end default to the whole dim (end: "to the end").
const AttrSpec kSliceAttrs[] = {{"dim", AttrType::Int, std::nullopt},
                                {"start", AttrType::Int, AttrValue(int64_t{0})},
                                {"end", AttrType::Int, AttrValue(std::numeric_limits<int64_t>::max())},
                                {"step", AttrType::Int, AttrValue(int64_t{1})}};
// torch.cumsum(x, dim); torch.argmax/argmin(x, dim, keepdim=False) with dim required
// (torch's dim=None, the index into the flattened tensor, is not offered).
const AttrSpec kCumsumAttrs[] = {{"dim", AttrType::Int, std::nullopt}};
const AttrSpec kArgReduceAttrs[] = {{"dim", AttrType::Int, std::nullopt},
                                    {"keepdim", AttrType::Bool, AttrValue(false)}};
// mean's `count`: the number its sum is divided by; 0 means the number of elements
// reduced. A rank's mean over its chunk of a sharded dim divides by the global count
// (local_node sets it), so that the ranks' results add up to the mean: Partial(sum).
const AttrSpec kMeanAttrs[] = {{"dims", AttrType::IntList, AttrValue(V{})},
                               {"keepdim", AttrType::Bool, AttrValue(false)},
                               {"count", AttrType::Int, AttrValue(int64_t{0})}};
const AttrSpec kConcatAttrs[] = {{"dim", AttrType::Int, AttrValue(int64_t{0})}};  // torch.cat's default
const AttrSpec kIndexDimAttrs[] = {{"dim", AttrType::Int, std::nullopt}};  // scatter_add
// `offset`: the row the lookup's index 0 names (out-of-range rows read as 0); local_node
// sets it to a rank's first row under a vocabulary-parallel (row-sharded) table.
const AttrSpec kIndexSelectAttrs[] = {{"dim", AttrType::Int, std::nullopt},
                                      {"offset", AttrType::Int, AttrValue(int64_t{0})}};
const AttrSpec kEmbeddingAttrs[] = {{"offset", AttrType::Int, AttrValue(int64_t{0})}};
// The seed first (required, so it may be positional: the printer writes it so) and
// no default: a graph names its random stream. p has torch's default, 0.5. origin
// and global_shape place a block inside a larger tensor (local_node writes them for a
// rank's shard; codegen/ir/dropout.h).
const AttrSpec kDropoutAttrs[] = {{"seed", AttrType::Int, std::nullopt},
                                  {"p", AttrType::Float, AttrValue(0.5)},
                                  {"origin", AttrType::IntList, AttrValue(V{})},
                                  {"global_shape", AttrType::IntList, AttrValue(V{})}};
// gather's offset likewise: x's first row along dim, for x sharded along dim.
const AttrSpec kGatherAttrs[] = {{"dim", AttrType::Int, std::nullopt}, {"offset", AttrType::Int, AttrValue(int64_t{0})}};
// F.cross_entropy's defaults (reduction='mean', ignore_index=-100).
const AttrSpec kCrossEntropyAttrs[] = {{"reduction", AttrType::Ident, AttrValue(std::string("mean"))},
                                       {"ignore_index", AttrType::Int, AttrValue(int64_t{-100})}};

std::span<const AttrSpec> attrs_of(OpKind k) {
  switch (k) {
    case OpKind::Constant: return kConstantAttrs;
    case OpKind::Cast: return kCastAttrs;
    case OpKind::Sum:
    case OpKind::Max:
    case OpKind::Min: return kReduceAttrs;
    case OpKind::Mean: return kMeanAttrs;
    case OpKind::Cumsum: return kCumsumAttrs;
    case OpKind::Argmax:
    case OpKind::Argmin: return kArgReduceAttrs;
    case OpKind::Transpose: return kTransposeAttrs;
    case OpKind::Permute: return kPermuteAttrs;
    case OpKind::Reshape:
    case OpKind::Expand: return kShapeAttrs;
    case OpKind::Softmax: return kSoftmaxAttrs;
    case OpKind::LayerNorm: return kLayerNormAttrs;
    case OpKind::RmsNorm: return kRmsNormAttrs;
    case OpKind::AllGather: return kAllGatherAttrs;
    case OpKind::ReduceScatter: return kReduceScatterAttrs;
    case OpKind::AllReduce: return kAllReduceAttrs;
    case OpKind::AllToAll: return kAllToAllAttrs;
    case OpKind::Redistribute: return kRedistributeAttrs;
    case OpKind::LogSoftmax: return kSoftmaxAttrs;
    case OpKind::Arange: return kArangeAttrs;
    case OpKind::Full: return kFullAttrs;
    case OpKind::Tril:
    case OpKind::Triu: return kTriangleAttrs;
    case OpKind::Slice: return kSliceAttrs;
    case OpKind::Concat: return kConcatAttrs;
    case OpKind::Gather: return kGatherAttrs;
    case OpKind::ScatterAdd: return kIndexDimAttrs;
    case OpKind::CrossEntropy: return kCrossEntropyAttrs;
    case OpKind::IndexSelect: return kIndexSelectAttrs;
    case OpKind::Embedding: return kEmbeddingAttrs;
    case OpKind::Dropout: return kDropoutAttrs;
    case OpKind::ScaledDotProductAttention: return attention_attrs();
    default: return std::span<const AttrSpec>(kNoAttrs, 0);
  }
}

const std::vector<OpInfo>& table() {
  static const std::vector<OpInfo> t = [] {
    std::vector<OpInfo> v;
#define SF_OP(kind, name, arity, category) \
  v.push_back(OpInfo{OpKind::kind, name, arity, OpCategory::category, attrs_of(OpKind::kind)});
#include "codegen/ir/ops.def"
#undef SF_OP
    return v;
  }();
  return t;
}

[[noreturn]] void fail(std::string msg) { throw OpError{std::move(msg)}; }

std::string_view attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::Int: return "an integer";
    case AttrType::IntList: return "a list of integers like [0, 1]";
    case AttrType::Float: return "a number";
    case AttrType::Bool: return "true or false";
    case AttrType::DType: return "a dtype (f32 f16 bf16 i32 i64 bool)";
    case AttrType::Ident: return "a name";
    case AttrType::Placements: return "placements like {tp: R}";
  }
  return "?";
}

// Coerces an attribute value to the schema type where that is lossless.
std::optional<AttrValue> coerce(const AttrValue& v, AttrType t) {
  if (static_cast<size_t>(t) == v.index()) return v;
  if (t == AttrType::Float && std::holds_alternative<int64_t>(v))
    return AttrValue(static_cast<double>(std::get<int64_t>(v)));
  if (t == AttrType::IntList && std::holds_alternative<int64_t>(v))  // dims=1 means dims=[1]
    return AttrValue(V{std::get<int64_t>(v)});
  if (t == AttrType::DType && std::holds_alternative<std::string>(v)) {
    if (auto d = parse_dtype(std::get<std::string>(v))) return AttrValue(*d);
    return std::nullopt;
  }
  if (t == AttrType::Bool && std::holds_alternative<std::string>(v)) {
    const auto& s = std::get<std::string>(v);
    if (s == "true") return AttrValue(true);
    if (s == "false") return AttrValue(false);
  }
  return std::nullopt;
}

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

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& [n, v] : items)
    if (n == name) return &v;
  return nullptr;
}

template <class T>
static const T& get_attr(const Attrs& a, std::string_view name) {
  const AttrValue* v = a.find(name);
  if (!v || !std::holds_alternative<T>(*v))
    throw OpError{"internal: attribute '" + std::string(name) + "' missing or mistyped"};
  return std::get<T>(*v);
}

int64_t Attrs::get_int(std::string_view n) const { return get_attr<int64_t>(*this, n); }
const std::vector<int64_t>& Attrs::get_ints(std::string_view n) const { return get_attr<V>(*this, n); }
double Attrs::get_float(std::string_view n) const { return get_attr<double>(*this, n); }
bool Attrs::get_bool(std::string_view n) const { return get_attr<bool>(*this, n); }
DType Attrs::get_dtype(std::string_view n) const { return get_attr<DType>(*this, n); }
const std::string& Attrs::get_ident(std::string_view n) const { return get_attr<std::string>(*this, n); }
const PlacementSpec& Attrs::get_placements(std::string_view n) const {
  return get_attr<PlacementSpec>(*this, n);
}

const OpInfo& op_info(OpKind k) { return table()[static_cast<size_t>(k)]; }
std::string_view op_name(OpKind k) { return op_info(k).name; }
std::optional<CollectiveKind> op_collective(OpKind k) {
  if (op_info(k).category != OpCategory::Collective) return std::nullopt;
  return parse_collective(op_name(k));  // the names are shared (tests/ir/collective_test.cpp)
}

std::span<const OpInfo> all_ops() { return table(); }

bool arity_ok(const OpInfo& info, size_t n) {
  if (info.arity == kVariadic) return n >= 2;
  if (info.arity == kThreeOrFour) return n == 3 || n == 4;
  return n == static_cast<size_t>(info.arity);
}

size_t max_operands(const OpInfo& info) {
  if (info.arity == kVariadic) return SIZE_MAX;
  if (info.arity == kThreeOrFour) return 4;
  return static_cast<size_t>(info.arity);
}

std::string arity_str(const OpInfo& info) {
  if (info.arity == kVariadic) return "2 or more";
  if (info.arity == kThreeOrFour) return "3 or 4";
  return std::to_string(info.arity);
}

std::optional<OpKind> find_op(std::string_view name) {
  for (const OpInfo& i : table())
    if (i.name == name && i.category != OpCategory::Leaf) return i.kind;
  return std::nullopt;
}

Attrs normalize_attrs(OpKind k, const std::vector<AttrValue>& positional,
                      const std::vector<std::pair<std::string, AttrValue>>& named) {
  auto schema = op_info(k).attrs;
  std::vector<std::optional<AttrValue>> vals(schema.size());
  if (positional.size() > schema.size()) {
    if (op_info(k).arity < 0)
      fail(op_str(k) + " takes " + std::to_string(schema.size()) + " attribute(s), got " +
           std::to_string(positional.size()) + " positional ones");
    fail(op_str(k) + " takes " + std::to_string(op_info(k).arity) + " operand(s) and " +
         std::to_string(schema.size()) + " attribute(s), got " +
         std::to_string(op_info(k).arity + positional.size()) + " arguments");
  }
  auto put = [&](size_t i, const AttrValue& v) {
    auto c = coerce(v, schema[i].type);
    if (!c)
      fail(op_str(k) + ": attribute '" + std::string(schema[i].name) + "' expects " +
           std::string(attr_type_name(schema[i].type)));
    vals[i] = std::move(*c);
  };
  for (size_t i = 0; i < positional.size(); ++i) put(i, positional[i]);
  for (const auto& [name, v] : named) {
    size_t i = 0;
    while (i < schema.size() && schema[i].name != name) ++i;
    if (i == schema.size()) {
      std::string known;
      for (const AttrSpec& s : schema) known += (known.empty() ? "" : ", ") + std::string(s.name);
      fail(op_str(k) + " has no attribute '" + name + "'" +
           (known.empty() ? " (it takes none)" : " (it takes: " + known + ")"));
    }
    if (vals[i]) fail(op_str(k) + ": attribute '" + name + "' is given twice");
    put(i, v);
  }
  Attrs out;
  for (size_t i = 0; i < schema.size(); ++i) {
    if (!vals[i]) {
      if (!schema[i].default_value)
        fail(op_str(k) + ": missing required attribute '" + std::string(schema[i].name) + "'");
      vals[i] = schema[i].default_value;
    }
    out.items.emplace_back(std::string(schema[i].name), std::move(*vals[i]));
  }
  return out;
}

void fill_operand_defaults(OpKind k, const std::vector<Operand>& in, Attrs& attrs) {
  if (k != OpKind::ScaledDotProductAttention || in.empty() || in[0].type.rank() < 1) return;
  const double scale = attention_scale(attrs, in[0].type.shape.back());
  for (auto& [name, value] : attrs.items)
    if (name == "scale") value = scale;
}

bool index_computed(OpKind k) {
  switch (op_info(k).category) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Compare:
    case OpCategory::Where:
    case OpCategory::Movement:
    case OpCategory::Generator:
    case OpCategory::Positional: return true;
    case OpCategory::AlongDim:
    case OpCategory::Leaf:
    case OpCategory::Reduce:
    case OpCategory::Matmul:
    case OpCategory::Gather:
    case OpCategory::Composite:
    case OpCategory::Collective: return false;
  }
  return false;
}

std::vector<int> reduced_dims(const Attrs& attrs, int rank) {
  std::vector<int> d;
  const auto& dims = attrs.get_ints("dims");
  if (dims.empty())
    for (int i = 0; i < rank; ++i) d.push_back(i);
  for (int64_t x : dims) d.push_back(*normalize_dim(x, rank));
  std::sort(d.begin(), d.end());
  return d;
}

SliceRange slice_range(int64_t size, int64_t start, int64_t end, int64_t step) {
  // Python's slice.indices for a positive step; no sum here can overflow (size <= 2^40).
  auto clamp = [size](int64_t i) { return i < 0 ? std::max<int64_t>(i + size, 0) : std::min(i, size); };
  SliceRange r;
  r.start = clamp(start);
  r.step = step;
  int64_t stop = clamp(end);
  r.length = stop > r.start ? (stop - r.start - 1) / step + 1 : 0;
  return r;
}

std::pair<int, SliceRange> slice_of(const Attrs& a, const Shape& shape) {
  int d = *normalize_dim(a.get_int("dim"), static_cast<int>(shape.size()));
  return {d, slice_range(shape[static_cast<size_t>(d)], a.get_int("start"), a.get_int("end"), a.get_int("step"))};
}

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

DType binary_result_dtype(const Operand& a, const Operand& b) {
  if (a.weak == b.weak) return promote(a.type.dtype, b.type.dtype);
  const Operand& strong = a.weak ? b : a;
  const Operand& weak = a.weak ? a : b;
  auto category = [](DType t) { return is_float(t) ? 2 : is_integer(t) ? 1 : 0; };
  // A literal only decides the dtype when it is of a higher category than the
  // tensor (an int tensor times 2.5 is f32), as PyTorch's default dtype rule does.
  if (category(weak.type.dtype) > category(strong.type.dtype)) return weak.type.dtype;
  return strong.type.dtype;
}

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

std::string attr_value_str(const AttrValue& v, const Mesh& mesh) {
  struct Visitor {
    const Mesh& mesh;
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(const V& l) const { return shape_str(l); }
    std::string operator()(double d) const {
      // Shortest text that reads back to the same double (to_chars without precision).
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, d);
      std::string s(buf, r.ptr);
      // Keep a float looking like a float so it reparses as one.
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(DType t) const { return std::string(dtype_name(t)); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const PlacementSpec& p) const { return p.str(mesh); }
  };
  return std::visit(Visitor{mesh}, v);
}

}  // namespace sf
