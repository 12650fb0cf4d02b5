// What ties a Plan to the graph it was compiled from: the digest `compile` stores in
// plan.json, and the check `exec` makes that graph.sf still describes the Plan
// (per-rank placements and local shapes re-derived by propagation). It needs the
// graph and propagation, so it lives here, above the runtime (runtime/plan_verify.h
// checks a Plan on its own).
#pragma once

#include <optional>
#include <string>

#include "codegen/ir/graph.h"
#include "runtime/core/diag.h"
#include "runtime/plan.h"

namespace sf {

// The digest `compile` stores as plan.json's "graph_digest": FNV-1a (64 bits, hex) of
// the printed graph, so any change to an op, attribute, type or placement shows.
std::string plan_graph_digest(const Graph& g);

// Whether `g` (graph.sf, parsed and resized to the Plan's world) is the program the
// Plan was compiled from: name, mesh, param and output names; per rank, each
// param's and output's placement and local dtype and shape re-derived from the
// graph (propagate + local_shard) against the Plan's buffers; and the digest. The
// structural checks come first because an edited Plan can carry any digest.
Result<void> verify_plan_matches_graph(const Plan& p, const Graph& g, const std::string& graph_file,
                                              const std::string& plan_file);

}  // namespace sf
