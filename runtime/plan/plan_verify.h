// What a Plan read from disk must satisfy before anything runs it: plan.json is
// input a user can edit, and the executor trusts it (buffer sizes are device
// allocations, kernels read and write what their PTX says, collectives meet peers
// by order). So a Plan is checked whole, before any device is opened, and a defect
// is reported by its JSON path (ranks[1].steps[4].group[1]) rather than met later
// as a wrong result, a hang or an out-of-bounds access. docs/plan.md lists the rules.
#pragma once

#include <optional>
#include <string>

#include "runtime/plan/plan.h"

namespace sf {

// The Plan's own consistency (`file` names plan.json in the Diag): the world and
// mesh agree and are within kMaxPlanWorld; rank i is ranks[i]; kernel ids are
// unique, launch dims legal; every buffer's element count is within
// kMaxPlanElements; every rank has an input buffer per param and an output buffer
// per output; every step reads buffers already written (or inputs), on a stream
// its op uses; collectives name a mesh dim, the rank's group along it, sizes that
// cut their buffers, a handle waited once into a buffer of the result's type;
// slices, concats and partializations fit their buffers; a gemm step's call fits
// its buffers (gemm_check, runtime/gpu/gemm.h) and writes none it reads; every launch of one
// kernel passes buffers of the same types; and the collectives of each group match
// member by member (same op, dims and sizes, equal shapes, all_to_all chunks sent
// equal to those expected).
Result<void> verify_plan(const Plan& p, const std::string& file);

// The number of parameters of `.entry NAME(...)` in `ptx`, or -1 if it has none.
int ptx_entry_params(const std::string& ptx, const std::string& entry);

// Every kernel step passes as many buffers as its PTX entry takes (read_plan_dir).
Result<void> verify_kernel_arity(const Plan& p, const std::string& kernel_id, int params,
                                 const std::string& ptx_file);

// What ties a Plan to graph.sf (the digest, verify_plan_matches_graph) needs the
// graph and its propagation: codegen/dist/plan_graph.h.

}  // namespace sf
