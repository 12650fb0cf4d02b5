// Compute/communication reordering on a rank's program (Inductor's raise_comms and
// sink_waits): every collective is issued as soon as its operand exists, and its
// wait is put off while any independent local step can still run, so that compute
// runs while the collective is in flight. Starts keep their relative order and the
// pass is deterministic, so every rank issues the same collectives in the same order.
#pragma once

#include "codegen/dist/local_program.h"

namespace sf {

LocalProgram schedule(LocalProgram p);

}  // namespace sf
