// Building graphs from C++: every op is checked as it is added (the shape rule runs
// at once), and finish() runs the verifier, so a Graph that exists is well formed.
//
//   sf::GraphBuilder b("mlp", sf::Mesh{{{"tp", 4}}});
//   auto x = b.param("x", sf::DType::F32, {20, 10});
//   auto w = b.param("w", sf::DType::F32, {16, 10}, b.spec({{"tp", sf::Placement::shard(0)}}));
//   auto h = sf::relu(sf::matmul(x, sf::transpose(w, 0, 1)) + 1.0);
//   b.ret(h);
//   sf::Result<sf::Graph> g = b.finish();
#pragma once

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "codegen/ir/graph.h"

namespace sf {

class GraphBuilder;

// A handle to a value under construction.
struct Value {
  GraphBuilder* builder = nullptr;
  ValueId id = -1;
  const TensorType& type() const;
};

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name, Mesh mesh = {});

  // Adds a parameter. Throws DiagError on a duplicate name, a negative dimension or
  // an invalid placement.
  Value param(const std::string& name, DType dtype, Shape shape,
              std::optional<PlacementSpec> placement = std::nullopt, SourceLoc loc = {});
  // A number literal: a weak scalar (f32 for a float, i64 for an integer literal).
  Value constant(double v, DType dtype = DType::F32, SourceLoc loc = {});
  // Adds an op. Attributes are positional (schema order) and/or named; the op's
  // shape rule runs now and throws DiagError (at `loc`) if it rejects the operands.
  Value op(OpKind k, const std::vector<Value>& inputs, const std::vector<AttrValue>& positional = {},
           const std::vector<std::pair<std::string, AttrValue>>& named = {}, SourceLoc loc = {});
  // Gives a value a name (a statement `name = ...`); throws on a redefinition.
  void name(Value v, const std::string& name, SourceLoc loc = {});
  // A sharding constraint on a value (`... {tp: S(1)}` after a statement).
  void constrain(Value v, const PlacementSpec& spec, SourceLoc loc = {});
  void ret(Value v, std::optional<PlacementSpec> placement = std::nullopt, SourceLoc loc = {});

  // A spec from (mesh dim name, placement) pairs; unnamed dims are R. Throws on an
  // unknown mesh dim.
  PlacementSpec spec(const std::vector<std::pair<std::string, Placement>>& dims) const;

  const Mesh& mesh() const { return g_.mesh_; }
  const Node& node(Value v) const { return g_.nodes_[static_cast<size_t>(v.id)]; }
  std::optional<Value> lookup(const std::string& name) const;

  // Verifies and returns the graph; the builder is left empty.
  Result<Graph> finish();

 private:
  Value push(Node n);
  Graph g_;
  std::unordered_map<std::string, ValueId> names_;
};

// The same graph on another mesh: every node re-added (so shapes of per-rank
// collectives are inferred again), names, placements and outputs kept. A Diag if
// the graph is not valid on `mesh` (an unknown mesh dim, a placement that no
// longer fits).
Result<Graph> remesh(const Graph& g, const Mesh& mesh);

// The same, each node first passed through `edit` (its copy: a param's type, a
// constant's or op's attributes may change; inputs may not), so that types are
// inferred again from what it changed.
Result<Graph> rebuild(const Graph& g, const Mesh& mesh, const std::function<void(Node&)>& edit);

// Ops as C++ functions. Each adds to the builder its first Value operand belongs to.
Value unary(OpKind k, Value x);
Value binary(OpKind k, Value a, Value b);
// A C++ double is a float literal (f32), an int an integer literal (i64); both weak.
Value binary(OpKind k, Value a, double b);
Value binary(OpKind k, double a, Value b);
Value binary(OpKind k, Value a, int b);
Value binary(OpKind k, int a, Value b);

inline Value operator+(Value a, Value b) { return binary(OpKind::Add, a, b); }
inline Value operator-(Value a, Value b) { return binary(OpKind::Sub, a, b); }
inline Value operator*(Value a, Value b) { return binary(OpKind::Mul, a, b); }
inline Value operator/(Value a, Value b) { return binary(OpKind::Div, a, b); }
inline Value operator+(Value a, double b) { return binary(OpKind::Add, a, b); }
inline Value operator-(Value a, double b) { return binary(OpKind::Sub, a, b); }
inline Value operator*(Value a, double b) { return binary(OpKind::Mul, a, b); }
inline Value operator/(Value a, double b) { return binary(OpKind::Div, a, b); }
inline Value operator+(double a, Value b) { return binary(OpKind::Add, a, b); }
inline Value operator-(double a, Value b) { return binary(OpKind::Sub, a, b); }
inline Value operator*(double a, Value b) { return binary(OpKind::Mul, a, b); }
inline Value operator/(double a, Value b) { return binary(OpKind::Div, a, b); }
inline Value operator+(Value a, int b) { return binary(OpKind::Add, a, b); }
inline Value operator+(int a, Value b) { return binary(OpKind::Add, a, b); }
inline Value operator-(Value a, int b) { return binary(OpKind::Sub, a, b); }
inline Value operator-(int a, Value b) { return binary(OpKind::Sub, a, b); }
inline Value operator*(Value a, int b) { return binary(OpKind::Mul, a, b); }
inline Value operator*(int a, Value b) { return binary(OpKind::Mul, a, b); }
inline Value operator/(Value a, int b) { return binary(OpKind::Div, a, b); }
inline Value operator/(int a, Value b) { return binary(OpKind::Div, a, b); }
inline Value operator-(Value a) { return unary(OpKind::Neg, a); }

inline Value relu(Value x) { return unary(OpKind::Relu, x); }
inline Value exp(Value x) { return unary(OpKind::Exp, x); }
inline Value tanh(Value x) { return unary(OpKind::Tanh, x); }
inline Value sigmoid(Value x) { return unary(OpKind::Sigmoid, x); }
inline Value gelu(Value x) { return unary(OpKind::Gelu, x); }
inline Value silu(Value x) { return unary(OpKind::Silu, x); }
Value cast(Value x, DType t);
Value matmul(Value a, Value b);
Value transpose(Value x, int64_t d0, int64_t d1);
Value permute(Value x, std::vector<int64_t> dims);
Value reshape(Value x, std::vector<int64_t> shape);
Value expand(Value x, std::vector<int64_t> shape);
// x[..., start:end:step, ...] along `dim`, Python's slicing (negative start and end
// count from the end, out-of-range values clamp; step >= 1).
Value slice(Value x, int64_t dim, int64_t start, int64_t end = std::numeric_limits<int64_t>::max(), int64_t step = 1);
// torch.cat of two or more values along `dim` (one dtype; throws DiagError for fewer).
Value concat(const std::vector<Value>& xs, int64_t dim = 0);
Value sum(Value x, std::vector<int64_t> dims = {}, bool keepdim = false);
Value max(Value x, std::vector<int64_t> dims = {}, bool keepdim = false);
Value mean(Value x, std::vector<int64_t> dims = {}, bool keepdim = false);
Value softmax(Value x, int64_t dim = -1);
Value layer_norm(Value x, Value w, Value b, double eps = 1e-5);
Value rms_norm(Value x, Value w, double eps = 1e-6);
Value where(Value c, Value a, Value b);
Value embedding(Value indices, Value weight);
// torch.gather(x, dim, index), torch.index_select(x, dim, index) and
// torch.scatter_add(x, dim, index, src); an index outside the dim reads (or adds) 0.
Value gather(Value x, Value index, int64_t dim);
Value index_select(Value x, Value index, int64_t dim);
Value scatter_add(Value x, Value index, Value src, int64_t dim);
Value log_softmax(Value x, int64_t dim = -1);
// torch.cumsum(x, dim) (integer and bool operands sum into i64), and
// torch.argmax/argmin(x, dim, keepdim): the first index of the extreme (NaN counts as
// the extreme), i64.
Value cumsum(Value x, int64_t dim);
Value argmax(Value x, int64_t dim, bool keepdim = false);
Value argmin(Value x, int64_t dim, bool keepdim = false);
// F.cross_entropy(logits, target, reduction=..., ignore_index=...) with class indices:
// logits [N, C, d1, ...] or [C], target [N, d1, ...] or 0-d; reduction mean, sum or none.
Value cross_entropy(Value logits, Value target, const std::string& reduction = "mean", int64_t ignore_index = -100);
// F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, enable_gqa):
// q [..., Hq, L, E], k [..., Hkv, S, E], v [..., Hkv, S, Ev]; an additive (q's dtype)
// or bool (true: takes part) mask broadcastable to [..., Hq, L, S]; scale 1/sqrt(E)
// when not given.
Value scaled_dot_product_attention(Value q, Value k, Value v, std::optional<Value> mask = std::nullopt,
                                   bool is_causal = false, std::optional<double> scale = std::nullopt,
                                   bool enable_gqa = false);
// torch.tril / torch.triu over the last two dims: x[..., i, j] where j - i <= diagonal
// (tril) or j - i >= diagonal (triu), 0 elsewhere.
Value tril(Value x, int64_t diagonal = 0);
Value triu(Value x, int64_t diagonal = 0);
// F.dropout(x, p, training=True) with a counter-based mask (codegen/ir/dropout.h):
// each element kept with probability 1 - p and scaled by 1 / (1 - p), else 0.
Value dropout(Value x, double p, int64_t seed);
// Ops without tensor operands, added to `b`: torch.arange(start, end, step) (integer
// bounds) and torch.full(shape, value).
Value arange(GraphBuilder& b, int64_t end, int64_t start = 0, int64_t step = 1, DType dtype = DType::I64);
Value full(GraphBuilder& b, std::vector<int64_t> shape, double value, DType dtype = DType::F32);

}  // namespace sf
