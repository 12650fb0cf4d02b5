// The device mesh of a distributed run (DTensor's DeviceMesh): ranks laid out
// row-major over named dims, each rank's coordinate, the sub-group of ranks along
// each mesh dim, and where each rank's shard of a placed tensor lies.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/mesh.h"
#include "runtime/core/tensor.h"

namespace sf {

class DeviceMesh {
 public:
  explicit DeviceMesh(Mesh mesh);  // the graph's mesh; an empty mesh is one rank

  const Mesh& mesh() const { return mesh_; }
  int ndim() const { return static_cast<int>(mesh_.dims.size()); }
  int64_t size(int dim) const { return mesh_.dims[static_cast<size_t>(dim)].size; }
  int world() const { return world_; }

  // Row-major: the last mesh dim varies fastest (rank 3 of dp=2 tp=2 is (1, 1)).
  std::vector<int64_t> coord(int rank) const;
  int rank_of(const std::vector<int64_t>& coord) const;
  // The ranks that differ from `rank` only along mesh dim `dim`, ordered by their
  // coordinate on it (so position i of the group holds chunk i).
  std::vector<int> group(int rank, int dim) const;
  // Every group along `dim`, each as group() orders it, ordered by its first rank.
  std::vector<std::vector<int>> groups(int dim) const;
  // `rank`'s group along every mesh dim, in dim order (what Comm::create takes).
  std::vector<std::vector<int>> rank_groups(int rank) const;

 private:
  Mesh mesh_;
  int world_ = 1;
};

// torch.chunk's split of `extent` into `parts`: every chunk has ceil(extent / parts)
// elements but the trailing ones, which may be shorter or empty (20 on 3 ranks is
// 7, 7, 6; 5 on 4 ranks is 2, 2, 1, 0).
struct Chunk {
  int64_t offset = 0;
  int64_t size = 0;
};
Chunk chunk_of(int64_t extent, int64_t parts, int64_t index);

// Where rank `rank`'s local tensor lies in a global tensor of shape `global` placed
// as `spec`: mesh dims shard in mesh-dim order, so a tensor dim sharded by two mesh
// dims is chunked by the first and the chunk again by the second (DTensor's
// compute_local_shape_and_global_offset). Replicate and Partial dims do not cut.
struct LocalShard {
  Shape shape;
  std::vector<int64_t> offset;  // per tensor dim
};
LocalShard local_shard(const Shape& global, const PlacementSpec& spec, const DeviceMesh& mesh, int rank);

// The spec with every Shard dim normalised to 0..rank-1.
PlacementSpec normalize_spec(const PlacementSpec& spec, int rank);

// An all-Replicate spec for `mesh`.
PlacementSpec replicated(const DeviceMesh& mesh);

}  // namespace sf
