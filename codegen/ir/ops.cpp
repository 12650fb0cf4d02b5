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
