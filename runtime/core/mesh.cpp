#include "runtime/core/mesh.h"

namespace sf {

int64_t Mesh::world_size() const {
  int64_t n = 1;
  for (const MeshDim& d : dims) n *= d.size;
  return n;
}

std::optional<int> Mesh::find(std::string_view name) const {
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].name == name) return static_cast<int>(i);
  return std::nullopt;
}

std::string Mesh::str() const {
  std::string s;
  for (const MeshDim& d : dims) {
    if (!s.empty()) s += ' ';
    s += d.name + "=" + std::to_string(d.size);
  }
  return s;
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg})
    if (reduce_op_name(op) == name) return op;
  return std::nullopt;
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate: return "R";
    case Kind::Shard: return "S(" + std::to_string(dim) + ")";
    case Kind::Partial:
      return op == ReduceOp::Sum ? "P" : "P(" + std::string(reduce_op_name(op)) + ")";
  }
  return "?";
}

std::string PlacementSpec::str(const Mesh& mesh) const {
  std::string s = "{";
  bool first = true;
  for (size_t i = 0; i < per_dim.size() && i < mesh.dims.size(); ++i) {
    if (per_dim[i].is_replicate()) continue;
    if (!first) s += ", ";
    first = false;
    s += mesh.dims[i].name + ": " + per_dim[i].str();
  }
  if (first) {  // all replicated: say so for every dim rather than print `{}`
    for (size_t i = 0; i < mesh.dims.size(); ++i) s += (i ? ", " : "") + mesh.dims[i].name + ": R";
  }
  return s + "}";
}

}  // namespace sf
