#include "codegen/dist/propagate.h"

#include <cmath>
#include <limits>

#include "codegen/dist/strategy.h"

namespace sf {

namespace {

double move_cost(const PlacementSpec& from, const PlacementSpec& to, const TensorType& t, const DeviceMesh& mesh,
                 const CostModel& model) {
  if (normalize_spec(from, t.rank()) == normalize_spec(to, t.rank())) return 0;
  return redistribute_cost(plan_redistribute(from, to, t, mesh), t, mesh, model);
}

}  // namespace

ShardingPlan propagate(const Graph& g, const DeviceMesh& mesh, const CostModel& model) {
  ShardingPlan plan;
  plan.nodes.resize(g.nodes().size());
  // Where a value must end up regardless of the strategy: its own constraint, or
  // the placement of the first output that returns it.
  std::vector<std::optional<PlacementSpec>> target(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) target[i] = g.nodes()[i].placement;
  for (const Output& o : g.outputs())
    if (o.placement && !target[static_cast<size_t>(o.value)]) target[static_cast<size_t>(o.value)] = o.placement;

  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    NodeSharding& ns = plan.nodes[i];
    if (n.op == OpKind::Param || n.op == OpKind::Constant) {
      ns.output = normalize_spec(n.op == OpKind::Param && n.placement ? *n.placement : replicated(mesh), n.type.rank());
      ns.value = ns.output;
      ns.candidates = 1;
      continue;
    }
    std::vector<Operand> operands;
    for (ValueId v : n.inputs) operands.push_back({g.node(v).type, g.node(v).op == OpKind::Constant});
    std::vector<OpStrategy> strategies = op_strategies(n.op, operands, n.attrs, n.type, mesh);
    double best = std::numeric_limits<double>::infinity(), second = best;
    const OpStrategy* chosen = nullptr;
    for (const OpStrategy& s : strategies) {
      double c = 0;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const TensorType& t = g.node(n.inputs[k]).type;
        c += move_cost(plan.nodes[static_cast<size_t>(n.inputs[k])].value, s.inputs[k], t, mesh, model);
      }
      if (target[i] && n.op != OpKind::Redistribute) c += move_cost(s.output, *target[i], n.type, mesh, model);
      // Strictly cheaper wins, so ties keep the strategy listed first.
      if (c < best) {
        second = best;
        best = c;
        chosen = &s;
      } else if (c < second) {
        second = c;
      }
    }
    ns.inputs.clear();
    for (size_t k = 0; k < n.inputs.size(); ++k)
      ns.inputs.push_back(normalize_spec(chosen->inputs[k], g.node(n.inputs[k]).type.rank()));
    ns.output = normalize_spec(chosen->output, n.type.rank());
    ns.value = n.placement ? normalize_spec(*n.placement, n.type.rank()) : ns.output;
    ns.cost = best;
    ns.runner_up = std::isinf(second) ? -1 : second;
    ns.candidates = static_cast<int>(strategies.size());
  }
  for (const Output& o : g.outputs()) {
    const Node& n = g.node(o.value);
    plan.outputs.push_back(o.placement ? normalize_spec(*o.placement, n.type.rank())
                                       : plan.nodes[static_cast<size_t>(o.value)].value);
  }
  return plan;
}

}  // namespace sf
