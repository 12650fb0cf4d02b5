// dtype conversions: f16 and bf16 round to nearest even, keep NaN and Inf, and
// handle subnormals; expected bit patterns are from the IEEE 754 formats by hand.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"

namespace sf {
namespace ir_dtype_test {

TEST(DType, NamesRoundTrip) {
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("f64"), std::nullopt);
  EXPECT_EQ(dtype_size(DType::BF16), 2);
  EXPECT_EQ(dtype_size(DType::Bool), 1);
  EXPECT_EQ(dtype_size(DType::I64), 8);
}

TEST(DType, PromotionFollowsTorch) {
  EXPECT_EQ(promote(DType::F16, DType::BF16), DType::F32);
  EXPECT_EQ(promote(DType::I32, DType::F16), DType::F16);
  EXPECT_EQ(promote(DType::I32, DType::I64), DType::I64);
  EXPECT_EQ(promote(DType::Bool, DType::I32), DType::I32);
  EXPECT_EQ(promote(DType::BF16, DType::F32), DType::F32);
}

struct F16Case {
  float in;
  uint16_t bits;
};

TEST(F16, RoundsToNearestEven) {
  const float ulp1 = std::ldexp(1.0f, -10);  // spacing of halves in [1, 2)
  const F16Case cases[] = {
      {1.0f, 0x3C00},
      {-2.0f, 0xC000},
      {65504.0f, 0x7BFF},                   // largest finite half
      {65519.0f, 0x7BFF},                   // below the midpoint to 65536: stays
      {65520.0f, 0x7C00},                   // the midpoint rounds to even = Inf
      {1.0f + ulp1 / 2, 0x3C00},            // tie, even neighbour is 1.0
      {1.0f + ulp1 * 1.5f, 0x3C02},         // tie, even neighbour is 1 + 2 ulp
      {1.0f + ulp1 * 0.75f, 0x3C01},        // above the tie
      {std::ldexp(1.0f, -24), 0x0001},      // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},      // half of it: tie to even (0)
      {std::ldexp(1.5f, -25), 0x0001},      // above the tie
      {std::ldexp(3.0f, -25), 0x0002},      // 1.5 subnormal units: tie to even (2)
      {std::ldexp(1.0f, -14), 0x0400},      // smallest normal
      {std::ldexp(1023.5f, -24), 0x0400},   // subnormal rounding up into the normals
      {-0.0f, 0x8000},
      {std::numeric_limits<float>::infinity(), 0x7C00},
      {-std::numeric_limits<float>::infinity(), 0xFC00},
      {1e10f, 0x7C00},
  };
  for (const F16Case& c : cases) {
    EXPECT_EQ(f32_to_f16_bits(c.in), c.bits) << "for " << c.in;
  }
}

TEST(F16, DecodesEveryPatternAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    float f = f16_bits_to_f32(static_cast<uint16_t>(b));
    bool is_nan = ((b >> 10) & 0x1F) == 0x1F && (b & 0x3FF);
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << b;
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f)))) << b;
    } else {
      EXPECT_EQ(f32_to_f16_bits(f), b) << "pattern " << b << " value " << f;
    }
  }
  EXPECT_EQ(f16_bits_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(BF16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3F80);
  // 1 + 2^-8 is the tie between 1 and 1 + 2^-7: even is 1.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8 is the tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to Inf
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must not become Inf.
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_EQ(bf16_bits_to_f32(0xC040), -3.0f);
}

TEST(RoundToDtype, DirectFromDoubleWithoutDoubleRounding) {
  // 1 + 2^-11 + 2^-40 is just above the f16 tie between 1 and 1 + 2^-10. Through
  // float it would first round to the tie 1 + 2^-11 and then to even (1.0): wrong.
  double v = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(round_to_dtype(v, DType::F16), 1.0 + std::ldexp(1.0, -10));
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -11), DType::F16), 1.0);
  EXPECT_EQ(round_to_dtype(65520.0, DType::F16), std::numeric_limits<double>::infinity());
  EXPECT_EQ(round_to_dtype(-65519.0, DType::F16), -65504.0);
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -8), DType::BF16), 1.0);
  EXPECT_EQ(round_to_dtype(0.1, DType::F32), static_cast<double>(0.1f));
  EXPECT_EQ(round_to_dtype(-2.7, DType::I32), -2.0);
  EXPECT_EQ(round_to_dtype(3e10, DType::I32), 2147483647.0);
  EXPECT_EQ(round_to_dtype(std::nan(""), DType::I64), 0.0);
  EXPECT_EQ(round_to_dtype(0.25, DType::Bool), 1.0);
  EXPECT_TRUE(std::isnan(round_to_dtype(std::nan(""), DType::BF16)));
}

TEST(Tensor, StoresNativeLayout) {
  Tensor t(DType::F16, {2, 3});
  EXPECT_EQ(t.nbytes(), 12u);
  t.set(4, 1.0 + std::ldexp(1.0, -12));  // rounds to 1.0
  EXPECT_EQ(t.get(4), 1.0);
  uint16_t raw;
  std::memcpy(&raw, t.data() + 8, 2);
  EXPECT_EQ(raw, 0x3C00);

  Tensor i(DType::I64, {2});
  i.set_int(1, (int64_t{1} << 60) + 1);  // not representable in a double
  EXPECT_EQ(i.get_int(1), (int64_t{1} << 60) + 1);

  Tensor e(DType::F32, {3, 0});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
}

}  // namespace ir_dtype_test
}  // namespace sf

namespace sf {
namespace ir_dtype_test {

TEST(Tensor, IntegerConversionsSaturateAndRoundOnce) {
  Tensor i(DType::I64, {3});
  i.set(0, 1e300);  // >= 2^63: saturates (a plain cast would be UB)
  i.set(1, -1e300);
  i.set(2, std::nan(""));
  EXPECT_EQ(i.get_int(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i.get_int(1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i.get_int(2), 0);

  Tensor f(DType::F32, {2});
  f.set(0, std::numeric_limits<double>::infinity());
  EXPECT_EQ(f.get_int(0), std::numeric_limits<int64_t>::max());
  // 2^60 + 2^36 + 1 is just above the f32 tie between 2^60 and 2^60 + 2^37; through a
  // plain double it becomes the tie 2^60 + 2^36 and rounds to even (2^60): wrong.
  f.set_int(1, (int64_t{1} << 60) + (int64_t{1} << 36) + 1);
  EXPECT_EQ(f.get(1), std::ldexp(1.0, 60) + std::ldexp(1.0, 37));
  EXPECT_EQ(i64_to_double_round_odd(-5), -5.0);
}

}  // namespace ir_dtype_test
}  // namespace sf
