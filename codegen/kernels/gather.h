// The gather emitter: an embedding lookup, out[i, c] = weight[indices[i], c], as a
// kernel over the output's flat index space (fusion keeps embeddings in kernels of
// their own). An index outside [offset, offset + rows) yields zeros (masked_row), as in
// the reference evaluator (PyTorch raises there); a vocabulary-parallel rank's lookup
// is this kernel with the offset of its rows.
#pragma once

#include "codegen/kernels/emitter.h"

namespace sf {

// NVPTX reads block and max_blocks (a grid-stride loop); the host a plain loop.
Result<EmittedKernel> emit_gather(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target);

}  // namespace sf
