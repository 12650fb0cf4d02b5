// The reference semantics of gather, index_select, scatter_add and embedding's offset,
// value by value against results worked out by hand (torch.gather, torch.index_select,
// torch.scatter_add; an index that names no element reads 0, or is added nowhere), and
// scatter_add's decomposition (decompose.cpp) against the direct evaluation.
#include <gtest/gtest.h>

#include <limits>

#include "codegen/ir/decompose.h"
#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_index_test {

using test::expect_close;
using test::finish;
using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(EvaluateIndex, GatherPicksAlongItsDim) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {2, 3});
  Value i1 = b.param("i1", DType::I64, {2, 2});
  Value i0 = b.param("i0", DType::I32, {1, 3});
  b.ret(gather(x, i1, 1));
  b.ret(gather(x, i1, -1));
  b.ret(gather(x, i0, 0));
  Graph g = finish(b);
  // x = [[1, 2, 3], [4, 5, 6]]
  auto out = run(g, {tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6}), itensor(DType::I64, {2, 2}, {2, 0, 1, 1}),
                     itensor(DType::I32, {1, 3}, {1, 0, 1})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].type(), (TensorType{DType::F32, {2, 2}}));
  expect_close(values(out[0]), {3, 1, 5, 5}, 0);
  expect_close(values(out[1]), {3, 1, 5, 5}, 0);
  expect_close(values(out[2]), {4, 2, 6}, 0);
  // Out of range (3, -1, INT64_MIN): 0, where torch raises.
  out = run(g, {tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6}), itensor(DType::I64, {2, 2}, {3, -1, kMin, 2}),
                itensor(DType::I32, {1, 3}, {2, -1, 1})});
  expect_close(values(out[0]), {0, 0, 0, 6}, 0);
  expect_close(values(out[2]), {0, 0, 6}, 0);
}

TEST(EvaluateIndex, IndexSelectTakesWholeSlices) {
  GraphBuilder b("s");
  Value x = b.param("x", DType::I64, {3, 2});
  Value i = b.param("i", DType::I64, {3});
  b.ret(index_select(x, i, 0));
  b.ret(index_select(x, b.param("j", DType::I32, {1}), -1));
  // offset 1: index k names row k - 1 (a rank holding rows 1.. of a sharded table).
  b.ret(b.op(OpKind::IndexSelect, {x, i}, {AttrValue(int64_t{0})}, {{"offset", AttrValue(int64_t{1})}}));
  Graph g = finish(b);
  // x = [[1, 2], [3, 4], [5, 6]]; exact beyond 2^53 too.
  auto out = run(g, {itensor(DType::I64, {3, 2}, {1, 2, 3, 4, 5, 9007199254740993}), itensor(DType::I64, {3}, {2, 0, 3}),
                     itensor(DType::I32, {1}, {1})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].type(), (TensorType{DType::I64, {3, 2}}));
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{5, 9007199254740993, 1, 2, 0, 0}));
  EXPECT_EQ(ivalues(out[1]), (std::vector<int64_t>{2, 4, 9007199254740993}));
  EXPECT_EQ(ivalues(out[2]), (std::vector<int64_t>{3, 4, 0, 0, 5, 9007199254740993}));
}

TEST(EvaluateIndex, EmbeddingOffsetShiftsTheRows) {
  GraphBuilder b("e");
  Value idx = b.param("idx", DType::I64, {4});
  b.ret(b.op(OpKind::Embedding, {idx, b.param("w", DType::F32, {2, 2})}, {}, {{"offset", AttrValue(int64_t{2})}}));
  Graph g = finish(b);
  // Rows 2 and 3 of a table, held here as local rows 0 and 1.
  auto out = run(g, {itensor(DType::I64, {4}, {3, 1, 2, 4}), tensor(DType::F32, {2, 2}, {1, 2, 3, 4})});
  expect_close(values(out[0]), {3, 4, 0, 0, 1, 2, 0, 0}, 0);
}

Graph scatter_graph(DType t, Shape x, Shape idx, Shape src, int64_t dim) {
  GraphBuilder b("sa");
  Value xv = b.param("x", t, x);  // one statement each: the params' order is the inputs'
  Value iv = b.param("i", DType::I64, idx);
  Value sv = b.param("s", t, src);
  b.ret(scatter_add(xv, iv, sv, dim));
  return finish(b);
}

TEST(EvaluateIndex, ScatterAddSumsDuplicates) {
  // x = ones(3, 2); index [[0, 2], [0, 0]], src [[10, 20], [30, 40]] along dim 0:
  // column 0 gets 10 + 30 in row 0; column 1 gets 20 in row 2 and 40 in row 0.
  Graph g = scatter_graph(DType::F32, {3, 2}, {2, 2}, {2, 2}, 0);
  std::vector<Tensor> in = {tensor(DType::F32, {3, 2}, {1, 1, 1, 1, 1, 1}), itensor(DType::I64, {2, 2}, {0, 2, 0, 0}),
                            tensor(DType::F32, {2, 2}, {10, 20, 30, 40})};
  auto out = run(g, in);
  expect_close(values(out[0]), {41, 41, 1, 1, 1, 21}, 0);
  // The decomposition (no atomics: a mask over the index positions, summed) agrees.
  expect_close(values(run(decompose(g), in)[0]), {41, 41, 1, 1, 1, 21}, 0);
  // Out-of-range indices add nothing.
  in[1] = itensor(DType::I64, {2, 2}, {3, -1, kMin, 5});
  expect_close(values(run(g, in)[0]), {1, 1, 1, 1, 1, 1}, 0);
  expect_close(values(run(decompose(g), in)[0]), {1, 1, 1, 1, 1, 1}, 0);
}

TEST(EvaluateIndex, ScatterAddSmallerIndexAndIntegerWrap) {
  // index [1, 1] of x [2, 3] along dim 1, src [1, 2]: only src[0][0] counts, into x[0][2].
  Graph g = scatter_graph(DType::F32, {2, 3}, {1, 1}, {1, 2}, -1);
  std::vector<Tensor> in = {tensor(DType::F32, {2, 3}, {0, 0, 0, 0, 0, 0}), itensor(DType::I64, {1, 1}, {2}),
                            tensor(DType::F32, {1, 2}, {7, 8})};
  expect_close(values(run(g, in)[0]), {0, 0, 7, 0, 0, 0}, 0);
  expect_close(values(run(decompose(g), in)[0]), {0, 0, 7, 0, 0, 0}, 0);
  // i32 wraps as torch's int32 scatter_add does: 2^31 - 1 + 1 + 1.
  Graph gi = scatter_graph(DType::I32, {1}, {2}, {2}, 0);
  std::vector<Tensor> ii = {itensor(DType::I32, {1}, {2147483647}), itensor(DType::I64, {2}, {0, 0}),
                            itensor(DType::I32, {2}, {1, 1})};
  EXPECT_EQ(ivalues(run(gi, ii)[0]), (std::vector<int64_t>{-2147483647}));
  EXPECT_EQ(ivalues(run(decompose(gi), ii)[0]), (std::vector<int64_t>{-2147483647}));
}

}  // namespace reference_evaluate_index_test
}  // namespace sf
