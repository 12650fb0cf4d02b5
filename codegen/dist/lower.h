// SPMD lowering: the global graph and its sharding plan become one LocalProgram
// per rank, with local shapes and the redistributions the plan needs as
// asynchronous collectives (each Wait right after its Start; schedule() then
// moves them apart).
#pragma once

#include "codegen/dist/local_program.h"
#include "codegen/dist/propagate.h"

namespace sf {

LocalProgram lower(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank);

}  // namespace sf
