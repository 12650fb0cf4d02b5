// Runs every rank's program in lockstep on one thread: compute steps with the
// reference kernels on local shards, collectives over each mesh-dim group at once
// with the host definitions (runtime/core/host_collectives.h). Deterministic and
// needs no communicator, so it is the distribution tests' oracle and the quickest
// way to test a lowering (the executor runs Plans: runtime/plan/plan_exec.h).
#pragma once

#include <vector>

#include "codegen/dist/local_program.h"
#include "runtime/core/diag.h"
#include "codegen/dist/kernel_runner.h"

namespace sf {

// programs[r] is rank r's program (all from the same graph, same step structure);
// inputs[r] holds rank r's local tensor per graph param. Returns each rank's local
// output tensors, in graph output order.
// Kernel steps run through `kernels` (the reference evaluator by default).
Result<std::vector<std::vector<Tensor>>> simulate(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                                  const std::vector<std::vector<Tensor>>& inputs,
                                                  const KernelRunner& kernels = reference_kernel_runner());

}  // namespace sf
