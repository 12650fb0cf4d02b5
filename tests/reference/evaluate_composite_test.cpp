// softmax, layer_norm and rms_norm of the reference evaluator against hand-computed
// values (gelu and gelu_tanh are in evaluate_elementwise_test.cpp).
#include <gtest/gtest.h>

#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_composite_test {

using test::expect_close;
using test::run;
using test::tensor;
using test::values;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor softmax_of(const Tensor& x, int64_t dim) {
  GraphBuilder b("s");
  b.ret(softmax(b.param("x", x.dtype(), x.shape()), dim));
  Graph g = test::finish(b);
  auto out = run(g, {x});
  return out.empty() ? Tensor{} : out[0];
}

// softmax([1, 2, 3]) = e^[0, 1, 2] / (1 + e + e^2) = [1, 2.71828, 7.38906] / 11.10734.
const std::vector<double> kSoftmax123 = {0.0900305732, 0.2447284711, 0.6652409558};

TEST(EvaluateSoftmax, LastDim) {
  Tensor y = softmax_of(tensor(DType::F32, {2, 3}, {1, 2, 3, 0, 0, 0}), -1);
  EXPECT_EQ(y.type(), (TensorType{DType::F32, {2, 3}}));
  expect_close(values(y), {kSoftmax123[0], kSoftmax123[1], kSoftmax123[2], 1.0 / 3, 1.0 / 3, 1.0 / 3});
}

TEST(EvaluateSoftmax, FirstDim) {
  // Columns [1, 2, 3] and [5, 5, 5].
  Tensor y = softmax_of(tensor(DType::F32, {3, 2}, {1, 5, 2, 5, 3, 5}), 0);
  expect_close(values(y), {kSoftmax123[0], 1.0 / 3, kSoftmax123[1], 1.0 / 3, kSoftmax123[2], 1.0 / 3});
}

TEST(EvaluateSoftmax, LargeAndInfiniteInputs) {
  // Shifting by a constant does not change softmax; exp(1002) alone would overflow.
  expect_close(values(softmax_of(tensor(DType::F32, {3}, {1001, 1002, 1003}), 0)), kSoftmax123);
  // A -inf logit gets probability 0 (masked attention).
  expect_close(values(softmax_of(tensor(DType::F32, {3}, {-kInf, 0, 0}), 0)), {0, 0.5, 0.5});
}

TEST(EvaluateLayerNorm, TrailingDimWithWeightAndBias) {
  GraphBuilder b("ln");
  Value x = b.param("x", DType::F32, {2, 4});
  Value w = b.param("w", DType::F32, {4});
  b.ret(layer_norm(x, w, b.param("b", DType::F32, {4})));
  Graph g = test::finish(b);
  // Row [1, 2, 3, 4]: mean 2.5, biased var (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25,
  // (x - 2.5) / sqrt(1.25 + 1e-5) = [-1.3416354, -0.4472118, 0.4472118, 1.3416354].
  // Row [2, 4, 6, 8]: mean 5, var 5, (x - 5) / sqrt(5 + 1e-5) = [-1.3416394, -0.4472131, ...].
  // Then * w = [1, 2, 1, 1] + b = [0, 0, 1, 0].
  auto out = run(g, {tensor(DType::F32, {2, 4}, {1, 2, 3, 4, 2, 4, 6, 8}),
                     tensor(DType::F32, {4}, {1, 2, 1, 1}), tensor(DType::F32, {4}, {0, 0, 1, 0})});
  ASSERT_EQ(out.size(), 1u);
  expect_close(values(out[0]), {-1.3416354200, -0.8944236133, 1.4472118067, 1.3416354200,
                                -1.3416394449, -0.8944262966, 1.4472131483, 1.3416394449});
}

TEST(EvaluateLayerNorm, OverTwoTrailingDims) {
  GraphBuilder b("ln");
  Value x = b.param("x", DType::F32, {1, 2, 2});
  Value w = b.param("w", DType::F32, {2, 2});
  b.ret(layer_norm(x, w, b.param("b", DType::F32, {2, 2}), 0.0));
  Graph g = test::finish(b);
  // [[1, 2], [3, 4]] normalised as one group of four, eps 0: [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25).
  auto out = run(g, {tensor(DType::F32, {1, 2, 2}, {1, 2, 3, 4}), tensor(DType::F32, {2, 2}, {1, 1, 1, 1}),
                     tensor(DType::F32, {2, 2}, {0, 0, 0, 0})});
  ASSERT_EQ(out.size(), 1u);
  expect_close(values(out[0]), {-1.3416407865, -0.4472135955, 0.4472135955, 1.3416407865});
}

TEST(EvaluateRmsNorm, TrailingDim) {
  GraphBuilder b("rms");
  Value x = b.param("x", DType::F32, {1, 4});
  b.ret(rms_norm(x, b.param("w", DType::F32, {4})));
  Graph g = test::finish(b);
  // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5; x / sqrt(7.5 + 1e-6) * [1, 1, 1, 2].
  auto out = run(g, {tensor(DType::F32, {1, 4}, {1, 2, 3, 4}), tensor(DType::F32, {4}, {1, 1, 1, 2})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type(), (TensorType{DType::F32, {1, 4}}));
  expect_close(values(out[0]), {0.3651483473, 0.7302966947, 1.0954450420, 2.9211867786});
}

TEST(EvaluateLayerNorm, Bf16RoundsTheFinalResultOnly) {
  GraphBuilder b("ln");
  Value x = b.param("x", DType::BF16, {4});
  Value w = b.param("w", DType::BF16, {4});
  b.ret(layer_norm(x, w, b.param("b", DType::BF16, {4}), 0.0));
  Graph g = test::finish(b);
  // [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25) = +-1.3416408, +-0.4472136; in bf16 (spacing
  // 2^-7 in [1, 2), 2^-9 in [0.25, 0.5)): 1.34375 (= 172/128) and 0.447265625 (= 229/512).
  auto out = run(g, {tensor(DType::BF16, {4}, {1, 2, 3, 4}), tensor(DType::BF16, {4}, {1, 1, 1, 1}),
                     tensor(DType::BF16, {4}, {0, 0, 0, 0})});
  ASSERT_EQ(out.size(), 1u);
  expect_close(values(out[0]), {-1.34375, -0.447265625, 0.447265625, 1.34375}, 0);
}

}  // namespace reference_evaluate_composite_test
}  // namespace sf
