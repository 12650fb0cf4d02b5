#include "runtime/core/device_mesh.h"

#include <stdexcept>


namespace sf {

DeviceMesh::DeviceMesh(Mesh mesh) : mesh_(std::move(mesh)) {
  int64_t w = mesh_.world_size();
  if (w < 1 || w > (int64_t{1} << 20)) throw std::invalid_argument("mesh size out of range: " + mesh_.str());
  world_ = static_cast<int>(w);
}

std::vector<int64_t> DeviceMesh::coord(int rank) const {
  std::vector<int64_t> c(mesh_.dims.size());
  int64_t r = rank;
  for (size_t i = c.size(); i-- > 0;) {
    c[i] = r % mesh_.dims[i].size;
    r /= mesh_.dims[i].size;
  }
  return c;
}

int DeviceMesh::rank_of(const std::vector<int64_t>& coord) const {
  int64_t r = 0;
  for (size_t i = 0; i < coord.size(); ++i) r = r * mesh_.dims[i].size + coord[i];
  return static_cast<int>(r);
}

std::vector<int> DeviceMesh::group(int rank, int dim) const {
  std::vector<int64_t> c = coord(rank);
  std::vector<int> g;
  for (int64_t i = 0; i < size(dim); ++i) {
    c[static_cast<size_t>(dim)] = i;
    g.push_back(rank_of(c));
  }
  return g;
}

std::vector<std::vector<int>> DeviceMesh::rank_groups(int rank) const {
  std::vector<std::vector<int>> g;
  for (int d = 0; d < ndim(); ++d) g.push_back(group(rank, d));
  return g;
}

std::vector<std::vector<int>> DeviceMesh::groups(int dim) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r)
    if (coord(r)[static_cast<size_t>(dim)] == 0) out.push_back(group(r, dim));
  return out;
}

Chunk chunk_of(int64_t extent, int64_t parts, int64_t index) {
  int64_t per = parts > 0 ? (extent + parts - 1) / parts : 0;
  int64_t begin = std::min(extent, per * index);
  int64_t end = std::min(extent, per * (index + 1));
  return {begin, end - begin};
}

LocalShard local_shard(const Shape& global, const PlacementSpec& spec, const DeviceMesh& mesh, int rank) {
  LocalShard s{global, std::vector<int64_t>(global.size(), 0)};
  std::vector<int64_t> c = mesh.coord(rank);
  int rk = static_cast<int>(global.size());
  for (int i = 0; i < mesh.ndim() && i < static_cast<int>(spec.per_dim.size()); ++i) {
    const Placement& p = spec.per_dim[static_cast<size_t>(i)];
    if (!p.is_shard()) continue;
    auto d = static_cast<size_t>(*normalize_dim(p.dim, rk));
    Chunk ch = chunk_of(s.shape[d], mesh.size(i), c[static_cast<size_t>(i)]);
    s.offset[d] += ch.offset;
    s.shape[d] = ch.size;
  }
  return s;
}

PlacementSpec normalize_spec(const PlacementSpec& spec, int rank) {
  PlacementSpec out = spec;
  for (Placement& p : out.per_dim)
    if (p.is_shard()) p.dim = *normalize_dim(p.dim, rank);
  return out;
}

PlacementSpec replicated(const DeviceMesh& mesh) {
  return PlacementSpec{std::vector<Placement>(static_cast<size_t>(mesh.ndim()), Placement::replicate())};
}

}  // namespace sf
