// Internal to the collective-matmul decomposition (collective_matmul.h): what its files share.
//
// collective_matmul_match.cpp: reading a program, and the three patterns (all_gather
// -> matmul, matmul -> reduce_scatter, matmul -> all_reduce);
// collective_matmul_rewrite.cpp: the rings that replace them, and splitting an
// all_reduce into reduce_scatter + all_gather; collective_matmul.cpp: the estimates
// that decide, and decompose_collective_matmuls. Only these files include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codegen/fusion/collective_matmul.h"

namespace sf::collective_matmul_detail {

// ---- reading a program (collective_matmul_match.cpp) --------------------------------

int rank_of(const TensorType& t);

struct Uses {
  std::map<int, std::vector<size_t>> users;  // value -> steps reading it
  std::map<int, size_t> producer;
  std::set<int> outputs;
};

Uses uses_of(const LocalProgram& p);
// The step waiting on `handle`, or p.steps.size() when none does.
size_t wait_of(const LocalProgram& p, int handle);

// --- all_gather -> matmul ----------------------------------------------------------

// A run of row-wise compute steps, each consuming the previous one's result.
struct Chain {
  std::vector<size_t> steps;
  std::vector<int> dims;  // per step: its output's shard dim
  bool has_matmul = false;
};

struct AgMatch {
  size_t start = 0, wait = 0;
  // Row-wise ops every consumer shares (a cast, say), then one branch per consumer
  // of their result (Megatron's q, k and v projections), each with one matmul.
  Chain prefix;
  std::vector<Chain> branches;
  std::vector<size_t> all_steps() const {
    std::vector<size_t> v = prefix.steps;
    for (const Chain& b : branches) v.insert(v.end(), b.steps.begin(), b.steps.end());
    return v;
  }
  std::string what(const LocalProgram& p) const {
    std::string w;
    for (const Chain& b : branches)
      w += (w.empty() ? "" : ", ") + p.names[static_cast<size_t>(p.steps[b.steps.back()].out)];
    return w;
  }
};

std::optional<AgMatch> match_all_gather(const LocalProgram& p, size_t start, std::string* why);

// --- matmul -> reduce_scatter ------------------------------------------------------

// Where a term of `out_rank` dims is cut for a chunk along dim `d` of the result:
// its own dim, or -1 when it broadcasts along d (absent or of extent 1).
int term_dim(const TensorType& t, int out_rank, int d);

struct RsMatch {
  size_t matmul = 0, start = 0, wait = 0;
  int lhs_dim = 0;  // the scattered dim, as a dim of the matmul's left operand
  std::vector<size_t> adds;  // terms added to the matmul's result before the collective
  std::vector<int> terms;
};

std::optional<RsMatch> match_reduce_scatter(const LocalProgram& p, size_t start, std::string* why);

// --- matmul -> all_reduce ----------------------------------------------------------

// An all_reduce(sum) of a matmul's result, which could become a reduce_scatter
// (decomposed into the matmul's ring) followed by an all_gather.
struct ArMatch {
  size_t matmul = 0, start = 0, wait = 0;
  std::vector<size_t> adds;  // terms added to the matmul's result first
  int dim = 0;  // the dim to scatter and gather: the matmul's output row dim (M)
};

std::optional<ArMatch> match_all_reduce(const LocalProgram& p, size_t start);

// ---- rewriting (collective_matmul_rewrite.cpp) --------------------------------------

void rewrite_all_gather(LocalProgram& p, const AgMatch& m, int pos);
void rewrite_reduce_scatter(LocalProgram& p, const RsMatch& m, int pos);
size_t split_all_reduce(LocalProgram& p, const ArMatch& m, int pos, int n);
void drop_dead_concats(LocalProgram& p);

}  // namespace sf::collective_matmul_detail
