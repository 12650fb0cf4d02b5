// Fusion on a rank's program (after decompose_program): groups compute steps into
// kernels and replaces each group with one Kernel step. Vertical fusion, greedy in
// program order, in the spirit of Inductor's can_fuse / score_fusion:
//   - pointwise chains over one index space (views and broadcasts fold into
//     index arithmetic), with several outputs where values escape the chain;
//   - reductions with a pointwise prologue and epilogue, and several reductions
//     over the same rows in one kernel (softmax, layer_norm, rms_norm each become
//     one kernel), siblings too: independent reductions of one shape over the same
//     dims that read a value in common join after the greedy pass (horizontal
//     fusion: a layer norm backward's sums of dy * xhat and of dy read dy once);
//   - matmul with transposed operands read in place and a pointwise epilogue
//     (bias, scale, activation, residual add, cast);
//   - attention (codegen/ir/attention_match.h: matmul -> scale/mask -> softmax ->
//     matmul, which scaled_dot_product_attention decomposes to) as one kernel, with
//     the views and pointwise ops that make q, k and v only for it (head splits, RoPE,
//     GQA's repeat) and the views after it (the head merge): FlashAttention's scores
//     never reach memory.
// Collectives and local slices are barriers: only compute steps fuse. Number
// literals are folded into the kernels that use them.
#pragma once

#include <set>

#include "codegen/dist/local_program.h"

namespace sf {

struct FusionOptions {
  bool enabled = true;  // false: every compute step becomes a kernel of its own
  int max_ops = 64;     // ops per kernel
  // Steps (indices into the unfused program) that must each stay a kernel of their
  // own: the fallback when a fused group could not be emitted.
  std::set<size_t> isolate;
  // Attention becomes one kernel (false: its matmuls and softmax fuse as any others,
  // torch's math backend).
  bool attention = true;
  // Steps that must not form an attention kernel: the fallback when one could not be
  // emitted (they then fuse as any other steps).
  std::set<size_t> no_attention;
};

// Fuses every rank's program alike: programs[r] is rank r's (same steps, local
// shapes); a merge happens only where it is valid on every rank, so all ranks end
// with the same kernels and the same step order. Use this for a distributed run.
std::vector<LocalProgram> fuse_all(std::vector<LocalProgram> programs, const FusionOptions& opts = {});

// One program on its own (a single rank, or tests).
LocalProgram fuse(LocalProgram p, const FusionOptions& opts = {});

}  // namespace sf
