// The reference semantics of arange, full, tril, triu and log_softmax, value by value
// (torch.arange, torch.full, torch.tril, torch.triu, F.log_softmax).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_generators_test {

using test::expect_close;
using test::finish;
using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();

std::vector<Tensor> eval(GraphBuilder& b, const std::vector<Tensor>& in = {}) { return run(finish(b), in); }

TEST(EvaluateGenerators, ArangeCountsFromStartByStep) {
  GraphBuilder b("a");
  b.ret(arange(b, 5));
  b.ret(arange(b, -7, 3, -3));                // 3, 0, -3, -6
  b.ret(arange(b, 4, 4));                     // empty
  b.ret(arange(b, 10, 1, 4, DType::F32));     // 1, 5, 9
  b.ret(arange(b, kMax, kMax - 10, 7));       // exact next to INT64_MAX
  b.ret(arange(b, 16842756, 16842753, 1, DType::BF16));  // one rounding of each int64
  b.ret(arange(b, -3, 0, -1, DType::I32));
  auto out = eval(b);
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ivalues(out[1]), (std::vector<int64_t>{3, 0, -3, -6}));
  EXPECT_EQ(out[2].numel(), 0);
  EXPECT_EQ(values(out[3]), (std::vector<double>{1, 5, 9}));
  EXPECT_EQ(ivalues(out[4]), (std::vector<int64_t>{kMax - 10, kMax - 3}));
  EXPECT_EQ(values(out[5]), (std::vector<double>{16908288, 16908288, 16908288}));  // not 16777216 via f32
  EXPECT_EQ(out[6].dtype(), DType::I32);
  EXPECT_EQ(ivalues(out[6]), (std::vector<int64_t>{0, -1, -2}));
}

TEST(EvaluateGenerators, FullFillsEveryElement) {
  GraphBuilder b("f");
  b.ret(full(b, {2, 3}, 0.1, DType::F16));
  b.ret(full(b, {2}, -4, DType::I64));
  b.ret(full(b, {3}, 2.0, DType::Bool));
  b.ret(full(b, {}, 1.5));
  b.ret(full(b, {0, 4}, 1.0));
  auto out = eval(b);
  for (double v : values(out[0])) EXPECT_EQ(v, 0.0999755859375);  // 0.1 in f16
  EXPECT_EQ(ivalues(out[1]), (std::vector<int64_t>{-4, -4}));
  EXPECT_EQ(ivalues(out[2]), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(values(out[3]), (std::vector<double>{1.5}));
  EXPECT_EQ(out[4].shape(), (Shape{0, 4}));
}

TEST(EvaluateGenerators, TrilAndTriuKeepOneSideOfADiagonal) {
  GraphBuilder b("t");
  Value x = b.param("x", DType::F32, {3, 4});
  b.ret(tril(x));
  b.ret(triu(x));
  b.ret(tril(x, 1));
  b.ret(triu(x, -1));
  b.ret(tril(x, kMax));   // everything
  b.ret(triu(x, kMax));   // nothing
  b.ret(tril(x, kMin));   // nothing
  b.ret(triu(x, kMin));   // everything
  Tensor t = tensor(DType::F32, {3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto out = eval(b, {t});
  EXPECT_EQ(values(out[0]), (std::vector<double>{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}));
  EXPECT_EQ(values(out[1]), (std::vector<double>{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}));
  EXPECT_EQ(values(out[2]), (std::vector<double>{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}));
  EXPECT_EQ(values(out[3]), (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}));
  EXPECT_EQ(values(out[4]), values(t));
  EXPECT_EQ(values(out[5]), std::vector<double>(12, 0.0));
  EXPECT_EQ(values(out[6]), std::vector<double>(12, 0.0));
  EXPECT_EQ(values(out[7]), values(t));
}

TEST(EvaluateGenerators, TrilMasksEachMatrixOfABatchAndKeepsTheDtype) {
  GraphBuilder b("t");
  Value x = b.param("x", DType::I64, {2, 2, 2});
  b.ret(tril(x, -1));
  b.ret(triu(b.param("c", DType::Bool, {2, 3}), 1));
  auto out = eval(b, {itensor(DType::I64, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}),
                      itensor(DType::Bool, {2, 3}, {1, 1, 1, 1, 1, 1})});
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{0, 0, 3, 0, 0, 0, 7, 0}));
  EXPECT_EQ(out[1].dtype(), DType::Bool);
  EXPECT_EQ(ivalues(out[1]), (std::vector<int64_t>{0, 1, 1, 0, 0, 1}));
}

TEST(EvaluateGenerators, LogSoftmaxIsStableWhereSoftmaxUnderflows) {
  GraphBuilder b("l");
  Value x = b.param("x", DType::F32, {2, 3});
  b.ret(log_softmax(x, -1));
  b.ret(log_softmax(x, 0));
  const double inf = std::numeric_limits<double>::infinity();
  auto out = eval(b, {tensor(DType::F32, {2, 3}, {1000, 0, -1000, 0, -inf, 1})});
  // Row 0: exp(-1000) and exp(-2000) are 0 in any float, the log of the sum is 1000.
  const double l1 = std::log(1.0 + std::exp(-1.0));
  expect_close(values(out[0]), {0, -1000, -2000, -1 - l1, -inf, -l1});
  // Columns [1000, 0], [0, -inf], [-1000, 1], laid out by rows.
  const double l2 = std::log1p(std::exp(-1001.0));
  expect_close(values(out[1]), {0, 0, -1001 - l2, -1000, -inf, -l2});
}

}  // namespace reference_evaluate_generators_test
}  // namespace sf
