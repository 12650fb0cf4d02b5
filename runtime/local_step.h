// The steps of a rank's program that need no communication (compute, kernel,
// slice, partialize), run on the rank's local values. Shared by the threaded
// executor and the lockstep simulator so the two cannot drift apart.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/dist/local_program.h"
#include "runtime/kernel_runner.h"

namespace sf {

// Whether `s` is such a step.
bool is_local_step(const LocalStep& s);
// Runs a local step of program `p` on `values` (indexed by local value id). On
// failure, the reason (the kernel or op's message, located at the op in the graph
// where the evaluator knows it); nothing is written then.
std::optional<Diag> run_local_step(const LocalProgram& p, const LocalStep& s, std::vector<Tensor>& values,
                                          const KernelRunner& kernels);

}  // namespace sf
