// IEEE half-precision formats for the stand-in libraries (tests/fake_nccl reduces
// f16/bf16 buffers, tests/fake_cublas multiplies them): bit patterns to and from
// doubles, exactly, rounding once to nearest even.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace fake {

// IEEE binary formats with `e` exponent and `m` mantissa bits (f16: 5, 10; bf16: 8, 7).
inline double decode(uint32_t bits, int e, int m) {
  const uint32_t exp = (bits >> m) & ((1u << e) - 1);
  const uint32_t mant = bits & ((1u << m) - 1);
  const int bias = (1 << (e - 1)) - 1;
  double v;
  if (exp == (1u << e) - 1) {
    v = mant ? std::nan("") : HUGE_VAL;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - m);
  } else {
    v = std::ldexp(static_cast<double>(mant + (1u << m)), static_cast<int>(exp) - bias - m);
  }
  return (bits >> (e + m)) & 1 ? -v : v;
}

// Rounds once, to nearest even, straight from the double (rounding through float
// first could round twice).
inline uint32_t encode(double v, int e, int m) {
  const uint32_t sign = std::signbit(v) ? 1u << (e + m) : 0;
  const uint32_t inf = ((1u << e) - 1) << m;
  if (std::isnan(v)) return sign | inf | (1u << (m - 1));
  const double a = std::fabs(v);
  if (a == 0) return sign;
  const int bias = (1 << (e - 1)) - 1;
  const int emin = 1 - bias;
  int x = 0;
  std::frexp(a, &x);  // a = f * 2^x, f in [0.5, 1)
  const int ex = x - 1;
  if (ex > bias) return sign | inf;
  // Whole multiples of the format's quantum at this exponent; nearbyint rounds to
  // nearest even (the default rounding mode). A subnormal that rounds up to 2^m
  // is exactly the smallest normal's encoding.
  const double r = std::nearbyint(std::ldexp(a, -(std::max(ex, emin) - m)));
  const uint64_t q = static_cast<uint64_t>(r);
  if (ex < emin) return sign | static_cast<uint32_t>(q);
  uint64_t biased = static_cast<uint64_t>(ex + bias);
  uint64_t mant = q - (uint64_t{1} << m);
  if (q == uint64_t{1} << (m + 1)) ++biased, mant = 0;  // rounded up into the next binade
  if (biased >= (1u << e) - 1) return sign | inf;
  return sign | static_cast<uint32_t>(biased << m) | static_cast<uint32_t>(mant);
}

}  // namespace fake
