// compare(): the tolerance rule worked out by hand.
#include "codegen/reference/compare.h"

#include <gtest/gtest.h>

#include <cmath>

namespace sf {
namespace reference_compare_test {

Tensor f32(std::vector<double> v) {
  Tensor t(DType::F32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
  return t;
}

TEST(Compare, AtolCountsInUnitsOfTheTensorsLargestMagnitude) {
  const Tolerance tol{1e-4, 1e-5};
  // Scale 1 (all |b| <= 1): 0.0011 vs 0.001 is off by 1e-4 > 1e-5 + 1e-4 * 0.001.
  Comparison small = compare(f32({1.0, 0.0011}), f32({1.0, 0.001}), tol);
  EXPECT_EQ(small.mismatches, 1);
  EXPECT_EQ(small.first_mismatch, 1);
  // Scale 1000: the same element may be off by up to 1e-5 * 1000 + 1e-4 * 0.001 = 0.0100001.
  Comparison big = compare(f32({1000.0, 0.0101}), f32({1000.0, 0.0001}), tol);
  EXPECT_EQ(big.mismatches, 0) << "0.01 off is within the scaled atol";
  Comparison too_far = compare(f32({1000.0, 0.0103}), f32({1000.0, 0.0001}), tol);
  EXPECT_EQ(too_far.mismatches, 1) << "0.0102 off is not";
  // The large element itself: rtol 1e-4 * 1000 + 0.01 = 0.11.
  EXPECT_EQ(compare(f32({1000.1, 0.0}), f32({1000.0, 0.0}), tol).mismatches, 0);
  EXPECT_EQ(compare(f32({1000.2, 0.0}), f32({1000.0, 0.0}), tol).mismatches, 1);
}

TEST(Compare, NonFiniteValuesMatchOnlyThemselvesAndDoNotSetTheScale) {
  const Tolerance tol{1e-4, 1e-5};
  EXPECT_EQ(compare(f32({NAN, 1.0}), f32({NAN, 1.0}), tol).mismatches, 0);
  EXPECT_EQ(compare(f32({0.0, 1.0}), f32({NAN, 1.0}), tol).mismatches, 1);
  EXPECT_EQ(compare(f32({INFINITY, 0.5}), f32({INFINITY, 0.5}), tol).mismatches, 0);
  // An infinity in `want` does not make the scale infinite: 0.5 vs 0.6 still differs.
  EXPECT_EQ(compare(f32({INFINITY, 0.6}), f32({INFINITY, 0.5}), tol).mismatches, 1);
}

TEST(Compare, DifferentTypesMismatchEverywhere) {
  Tensor a(DType::F32, {2}), b(DType::F32, {3});
  Comparison c = compare(a, b, default_tolerance(DType::F32));
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.mismatches, 3);
}

}  // namespace reference_compare_test
}  // namespace sf
