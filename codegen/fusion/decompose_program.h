// Per rank, before fusion: every composite op (softmax, layer_norm, rms_norm,
// gelu, gelu_tanh) of a rank's program becomes the primitives of
// codegen/ir/decompose.h on local shapes, so that fusion and the emitters see
// primitive ops only. A global `redistribute` is, on a rank, the identity on what
// the collectives before it delivered: its users read that value directly (a copy
// kernel would cost a pass over the tensor, per ring step once decomposed), and only
// a redistribute that is itself returned stays, as an identity cast.
#pragma once

#include "codegen/dist/local_program.h"

namespace sf {

LocalProgram decompose_program(LocalProgram p);

}  // namespace sf
