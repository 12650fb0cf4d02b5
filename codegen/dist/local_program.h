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
#include "runtime/core/kernel_kind.h"

namespace sf {

struct LocalStep {
  enum class Kind : uint8_t {
    Compute,     // node on local operands
    Slice,       // keep a block of the operand (Replicate -> Shard), no communication
    Partialize,  // Replicate -> Partial: zeros unless this rank keeps the value
    Start,       // issue a collective on in[0]; completes into `handle`
    Wait,        // out = the result of collective `handle`
    Kernel,      // fused kernel `kernel` on in, producing outs
    Concat,      // out = the `in` values joined along `dim`, in order (a decomposed
                 // all_gather -> matmul assembling its per-shard results)
  };
  Kind kind = Kind::Compute;
  std::vector<int> in;  // local value ids consumed
  int out = -1;         // local value id produced (Compute, Slice, Partialize, Wait)

  Node node;  // Compute: the op with local types and attributes (node.inputs unused)

  // Start: what to run. sizes/sizes2 are the per-member extents the backend needs:
  //   all_gather: members' extents along dim;  reduce_scatter: each member's kept
  //   extent along dim;  all_to_all: extents sent to each member along dim (split)
  //   and received from each along dim2 (concat) in sizes2.
  CollectiveKind collective = CollectiveKind::AllGather;
  int mesh_dim = 0;
  int dim = 0, dim2 = 0;
  ReduceOp op = ReduceOp::Sum;
  std::vector<int64_t> sizes, sizes2;
  int handle = -1;  // Start and its Wait share it
  // Start: one step of a decomposed collective matmul (an all_to_all with one
  // chunk, sent to the member `ring_to` places on in the group: -1, the previous
  // member, in an all-gather's ring; +step in a reduce-scatter, the chunk's owner);
  // ring_step counts from 1.
  int ring_step = 0, ring_steps = 0, ring_to = 0;

  // Slice: the block kept; Partialize: whether this rank keeps the value.
  std::vector<int64_t> offset;
  Shape shape;
  bool keep = true;

  // Kernel: which of LocalProgram::kernels, and the values it writes (in the order
  // of the kernel group's outputs).
  int kernel = -1;
  std::vector<int> outs;
};

// A fused kernel: a group of primitive ops on local shapes, as a Graph whose params
// are the kernel's inputs and whose outputs are what it writes (codegen/kernels/
// emitter.h describes how it becomes code).
struct LocalKernel {
  std::string name;
  KernelKind kind = KernelKind::Pointwise;
  Graph group;
  int64_t bytes_read = 0, bytes_written = 0, flops = 0;
  int64_t bytes_saved = 0;  // traffic of the intermediates fusion kept on chip
  std::vector<std::string> ops;  // the ops fused, in order, for explain
  std::vector<size_t> steps;     // the steps it replaced, as indices into the unfused program
};

// The key that names a distinct kernel: its kind and its group's text (ranks with
// equal local shapes share one; the Plan, the host JIT and --dump-after dedupe by it).
std::string kernel_key(const LocalKernel& k);

struct LocalProgram {
  int rank = 0;
  std::vector<TensorType> types;  // per local value
  std::vector<std::string> names;
  std::vector<LocalStep> steps;
  std::vector<int> param_values;        // per graph param: its local value
  std::vector<int> output_values;       // per graph output
  std::vector<PlacementSpec> output_specs;  // how each output is placed across ranks
  int num_handles = 0;
  std::vector<LocalKernel> kernels;
};

}  // namespace sf
