// The size limits every graph is held to, and the overflow-checked arithmetic that
// enforces them. Element counts, byte counts and mesh sizes are products of
// user-written numbers; an unchecked product wraps (f32[2^62, 4] has "0" elements)
// and every later stage then works on a wrong size: a sum of nothing, a .npy
// header with no data, an allocation of the wrapped size indexed with the real
// one. So these are computed only here, and the verifier refuses any value (a
// param or any op's result) or mesh above the limits. docs/graph-format.md#limits
// states them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/core/mesh.h"
#include "runtime/core/tensor.h"

namespace sf {

// Most dims a tensor may have. PyTorch allows 64; the examples use 4 and a
// reshape to more than 16 dims is a typo in practice, while each dim is a
// per-dim loop or index term in every emitter.
inline constexpr int kMaxRank = 16;
// Most elements one tensor may have: 2^40 (1.1e12). The largest tensor of
// bench/graphs is attention's scores [8, 32, 2048, 2048] = 2^30, so real sizes
// have 1024x headroom; and 2^40 times any dtype size, or times the size of
// a mesh, still fits in 64 bits, so later arithmetic cannot wrap either.
// The same bound holds for each dim and for the product of the non-zero dims
// (a size-0 dim makes the count 0, but strides are products of the other dims).
inline constexpr int64_t kMaxElements = int64_t{1} << 40;
// Most bytes one tensor may have: 2^42 (4 TiB), 2^40 f32 elements; it binds the
// 8-byte dtypes (i64) to 2^39 elements.
inline constexpr int64_t kMaxBytes = int64_t{1} << 42;
// Most ranks a mesh may have (the graph's mesh line, and --world): 1024.
// explain, compile, simulate and run lower every rank's program (fusion decides
// for all ranks together), and each collective in a program lists every group
// member's extent, so that work and memory grow as world^2: transformer_block.sf
// at 1024 ranks takes 2 s and 340 MB to explain and 6 s to compile (a 177 MB
// plan.json); at 4096, 20 s and 3.2 GB to explain. The bench graphs use 8.
inline constexpr int64_t kMaxMeshRanks = 1024;

// a * b, or nullopt when the product does not fit in int64.
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
// a + b, or nullopt when the sum does not fit in int64.
std::optional<int64_t> checked_add(int64_t a, int64_t b);
// The element count of `s`, or nullopt when it does not fit in int64 (or a dim
// is negative).
std::optional<int64_t> checked_numel(const Shape& s);
// The byte count of `t`, or nullopt when it does not fit in int64.
std::optional<int64_t> checked_nbytes(const TensorType& t);
// The product of the mesh's dim sizes, or nullopt when it does not fit in int64.
std::optional<int64_t> checked_world_size(const Mesh& m);

// Why `t` is above the limits (rank, a negative or too large dim, elements,
// bytes), or nullopt when it is within them. The message names the type.
std::optional<std::string> check_type_limits(const TensorType& t);
// Why `m` is above kMaxMeshRanks (or has a dim size < 1), or nullopt.
std::optional<std::string> check_mesh_limits(const Mesh& m);

}  // namespace sf
