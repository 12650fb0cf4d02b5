// Reductions of the reference evaluator against hand-computed sums, maxima and means.
#include <gtest/gtest.h>

#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_reduce_test {

using test::expect_close;
using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor reduce_op(OpKind k, const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  GraphBuilder b("r");
  Value p = b.param("x", x.dtype(), x.shape());
  b.ret(b.op(k, {p}, {AttrValue(std::move(dims)), AttrValue(keepdim)}));
  Graph g = test::finish(b);
  auto out = run(g, {x});
  return out.empty() ? Tensor{} : out[0];
}

// x = [[1, 2, 3], [4, 5, 6]]
Tensor x23() { return tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6}); }

TEST(EvaluateReduce, SumOverOneDim) {
  Tensor rows = reduce_op(OpKind::Sum, x23(), {1}, false);
  EXPECT_EQ(rows.type(), (TensorType{DType::F32, {2}}));
  expect_close(values(rows), {6, 15});
  Tensor cols = reduce_op(OpKind::Sum, x23(), {0}, false);
  EXPECT_EQ(cols.shape(), (Shape{3}));
  expect_close(values(cols), {5, 7, 9});
}

TEST(EvaluateReduce, KeepdimKeepsSizeOneDims) {
  Tensor rows = reduce_op(OpKind::Sum, x23(), {-1}, true);
  EXPECT_EQ(rows.shape(), (Shape{2, 1}));
  expect_close(values(rows), {6, 15});
  Tensor cols = reduce_op(OpKind::Max, x23(), {0}, true);
  EXPECT_EQ(cols.shape(), (Shape{1, 3}));
  expect_close(values(cols), {4, 5, 6});
}

TEST(EvaluateReduce, AllDimsWhenTheListIsEmpty) {
  Tensor s = reduce_op(OpKind::Sum, x23(), {}, false);
  EXPECT_EQ(s.shape(), (Shape{}));
  expect_close(values(s), {21});
  Tensor k = reduce_op(OpKind::Sum, x23(), {}, true);
  EXPECT_EQ(k.shape(), (Shape{1, 1}));
  expect_close(values(k), {21});
  expect_close(values(reduce_op(OpKind::Mean, x23(), {}, false)), {3.5});
  expect_close(values(reduce_op(OpKind::Max, x23(), {}, false)), {6});
  expect_close(values(reduce_op(OpKind::Min, x23(), {}, false)), {1});
  // Listing every dim is the same as listing none.
  expect_close(values(reduce_op(OpKind::Sum, x23(), {0, 1}, false)), {21});
}

TEST(EvaluateReduce, SeveralDims) {
  // x[i][j][k] = 6i + 3j + k for shape [2, 2, 3]. Summing over i and k:
  // j = 0: (0+1+2) + (6+7+8) = 24; j = 1: (3+4+5) + (9+10+11) = 42.
  std::vector<double> v;
  for (int i = 0; i < 12; ++i) v.push_back(i);
  Tensor x = tensor(DType::F32, {2, 2, 3}, v);
  Tensor s = reduce_op(OpKind::Sum, x, {0, 2}, false);
  EXPECT_EQ(s.shape(), (Shape{2}));
  expect_close(values(s), {24, 42});
  Tensor k = reduce_op(OpKind::Sum, x, {-1, 0}, true);
  EXPECT_EQ(k.shape(), (Shape{1, 2, 1}));
  expect_close(values(k), {24, 42});
  // Means: 24 / 6 = 4 and 42 / 6 = 7; max over i, k: 8 and 11; min: 0 and 3.
  expect_close(values(reduce_op(OpKind::Mean, x, {0, 2}, false)), {4, 7});
  expect_close(values(reduce_op(OpKind::Max, x, {0, 2}, false)), {8, 11});
  expect_close(values(reduce_op(OpKind::Min, x, {2, 0}, false)), {0, 3});
  // Over j only: x[i][0][k] + x[i][1][k] = 12i + 2k + 3.
  expect_close(values(reduce_op(OpKind::Sum, x, {1}, false)), {3, 5, 7, 15, 17, 19});
}

TEST(EvaluateReduce, MaxMinMean) {
  expect_close(values(reduce_op(OpKind::Max, x23(), {1}, false)), {3, 6});
  expect_close(values(reduce_op(OpKind::Min, x23(), {1}, false)), {1, 4});
  expect_close(values(reduce_op(OpKind::Mean, x23(), {1}, false)), {2, 5});
  expect_close(values(reduce_op(OpKind::Mean, x23(), {0}, false)), {2.5, 3.5, 4.5});
  // max and min propagate NaN, as torch.amax does.
  Tensor n = tensor(DType::F32, {3}, {1, kNaN, 3});
  expect_close(values(reduce_op(OpKind::Max, n, {}, false)), {kNaN});
  expect_close(values(reduce_op(OpKind::Min, n, {}, false)), {kNaN});
}

TEST(EvaluateReduce, IntegerSumsAreExactInI64) {
  // i32 sums go to i64, as torch.sum does; 2^31 - 1 + 1 does not wrap there.
  Tensor s = reduce_op(OpKind::Sum, itensor(DType::I32, {2}, {2147483647, 1}), {}, false);
  EXPECT_EQ(s.dtype(), DType::I64);
  EXPECT_EQ(ivalues(s), (std::vector<int64_t>{2147483648LL}));
  // 2^53 + 1 + 1 = 2^53 + 2 (a double accumulator gives 2^53).
  EXPECT_EQ(ivalues(reduce_op(OpKind::Sum, itensor(DType::I64, {2}, {9007199254740993, 1}), {}, false)),
            (std::vector<int64_t>{9007199254740994}));
  // A bool sum counts the trues.
  Tensor c = reduce_op(OpKind::Sum, itensor(DType::Bool, {4}, {1, 0, 1, 1}), {}, false);
  EXPECT_EQ(c.dtype(), DType::I64);
  EXPECT_EQ(ivalues(c), (std::vector<int64_t>{3}));
  // Integer max/min keep the dtype and stay exact.
  Tensor m = reduce_op(OpKind::Max, itensor(DType::I64, {2}, {9007199254740993, 9007199254740992}), {}, false);
  EXPECT_EQ(m.dtype(), DType::I64);
  EXPECT_EQ(ivalues(m), (std::vector<int64_t>{9007199254740993}));
}

TEST(EvaluateReduce, EmptyReductions) {
  Tensor e(DType::F32, {2, 0});
  Tensor s = reduce_op(OpKind::Sum, e, {1}, false);
  EXPECT_EQ(s.shape(), (Shape{2}));
  expect_close(values(s), {0, 0});
  expect_close(values(reduce_op(OpKind::Mean, e, {1}, false)), {kNaN, kNaN});
  // Reducing the non-empty dim of an empty tensor gives an empty result, not an error.
  EXPECT_EQ(reduce_op(OpKind::Max, e, {0}, false).shape(), (Shape{0}));

  GraphBuilder b("r");
  b.ret(max(b.param("x", DType::F32, {2, 0}), {1}));
  Graph g = test::finish(b);
  std::string msg = test::run_error(g, {e});
  EXPECT_NE(msg.find("max"), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
}

}  // namespace reference_evaluate_reduce_test
}  // namespace sf
