// dropout, defined once: its shape rule, and its random numbers from the Philox4x32-10
// counter-based generator
// (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11;
// the generator torch's CUDA random ops and cuRAND use) and how dropout maps a
// global element index to a keep/drop decision. The reference evaluator calls these
// functions; the kernel emitters build the same arithmetic in LLVM IR
// (codegen/kernels/element_dropout.cpp), and tests hold the two together bit for bit.
//
// Counter-based: an element's random word is a pure function of (seed, the element's
// global index), so every rank computes the same bit for the same global element
// whatever the sharding (DTensor's random-op guarantee), and no generator state is
// carried between ops or ranks.
#pragma once

#include <array>
#include <cstdint>

#include "codegen/ir/ops.h"

namespace sf {

// dropout's shape rule (ops.cpp's infer_type calls it): a floating-point x; p in
// [0, 1]; seed >= 0; `origin` and `global_shape` both empty (x is the whole tensor)
// or both of x's rank with 0 <= origin[d] <= global_shape[d] - x.shape[d] and at most
// 2^40 elements in global_shape (x is the block at `origin` of a tensor of
// global_shape: what local_node writes for a rank's shard). OpError otherwise.
TensorType infer_dropout(const TensorType& x, const Attrs& a);

// The global row-major index of element 0 of a dropout node's own tensor, and the
// global strides of its dims: element c has index base + sum(c[d] * strides[d]).
// From `origin` and `global_shape` (their defaults: base 0, x's own strides).
struct DropoutIndex {
  int64_t base = 0;
  std::vector<int64_t> strides;
};
DropoutIndex dropout_index(const Shape& shape, const Attrs& a);

// Philox4x32's constants (the paper's Table 2; Random123's PHILOX_M4x32_0/1 and
// PHILOX_W32_0/1): the round multipliers and the Weyl-sequence key increments.
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kPhiloxRounds = 10;

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32-10: ten rounds, the key bumped by (W0, W1) between rounds. One round is
//   (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2   (32 x 32 -> 64-bit products)
//   c' = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key);

// dropout's random word for the element at global row-major index `index` of a
// tensor: one Philox call gives four words, so four consecutive elements share one
// counter:  counter = (lo32(index / 4), hi32(index / 4), 0, 0),
//           key     = (lo32(seed), hi32(seed)),
//           word    = philox4x32_10(counter, key)[index % 4].
uint32_t dropout_word(uint64_t seed, uint64_t index);

// The uniform number of a word: u = word * 2^-32, exactly (a double holds every
// such value), in [0, 1 - 2^-32]. dropout keeps an element when u >= p, so it drops
// with probability ceil(p * 2^32) / 2^32 (p itself within 2^-32).
inline double dropout_uniform(uint32_t word) { return static_cast<double>(word) * 0x1p-32; }

// The same test in integers, for kernels: u >= p  <=>  word >= ceil(p * 2^32) (p * 2^32
// is exact in a double). In [0, 2^32]: 0 keeps everything (p = 0), 2^32 nothing (p = 1).
// p must be in [0, 1].
uint64_t dropout_threshold(double p);

// What a kept element is multiplied by: 1 / (1 - p) (torch's scale); 0 for p = 1,
// where nothing is kept.
double dropout_scale(double p);

}  // namespace sf
