// Structure-aware graph generation for tests/fuzz/pipeline_fuzz.cpp: turns fuzz
// bytes into the text of a small graph that `check` is likely to accept.
//
// Every decision (mesh, params, ops, attributes, placements) is read from the bytes,
// so libFuzzer's mutations change the graph's structure rather than its spelling.
// Ops come from the op table (ops.def); each statement is kept only when the op
// table's own type rule (normalize_attrs + infer_type) accepts it, so almost every
// input yields a graph the verifier accepts. Operands a statement needs in a given
// shape (a matmul's right-hand side, a norm's weight) are new params made to fit.
#pragma once

#include <cstdint>
#include <string>

namespace sf::fuzz {

struct GenOptions {
  int max_statements = 8;
  int max_dim = 6;     // each tensor dim is 0..max_dim (0 rarely)
  int max_rank = 3;    // params' rank; views may add one
  int max_world = 4;   // ranks of the mesh
  // Explicit per-rank collectives (all_gather, reduce_scatter, all_reduce,
  // all_to_all) are off by default: `check` refuses them at the op (a graph is
  // global), so a graph holding one is only a rejected input. `redistribute`, the
  // global-view op, is generated.
  bool explicit_collectives = false;
};

// The graph text, and the pipeline choices the same bytes make (so one input file
// reproduces a whole run).
struct GeneratedCase {
  std::string text;
  uint64_t seed = 0;         // random inputs
  bool fuse = true;          // --no-fuse when false
  bool reorder = true;       // --no-reorder when false
  int decompose = 0;         // 0 auto, 1 always, 2 never
};

GeneratedCase generate_graph(const uint8_t* data, size_t size, const GenOptions& opts = {});

}  // namespace sf::fuzz
