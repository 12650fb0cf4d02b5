// Planning a redistribution from one placement spec to another on an N-D mesh
// (DTensor's redistribute): a list of per-mesh-dim steps, each a collective or a
// local operation, that turns a value placed as `from` into the same value placed
// as `to`. Uneven (torch.chunk) shards are handled by variable counts.
#pragma once

#include <string>
#include <vector>

#include "autotune/perf_model.h"
#include "runtime/core/device_mesh.h"
#include "runtime/core/collective.h"

namespace sf {

enum class RedistKind : uint8_t {
  AllGather,      // Shard(dim) -> Replicate along mesh_dim
  AllReduce,      // Partial(op) -> Replicate
  ReduceScatter,  // Partial(op) -> Shard(dim)
  AllToAll,       // Shard(dim2) -> Shard(dim): split along dim, concatenate along dim2
  Slice,          // Replicate -> Shard(dim): keep this rank's chunk, no communication
  Partialize,     // Replicate -> Partial(op): sum keeps the value on coordinate 0, zeros elsewhere
};
std::string_view redist_kind_name(RedistKind k);  // all_gather, all_reduce, ...
bool is_collective(RedistKind k);
// The collective a redistribution step runs (runtime/core/collective.h, the one
// collective kind); nullopt for the local steps (Slice, Partialize).
std::optional<CollectiveKind> collective_of(RedistKind k);

struct RedistStep {
  RedistKind kind;
  int mesh_dim = 0;
  int64_t dim = 0;   // the tensor dim gathered, scattered, sliced, or (all_to_all) newly sharded
  int64_t dim2 = 0;  // all_to_all: the tensor dim that was sharded and is concatenated
  ReduceOp op = ReduceOp::Sum;
  PlacementSpec before, after;
};

// The steps from `from` to `to` for a value of `type` (specs normalised to the
// value's rank). Order: all_to_all where one mesh dim moves a shard between tensor
// dims that no other mesh dim touches; then all-gathers, innermost mesh dim first
// (a nested shard must be gathered before the one it subdivides); then partial
// reductions (reduce_scatter when it lands directly on the target, else
// all_reduce); then local slices and partialisations, outermost mesh dim first.
// Empty when from == to.
std::vector<RedistStep> plan_redistribute(const PlacementSpec& from, const PlacementSpec& to,
                                          const TensorType& type, const DeviceMesh& mesh);

// Seconds the collectives of `steps` take for a value of `type` on `mesh`: each
// priced by the one performance model's alpha-beta model (collective_us,
// autotune/perf_model.h) over the link class its mesh dim's groups cross, with
// nccl-tests' sizes (all_gather the gathered shard, reduce_scatter and all_reduce
// the buffer before, all_to_all the send buffer) of even shards. Local slices and
// partialisations are free. Propagation chooses among sharding strategies with it.
double redistribute_cost(const std::vector<RedistStep>& steps, const TensorType& type, const DeviceMesh& mesh,
                         const CommRates& rates = default_comm_rates());

// "all_gather(tp, dim 0)" etc., for explain.
std::string step_str(const RedistStep& s, const DeviceMesh& mesh);

}  // namespace sf
