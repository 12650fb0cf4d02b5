#include "codegen/ir/limits.h"

namespace sf {

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<int64_t> checked_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) return std::nullopt;
    std::optional<int64_t> m = checked_mul(n, d);
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

std::optional<int64_t> checked_nbytes(const TensorType& t) {
  std::optional<int64_t> n = checked_numel(t.shape);
  if (!n) return std::nullopt;
  return checked_mul(*n, static_cast<int64_t>(dtype_size(t.dtype)));
}

std::optional<int64_t> checked_world_size(const Mesh& m) {
  int64_t n = 1;
  for (const MeshDim& d : m.dims) {
    if (d.size < 0) return std::nullopt;
    std::optional<int64_t> p = checked_mul(n, d.size);
    if (!p) return std::nullopt;
    n = *p;
  }
  return n;
}

namespace {
std::string pow2(int64_t v) {
  int k = 0;
  while ((int64_t{1} << k) < v) ++k;
  return "2^" + std::to_string(k);
}
}  // namespace

std::optional<std::string> check_type_limits(const TensorType& t) {
  // Printed with its shape only when that is short: a 10000-dim reshape target
  // would make a message of 60 KB.
  auto name = [&] { return t.rank() <= kMaxRank ? t.str() : std::string(dtype_name(t.dtype)) + "[...]"; };
  if (t.rank() > kMaxRank)
    return "a value of " + std::to_string(t.rank()) + " dims is above the limit of " + std::to_string(kMaxRank) +
           " dims";
  // Each dim, and the product of the non-zero dims, within kMaxElements: a
  // size-0 tensor's strides are products of its other dims.
  int64_t extent = 1;
  bool empty = false;
  for (int64_t d : t.shape) empty |= d == 0;
  for (int64_t d : t.shape) {
    if (d < 0) return name() + " has the negative dim " + std::to_string(d);
    if (d > kMaxElements)
      return name() + ": dim " + std::to_string(d) + " is above the limit of " + pow2(kMaxElements) +
             " elements per tensor";
    if (d == 0) continue;
    if (extent > kMaxElements / d)  // extent * d > kMaxElements, tested without the product
      return name() + (empty ? ": the product of its non-zero dims is above " : " has more than ") +
             pow2(kMaxElements) + (empty ? ", the limit of elements per tensor" : " elements (the limit per tensor)");
    extent *= d;
  }
  std::optional<int64_t> bytes = checked_nbytes(t);
  if (!bytes || *bytes > kMaxBytes)
    return name() + " has more than " + pow2(kMaxBytes) + " bytes (the limit per tensor)";
  return std::nullopt;
}

std::optional<std::string> check_mesh_limits(const Mesh& m) {
  for (const MeshDim& d : m.dims)
    if (d.size < 1)
      return "mesh dimension '" + d.name + "' has size " + std::to_string(d.size) + " (expected >= 1)";
  std::optional<int64_t> w = checked_world_size(m);
  if (!w || *w > kMaxMeshRanks)
    return "mesh '" + m.str() + "' has " + (w ? std::to_string(*w) : std::string("more than 2^63 - 1")) +
           " ranks, above the limit of " + std::to_string(kMaxMeshRanks);
  return std::nullopt;
}

}  // namespace sf
