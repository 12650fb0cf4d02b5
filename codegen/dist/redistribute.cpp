#include "codegen/dist/redistribute.h"

#include <stdexcept>

namespace sf {

std::string_view redist_kind_name(RedistKind k) {
  if (std::optional<CollectiveKind> c = collective_of(k)) return collective_name(*c);
  return k == RedistKind::Slice ? "slice" : "partialize";
}

bool is_collective(RedistKind k) { return collective_of(k).has_value(); }

std::optional<CollectiveKind> collective_of(RedistKind k) {
  switch (k) {
    case RedistKind::AllGather: return CollectiveKind::AllGather;
    case RedistKind::AllReduce: return CollectiveKind::AllReduce;
    case RedistKind::ReduceScatter: return CollectiveKind::ReduceScatter;
    case RedistKind::AllToAll: return CollectiveKind::AllToAll;
    case RedistKind::Slice:
    case RedistKind::Partialize: return std::nullopt;
  }
  return std::nullopt;
}

namespace {

bool shards(const Placement& p, int64_t d) { return p.is_shard() && p.dim == d; }

class Planner {
 public:
  Planner(const PlacementSpec& from, const PlacementSpec& to, int rank)
      : cur_(normalize_spec(from, rank)), to_(normalize_spec(to, rank)), n_(static_cast<int>(cur_.per_dim.size())) {}

  std::vector<RedistStep> plan() {
    all_to_alls();
    gathers();
    partials();
    slices();
    if (!(cur_ == to_)) throw std::logic_error("redistribution planner did not reach its target");
    return steps_;
  }

 private:
  Placement& cur(int i) { return cur_.per_dim[static_cast<size_t>(i)]; }
  const Placement& to(int i) const { return to_.per_dim[static_cast<size_t>(i)]; }

  void emit(RedistKind k, int i, int64_t dim, int64_t dim2, ReduceOp op, Placement next) {
    RedistStep s{k, i, dim, dim2, op, cur_, cur_};
    cur(i) = next;
    s.after = cur_;
    steps_.push_back(std::move(s));
  }

  // Is tensor dim d sharded by any mesh dim other than i, now or in the target?
  bool touched_elsewhere(int i, int64_t d) {
    for (int j = 0; j < n_; ++j)
      if (j != i && (shards(cur(j), d) || shards(to(j), d))) return true;
    return false;
  }

  void all_to_alls() {
    for (int i = 0; i < n_; ++i) {
      if (!cur(i).is_shard() || !to(i).is_shard() || cur(i).dim == to(i).dim) continue;
      int64_t a = cur(i).dim, b = to(i).dim;
      if (touched_elsewhere(i, a) || touched_elsewhere(i, b)) continue;
      emit(RedistKind::AllToAll, i, b, a, ReduceOp::Sum, Placement::shard(b));
    }
  }

  void gathers() {
    std::vector<bool> unshard(static_cast<size_t>(n_), false);
    auto mark_inner = [&](int i, int64_t d) {
      for (int j = i + 1; j < n_; ++j)
        if (shards(cur(j), d)) unshard[static_cast<size_t>(j)] = true;
    };
    for (int i = 0; i < n_; ++i) {
      // A shard that changes is gathered, and so is every shard nested inside it.
      if (cur(i).is_shard() && !(cur(i) == to(i))) {
        unshard[static_cast<size_t>(i)] = true;
        mark_inner(i, cur(i).dim);
      }
      // A new shard at mesh dim i must cut before any inner mesh dim's shard of the
      // same tensor dim, so those are gathered and re-sliced after it.
      if (to(i).is_shard() && !(cur(i) == to(i))) mark_inner(i, to(i).dim);
    }
    for (int i = n_ - 1; i >= 0; --i)
      if (unshard[static_cast<size_t>(i)]) emit(RedistKind::AllGather, i, cur(i).dim, 0, ReduceOp::Sum, Placement::replicate());
  }

  void partials() {
    for (int i = n_ - 1; i >= 0; --i) {
      if (!cur(i).is_partial() || cur(i) == to(i)) continue;
      ReduceOp op = cur(i).op;
      if (to(i).is_shard() && outer_shards_ready(i, to(i).dim)) {
        emit(RedistKind::ReduceScatter, i, to(i).dim, 0, op, to(i));
      } else {
        emit(RedistKind::AllReduce, i, 0, 0, op, Placement::replicate());
      }
    }
  }

  // Reduce-scattering onto Shard(d) at mesh dim i is right only if every outer mesh
  // dim that will shard d already does (chunks nest outer to inner).
  bool outer_shards_ready(int i, int64_t d) {
    for (int j = 0; j < i; ++j)
      if (shards(to(j), d) && !shards(cur(j), d)) return false;
    for (int j = i + 1; j < n_; ++j)
      if (shards(cur(j), d)) return false;
    return true;
  }

  void slices() {
    for (int i = 0; i < n_; ++i) {
      if (cur(i) == to(i)) continue;
      if (!cur(i).is_replicate()) throw std::logic_error("redistribution planner: unexpected state");
      if (to(i).is_shard()) emit(RedistKind::Slice, i, to(i).dim, 0, ReduceOp::Sum, to(i));
      else emit(RedistKind::Partialize, i, 0, 0, to(i).op, to(i));
    }
  }

  PlacementSpec cur_, to_;
  int n_;
  std::vector<RedistStep> steps_;
};

}  // namespace

std::vector<RedistStep> plan_redistribute(const PlacementSpec& from, const PlacementSpec& to,
                                          const TensorType& type, const DeviceMesh& mesh) {
  (void)mesh;
  return Planner(from, to, type.rank()).plan();
}

double redistribute_cost(const std::vector<RedistStep>& steps, const TensorType& type, const DeviceMesh& mesh,
                         const CommRates& rates) {
  double cost = 0;
  double elem = dtype_size(type.dtype);
  // Bytes a rank holds under `spec`, with even shards (the cost model's approximation).
  auto bytes = [&](const PlacementSpec& spec) {
    double b = static_cast<double>(numel(type.shape)) * elem;
    for (int i = 0; i < mesh.ndim(); ++i)
      if (spec.per_dim[static_cast<size_t>(i)].is_shard()) b /= static_cast<double>(mesh.size(i));
    return b;
  };
  for (const RedistStep& s : steps) {
    if (mesh.size(s.mesh_dim) <= 1 || !is_collective(s.kind)) continue;
    double size = 0;
    switch (s.kind) {
      case RedistKind::AllGather: size = bytes(s.after); break;
      case RedistKind::ReduceScatter:
      case RedistKind::AllReduce:
      case RedistKind::AllToAll: size = bytes(s.before); break;
      case RedistKind::Slice:
      case RedistKind::Partialize: break;
    }
    cost += rates.collective_s(*collective_of(s.kind), mesh, s.mesh_dim, size);
  }
  return cost;
}

std::string step_str(const RedistStep& s, const DeviceMesh& mesh) {
  std::string m = mesh.mesh().dims[static_cast<size_t>(s.mesh_dim)].name;
  std::string r = std::string(redist_kind_name(s.kind)) + "(" + m;
  switch (s.kind) {
    case RedistKind::AllGather:
    case RedistKind::Slice: r += ", dim " + std::to_string(s.dim); break;
    case RedistKind::ReduceScatter: r += ", dim " + std::to_string(s.dim) + ", " + std::string(reduce_op_name(s.op)); break;
    case RedistKind::AllReduce:
    case RedistKind::Partialize: r += ", " + std::string(reduce_op_name(s.op)); break;
    case RedistKind::AllToAll: r += ", split " + std::to_string(s.dim) + ", concat " + std::to_string(s.dim2); break;
  }
  return r + ")";
}

}  // namespace sf
