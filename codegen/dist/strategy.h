// Per-op sharding strategies: what DTensor's ShardingPropagator registers for each
// aten op (register_op_strategy), here for every op of ops.def in one switch.
// docs/sharding-strategies.md has the rules as a table and the reasons behind them.
#pragma once

#include <vector>

#include "runtime/core/device_mesh.h"
#include "codegen/ir/graph.h"
#include "runtime/core/mesh.h"
#include "codegen/ir/ops.h"
#include "runtime/core/tensor.h"

namespace sf {

// One way to run an op on a sharded mesh without communication: the placement each
// operand must have and the placement the result then has. Shard dims are
// normalised to 0..rank-1.
struct OpStrategy {
  std::vector<PlacementSpec> inputs;  // one per operand (constants / weak scalars: all R)
  PlacementSpec output;
  bool operator==(const OpStrategy&) const = default;
};

// Every valid strategy for op `k` on operands `in` (global types; weak = a number
// literal), complete `attrs`, result type `out`, on `mesh`.
//
// The op's rules are written for one mesh dim (input placements -> output placement)
// and expanded to the whole mesh as their cartesian product over mesh dims, mesh dim 0
// varying slowest (DTensor's expand_to_full_mesh_op_strategy); then strategies that
// fail a check needing the whole spec are dropped: reshape's evenness (a dim kept
// sharded through a merge or split must divide by the product of the mesh sizes
// sharding it) and max/min's non-empty shards (a rank reducing an empty chunk has no
// identity to return).
//
// The result has no duplicates, its order is deterministic, and it contains the
// all-Replicate strategy, except for `redistribute`, whose one strategy is its
// attribute (the propagator treats it as a constraint). Per-rank collectives
// (all_gather, reduce_scatter, all_reduce, all_to_all) have only all-Replicate.
std::vector<OpStrategy> op_strategies(OpKind k, const std::vector<Operand>& in, const Attrs& attrs,
                                      const TensorType& out, const DeviceMesh& mesh);

// The node as it runs on one rank: `n` is the global node, `local_out` the rank's
// result shape under the chosen strategy. The result type takes the local shape, and
// attributes that name a shape (reshape's and expand's `shape`) are rewritten to it;
// every other attribute is shape-independent and stays. Operand ids are unchanged
// (their local types are the operands' own local shards).
Node local_node(const Node& n, const Shape& local_out);

}  // namespace sf
