#include "runtime/core/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace sf {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "bool";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

int dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::Bool: return 1;
  }
  return 0;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
bool is_integer(DType t) { return t == DType::I32 || t == DType::I64; }

static int promote_rank(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::I32: return 1;
    case DType::I64: return 2;
    case DType::F16: return 3;
    case DType::BF16: return 3;
    case DType::F32: return 4;
  }
  return 0;
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16))
    return DType::F32;
  return promote_rank(a) >= promote_rank(b) ? a : b;
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xFFu;
  uint32_t man = x & 0x7FFFFFu;
  if (exp == 0xFF) {  // Inf or NaN; NaN keeps a quiet bit so it stays NaN.
    return static_cast<uint16_t>(sign | 0x7C00u | (man ? 0x0200u | (man >> 13) : 0u));
  }
  // Unbiased exponent; half has bias 15, float 127.
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1F) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> Inf
  if (e <= 0) {
    // Subnormal half (or zero). The value is man_full * 2^(exp-150); a half
    // subnormal unit is 2^-24, so shift right by (126 - exp) - 0 ... = 1 - e + 13.
    if (e < -10) return sign;  // below half the smallest subnormal: rounds to 0
    uint32_t m = man | 0x800000u;
    int shift = 14 - e;  // 13 for the mantissa width difference, 1 - e for denormalising
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);  // a carry into bit 10 gives the min normal
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (man >> 13);
  uint32_t rem = man & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // carry may reach Inf: correct
  return static_cast<uint16_t>(sign | half);
}

float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float.
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

uint16_t f32_to_bf16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu))  // NaN: keep it quiet
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7FFFu + lsb;  // round to nearest even; overflow carries into Inf correctly
  return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Rounds to a binary float format with `mbits` stored mantissa bits, smallest normal
// exponent `emin` and largest finite value `max`, ties to even (nearbyint under the
// default rounding mode).
static double round_to_format(double v, int mbits, int emin, double max) {
  if (std::isnan(v) || std::isinf(v) || v == 0.0) return v;
  int e = std::max(std::ilogb(v), emin);
  double quantum = std::ldexp(1.0, e - mbits);
  double r = std::nearbyint(v / quantum) * quantum;
  if (std::fabs(r) > max) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

double round_to_dtype(double v, DType t) {
  switch (t) {
    case DType::F32: return static_cast<double>(static_cast<float>(v));
    // Rounded from the double directly: going through float first would round twice
    // and can land on the wrong neighbour when the float lands exactly on a tie.
    case DType::F16: return round_to_format(v, 10, -14, 65504.0);
    case DType::BF16: return round_to_format(v, 7, -126, 3.3895313892515355e38);
    case DType::Bool: return v != 0.0 ? 1.0 : 0.0;
    case DType::I32:
    case DType::I64: {
      if (std::isnan(v)) return 0.0;
      double lo = t == DType::I32 ? -2147483648.0 : -9223372036854775808.0;
      double hi = t == DType::I32 ? 2147483647.0 : 9223372036854775807.0;
      return std::trunc(std::fmin(std::fmax(v, lo), hi));
    }
  }
  return v;
}

int64_t saturating_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 0x1p63) return std::numeric_limits<int64_t>::max();
  if (v < -0x1p63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

double i64_to_double_round_odd(int64_t v) {
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  int width = std::bit_width(u);
  if (width > 53) {
    int shift = width - 53;
    uint64_t kept = u >> shift << shift;
    if (kept != u) kept |= uint64_t{1} << shift;  // sticky: dropped bits were not all zero
    u = kept;
  }
  double d = static_cast<double>(u);  // exact: at most 53 significant bits
  return v < 0 ? -d : d;
}

}  // namespace sf
