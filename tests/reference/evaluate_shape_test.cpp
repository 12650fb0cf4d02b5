// matmul, movement ops and embedding of the reference evaluator, against results
// worked out by hand.
#include <gtest/gtest.h>

#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_shape_test {

using test::expect_close;
using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

Tensor matmul_of(const Tensor& a, const Tensor& b) {
  GraphBuilder g("mm");
  Value pa = g.param("a", a.dtype(), a.shape());
  g.ret(matmul(pa, g.param("b", b.dtype(), b.shape())));
  Graph graph = test::finish(g);
  auto out = run(graph, {a, b});
  return out.empty() ? Tensor{} : out[0];
}

// Runs `f` on a param shaped like x and returns the single output.
template <class F>
Tensor apply(const Tensor& x, F f) {
  GraphBuilder b("m");
  b.ret(f(b.param("x", x.dtype(), x.shape())));
  Graph g = test::finish(b);
  auto out = run(g, {x});
  return out.empty() ? Tensor{} : out[0];
}

TEST(EvaluateMatmul, TwoD) {
  // [[1,2,3],[4,5,6]] @ [[7,8],[9,10],[11,12]]:
  // 1*7+2*9+3*11 = 58, 1*8+2*10+3*12 = 64, 4*7+5*9+6*11 = 139, 4*8+5*10+6*12 = 154.
  Tensor c = matmul_of(tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6}),
                       tensor(DType::F32, {3, 2}, {7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(c.type(), (TensorType{DType::F32, {2, 2}}));
  expect_close(values(c), {58, 64, 139, 154});
}

TEST(EvaluateMatmul, BatchedWithSharedRightOperand) {
  // a[0] = I, a[1] = [[0,1],[1,0]] (row swap); b = [[1,2],[3,4]] broadcast over the batch.
  Tensor c = matmul_of(tensor(DType::F32, {2, 2, 2}, {1, 0, 0, 1, 0, 1, 1, 0}),
                       tensor(DType::F32, {2, 2}, {1, 2, 3, 4}));
  EXPECT_EQ(c.shape(), (Shape{2, 2, 2}));
  expect_close(values(c), {1, 2, 3, 4, 3, 4, 1, 2});
}

TEST(EvaluateMatmul, BatchDimsBroadcastBothWays) {
  // a: [2, 1, 1, 2], the rows [1, 2] and [3, 4]; b: [3, 2, 1], the columns [1, 0],
  // [0, 1], [1, 1]. out[i][j] = row_i . col_j, shape [2, 3, 1, 1].
  Tensor c = matmul_of(tensor(DType::F32, {2, 1, 1, 2}, {1, 2, 3, 4}),
                       tensor(DType::F32, {3, 2, 1}, {1, 0, 0, 1, 1, 1}));
  EXPECT_EQ(c.shape(), (Shape{2, 3, 1, 1}));
  expect_close(values(c), {1, 2, 3, 3, 4, 7});
}

TEST(EvaluateMatmul, HalfAccumulatesInDoubleAndRoundsOnce) {
  // 2048 + 1 + 1 in f16 step by step gives 2048 (2049 ties to 2048 each time);
  // accumulated in double it is 2050, which f16 represents.
  Tensor c = matmul_of(tensor(DType::F16, {1, 3}, {2048, 1, 1}), tensor(DType::F16, {3, 1}, {1, 1, 1}));
  EXPECT_EQ(c.dtype(), DType::F16);
  expect_close(values(c), {2050}, 0);
}

TEST(EvaluateMatmul, IntegerIsExact) {
  Tensor c = matmul_of(itensor(DType::I64, {1, 2}, {9007199254740993, 1}), itensor(DType::I64, {2, 1}, {1, 1}));
  EXPECT_EQ(c.dtype(), DType::I64);
  EXPECT_EQ(ivalues(c), (std::vector<int64_t>{9007199254740994}));
}

TEST(EvaluateMovement, Transpose) {
  Tensor x = tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor t = apply(x, [](Value v) { return transpose(v, 0, 1); });
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  expect_close(values(t), {1, 4, 2, 5, 3, 6});
  expect_close(values(apply(x, [](Value v) { return transpose(v, -1, -2); })), {1, 4, 2, 5, 3, 6});
  // Swapping the outer dims of [2, 2, 1]: x[i][j][0] = 2i + j -> y[j][i][0].
  Tensor y = apply(tensor(DType::F32, {2, 2, 1}, {0, 1, 2, 3}), [](Value v) { return transpose(v, 0, 1); });
  expect_close(values(y), {0, 2, 1, 3});
}

TEST(EvaluateMovement, Permute) {
  // x[i][j][k] = 12i + 4j + k, shape [2, 3, 4]; permute [2, 0, 1] gives y[k][i][j].
  std::vector<double> v;
  for (int i = 0; i < 24; ++i) v.push_back(i);
  Tensor y = apply(tensor(DType::F32, {2, 3, 4}, v), [](Value x) { return permute(x, {2, 0, 1}); });
  EXPECT_EQ(y.shape(), (Shape{4, 2, 3}));
  expect_close(values(y), {0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21,
                           2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23});
}

TEST(EvaluateMovement, ReshapeWithInferredDim) {
  Tensor x = tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor r = apply(x, [](Value v) { return reshape(v, {-1, 2}); });
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  expect_close(values(r), {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(apply(x, [](Value v) { return reshape(v, {6}); }).shape(), (Shape{6}));
  EXPECT_EQ(apply(x, [](Value v) { return reshape(v, {1, -1, 1}); }).shape(), (Shape{1, 6, 1}));
}

TEST(EvaluateMovement, Expand) {
  // [3, 1] -> [2, 3, 2]: y[b][i][j] = x[i].
  Tensor x = tensor(DType::F32, {3, 1}, {1, 2, 3});
  Tensor y = apply(x, [](Value v) { return expand(v, {2, 3, 2}); });
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  expect_close(values(y), {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  // -1 keeps the dim.
  Tensor z = apply(x, [](Value v) { return expand(v, {-1, 2}); });
  EXPECT_EQ(z.shape(), (Shape{3, 2}));
  expect_close(values(z), {1, 1, 2, 2, 3, 3});
}

TEST(EvaluateMovement, CopiesAreExactForI64AndHalfTypes) {
  const int64_t big = 9007199254740993;  // 2^53 + 1
  Tensor x = itensor(DType::I64, {2, 2}, {big, 1, 2, -big});
  EXPECT_EQ(ivalues(apply(x, [](Value v) { return transpose(v, 0, 1); })),
            (std::vector<int64_t>{big, 2, 1, -big}));
  EXPECT_EQ(ivalues(apply(x, [](Value v) { return permute(v, {1, 0}); })),
            (std::vector<int64_t>{big, 2, 1, -big}));
  EXPECT_EQ(ivalues(apply(x, [](Value v) { return reshape(v, {4}); })),
            (std::vector<int64_t>{big, 1, 2, -big}));
  EXPECT_EQ(ivalues(apply(itensor(DType::I64, {1}, {big}), [](Value v) { return expand(v, {3}); })),
            (std::vector<int64_t>{big, big, big}));
  // bf16 values (1 + 2^-7 is exact in bf16) survive a transpose bit for bit.
  Tensor h = tensor(DType::BF16, {1, 2}, {1.0 + 0x1p-7, -3.0});
  expect_close(values(apply(h, [](Value v) { return transpose(v, 0, 1); })), {1.0 + 0x1p-7, -3.0}, 0);
}

TEST(EvaluateEmbedding, GathersRows) {
  GraphBuilder b("e");
  Value idx = b.param("idx", DType::I64, {2, 2});
  b.ret(embedding(idx, b.param("w", DType::F32, {4, 2})));
  Graph g = test::finish(b);
  // Row r of w is [10r, 10r + 1].
  auto out = run(g, {itensor(DType::I64, {2, 2}, {3, 0, 1, 3}),
                     tensor(DType::F32, {4, 2}, {0, 1, 10, 11, 20, 21, 30, 31})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type(), (TensorType{DType::F32, {2, 2, 2}}));
  expect_close(values(out[0]), {30, 31, 0, 1, 10, 11, 30, 31});
}

TEST(EvaluateEmbedding, I32IndicesAndI64WeightsAreExact) {
  GraphBuilder b("e");
  Value idx = b.param("idx", DType::I32, {2});
  b.ret(embedding(idx, b.param("w", DType::I64, {2, 1})));
  Graph g = test::finish(b);
  auto out = run(g, {itensor(DType::I32, {2}, {1, 0}), itensor(DType::I64, {2, 1}, {5, 9007199254740993})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{9007199254740993, 5}));
}

TEST(EvaluateEmbedding, OutOfRangeIndexReadsZeros) {
  // PyTorch raises; shardfuse's rule (kernels and reference alike) is a row of zeros,
  // which is also what a vocabulary-parallel rank computes for rows it does not hold.
  GraphBuilder b("e");
  Value idx = b.param("idx", DType::I64, {4});
  b.ret(embedding(idx, b.param("w", DType::F32, {2, 2})));
  Graph g = test::finish(b);
  auto out = run(g, {itensor(DType::I64, {4}, {1, 2, -1, std::numeric_limits<int64_t>::min()}),
                     tensor(DType::F32, {2, 2}, {1, 2, 3, 4})});
  expect_close(values(out[0]), {3, 4, 0, 0, 0, 0, 0, 0});
}

}  // namespace reference_evaluate_shape_test
}  // namespace sf
