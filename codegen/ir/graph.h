// The graph: nodes in topological order, each producing one value. A Graph is
// immutable and exists only once the verifier has accepted it (GraphBuilder::finish).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/diag.h"
#include "runtime/core/mesh.h"
#include "codegen/ir/ops.h"
#include "runtime/core/tensor.h"

namespace sf {

using ValueId = int32_t;

struct Node {
  OpKind op = OpKind::Param;
  std::vector<ValueId> inputs;
  Attrs attrs;
  TensorType type;
  std::string name;  // empty: an anonymous value (a nested call in the text)
  // Params: the parameter's placement. Others: a sharding constraint the value is
  // redistributed to, as `h = matmul(...) {tp: S(1)}` says.
  std::optional<PlacementSpec> placement;
  SourceLoc loc;
};

struct Output {
  ValueId value = -1;
  std::string name;  // the returned value's name, or out<i> for an anonymous value
  std::optional<PlacementSpec> placement;
  SourceLoc loc;
};

class Graph {
 public:
  const std::string& name() const { return name_; }
  const Mesh& mesh() const { return mesh_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(ValueId v) const { return nodes_[static_cast<size_t>(v)]; }
  const std::vector<ValueId>& params() const { return params_; }
  const std::vector<Output>& outputs() const { return outputs_; }
  // Number of nodes that are ops (not params or constants).
  int op_count() const;
  // How many times each value is used (as an operand or an output).
  std::vector<int> use_counts() const;

 private:
  friend class GraphBuilder;
  std::string name_;
  Mesh mesh_;
  std::vector<Node> nodes_;
  std::vector<ValueId> params_;
  std::vector<Output> outputs_;
};

// Checks the invariants every pass may rely on: operands defined before use, every
// node's type equal to its op's shape rule, attributes complete, names unique,
// placements valid for the mesh and the value's rank, at least one output.
// Returns nullopt when the graph is well formed.
Result<void> verify(const Graph& g);

// Validates a placement spec for a value of `rank` on `mesh`; the message names the
// offending placement. Shared by the builder, the verifier and the parser.
std::optional<std::string> check_placements(const PlacementSpec& spec, const Mesh& mesh, int rank);

}  // namespace sf
