// Moving whole tensors between the global view and per-rank shards on the host:
// DTensor's distribute_tensor (shard_tensor) and full_tensor (unshard_tensor). The
// CLI uses them for --inputs/--save-outputs and the tests use them as the oracle
// for every sharded result.
#pragma once

#include <vector>

#include "runtime/core/device_mesh.h"
#include "runtime/core/diag.h"
#include "runtime/core/tensor.h"

namespace sf {

// The block of `t` at `offset` with `shape` (a copy).
Tensor slice_block(const Tensor& t, const std::vector<int64_t>& offset, const Shape& shape);
// Writes `block` into `dst` at `offset`.
void place_block(Tensor& dst, const Tensor& block, const std::vector<int64_t>& offset);

// Rank `rank`'s local tensor of `global` placed as `spec`. Along a Partial mesh dim
// the ranks' locals must reduce to the value: for sum the coordinate-0 rank holds it
// and the others zeros; for avg, max and min every rank holds it.
Tensor shard_tensor(const Tensor& global, const PlacementSpec& spec, const DeviceMesh& mesh, int rank);

// The global tensor from every rank's local (indexed by rank), as `spec` placed it:
// shards are placed at their offsets, Partial mesh dims reduced (the innermost mesh
// dim first). A Diag if a local has the wrong shape for its rank.
Result<Tensor> unshard_tensor(const std::vector<Tensor>& locals, const TensorType& global,
                              const PlacementSpec& spec, const DeviceMesh& mesh);

}  // namespace sf
