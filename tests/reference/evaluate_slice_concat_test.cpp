// slice and concat in the reference evaluator, against results worked out by hand:
// they copy elements, so every dtype comes out bit for bit.
#include <gtest/gtest.h>

#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_slice_concat_test {

using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

// x = [[0, 1, ..., 5], [10, 11, ..., 15], [20, ..., 25]]: element (r, c) is 10r + c.
Tensor grid(DType t = DType::F32) {
  std::vector<int64_t> v;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 6; ++c) v.push_back(10 * r + c);
  return itensor(t, {3, 6}, v);
}

Tensor slice_of_grid(int64_t dim, int64_t start, int64_t end, int64_t step, DType t = DType::F32) {
  GraphBuilder b("s");
  b.ret(slice(b.param("x", t, {3, 6}), dim, start, end, step));
  Graph g = test::finish(b);
  auto out = run(g, {grid(t)});
  return out.empty() ? Tensor{} : out[0];
}

TEST(EvaluateSlice, PythonSlicesOfEveryKind) {
  Tensor a = slice_of_grid(1, 1, 4, 1);  // x[:, 1:4]
  EXPECT_EQ(a.shape(), (Shape{3, 3}));
  EXPECT_EQ(ivalues(a), (std::vector<int64_t>{1, 2, 3, 11, 12, 13, 21, 22, 23}));
  Tensor b = slice_of_grid(-1, -2, std::numeric_limits<int64_t>::max(), 1);  // x[:, -2:]
  EXPECT_EQ(ivalues(b), (std::vector<int64_t>{4, 5, 14, 15, 24, 25}));
  Tensor c = slice_of_grid(1, 0, 6, 2);  // x[:, ::2]
  EXPECT_EQ(ivalues(c), (std::vector<int64_t>{0, 2, 4, 10, 12, 14, 20, 22, 24}));
  Tensor d = slice_of_grid(0, -5, 2, 1);  // x[-5:2]: start clamps to 0
  EXPECT_EQ(ivalues(d), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15}));
  Tensor e = slice_of_grid(0, 2, 1, 1);  // x[2:1]: empty
  EXPECT_EQ(e.shape(), (Shape{0, 6}));
  Tensor f = slice_of_grid(1, 1, -1, 3, DType::I64);  // x[:, 1:-1:3] in i64
  EXPECT_EQ(ivalues(f), (std::vector<int64_t>{1, 4, 11, 14, 21, 24}));
  Tensor g = slice_of_grid(1, 5, 100, 7, DType::BF16);
  EXPECT_EQ(ivalues(g), (std::vector<int64_t>{5, 15, 25}));
}

TEST(EvaluateConcat, JoinsAlongAnyDimBitForBit) {
  GraphBuilder b("c");
  Value x = b.param("x", DType::F16, {2, 2});
  Value y = b.param("y", DType::F16, {2, 1});
  Value z = b.param("z", DType::F16, {1, 2});
  Value e = b.param("e", DType::F16, {2, 0});
  b.ret(concat({x, y, e, y}, 1));  // [2, 4]
  b.ret(concat({x, z}, -2));       // [3, 2]
  b.ret(concat({e, e}, 0));        // [4, 0]
  Graph g = test::finish(b);
  // 0.1 is not exact in f16: the values must come through unchanged, not recomputed.
  auto out = run(g, {tensor(DType::F16, {2, 2}, {0.1, 1, 2, 3}), tensor(DType::F16, {2, 1}, {-4, 5}),
                     tensor(DType::F16, {1, 2}, {6, 7}), Tensor(DType::F16, {2, 0})});
  ASSERT_EQ(out.size(), 3u);
  Tensor h = tensor(DType::F16, {1}, {0.1});
  EXPECT_EQ(out[0].shape(), (Shape{2, 4}));
  EXPECT_EQ(values(out[0]), (std::vector<double>{h.get(0), 1, -4, -4, 2, 3, 5, 5}));
  EXPECT_EQ(values(out[1]), (std::vector<double>{h.get(0), 1, 2, 3, 6, 7}));
  EXPECT_EQ(out[2].shape(), (Shape{4, 0}));
}

TEST(EvaluateConcat, RotateHalfIsSliceNegConcat) {
  // rotate_half(x) = cat(-x2, x1) on the last dim, as in Llama's RoPE.
  GraphBuilder b("rope");
  Value x = b.param("x", DType::I32, {2, 4});
  b.ret(concat({-slice(x, -1, 2, 4), slice(x, -1, 0, 2)}, -1));
  Graph g = test::finish(b);
  auto out = run(g, {itensor(DType::I32, {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{-3, -4, 1, 2, -7, -8, 5, 6}));
}

}  // namespace reference_evaluate_slice_concat_test
}  // namespace sf
