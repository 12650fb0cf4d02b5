// Graph-level behaviour of the reference evaluator: input checking, several outputs,
// and collectives in the global view.
#include <gtest/gtest.h>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_graph_test {

using test::expect_close;
using test::run;
using test::run_error;
using test::tensor;
using test::values;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(EvaluateGraph, InputTypeMismatchNamesParamAndTypes) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {2, 3});
  Value w = b.param("w", DType::F32, {3});
  b.ret(x + w);
  Graph g = test::finish(b);
  std::string e = run_error(g, {Tensor(DType::F32, {2, 3}), Tensor(DType::F32, {1, 3})});
  EXPECT_TRUE(contains(e, "'w'")) << e;
  EXPECT_TRUE(contains(e, "expected f32[3]")) << e;
  EXPECT_TRUE(contains(e, "found f32[1, 3]")) << e;
  e = run_error(g, {Tensor(DType::BF16, {2, 3}), Tensor(DType::F32, {3})});
  EXPECT_TRUE(contains(e, "'x'")) << e;
  EXPECT_TRUE(contains(e, "expected f32[2, 3], found bf16[2, 3]")) << e;
  e = run_error(g, {Tensor(DType::F32, {2, 3})});
  EXPECT_TRUE(contains(e, "2 parameter(s) but 1 input")) << e;
}

TEST(EvaluateGraph, SeveralOutputsInOrderIncludingAParam) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {2});
  Value y = relu(x);
  b.ret(y);
  b.ret(x);
  b.ret(y * 2.0);
  Graph g = test::finish(b);
  auto out = run(g, {tensor(DType::F32, {2}, {-1, 3})});
  ASSERT_EQ(out.size(), 3u);
  expect_close(values(out[0]), {0, 3});
  expect_close(values(out[1]), {-1, 3});
  expect_close(values(out[2]), {0, 6});
}

TEST(EvaluateGraph, MlpFromTheDesignDoc) {
  // y = relu(x @ w1^T + b1) @ w2^T + b2 with x = [1, 2], w1 = [[1, 0], [0, -1], [1, 1]],
  // b1 = [0, 0, -1], w2 = [[1, 1, 1]], b2 = [0.5]:
  // h = [1, -2, 3] + [0, 0, -1] = [1, -2, 2]; relu -> [1, 0, 2]; y = 3 + 0.5 = 3.5.
  GraphBuilder b("mlp", Mesh{{{"tp", 1}}});
  Value x = b.param("x", DType::F32, {1, 2});
  Value w1 = b.param("w1", DType::F32, {3, 2}, b.spec({{"tp", Placement::shard(0)}}));
  Value b1 = b.param("b1", DType::F32, {3}, b.spec({{"tp", Placement::shard(0)}}));
  Value w2 = b.param("w2", DType::F32, {1, 3}, b.spec({{"tp", Placement::shard(1)}}));
  Value b2 = b.param("b2", DType::F32, {1});
  Value a = relu(matmul(x, transpose(w1, 0, 1)) + b1);
  b.ret(matmul(a, transpose(w2, 0, 1)) + b2, b.spec({}));
  Graph g = test::finish(b);
  auto out = run(g, {tensor(DType::F32, {1, 2}, {1, 2}), tensor(DType::F32, {3, 2}, {1, 0, 0, -1, 1, 1}),
                     tensor(DType::F32, {3}, {0, 0, -1}), tensor(DType::F32, {1, 3}, {1, 1, 1}),
                     tensor(DType::F32, {1}, {0.5})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{1, 1}));
  expect_close(values(out[0]), {3.5});
}

// Graphs are global: the per-rank collectives are refused by the builder (so
// neither the evaluator nor any later stage meets one), on any mesh size.
TEST(EvaluateCollective, PerRankCollectivesAreRefusedByTheBuilder) {
  const OpKind kinds[] = {OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllReduce, OpKind::AllToAll};
  for (int64_t tp : {1, 2})
    for (OpKind k : kinds) {
      SCOPED_TRACE(std::string(op_name(k)) + " tp=" + std::to_string(tp));
      GraphBuilder b("c", Mesh{{{"dp", 1}, {"tp", tp}}});
      Value x = b.param("x", DType::F32, {4, 2});
      try {
        b.op(k, {x}, {}, {{"mesh_dim", AttrValue(std::string("tp"))}}, SourceLoc{3, 7});
        ADD_FAILURE() << "accepted";
      } catch (const DiagError& e) {
        EXPECT_EQ(e.diag.loc.line, 3);
        EXPECT_TRUE(contains(e.diag.message, std::string(op_name(k)) +
                                                 ": explicit per-rank collectives are not supported"))
            << e.diag.message;
      }
    }
}

TEST(EvaluateCollective, RedistributeIsTheIdentity) {
  GraphBuilder b("r", Mesh{{{"tp", 2}}});
  Value x = b.param("x", DType::I64, {2, 2}, b.spec({{"tp", Placement::shard(0)}}));
  b.ret(b.op(OpKind::Redistribute, {x}, {AttrValue(b.spec({{"tp", Placement::partial()}}))}));
  Graph g = test::finish(b);
  auto out = run(g, {test::itensor(DType::I64, {2, 2}, {9007199254740993, 2, 3, 4})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(test::ivalues(out[0]), (std::vector<int64_t>{9007199254740993, 2, 3, 4}));
}

}  // namespace reference_evaluate_graph_test
}  // namespace sf
