// One rank's program: local values (each rank's shard of a global value, or a
// redistributed version of it) and the steps that compute them. Collectives are
// asynchronous, as PyTorch's functional collectives are: a Start issues one on
// the rank's comm stream and a Wait makes its result available. Every rank's
// program has the same steps in the same order (SPMD); only shapes differ.
#pragma once

#include <string>
#include <vector>

#include "codegen/dist/redistribute.h"
#include "codegen/ir/graph.h"

namespace sf {

struct LocalStep {
  enum class Kind : uint8_t {
    Compute,     // node on local operands
    Slice,       // keep a block of the operand (Replicate -> Shard), no communication
    Partialize,  // Replicate -> Partial: zeros unless this rank keeps the value
    Start,       // issue a collective on in[0]; completes into `handle`
    Wait,        // out = the result of collective `handle`
  };
  Kind kind = Kind::Compute;
  std::vector<int> in;  // local value ids consumed
  int out = -1;         // local value id produced (Compute, Slice, Partialize, Wait)

  Node node;  // Compute: the op with local types and attributes (node.inputs unused)

  // Start: what to run. sizes/sizes2 are the per-member extents the backend needs:
  //   all_gather: members' extents along dim;  reduce_scatter: each member's kept
  //   extent along dim;  all_to_all: extents sent to each member along dim (split)
  //   and received from each along dim2 (concat) in sizes2.
  RedistKind comm = RedistKind::AllGather;
  int mesh_dim = 0;
  int dim = 0, dim2 = 0;
  ReduceOp op = ReduceOp::Sum;
  std::vector<int64_t> sizes, sizes2;
  int handle = -1;  // Start and its Wait share it

  // Slice: the block kept; Partialize: whether this rank keeps the value.
  std::vector<int64_t> offset;
  Shape shape;
  bool keep = true;
};

struct LocalProgram {
  int rank = 0;
  std::vector<TensorType> types;  // per local value
  std::vector<std::string> names;
  std::vector<LocalStep> steps;
  std::vector<int> param_values;        // per graph param: its local value
  std::vector<int> output_values;       // per graph output
  std::vector<PlacementSpec> output_specs;  // how each output is placed across ranks
  int num_handles = 0;
};

}  // namespace sf
