// The reference semantics of dropout (F.dropout in training mode with shardfuse's
// counter-based mask, codegen/ir/dropout.h): values worked out from the published
// Philox known answers, the kept fraction over 1e5 elements, the scale, the p = 0 and
// p = 1 edges, seeds, and a block evaluated at its origin inside a larger tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_dropout_test {

using test::finish;
using test::run;
using test::tensor;
using test::values;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor one_dropout(const Tensor& x, double p, int64_t seed) {
  GraphBuilder b("d");
  b.ret(dropout(b.param("x", x.dtype(), x.shape()), p, seed));
  return run(finish(b), {x})[0];
}

// Seed 0's first four elements are lanes 0..3 of Philox4x32-10 at counter 0, key 0:
// Random123's known answer 6627e8d5 e169c58d bc57ac4c 9b00dbd8, that is
// u = 0.39905, 0.88052, 0.73571, 0.60548 (word / 2^32). Kept where u >= p.
TEST(EvaluateDropout, FirstElementsOfSeedZeroFollowTheKnownAnswer) {
  const Tensor x = tensor(DType::F32, {4}, {3, -5, 0.5, 7});
  EXPECT_EQ(values(one_dropout(x, 0.5, 0)), (std::vector<double>{0, -10, 1, 14}));    // 0.399 < 0.5
  EXPECT_EQ(values(one_dropout(x, 0.75, 0)), (std::vector<double>{0, -20, 0, 0}));    // only 0.880
  EXPECT_EQ(values(one_dropout(x, 0.6, 0)), (std::vector<double>{0, -12.5, 1.25, 17.5}));  // 0.6055 >= 0.6
  // The same in bf16 (x * 2 is exact there too), from a 2-D tensor read row-major.
  const Tensor y = tensor(DType::BF16, {2, 2}, {3, -5, 0.5, 7});
  EXPECT_EQ(values(one_dropout(y, 0.5, 0)), (std::vector<double>{0, -10, 1, 14}));
  // A dropped negative is -0 (x * 0, as torch multiplies by its mask).
  EXPECT_TRUE(std::signbit(one_dropout(tensor(DType::F32, {1}, {-3}), 0.5, 0).get(0)));
}

TEST(EvaluateDropout, KeepsAboutOneMinusPOfManyElementsScaledExactly) {
  // 1e5 elements: the kept count is Binomial(n, 1 - p), standard deviation
  // sqrt(p (1 - p) / n) <= 0.0016 in the fraction; 0.006 is about 4 standard deviations.
  constexpr int64_t n = 100000;
  Tensor x(DType::F32, {100, 1000});
  for (int64_t i = 0; i < n; ++i) x.set(i, 1.0 + static_cast<double>(i % 97) / 8.0);  // exact in f32, never 0
  for (double p : {0.1, 0.3, 0.75}) {
    SCOPED_TRACE(p);
    Tensor y = one_dropout(x, p, 1234);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = y.get(i);
      if (v == 0) continue;
      ++kept;
      // x / (1 - p) rounded to f32 once; exact for p = 0.75 (x * 4).
      if (p == 0.75) ASSERT_EQ(v, x.get(i) * 4) << i;
      else ASSERT_EQ(v, static_cast<double>(static_cast<float>(x.get(i) * (1 / (1 - p))))) << i;
    }
    EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 0.006);
  }
}

TEST(EvaluateDropout, PZeroIsTheIdentityAndPOneGivesZeros) {
  const Tensor x = tensor(DType::F32, {5}, {1.5, -2, kInf, 1e30, 3});
  Tensor same = one_dropout(x, 0.0, 42);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(same.get(i), x.get(i)) << i;
  // torch's p = 1 is input * 0: zeros, -0 for negatives, NaN for an infinity.
  Tensor zero = one_dropout(x, 1.0, 42);
  EXPECT_EQ(zero.get(0), 0.0);
  EXPECT_TRUE(std::signbit(zero.get(1)));
  EXPECT_TRUE(std::isnan(zero.get(2)));
  EXPECT_EQ(zero.get(3), 0.0);
}

TEST(EvaluateDropout, SeedsDrawDifferentMasks) {
  Tensor x(DType::F32, {1000});
  for (int64_t i = 0; i < 1000; ++i) x.set(i, 1.0);
  Tensor a = one_dropout(x, 0.5, 1), b = one_dropout(x, 0.5, 2), a2 = one_dropout(x, 0.5, 1);
  int differ = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    differ += (a.get(i) == 0) != (b.get(i) == 0);
    EXPECT_EQ(a.get(i), a2.get(i)) << "the same seed must draw the same mask, at " << i;
  }
  // Independent masks disagree on half the elements (Binomial(1000, 0.5): 500 +- 16).
  EXPECT_GT(differ, 400);
  EXPECT_LT(differ, 600);
}

// A block of a tensor, dropped out at its origin inside the global shape, is that
// block of the dropped-out tensor: what a rank computes for its shard.
TEST(EvaluateDropout, ABlockAtItsOriginIsThatBlockOfTheWholeTensor) {
  Tensor x(DType::F32, {5, 7});
  for (int64_t i = 0; i < 35; ++i) x.set(i, static_cast<double>(i + 1));
  const Tensor whole = one_dropout(x, 0.5, 9);
  GraphBuilder b("block");
  Value xb = b.param("x", DType::F32, {2, 4});
  b.ret(b.op(OpKind::Dropout, {xb}, {}, {{"p", 0.5}, {"seed", int64_t{9}}, {"origin", std::vector<int64_t>{3, 2}},
                                            {"global_shape", std::vector<int64_t>{5, 7}}}));
  Tensor block(DType::F32, {2, 4});
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 4; ++c) block.set(r * 4 + c, x.get((r + 3) * 7 + c + 2));
  const Tensor got = run(finish(b), {block})[0];
  int kept = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_EQ(got.get(r * 4 + c), whole.get((r + 3) * 7 + c + 2)) << r << ", " << c;
      kept += got.get(r * 4 + c) != 0;
    }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 8);  // a mask, not all or nothing (seed 9 keeps some of these 8)
}

}  // namespace reference_evaluate_dropout_test
}  // namespace sf
