// What ties a Plan to the graph it was compiled from: the digest `compile` stores in
// plan.json, and the check `exec` makes that graph.sf still describes the Plan
// (per-rank placements and local shapes against the graph's). It needs the graph,
// so it lives here, above the runtime (runtime/plan/plan_verify.h
// checks a Plan on its own).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/ir/graph.h"
#include "runtime/core/diag.h"
#include "runtime/plan/plan.h"

namespace sf {

// The digest `compile` stores as plan.json's "graph_digest": FNV-1a (64 bits, hex) of
// the printed graph, so any change to an op, attribute, type or placement shows.
std::string plan_graph_digest(const Graph& g);

// The placements exec shards a Plan's inputs and gathers its outputs by: each param
// as the graph declares it (Replicate when it does not), each output as rank 0 of
// the Plan records it (the Plan's compile chose it, with whatever cost model it
// was given: exec does not propagate again). A Diag names the Plan's field when an
// output's placement does not parse or does not fit the value.
struct PlanPlacements {
  std::vector<PlacementSpec> params, outputs;
};
Result<PlanPlacements> plan_placements(const Plan& p, const Graph& g, const std::string& plan_file);

// Whether `g` (graph.sf, parsed and resized to the Plan's world) is the program the
// Plan was compiled from: name, mesh, param and output names; per rank, each
// param's and output's placement (plan_placements; every rank's must agree) and
// local dtype and shape (local_shard) against the Plan's buffers; and the digest. The
// structural checks come first because an edited Plan can carry any digest.
Result<void> verify_plan_matches_graph(const Plan& p, const Graph& g, const std::string& graph_file,
                                              const std::string& plan_file);

}  // namespace sf
