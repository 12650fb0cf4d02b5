// Per rank, before fusion: every composite op (softmax, layer_norm, rms_norm,
// gelu, gelu_tanh) of a rank's program becomes the primitives of
// codegen/ir/decompose.h on local shapes, and the local copy a global
// `redistribute` leaves behind becomes an identity cast, so that fusion and the
// emitters see primitive ops only.
#pragma once

#include "codegen/dist/local_program.h"

namespace sf {

LocalProgram decompose_program(LocalProgram p);

}  // namespace sf
