#include "runtime/core/mesh.h"

#include <cctype>
#include <charconv>

namespace sf {

int64_t Mesh::world_size() const {
  int64_t n = 1;
  for (const MeshDim& d : dims) n *= d.size;
  return n;
}

std::optional<int> Mesh::find(std::string_view name) const {
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].name == name) return static_cast<int>(i);
  return std::nullopt;
}

std::string Mesh::str() const {
  std::string s;
  for (const MeshDim& d : dims) {
    if (!s.empty()) s += ' ';
    s += d.name + "=" + std::to_string(d.size);
  }
  return s;
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg})
    if (reduce_op_name(op) == name) return op;
  return std::nullopt;
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate: return "R";
    case Kind::Shard: return "S(" + std::to_string(dim) + ")";
    case Kind::Partial:
      return op == ReduceOp::Sum ? "P" : "P(" + std::string(reduce_op_name(op)) + ")";
  }
  return "?";
}

std::string PlacementSpec::str(const Mesh& mesh) const {
  std::string s = "{";
  bool first = true;
  for (size_t i = 0; i < per_dim.size() && i < mesh.dims.size(); ++i) {
    if (per_dim[i].is_replicate()) continue;
    if (!first) s += ", ";
    first = false;
    s += mesh.dims[i].name + ": " + per_dim[i].str();
  }
  if (first) {  // all replicated: say so for every dim rather than print `{}`
    for (size_t i = 0; i < mesh.dims.size(); ++i) s += (i ? ", " : "") + mesh.dims[i].name + ": R";
  }
  return s + "}";
}

namespace {

// A cursor over the spec's text; every reader returns false at the first mismatch.
struct SpecText {
  std::string_view s;
  size_t at = 0;
  void space() {
    while (at < s.size() && s[at] == ' ') ++at;
  }
  bool eat(char c) {
    space();
    if (at >= s.size() || s[at] != c) return false;
    ++at;
    return true;
  }
  std::string_view word() {
    space();
    size_t b = at;
    while (at < s.size() && (std::isalnum(static_cast<unsigned char>(s[at])) || s[at] == '_')) ++at;
    return s.substr(b, at - b);
  }
  bool integer(int64_t* v) {
    space();
    size_t b = at;
    if (at < s.size() && s[at] == '-') ++at;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
    auto [p, ec] = std::from_chars(s.data() + b, s.data() + at, *v);
    return ec == std::errc() && p == s.data() + at && at > b;
  }
};

}  // namespace

std::optional<PlacementSpec> parse_placement_spec(std::string_view text, const Mesh& mesh) {
  SpecText t{text};
  PlacementSpec spec;
  spec.per_dim.assign(mesh.dims.size(), Placement::replicate());
  std::vector<bool> seen(mesh.dims.size(), false);
  if (!t.eat('{')) return std::nullopt;
  bool first = true;
  while (!t.eat('}')) {
    if (!first && !t.eat(',')) return std::nullopt;
    first = false;
    std::optional<int> d = mesh.find(t.word());
    if (!d || seen[static_cast<size_t>(*d)] || !t.eat(':')) return std::nullopt;
    seen[static_cast<size_t>(*d)] = true;
    Placement& p = spec.per_dim[static_cast<size_t>(*d)];
    std::string_view kind = t.word();
    if (kind == "R") {
      p = Placement::replicate();
    } else if (kind == "S") {
      int64_t dim = 0;
      if (!t.eat('(') || !t.integer(&dim) || !t.eat(')')) return std::nullopt;
      p = Placement::shard(dim);
    } else if (kind == "P") {
      p = Placement::partial(ReduceOp::Sum);
      if (t.eat('(')) {
        std::optional<ReduceOp> op = parse_reduce_op(t.word());
        if (!op || !t.eat(')')) return std::nullopt;
        p = Placement::partial(*op);
      }
    } else {
      return std::nullopt;
    }
  }
  t.space();
  if (t.at != text.size()) return std::nullopt;
  return spec;
}

}  // namespace sf
