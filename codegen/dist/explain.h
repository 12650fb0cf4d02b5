// The text `shardfuse explain` prints: each value's chosen placement and why (the
// cost of the choice against the runner-up), the redistributions inserted, and a
// rank's schedule one step per line (`all_gather x -> x_ag [tp]`, `wait x_ag`,
// `matmul x_ag, v3 -> h`).
#pragma once

#include <string>

#include "codegen/dist/local_program.h"
#include "codegen/dist/propagate.h"

namespace sf {

std::string explain_sharding(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh);
std::string explain_schedule(const LocalProgram& p, const DeviceMesh& mesh);
// One line per fused kernel: its kind, ops, bytes read and written, flops, and the
// traffic fusion saved (intermediates that stay on chip).
std::string explain_kernels(const LocalProgram& p);
// One step as explain prints it (no indent, no newline).
std::string step_line(const LocalProgram& p, const LocalStep& s, const DeviceMesh& mesh);

}  // namespace sf
