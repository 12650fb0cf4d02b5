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
        if (!ns.carry.empty()) out = carry_scan(n, ns.carry, p_.steps.back().in[0], out, name);
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

  // One compute step on local values (the carry's sums, slice and add).
  int compute(OpKind k, std::vector<int> in, const std::vector<AttrValue>& attrs, const std::string& name,
              const SourceLoc& loc) {
    std::vector<Operand> operands;
    for (int v : in) operands.push_back({p_.types[static_cast<size_t>(v)], false});
    LocalStep s;
    s.kind = LocalStep::Kind::Compute;
    s.node.op = k;
    s.node.attrs = normalize_attrs(k, attrs, {});
    s.node.type = infer_type(k, operands, s.node.attrs, g_.mesh());
    s.node.name = name;
    s.node.loc = loc;
    s.in = std::move(in);
    s.out = add_value(s.node.type, name);
    p_.steps.push_back(s);
    return s.out;
  }

  // A cumsum over a dim sharded on mesh dims `carry` (OpStrategy::carry): `scanned`
  // is the rank's cumsum of its chunk `x`. Every rank's total (a sum over the dim,
  // kept as size 1: 0 for an empty chunk) is all-gathered along the carry mesh dims,
  // the last first, so the gathered totals lie in the chunks' global order (a dim
  // chunked by mesh dim 0, each chunk again by mesh dim 1); the rank adds the sum of
  // the totals before its own chunk (an exclusive prefix: slice [0, j), then sum).
  int carry_scan(const Node& n, const std::vector<int>& carry, int x, int scanned, const std::string& name) {
    const int64_t dim = *normalize_dim(n.attrs.get_int("dim"), n.type.rank());
    int cur = compute(OpKind::Sum, {x}, {AttrValue(std::vector<int64_t>{dim}), AttrValue(true)}, name + "_total", n.loc);
    for (auto m = carry.rbegin(); m != carry.rend(); ++m) {
      const TensorType t = p_.types[static_cast<size_t>(cur)];
      TensorType after = t;
      after.shape[static_cast<size_t>(dim)] *= mesh_.size(*m);
      const int out = add_value(after, name + "_totals");
      LocalStep s;
      s.kind = LocalStep::Kind::Start;
      s.collective = CollectiveKind::AllGather;
      s.in = {cur};
      s.mesh_dim = *m;
      s.dim = static_cast<int>(dim);
      s.sizes.assign(static_cast<size_t>(mesh_.size(*m)), t.shape[static_cast<size_t>(dim)]);
      s.handle = p_.num_handles++;
      LocalStep w;
      w.kind = LocalStep::Kind::Wait;
      w.handle = s.handle;
      w.out = out;
      w.collective = s.collective;
      w.mesh_dim = s.mesh_dim;
      p_.steps.push_back(std::move(s));
      p_.steps.push_back(std::move(w));
      cur = out;
    }
    int64_t chunk = 0;  // this rank's chunk of the dim, in global order
    for (int m : carry) chunk = chunk * mesh_.size(m) + mesh_.coord(rank_)[static_cast<size_t>(m)];
    const int before = compute(OpKind::Slice, {cur}, {AttrValue(dim), AttrValue(int64_t{0}), AttrValue(chunk)},
                               name + "_before", n.loc);
    const int offset = compute(OpKind::Sum, {before}, {AttrValue(std::vector<int64_t>{dim}), AttrValue(true)},
                               name + "_carry", n.loc);
    return compute(OpKind::Add, {scanned, offset}, {}, name + "_scan", n.loc);
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
