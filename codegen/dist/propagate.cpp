#include "codegen/dist/propagate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "codegen/dist/strategy.h"

namespace sf {

namespace {

// The modelled time of moving a value from `from` to `to`, and the collectives it takes.
struct MoveCost {
  double seconds = 0;
  int collectives = 0;
};

MoveCost move_cost(const PlacementSpec& from, const PlacementSpec& to, const TensorType& t, const DeviceMesh& mesh,
                   const CommRates& rates) {
  if (normalize_spec(from, t.rank()) == normalize_spec(to, t.rank())) return {};
  const std::vector<RedistStep> steps = plan_redistribute(from, to, t, mesh);
  MoveCost m{redistribute_cost(steps, t, mesh, rates), 0};
  for (const RedistStep& s : steps) m.collectives += is_collective(s.kind) && mesh.size(s.mesh_dim) > 1;
  return m;
}

// What a cumsum's carry over mesh dim m costs (OpStrategy::carry): an all_gather of
// one total per member along the scanned dim.
MoveCost carry_cost(const TensorType& x, int dim, int m, const DeviceMesh& mesh, const CommRates& rates) {
  TensorType totals = x;
  totals.shape[static_cast<size_t>(dim)] = mesh.size(m);
  PlacementSpec from = replicated(mesh);
  from.per_dim[static_cast<size_t>(m)] = Placement::shard(dim);
  return move_cost(from, replicated(mesh), totals, mesh, rates);
}

// Whether a strategy costing `c` beats the best so far: strictly cheaper, or as
// cheap (within rounding) with fewer collectives. Latency per ring step prices an
// all_reduce like a reduce_scatter plus an all_gather; NCCL launches one kernel
// per collective, so at equal modelled time fewer collectives win.
bool better(const MoveCost& c, const MoveCost& best) {
  const double tol = 1e-9 * std::max(std::abs(c.seconds), std::abs(best.seconds));
  if (c.seconds < best.seconds - tol) return true;
  return c.seconds <= best.seconds + tol && c.collectives < best.collectives;
}

// Values made from their index alone (a generator, or elementwise ops, views and
// tril/triu of such values and literals: a causal mask) cost nothing to place any
// way, but the greedy walk places them before their users choose, as the first
// strategy (Replicate). So afterwards each is re-placed as its users want it, when
// they all want the same and a strategy of its own gives that: each rank builds only
// its chunk, with no slice after it, and fusion can still recompute it in the users'
// kernels. Walked backwards, so a choice travels up a chain to its generator.
void place_index_computed(const Graph& g, const DeviceMesh& mesh, ShardingPlan& plan) {
  const size_t n = g.nodes().size();
  std::vector<bool> movable(n, false), returned(n, false);
  std::vector<std::vector<std::pair<size_t, size_t>>> users(n);  // (user, operand index)
  for (const Output& o : g.outputs()) returned[static_cast<size_t>(o.value)] = true;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    for (size_t k = 0; k < node.inputs.size(); ++k) users[static_cast<size_t>(node.inputs[k])].push_back({i, k});
    movable[i] = index_computed(node.op) && !node.placement && !returned[i] &&
                 std::all_of(node.inputs.begin(), node.inputs.end(), [&](ValueId v) {
                   return g.node(v).op == OpKind::Constant || movable[static_cast<size_t>(v)];
                 });
  }
  for (size_t i = n; i-- > 0;) {
    if (!movable[i] || users[i].empty()) continue;
    const PlacementSpec& want = plan.nodes[users[i][0].first].inputs[users[i][0].second];
    bool agree = true;
    for (const auto& [u, k] : users[i]) agree = agree && plan.nodes[u].inputs[k] == want;
    NodeSharding& ns = plan.nodes[i];
    if (!agree || want == ns.output) continue;
    const Node& node = g.nodes()[i];
    std::vector<Operand> operands;
    for (ValueId v : node.inputs) operands.push_back({g.node(v).type, g.node(v).op == OpKind::Constant});
    for (const OpStrategy& s : op_strategies(node.op, operands, node.attrs, node.type, mesh)) {
      if (!(normalize_spec(s.output, node.type.rank()) == want)) continue;
      for (size_t k = 0; k < node.inputs.size(); ++k)
        ns.inputs[k] = normalize_spec(s.inputs[k], g.node(node.inputs[k]).type.rank());
      ns.output = ns.value = want;
      break;
    }
  }
}

}  // namespace

ShardingPlan propagate(const Graph& g, const DeviceMesh& mesh, const CommRates& rates) {
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
    MoveCost best{std::numeric_limits<double>::infinity(), 0};
    double second = best.seconds;
    const OpStrategy* chosen = nullptr;
    for (const OpStrategy& s : strategies) {
      MoveCost c;
      auto add = [&](const MoveCost& m) {
        c.seconds += m.seconds;
        c.collectives += m.collectives;
      };
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const TensorType& t = g.node(n.inputs[k]).type;
        add(move_cost(plan.nodes[static_cast<size_t>(n.inputs[k])].value, s.inputs[k], t, mesh, rates));
      }
      if (target[i] && n.op != OpKind::Redistribute) add(move_cost(s.output, *target[i], n.type, mesh, rates));
      for (int m : s.carry)
        add(carry_cost(n.type, *normalize_dim(n.attrs.get_int("dim"), n.type.rank()), m, mesh, rates));
      // Ties (in time and collectives) keep the strategy listed first.
      if (!chosen || better(c, best)) {
        if (chosen) second = std::min(second, best.seconds);
        best = c;
        chosen = &s;
      } else if (c.seconds < second) {
        second = c.seconds;
      }
    }
    ns.inputs.clear();
    for (size_t k = 0; k < n.inputs.size(); ++k)
      ns.inputs.push_back(normalize_spec(chosen->inputs[k], g.node(n.inputs[k]).type.rank()));
    ns.output = normalize_spec(chosen->output, n.type.rank());
    ns.carry = chosen->carry;
    ns.value = n.placement ? normalize_spec(*n.placement, n.type.rank()) : ns.output;
    ns.cost = best.seconds;
    ns.runner_up = std::isinf(second) ? -1 : second;
    ns.candidates = static_cast<int>(strategies.size());
  }
  place_index_computed(g, mesh, plan);
  for (const Output& o : g.outputs()) {
    const Node& n = g.node(o.value);
    plan.outputs.push_back(o.placement ? normalize_spec(*o.placement, n.type.rank())
                                       : plan.nodes[static_cast<size_t>(o.value)].value);
  }
  return plan;
}

}  // namespace sf
