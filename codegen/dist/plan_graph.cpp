#include "codegen/dist/plan_graph.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "codegen/ir/printer.h"
#include "runtime/core/device_mesh.h"
#include "runtime/core/shard.h"

namespace sf {

std::string plan_graph_digest(const Graph& g) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : print_graph(g)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Result<PlanPlacements> plan_placements(const Plan& p, const Graph& g, const std::string& plan_file) {
  const Mesh& mesh = g.mesh();
  PlanPlacements out;
  for (ValueId v : g.params()) {
    const Node& n = g.node(v);
    out.params.push_back(normalize_spec(n.placement ? *n.placement : replicated(DeviceMesh(mesh)), n.type.rank()));
  }
  if (p.ranks.empty() || p.ranks[0].output_specs.size() != g.outputs().size())
    return Diag{plan_file, {}, "ranks[0].output_placements: expected one placement per returned value (" +
                                   std::to_string(g.outputs().size()) + ")"};
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const std::string& text = p.ranks[0].output_specs[o];
    const std::string field = plan_file + ": ranks[0].output_placements[" + std::to_string(o) + "]";
    const Output& ret = g.outputs()[o];
    const int rank = g.node(ret.value).type.rank();
    std::optional<PlacementSpec> spec = parse_placement_spec(text, mesh);
    if (!spec) return Diag{field, {}, "'" + text + "' is not a placement on mesh '" + mesh.str() + "'"};
    if (std::optional<std::string> why = check_placements(*spec, mesh, rank))
      return Diag{field, {}, "'" + text + "' does not fit output " + ret.name + ": " + *why};
    out.outputs.push_back(normalize_spec(*spec, rank));
  }
  return out;
}

Result<void> verify_plan_matches_graph(const Plan& p, const Graph& g, const std::string& graph_file,
                                              const std::string& plan_file) {
  auto fail = [&](const std::string& what) {
    return Diag{graph_file, {}, what + " (recompile the Plan, or restore graph.sf: exec shards the inputs and "
                                       "gathers the outputs by it)"};
  };
  const DeviceMesh mesh(g.mesh());
  std::vector<std::string> params, outputs;
  for (ValueId v : g.params()) params.push_back(g.node(v).name);
  for (const Output& o : g.outputs()) outputs.push_back(o.name);
  if (g.name() != p.graph || g.mesh().str() != p.mesh || mesh.world() != p.world)
    return fail("graph '" + g.name() + "' (mesh '" + g.mesh().str() + "') is not the graph plan.json was compiled from ('" +
                p.graph + "', mesh '" + p.mesh + "')");
  if (params != p.params) return fail("the params are not the ones plan.json was compiled for");
  if (outputs != p.outputs) return fail("the returned values are not the ones plan.json was compiled for");
  // The placements: params as the graph declares them, outputs as the Plan chose
  // them (its compile's cost model may differ from any default); then per rank,
  // what each param's and output's buffer must hold.
  Result<PlanPlacements> placed_by = plan_placements(p, g, plan_file);
  if (!placed_by.ok()) return placed_by.error();
  // An output the graph returns with a placement must have it in the Plan.
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const Output& ret = g.outputs()[o];
    if (ret.placement && normalize_spec(*ret.placement, g.node(ret.value).type.rank()) != placed_by->outputs[o])
      return fail("output " + ret.name + " is placed " + ret.placement->str(g.mesh()) + ", but " + plan_file +
                  ": ranks[0].output_placements[" + std::to_string(o) + "] has it " + p.ranks[0].output_specs[o]);
  }
  for (const PlanRank& r : p.ranks) {
    const std::string rpath = plan_file + ": ranks[" + std::to_string(r.rank) + "]";
    auto check = [&](const char* what, const std::string& name, const TensorType& global, const PlacementSpec& spec,
                     int buffer, const std::string& plan_spec) -> Result<void> {
      const std::string placed = spec.str(mesh.mesh());
      if (placed != plan_spec)
        return fail(std::string(what) + " " + name + " is placed " + placed + ", but " + rpath + " has it " + plan_spec);
      const TensorType local{global.dtype, local_shard(global.shape, spec, mesh, r.rank).shape};
      const PlanBuffer& b = r.buffers[static_cast<size_t>(buffer)];
      if (TensorType{b.dtype, b.shape} != local)
        return fail(std::string(what) + " " + name + " is " + global.str() + " placed " + placed + ", so rank " +
                    std::to_string(r.rank) + " holds " + local.str() + ", but " + rpath + "'s buffer " +
                    std::to_string(buffer) + " is " + TensorType{b.dtype, b.shape}.str());
      return {};
    };
    for (size_t i = 0; i < g.params().size(); ++i) {
      const ValueId v = g.params()[i];
      SF_TRY(check("param", params[i], g.node(v).type, placed_by->params[i], r.inputs[i], r.input_specs[i]));
    }
    for (size_t o = 0; o < g.outputs().size(); ++o)
      SF_TRY(check("output", outputs[o], g.node(g.outputs()[o].value).type, placed_by->outputs[o], r.outputs[o],
                   r.output_specs[o]));
  }
  if (p.graph_digest.empty())
    return Diag{plan_file, {}, "graph_digest: missing; exec checks graph.sf against it (recompile the Plan)"};
  if (plan_graph_digest(g) != p.graph_digest)
    return fail("its ops are not the ones plan.json was compiled from (digest " + plan_graph_digest(g) +
                ", plan.json's graph_digest " + p.graph_digest + ")");
  return {};
}

}  // namespace sf
