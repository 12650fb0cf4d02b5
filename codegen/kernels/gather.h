// The gather emitter: an embedding lookup, out[i, c] = weight[indices[i], c], as a
// kernel over the output's flat index space (fusion keeps embeddings in kernels of
// their own). An index outside [0, rows) yields zeros in the generated kernel (the
// reference evaluator reports it; PyTorch asserts on the device).
#pragma once

#include "codegen/kernels/emitter.h"

namespace sf {

// NVPTX reads block and max_blocks (a grid-stride loop); the host a plain loop.
Result<EmittedKernel> emit_gather(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target);

}  // namespace sf
