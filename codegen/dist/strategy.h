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
//
// One kind needs a little communication after the local op, which the lowering adds:
// a cumsum over a dim sharded on mesh dims `carry` (S(dim) -> S(dim)). Each rank
// scans its chunk, then adds the totals of the chunks before it along those mesh
// dims (an all_gather of each rank's total, then a sum of the ones before it: see
// carry_scan in lower.cpp). Every other strategy has `carry` empty.
struct OpStrategy {
  std::vector<PlacementSpec> inputs;  // one per operand (constants / weak scalars: all R)
  PlacementSpec output;
  std::vector<int> carry = {};  // mesh dims a cumsum's chunk totals are carried over
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

// Where one rank's blocks lie in the global tensors of a node under a strategy: the
// result's and each operand's local shape and global offset per dim (local_shard:
// torch.chunk's chunks, uneven and empty ones included; a Replicate or Partial mesh
// dim does not cut, so its offset is 0).
struct RankShards {
  LocalShard out;
  std::vector<LocalShard> inputs;  // per operand
  // The operands' global shapes and placements under the strategy (rank_shards fills
  // them): mean's global count; scaled_dot_product_attention's global kv head count,
  // and whether the strategy cuts the heads, which every rank must decide alike (its
  // decomposition's ops must be the same on every rank, only their attributes differ).
  std::vector<Shape> input_shapes = {};
  std::vector<PlacementSpec> in_specs = {};
};
RankShards rank_shards(const Shape& out, const PlacementSpec& out_spec, const std::vector<Shape>& in,
                       const std::vector<PlacementSpec>& in_specs, const DeviceMesh& mesh, int rank);

// The node as it runs on one rank: `n` is the global node, `at` where the rank's
// blocks lie under the chosen strategy. This is the one per-rank hook of the
// lowering (and of the strategy test): the result type takes the local shape,
// attributes that name a shape (`shape` of reshape, expand, full) are rewritten to it,
// and ops whose values depend on the global position of an element are rewritten
// with the offsets: arange starts at its chunk's first value, tril/triu shift the
// diagonal by the row offset minus the column offset, dropout takes the rank's
// block's origin and the global shape (its mask is drawn by global index),
// scaled_dot_product_attention takes its query rows' global offset (query_offset, for
// the causal mask) and, where its heads are split, which kv head each local query head
// reads (head_offset and gqa_group, codegen/ir/attention.h). Every other attribute is
// shape-independent and stays. An op that needs the operands' offsets (a
// vocabulary-parallel embedding masking the rows a rank holds) reads at.inputs.
// Operand ids are unchanged (their local types are the operands' own local shards).
Node local_node(const Node& n, const RankShards& at);

}  // namespace sf
