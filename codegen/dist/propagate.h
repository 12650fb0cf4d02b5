// Sharding propagation (DTensor's ShardingPropagator): walks the global graph in
// order and picks, for every op, the strategy whose input redistributions cost
// least under the α-β model, honouring every placement the graph states.
#pragma once

#include <vector>

#include "codegen/dist/redistribute.h"
#include "codegen/ir/graph.h"

namespace sf {

struct NodeSharding {
  std::vector<PlacementSpec> inputs;  // what the chosen strategy needs of each operand
  PlacementSpec output;               // what the op produces
  PlacementSpec value;                // the value's spec after its constraint, if any
  std::vector<int> carry;             // a cumsum's carry mesh dims (OpStrategy::carry)
  double cost = 0;                    // redistribution cost of the choice (seconds, model)
  double runner_up = -1;              // cost of the best other strategy; -1 if none
  int candidates = 0;                 // strategies considered
};

struct ShardingPlan {
  std::vector<NodeSharding> nodes;          // per node (params and constants too)
  std::vector<PlacementSpec> outputs;       // per graph output: its final spec
};

// Chooses greedily in topological order, as DTensor's _select_strategy does, but
// also counts the cost of reaching a constraint the value must meet (a placement
// on its statement or on the return), so a choice is not cheap now and dear later.
// Params are placed as declared (Replicate when not), literals are Replicate.
// Afterwards, values made from generators and literals alone (a causal mask), which
// cost nothing to place any way, are re-placed as all their users want them when the
// users agree (docs/sharding-strategies.md, "Placing generated values").
ShardingPlan propagate(const Graph& g, const DeviceMesh& mesh, const CommRates& rates = default_comm_rates());

}  // namespace sf
