#include "codegen/ir/dropout.h"

#include <cmath>
#include <string>

#include "codegen/ir/limits.h"

namespace sf {

namespace {

[[noreturn]] void fail(std::string msg) { throw OpError{"dropout: " + std::move(msg)}; }

PhiloxCounter round_of(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = uint64_t{kPhiloxM0} * c[0], p1 = uint64_t{kPhiloxM1} * c[2];
  const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

TensorType infer_dropout(const TensorType& x, const Attrs& a) {
  if (!is_float(x.dtype)) throw OpError{"dropout expects a floating-point operand, got " + x.str() + " (cast it first)"};
  const double p = a.get_float("p");
  // torch: "dropout probability has to be between 0 and 1"; NaN fails this test too.
  if (!(p >= 0.0 && p <= 1.0))
    fail("p must be in [0, 1] (the probability of zeroing an element), got " + attr_value_str(AttrValue(p), Mesh{}));
  if (a.get_int("seed") < 0)
    fail("seed must be a non-negative integer (a Philox key), got " + std::to_string(a.get_int("seed")));
  const std::vector<int64_t>& origin = a.get_ints("origin");
  const std::vector<int64_t>& global = a.get_ints("global_shape");
  if (origin.empty() && global.empty()) return x;
  const auto rank = static_cast<size_t>(x.rank());
  if (origin.size() != rank || global.size() != rank)
    fail("origin " + shape_str(origin) + " and global_shape " + shape_str(global) + " must both have " +
         std::to_string(rank) + " entries (the rank of " + x.str() + "), or both be left out");
  // The tensor limits (each dim and the product of the non-zero dims below 2^40) keep
  // every global index and stride in range.
  if (std::optional<std::string> why = check_type_limits(TensorType{x.dtype, global}))
    fail("global_shape: " + *why);
  for (size_t d = 0; d < rank; ++d)
    if (origin[d] < 0 || global[d] < x.shape[d] || origin[d] > global[d] - x.shape[d])
      fail("the block of " + x.str() + " at origin " + shape_str(origin) + " does not lie inside global_shape " +
           shape_str(global) + " (dim " + std::to_string(d) + ")");
  return x;
}

DropoutIndex dropout_index(const Shape& shape, const Attrs& a) {
  const std::vector<int64_t>& origin = a.get_ints("origin");
  const std::vector<int64_t>& global = a.get_ints("global_shape");
  DropoutIndex r{0, contiguous_strides(global.empty() ? shape : global)};
  // Below 2^40 (the shape rule's bound on global_shape): no overflow.
  for (size_t d = 0; d < origin.size(); ++d) r.base += origin[d] * r.strides[d];
  return r;
}

PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int r = 0; r < kPhiloxRounds; ++r) {
    if (r > 0) {
      key[0] += kPhiloxW0;  // unsigned: modulo 2^32
      key[1] += kPhiloxW1;
    }
    ctr = round_of(ctr, key);
  }
  return ctr;
}

uint32_t dropout_word(uint64_t seed, uint64_t index) {
  const uint64_t n = index >> 2;
  const PhiloxCounter ctr{static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), 0, 0};
  const PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return philox4x32_10(ctr, key)[index & 3];
}

uint64_t dropout_threshold(double p) { return static_cast<uint64_t>(std::ceil(p * 0x1p32)); }

double dropout_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

}  // namespace sf
