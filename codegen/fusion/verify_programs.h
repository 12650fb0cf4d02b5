// The invariant checker between pipeline stages (LLVM's verifier after every pass):
// rank_programs runs it after each stage when asked (RankPipelineOptions::verify_each,
// `--verify-each`, or SHARDFUSE_VERIFY_EACH=1 in the environment, which the test
// suite sets), so a stage that breaks a program is named at once rather than met
// later as a wrong result, a hang in a collective or an out-of-bounds kernel.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "runtime/core/device_mesh.h"
#include "codegen/dist/local_program.h"
#include "runtime/core/diag.h"

namespace sf {

// Checks every rank's program as `stage` left it (programs[r] is rank r of `mesh`):
//   - values: every value id in range, every value defined before use (params
//     first) and defined once, every output defined;
//   - steps: a compute step's result has its node's type; a kernel's operands and
//     results have the types of its group's params and outputs; slices, concats and
//     partializations fit their operands (buffers in bounds);
//   - collectives: a start names a mesh dim, sizes that cut its operand, a handle
//     waited once, into a value of the result's type; and across ranks, the k-th
//     collective of every member of a group along a mesh dim is the same collective
//     with equal shapes (runtime/core/collective_check.h).
// nullopt when all hold, else a Diag "after STAGE: rank R, step I (WHAT): DEFECT".
Result<void> verify_programs(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                    std::string_view stage);

// Whether rank_programs checks after every stage without being asked per call:
// SHARDFUSE_VERIFY_EACH is set to something other than "" or "0", or
// set_verify_each(true) was called (the CLI's --verify-each, a process-wide switch
// like LLVM's -verify-each).
bool verify_each_from_env();
void set_verify_each(bool on);

}  // namespace sf
