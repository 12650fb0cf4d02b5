// The op table: for every op in ops.def its name, arity, attributes with defaults,
// and its shape/dtype rule. Everything else (printer, parser, verifier, reference
// evaluator, decompositions, later sharding rules and emitters) looks ops up here.
#pragma once

#include "runtime/core/collective.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/core/mesh.h"
#include "runtime/core/tensor.h"

namespace sf {

enum class OpKind : uint8_t {
#define SF_OP(kind, name, arity, category) kind,
#include "codegen/ir/ops.def"
#undef SF_OP
};

enum class OpCategory : uint8_t {
  Leaf, Unary, Binary, Compare, Where, Reduce, Matmul, Movement, Gather, Composite, Collective,
  Generator,   // no tensor operands: each element from its own index (arange, full)
  Positional,  // elementwise, the element's coordinates decide (tril, triu, dropout)
  AlongDim,    // rows along one dim, read in order (cumsum, argmax, argmin)
};

// Attribute kinds; the order matches AttrValue's alternatives.
enum class AttrType : uint8_t { Int, IntList, Float, Bool, DType, Ident, Placements };
using AttrValue =
    std::variant<int64_t, std::vector<int64_t>, double, bool, DType, std::string, PlacementSpec>;

struct AttrSpec {
  std::string_view name;
  AttrType type;
  std::optional<AttrValue> default_value;  // nullopt: required
};

// An op's attributes, complete (every attribute of the schema, defaults filled in)
// and in schema order once normalize_attrs has run.
struct Attrs {
  std::vector<std::pair<std::string, AttrValue>> items;

  const AttrValue* find(std::string_view name) const;
  int64_t get_int(std::string_view name) const;
  const std::vector<int64_t>& get_ints(std::string_view name) const;
  double get_float(std::string_view name) const;
  bool get_bool(std::string_view name) const;
  DType get_dtype(std::string_view name) const;
  const std::string& get_ident(std::string_view name) const;
  const PlacementSpec& get_placements(std::string_view name) const;
  bool operator==(const Attrs&) const = default;
};

// OpInfo::arity of an op that takes two or more tensor operands (concat).
inline constexpr int kVariadic = -1;
// OpInfo::arity of an op that takes three tensor operands and an optional fourth
// (scaled_dot_product_attention's attn_mask).
inline constexpr int kThreeOrFour = -2;

struct OpInfo {
  OpKind kind;
  std::string_view name;
  int arity;  // tensor operands, or kVariadic, or kThreeOrFour
  OpCategory category;
  std::span<const AttrSpec> attrs;
};

// Whether `n` operands are what the op takes: exactly its arity, two or more, or
// three or four.
bool arity_ok(const OpInfo& info, size_t n);
// The most tensor operands the op takes (SIZE_MAX for a variadic op). An op whose
// operand count varies (arity < 0) takes every positional argument of a call as an
// operand, so its attributes are written by name.
size_t max_operands(const OpInfo& info);
// Its operand count for messages: "2", "2 or more" for a variadic op, "3 or 4".
std::string arity_str(const OpInfo& info);

const OpInfo& op_info(OpKind k);
std::string_view op_name(OpKind k);
std::optional<OpKind> find_op(std::string_view name);
std::span<const OpInfo> all_ops();
// The collective a per-rank collective op names (runtime/core/collective.h: the same
// kind the lowering's Start steps and the Plan use); nullopt for any other op,
// `redistribute` included (it plans its collectives).
std::optional<CollectiveKind> op_collective(OpKind k);

// What a shape rule or attribute check reports; the caller adds the location.
struct OpError {
  std::string message;
};

// Resolves positional and named attributes against the op's schema: unknown name,
// duplicate, wrong type or missing required attribute -> OpError. Ints are accepted
// where a float is expected. Returns the complete attribute list in schema order.
Attrs normalize_attrs(OpKind k, const std::vector<AttrValue>& positional,
                      const std::vector<std::pair<std::string, AttrValue>>& named);

// An operand's type, and whether it is a weak scalar (a number literal, which
// does not widen a tensor's dtype: `mul(x_f16, 2.0)` stays f16, as in PyTorch).
struct Operand {
  TensorType type;
  bool weak = false;
};

// Fills in the attributes whose default depends on the operands, once they are known:
// scaled_dot_product_attention's `scale` (not given: 1/sqrt(E), E = q's last dim, as
// torch's scale=None), so that a node always carries the value it uses. Attributes
// given explicitly are kept. Call after normalize_attrs, before infer_type.
void fill_operand_defaults(OpKind k, const std::vector<Operand>& in, Attrs& attrs);

// The result type of `k` applied to `in` with complete attrs, or OpError saying
// what was expected and what was found.
TensorType infer_type(OpKind k, const std::vector<Operand>& in, const Attrs& attrs,
                      const Mesh& mesh);

// Helpers shared by passes.
// Whether op k computes each element of its result from that element's index and the
// same element of its operands (broadcasting): elementwise ops, views, generators
// (arange, full), tril/triu and dropout. A value such ops make from literals and generators
// alone reads no memory: fusion recomputes it in the kernels that use it, and
// propagation places it as its users want it.
bool index_computed(OpKind k);
// (normalize_dim, for a possibly negative dim, is in runtime/core/tensor.h.)
// The dims a reduction (sum/max/min/mean) reduces, normalised and sorted: its
// `dims` attribute, or every dim when that is empty. `attrs` must be complete.
std::vector<int> reduced_dims(const Attrs& attrs, int rank);
// The elements `slice` takes along its dim of `size`, by Python's slicing rules:
// a negative start or end counts from the end, both clamp to [0, size], and the
// slice is empty when end <= start. `step` must be >= 1 (the shape rule says so).
// Element k of the slice is element start + k * step of the operand.
struct SliceRange {
  int64_t start = 0;
  int64_t length = 0;
  int64_t step = 1;
};
SliceRange slice_range(int64_t size, int64_t start, int64_t end, int64_t step);
// A valid slice node's dim (normalised) and range on an operand of `shape`.
std::pair<int, SliceRange> slice_of(const Attrs& attrs, const Shape& shape);
// NumPy broadcasting of two shapes; nullopt if incompatible.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);
// Result dtype of a binary op between two operands with weak-scalar rules.
DType binary_result_dtype(const Operand& a, const Operand& b);

std::string attr_value_str(const AttrValue& v, const Mesh& mesh);

}  // namespace sf
