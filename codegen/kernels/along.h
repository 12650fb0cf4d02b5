// The along-dim emitter: one cumsum, argmax or argmin (ops.def's AlongDim ops) as a
// kernel of its own, KernelKind::Gather's (fusion gives these ops a kernel each, as
// it does embeddings; emitter.cpp picks this emitter by the group's op). The operand
// is read as [outer, len, inner] around `dim`; each row (outer * inner of them) is
// read in order by one thread (a grid-stride loop over rows on NVPTX, a plain loop on
// the host), so the kernel is the reference's loop and needs no cross-thread step:
//   cumsum: a running sum, f32 for f32/f16/bf16 operands (as torch's GPU kernel
//     accumulates 16-bit values), i64 for integer and bool ones (wrapping, as torch);
//     each prefix is stored as the result's dtype;
//   argmax/argmin: a (value, index) pair replaced only by a strictly greater (smaller)
//     value or by the row's first NaN, so ties keep the first index and a NaN wins
//     (torch's rule); the index is stored as i64.
// Adjacent threads take adjacent rows, so with inner > 1 a warp's reads of one step
// along the row are adjacent in memory.
#pragma once

#include "codegen/kernels/emitter.h"

namespace sf {

// Whether `spec`'s group is one along-dim op of a param (this emitter's).
bool is_along_group(const KernelSpec& spec);

// NVPTX reads block and max_blocks (a grid-stride loop over rows); the host checks
// its knobs and runs one loop over rows.
Result<EmittedKernel> emit_along(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target);

}  // namespace sf
