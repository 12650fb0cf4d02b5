// Static pruning and ranking of built candidates. After a candidate is compiled,
// ptxas's registers and shared memory give its occupancy; a config that cannot
// place one block on an SM is pruned, and one that spills is ranked after every
// config that does not. The rest are ranked by a roofline estimate corrected for
// occupancy (latency hiding), wave quantisation and tile padding, and only the
// best top_k are measured. The model ranks; it does not need to be right about
// absolute times (docs/autotuning.md).
#pragma once

#include <optional>
#include <string>

#include "autotune/builder.h"
#include "autotune/problem.h"
#include "autotune/target.h"

namespace sf {

// Why a built candidate cannot run well enough to be worth measuring (it does not
// fit on an SM), or nullopt.
std::optional<std::string> resource_reject(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t,
                                           const BuildResult& b);

// The estimated time in microseconds.
double predict_us(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t, const BuildResult& b);

}  // namespace sf
