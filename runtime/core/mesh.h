// The graph-level view of a device mesh and of DTensor placements: what a `.sf`
// file can say. codegen/dist builds rank coordinates and groups on top of this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sf {

struct MeshDim {
  std::string name;
  int64_t size = 1;
  bool operator==(const MeshDim&) const = default;
};

// Named mesh dimensions, outermost first (`mesh dp=2 tp=2`). Empty = one rank.
struct Mesh {
  std::vector<MeshDim> dims;

  int64_t world_size() const;
  std::optional<int> find(std::string_view name) const;
  std::string str() const;  // "dp=2 tp=2", or "" for the 1-rank mesh
  bool operator==(const Mesh&) const = default;
};

enum class ReduceOp : uint8_t { Sum, Max, Min, Avg };
std::string_view reduce_op_name(ReduceOp op);
std::optional<ReduceOp> parse_reduce_op(std::string_view name);

struct Placement {
  enum class Kind : uint8_t { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;               // Shard: tensor dim as written (may be negative)
  ReduceOp op = ReduceOp::Sum;   // Partial

  static Placement replicate() { return {}; }
  static Placement shard(int64_t d) { return {Kind::Shard, d, ReduceOp::Sum}; }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, 0, op}; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_partial() const { return kind == Kind::Partial; }
  std::string str() const;  // R, S(0), P, P(max)
  bool operator==(const Placement&) const = default;
};

// One placement per mesh dim, by mesh-dim index (a dim the text does not name is R).
struct PlacementSpec {
  std::vector<Placement> per_dim;

  // `{tp: S(0)}` with the mesh's names; dims that are R are left out, and an all-R
  // spec names every dim (`{dp: R, tp: R}`).
  std::string str(const Mesh& mesh) const;
  bool operator==(const PlacementSpec&) const = default;
};

// The inverse of PlacementSpec::str: `{tp: S(0)}`, `{dp: R, tp: P(max)}` over
// `mesh`'s dim names (a Plan's input_specs and output_specs). nullopt for any other
// text: an unknown or repeated dim name, a placement other than R, S(int), P or
// P(op), a stray character. Shard dims are not checked against a rank here.
std::optional<PlacementSpec> parse_placement_spec(std::string_view text, const Mesh& mesh);

}  // namespace sf
