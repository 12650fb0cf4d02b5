#include "codegen/dist/lower.h"

#include <map>

#include "codegen/dist/strategy.h"

namespace sf {

namespace {

std::string_view suffix(RedistKind k) {
  switch (k) {
    case RedistKind::AllGather: return "_ag";
    case RedistKind::AllReduce: return "_ar";
    case RedistKind::ReduceScatter: return "_rs";
    case RedistKind::AllToAll: return "_a2a";
    case RedistKind::Slice: return "_slice";
    case RedistKind::Partialize: return "_part";
  }
  return "_r";
}

class Lowering {
 public:
  Lowering(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank)
      : g_(g), plan_(plan), mesh_(mesh), rank_(rank) {
    p_.rank = rank;
  }

  LocalProgram run() {
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      const Node& n = g_.nodes()[i];
      const NodeSharding& ns = plan_.nodes[i];
      auto v = static_cast<ValueId>(i);
      std::string name = n.name.empty() ? "v" + std::to_string(i) : n.name;
      Shape local = local_shard(n.type.shape, ns.output, mesh_, rank_).shape;
      int out;
      if (n.op == OpKind::Param) {
        out = add_value({n.type.dtype, local}, name);
        p_.param_values.push_back(out);
      } else {
        std::vector<int> in;
        for (size_t k = 0; k < n.inputs.size(); ++k) in.push_back(get(n.inputs[k], ns.inputs[k]));
        out = add_value({n.type.dtype, local}, name);
        LocalStep s;
        s.kind = LocalStep::Kind::Compute;
        s.in = std::move(in);
        s.out = out;
        std::vector<Shape> in_shapes;
        for (ValueId u : n.inputs) in_shapes.push_back(g_.node(u).type.shape);
        s.node = local_node(n, rank_shards(n.type.shape, ns.output, in_shapes, ns.inputs, mesh_, rank_));
        p_.steps.push_back(std::move(s));
      }
      have_[{v, key(ns.output, n.type.rank())}] = out;
      current_[v] = ns.output;
      // A constraint redistributes the value; consumers then start from there.
      if (!(ns.value == ns.output)) {
        get(v, ns.value);
        current_[v] = ns.value;
      }
    }
    for (size_t o = 0; o < g_.outputs().size(); ++o) {
      ValueId v = g_.outputs()[o].value;
      p_.output_values.push_back(get(v, plan_.outputs[o]));
      p_.output_specs.push_back(plan_.outputs[o]);
    }
    return std::move(p_);
  }

 private:
  static std::string key(const PlacementSpec& s, int rank) {
    std::string k;
    for (const Placement& p : normalize_spec(s, rank).per_dim) k += p.str() + ";";
    return k;
  }

  int add_value(TensorType t, std::string name) {
    p_.types.push_back(std::move(t));
    p_.names.push_back(std::move(name));
    return static_cast<int>(p_.types.size()) - 1;
  }

  // The local value of global value v placed as `spec`, redistributing (once per
  // (value, spec)) from the spec it was produced with.
  int get(ValueId v, const PlacementSpec& spec) {
    const TensorType& t = g_.node(v).type;
    auto hit = have_.find({v, key(spec, t.rank())});
    if (hit != have_.end()) return hit->second;
    PlacementSpec from = current_.at(v);
    int cur = have_.at({v, key(from, t.rank())});
    for (const RedistStep& st : plan_redistribute(from, spec, t, mesh_)) {
      cur = emit(st, cur, t);
      have_[{v, key(st.after, t.rank())}] = cur;
    }
    return cur;
  }

  std::vector<int64_t> member_extents(const TensorType& t, const PlacementSpec& spec, int mesh_dim, int64_t dim) {
    std::vector<int64_t> e;
    for (int r : mesh_.group(rank_, mesh_dim))
      e.push_back(local_shard(t.shape, spec, mesh_, r).shape[static_cast<size_t>(dim)]);
    return e;
  }

  int emit(const RedistStep& st, int in, const TensorType& t) {
    LocalShard before = local_shard(t.shape, st.before, mesh_, rank_);
    LocalShard after = local_shard(t.shape, st.after, mesh_, rank_);
    int out = add_value({t.dtype, after.shape}, p_.names[static_cast<size_t>(in)] + std::string(suffix(st.kind)));
    LocalStep s;
    s.in = {in};
    s.out = out;
    s.mesh_dim = st.mesh_dim;
    s.op = st.op;
    s.dim = static_cast<int>(st.dim);
    s.dim2 = static_cast<int>(st.dim2);
    switch (st.kind) {
      case RedistKind::Slice: {
        s.kind = LocalStep::Kind::Slice;
        for (size_t d = 0; d < after.offset.size(); ++d) s.offset.push_back(after.offset[d] - before.offset[d]);
        s.shape = after.shape;
        p_.steps.push_back(std::move(s));
        return out;
      }
      case RedistKind::Partialize:
        s.kind = LocalStep::Kind::Partialize;
        s.keep = st.op != ReduceOp::Sum || mesh_.coord(rank_)[static_cast<size_t>(st.mesh_dim)] == 0;
        p_.steps.push_back(std::move(s));
        return out;
      case RedistKind::AllGather: s.sizes = member_extents(t, st.before, st.mesh_dim, st.dim); break;
      case RedistKind::ReduceScatter: s.sizes = member_extents(t, st.after, st.mesh_dim, st.dim); break;
      case RedistKind::AllReduce: break;
      case RedistKind::AllToAll:
        s.sizes = member_extents(t, st.after, st.mesh_dim, st.dim);
        s.sizes2 = member_extents(t, st.before, st.mesh_dim, st.dim2);
        break;
    }
    s.kind = LocalStep::Kind::Start;
    s.collective = *collective_of(st.kind);
    s.handle = p_.num_handles++;
    s.out = -1;
    LocalStep w;
    w.kind = LocalStep::Kind::Wait;
    w.handle = s.handle;
    w.out = out;
    w.collective = s.collective;
    w.mesh_dim = s.mesh_dim;
    p_.steps.push_back(std::move(s));
    p_.steps.push_back(std::move(w));
    return out;
  }

  const Graph& g_;
  const ShardingPlan& plan_;
  const DeviceMesh& mesh_;
  int rank_;
  LocalProgram p_;
  std::map<std::pair<ValueId, std::string>, int> have_;
  std::map<ValueId, PlacementSpec> current_;
};

}  // namespace

LocalProgram lower(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank) {
  return Lowering(g, plan, mesh, rank).run();
}

}  // namespace sf
