// Fusion's attention kernels (fuse.h): every attention (codegen/ir/attention_match.h)
// of a rank's program, with its prologue (the pointwise ops and views only it reads:
// head splits, RoPE, GQA's repeat) and its epilogue (the views after it that its store
// can follow), as the steps of one kernel. Steps isolated or marked no_attention,
// inlined values and literals stay out (the group recomputes the last two). Internal
// to codegen/fusion: the Fuser passes its view of the program.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <vector>

#include "codegen/fusion/fuse.h"

namespace sf {

struct AttentionSearch {
  const LocalProgram& p;
  const std::map<int, size_t>& producer;               // value -> the step computing it
  const std::map<int, std::vector<size_t>>& users;     // value -> the steps reading it
  const std::set<size_t>& inlined;                     // steps recomputed where read
  const FusionOptions& opts;
  std::function<bool(const std::set<size_t>&)> cycle;  // whether steps as one kernel make a cycle
};

// Each kernel's steps (indices into p.steps, sorted), in program order of their
// scores' matmul; no step is in two.
std::vector<std::vector<size_t>> find_attention_groups(const AttentionSearch& a);

}  // namespace sf
