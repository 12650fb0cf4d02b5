#include "codegen/ir/graph.h"

#include <unordered_set>

#include "codegen/ir/limits.h"

namespace sf {

int Graph::op_count() const {
  int n = 0;
  for (const Node& node : nodes_)
    if (op_info(node.op).category != OpCategory::Leaf) ++n;
  return n;
}

std::vector<int> Graph::use_counts() const {
  std::vector<int> uses(nodes_.size(), 0);
  for (const Node& n : nodes_)
    for (ValueId v : n.inputs) ++uses[static_cast<size_t>(v)];
  for (const Output& o : outputs_) ++uses[static_cast<size_t>(o.value)];
  return uses;
}

std::optional<std::string> check_placements(const PlacementSpec& spec, const Mesh& mesh, int rank) {
  if (spec.per_dim.size() != mesh.dims.size())
    return "placement has " + std::to_string(spec.per_dim.size()) + " entries for a mesh of " +
           std::to_string(mesh.dims.size()) + " dims";
  for (size_t i = 0; i < spec.per_dim.size(); ++i) {
    const Placement& p = spec.per_dim[i];
    if (p.is_shard() && !normalize_dim(p.dim, rank))
      return "placement " + mesh.dims[i].name + ": " + p.str() + " is out of range for a rank-" +
             std::to_string(rank) + " value (expected S(" + std::to_string(-rank) + ")..S(" +
             std::to_string(rank - 1) + "))";
  }
  return std::nullopt;
}

Result<void> verify(const Graph& g) {
  auto err = [](SourceLoc loc, std::string m) { return Diag{"", loc, std::move(m)}; };
  // Sizes first: every count below (and in every later stage) is then known to fit.
  if (auto why = check_mesh_limits(g.mesh())) return err({}, *why);
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!n.name.empty() && !names.insert(n.name).second)
      return err(n.loc, "'" + n.name + "' is already defined");
    for (ValueId v : n.inputs)
      if (v < 0 || static_cast<size_t>(v) >= i)
        return err(n.loc, std::string(op_name(n.op)) + ": operand %" + std::to_string(v) +
                              " is not defined before its use");
    if (auto why = check_type_limits(n.type))
      return err(n.loc, (n.op == OpKind::Param ? "parameter '" + n.name + "': "
                                               : std::string(op_name(n.op)) + ": result ") + *why);
    if (n.placement)
      if (auto e = check_placements(*n.placement, g.mesh(), n.type.rank())) return err(n.loc, *e);
    switch (op_info(n.op).category) {
      case OpCategory::Leaf:
        if (!n.inputs.empty()) return err(n.loc, "a leaf node has operands");
        for (int64_t d : n.type.shape)
          if (d < 0) return err(n.loc, "negative dimension in " + n.type.str());
        break;
      default: {
        std::vector<Operand> in;
        for (ValueId v : n.inputs) in.push_back({g.node(v).type, g.node(v).op == OpKind::Constant});
        try {
          Attrs complete = normalize_attrs(n.op, {}, n.attrs.items);
          if (!(complete == n.attrs))
            return err(n.loc, std::string(op_name(n.op)) + ": attributes are not in normal form");
          TensorType t = infer_type(n.op, in, n.attrs, g.mesh());
          if (!(t == n.type))
            return err(n.loc, std::string(op_name(n.op)) + ": recorded type " + n.type.str() +
                                  " differs from the inferred " + t.str());
        } catch (const OpError& e) {
          return err(n.loc, e.message);
        }
      }
    }
  }
  if (g.outputs().empty()) return err({}, "graph '" + g.name() + "' returns nothing");
  for (const Output& o : g.outputs()) {
    if (o.value < 0 || static_cast<size_t>(o.value) >= g.nodes().size())
      return err(o.loc, "returned value is not defined");
    if (o.placement)
      if (auto e = check_placements(*o.placement, g.mesh(), g.node(o.value).type.rank()))
        return err(o.loc, *e);
  }
  return {};
}

}  // namespace sf
