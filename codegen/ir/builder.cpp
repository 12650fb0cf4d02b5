#include "codegen/ir/builder.h"

#include "codegen/ir/limits.h"


namespace sf {

namespace {
[[noreturn]] void throw_at(SourceLoc loc, std::string msg) {
  throw DiagError{Diag{"", loc, std::move(msg)}};
}
}  // namespace

const TensorType& Value::type() const { return builder->node(*this).type; }

GraphBuilder::GraphBuilder(std::string name, Mesh mesh) {
  g_.name_ = std::move(name);
  g_.mesh_ = std::move(mesh);
}

Value GraphBuilder::push(Node n) {
  g_.nodes_.push_back(std::move(n));
  return Value{this, static_cast<ValueId>(g_.nodes_.size() - 1)};
}

std::optional<Value> GraphBuilder::lookup(const std::string& name) const {
  auto it = names_.find(name);
  if (it == names_.end()) return std::nullopt;
  return Value{const_cast<GraphBuilder*>(this), it->second};
}

Value GraphBuilder::param(const std::string& name, DType dtype, Shape shape,
                          std::optional<PlacementSpec> placement, SourceLoc loc) {
  if (lookup(name)) throw_at(loc, "'" + name + "' is already defined");
  for (int64_t d : shape)
    if (d < 0) throw_at(loc, "parameter '" + name + "': dimension " + std::to_string(d) + " is negative");
  Node n;
  n.op = OpKind::Param;
  n.type = {dtype, std::move(shape)};
  if (auto why = check_type_limits(n.type)) throw_at(loc, "parameter '" + name + "': " + *why);
  n.name = name;
  n.loc = loc;
  if (placement) {
    if (auto err = check_placements(*placement, g_.mesh_, n.type.rank()))
      throw_at(loc, "parameter '" + name + "': " + *err);
    n.placement = std::move(placement);
  }
  Value v = push(std::move(n));
  g_.params_.push_back(v.id);
  names_[name] = v.id;
  return v;
}

Value GraphBuilder::constant(double v, DType dtype, SourceLoc loc) {
  Node n;
  n.op = OpKind::Constant;
  n.attrs = normalize_attrs(OpKind::Constant, {AttrValue(v), AttrValue(dtype)}, {});
  n.type = {dtype, {}};
  n.loc = loc;
  return push(std::move(n));
}

Value GraphBuilder::op(OpKind k, const std::vector<Value>& inputs,
                       const std::vector<AttrValue>& positional,
                       const std::vector<std::pair<std::string, AttrValue>>& named, SourceLoc loc) {
  Node n;
  n.op = k;
  n.loc = loc;
  std::vector<Operand> operands;
  for (const Value& v : inputs) {
    if (v.builder != this) throw_at(loc, std::string(op_name(k)) + ": operand from another graph");
    n.inputs.push_back(v.id);
    operands.push_back({node(v).type, node(v).op == OpKind::Constant});
  }
  try {
    n.attrs = normalize_attrs(k, positional, named);
    fill_operand_defaults(k, operands, n.attrs);
    n.type = infer_type(k, operands, n.attrs, g_.mesh_);
  } catch (const OpError& e) {
    throw_at(loc, e.message);
  }
  // Every result, not only the params: expand, matmul, reshape and all_gather make
  // values larger than their operands (docs/graph-format.md#limits).
  if (auto why = check_type_limits(n.type)) throw_at(loc, std::string(op_name(k)) + ": result " + *why);
  // A graph is global (every value has its global shape and a placement), and the
  // per-rank collectives' shape rules are per rank (all_gather multiplies a dim by
  // the mesh size): in a global graph they have no consistent meaning, and no
  // stage after the verifier can run them. Refused here, after the shape rule's own
  // errors, so that `check` and every command say so at the op (docs/graph-format.md).
  if (op_collective(k))
    throw_at(loc, std::string(op_name(k)) +
                      ": explicit per-rank collectives are not supported (a shardfuse graph is global: values have "
                      "their global shapes); use a placement or redistribute(x, {" +
                      n.attrs.get_ident("mesh_dim") + ": R}) and shardfuse inserts the collectives");
  return push(std::move(n));
}

void GraphBuilder::name(Value v, const std::string& name, SourceLoc loc) {
  if (lookup(name)) throw_at(loc, "'" + name + "' is already defined");
  Node& n = g_.nodes_[static_cast<size_t>(v.id)];
  if (!n.name.empty() || n.op == OpKind::Constant) {
    // `y = x` or `y = 2.0`: an alias. Give it its own node so every name has one.
    Value copy = op(OpKind::Cast, {v}, {AttrValue(n.type.dtype)}, {}, loc);
    g_.nodes_[static_cast<size_t>(copy.id)].name = name;
    names_[name] = copy.id;
    return;
  }
  n.name = name;
  names_[name] = v.id;
}

void GraphBuilder::constrain(Value v, const PlacementSpec& spec, SourceLoc loc) {
  Node& n = g_.nodes_[static_cast<size_t>(v.id)];
  if (auto err = check_placements(spec, g_.mesh_, n.type.rank())) throw_at(loc, *err);
  n.placement = spec;
}

void GraphBuilder::ret(Value v, std::optional<PlacementSpec> placement, SourceLoc loc) {
  const Node& n = node(v);
  if (placement) {
    if (auto err = check_placements(*placement, g_.mesh_, n.type.rank())) throw_at(loc, *err);
  }
  Output o;
  o.value = v.id;
  o.name = n.name.empty() ? "out" + std::to_string(g_.outputs_.size()) : n.name;
  for (const Output& prev : g_.outputs_)
    if (prev.name == o.name) o.name += "_" + std::to_string(g_.outputs_.size());
  o.placement = std::move(placement);
  o.loc = loc;
  g_.outputs_.push_back(std::move(o));
}

PlacementSpec GraphBuilder::spec(const std::vector<std::pair<std::string, Placement>>& dims) const {
  PlacementSpec s;
  s.per_dim.assign(g_.mesh_.dims.size(), Placement::replicate());
  for (const auto& [name, p] : dims) {
    auto i = g_.mesh_.find(name);
    if (!i) throw_at({}, "unknown mesh dimension '" + name + "'");
    s.per_dim[static_cast<size_t>(*i)] = p;
  }
  return s;
}

Result<Graph> GraphBuilder::finish() {
  Graph g = std::move(g_);
  g_ = Graph{};
  names_.clear();
  SF_TRY(verify(g));
  return g;
}

Result<Graph> remesh(const Graph& g, const Mesh& mesh) { return rebuild(g, mesh, {}); }

Result<Graph> rebuild(const Graph& g, const Mesh& mesh, const std::function<void(Node&)>& edit) {
  try {
    GraphBuilder b(g.name(), mesh);
    std::vector<Value> v;
    for (const Node& original : g.nodes()) {
      Node n = original;
      if (edit) edit(n);
      switch (op_info(n.op).category) {
        case OpCategory::Leaf:
          v.push_back(n.op == OpKind::Param ? b.param(n.name, n.type.dtype, n.type.shape, n.placement, n.loc)
                                            : b.constant(n.attrs.get_float("value"), n.attrs.get_dtype("dtype"), n.loc));
          continue;
        default: {
          std::vector<Value> in;
          for (ValueId i : n.inputs) in.push_back(v[static_cast<size_t>(i)]);
          Value out = b.op(n.op, in, {}, n.attrs.items, n.loc);
          if (!n.name.empty()) b.name(out, n.name, n.loc);
          if (n.placement) b.constrain(out, *n.placement, n.loc);
          v.push_back(out);
        }
      }
    }
    for (const Output& o : g.outputs()) b.ret(v[static_cast<size_t>(o.value)], o.placement, o.loc);
    return b.finish();
  } catch (const DiagError& e) {
    return e.diag;
  } catch (const OpError& e) {
    return Diag{"", {}, e.message};
  }
}

Value unary(OpKind k, Value x) { return x.builder->op(k, {x}); }
Value binary(OpKind k, Value a, Value b) { return a.builder->op(k, {a, b}); }
Value binary(OpKind k, Value a, double b) { return a.builder->op(k, {a, a.builder->constant(b, DType::F32)}); }
Value binary(OpKind k, double a, Value b) { return b.builder->op(k, {b.builder->constant(a, DType::F32), b}); }
Value binary(OpKind k, Value a, int b) { return a.builder->op(k, {a, a.builder->constant(b, DType::I64)}); }
Value binary(OpKind k, int a, Value b) { return b.builder->op(k, {b.builder->constant(a, DType::I64), b}); }

Value cast(Value x, DType t) { return x.builder->op(OpKind::Cast, {x}, {AttrValue(t)}); }
Value matmul(Value a, Value b) { return a.builder->op(OpKind::Matmul, {a, b}); }
Value transpose(Value x, int64_t d0, int64_t d1) {
  return x.builder->op(OpKind::Transpose, {x}, {AttrValue(d0), AttrValue(d1)});
}
Value permute(Value x, std::vector<int64_t> dims) {
  return x.builder->op(OpKind::Permute, {x}, {AttrValue(std::move(dims))});
}
Value reshape(Value x, std::vector<int64_t> shape) {
  return x.builder->op(OpKind::Reshape, {x}, {AttrValue(std::move(shape))});
}
Value expand(Value x, std::vector<int64_t> shape) {
  return x.builder->op(OpKind::Expand, {x}, {AttrValue(std::move(shape))});
}
static Value reduce(OpKind k, Value x, std::vector<int64_t> dims, bool keepdim) {
  return x.builder->op(k, {x}, {AttrValue(std::move(dims)), AttrValue(keepdim)});
}
Value slice(Value x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return x.builder->op(OpKind::Slice, {x}, {AttrValue(dim), AttrValue(start), AttrValue(end), AttrValue(step)});
}
Value concat(const std::vector<Value>& xs, int64_t dim) {
  if (xs.empty()) throw_at({}, "concat expects 2 or more operand(s), got 0");
  return xs[0].builder->op(OpKind::Concat, xs, {}, {{"dim", AttrValue(dim)}});
}
Value sum(Value x, std::vector<int64_t> dims, bool keepdim) { return reduce(OpKind::Sum, x, std::move(dims), keepdim); }
Value max(Value x, std::vector<int64_t> dims, bool keepdim) { return reduce(OpKind::Max, x, std::move(dims), keepdim); }
Value mean(Value x, std::vector<int64_t> dims, bool keepdim) { return reduce(OpKind::Mean, x, std::move(dims), keepdim); }
Value softmax(Value x, int64_t dim) { return x.builder->op(OpKind::Softmax, {x}, {AttrValue(dim)}); }
Value layer_norm(Value x, Value w, Value b, double eps) {
  return x.builder->op(OpKind::LayerNorm, {x, w, b}, {AttrValue(eps)});
}
Value rms_norm(Value x, Value w, double eps) { return x.builder->op(OpKind::RmsNorm, {x, w}, {AttrValue(eps)}); }
Value where(Value c, Value a, Value b) { return c.builder->op(OpKind::Where, {c, a, b}); }
Value embedding(Value indices, Value weight) { return indices.builder->op(OpKind::Embedding, {indices, weight}); }
Value gather(Value x, Value index, int64_t dim) { return x.builder->op(OpKind::Gather, {x, index}, {AttrValue(dim)}); }
Value index_select(Value x, Value index, int64_t dim) {
  return x.builder->op(OpKind::IndexSelect, {x, index}, {AttrValue(dim)});
}
Value scatter_add(Value x, Value index, Value src, int64_t dim) {
  return x.builder->op(OpKind::ScatterAdd, {x, index, src}, {AttrValue(dim)});
}
Value cross_entropy(Value logits, Value target, const std::string& reduction, int64_t ignore_index) {
  return logits.builder->op(OpKind::CrossEntropy, {logits, target}, {AttrValue(reduction), AttrValue(ignore_index)});
}
Value log_softmax(Value x, int64_t dim) { return x.builder->op(OpKind::LogSoftmax, {x}, {AttrValue(dim)}); }
Value scaled_dot_product_attention(Value q, Value k, Value v, std::optional<Value> mask, bool is_causal,
                                   std::optional<double> scale, bool enable_gqa) {
  std::vector<Value> in{q, k, v};
  if (mask) in.push_back(*mask);
  std::vector<std::pair<std::string, AttrValue>> named{{"is_causal", is_causal}, {"enable_gqa", enable_gqa}};
  if (scale) named.emplace_back("scale", *scale);
  return q.builder->op(OpKind::ScaledDotProductAttention, in, {}, named);
}
Value tril(Value x, int64_t diagonal) { return x.builder->op(OpKind::Tril, {x}, {AttrValue(diagonal)}); }
Value triu(Value x, int64_t diagonal) { return x.builder->op(OpKind::Triu, {x}, {AttrValue(diagonal)}); }
Value cumsum(Value x, int64_t dim) { return x.builder->op(OpKind::Cumsum, {x}, {AttrValue(dim)}); }
Value argmax(Value x, int64_t dim, bool keepdim) { return x.builder->op(OpKind::Argmax, {x}, {AttrValue(dim), AttrValue(keepdim)}); }
Value argmin(Value x, int64_t dim, bool keepdim) { return x.builder->op(OpKind::Argmin, {x}, {AttrValue(dim), AttrValue(keepdim)}); }
Value dropout(Value x, double p, int64_t seed) {
  return x.builder->op(OpKind::Dropout, {x}, {AttrValue(seed), AttrValue(p)});
}
Value arange(GraphBuilder& b, int64_t end, int64_t start, int64_t step, DType dtype) {
  return b.op(OpKind::Arange, {}, {AttrValue(end), AttrValue(start), AttrValue(step), AttrValue(dtype)});
}
Value full(GraphBuilder& b, std::vector<int64_t> shape, double value, DType dtype) {
  return b.op(OpKind::Full, {}, {AttrValue(std::move(shape)), AttrValue(value), AttrValue(dtype)});
}

}  // namespace sf
