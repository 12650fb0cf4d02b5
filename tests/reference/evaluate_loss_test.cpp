// The reference semantics of cross_entropy (F.cross_entropy with class indices):
// values worked out by hand on a 2x3 case, every reduction, ignore_index, an
// out-of-range target, the unbatched [C] form; then against an independent
// formulation built from log_softmax and gather on [N, C, d] logits; then its
// decomposition (decompose.cpp) against the direct evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "codegen/ir/decompose.h"
#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_loss_test {

using test::expect_close;
using test::finish;
using test::itensor;
using test::run;
using test::tensor;
using test::values;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// logits [[1, 2, 3], [1, 1, 1]]:
//   row 0: logsumexp = log(e + e^2 + e^3) = 3 + log(1 + e^-1 + e^-2) = 3.40760596444438
//   row 1: logsumexp = 1 + log 3 = 2.09861228866811
// so target 2 on row 0 loses log(1 + e^-1 + e^-2) = 0.40760596444438 and target 0
// on row 1 loses log 3 = 1.0986122886681098.
constexpr double kLoss0 = 0.40760596444438013, kLoss1 = 1.0986122886681098, kLse0 = 3.40760596444438;

Tensor logits_2x3(DType t = DType::F32) { return tensor(t, {2, 3}, {1, 2, 3, 1, 1, 1}); }

// cross_entropy of the 2x3 logits against `target` (i64[2]) with each reduction.
std::vector<std::vector<double>> losses(const std::vector<int64_t>& target, int64_t ignore_index = -100,
                                        DType target_dtype = DType::I64) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {2, 3});
  Value t = b.param("t", target_dtype, {2});
  for (const char* red : {"none", "sum", "mean"}) b.ret(cross_entropy(x, t, red, ignore_index));
  auto out = run(finish(b), {logits_2x3(), itensor(target_dtype, {2}, target)});
  std::vector<std::vector<double>> v;
  for (const Tensor& o : out) v.push_back(values(o));
  return v;
}

TEST(EvaluateLoss, TwoByThreeByHand) {
  auto v = losses({2, 0});
  ASSERT_EQ(v.size(), 3u);
  expect_close(v[0], {kLoss0, kLoss1}, 1e-7);
  expect_close(v[1], {kLoss0 + kLoss1}, 1e-7);
  expect_close(v[2], {(kLoss0 + kLoss1) / 2}, 1e-7);
  // An i32 target reads the same classes.
  auto w = losses({2, 0}, -100, DType::I32);
  ASSERT_EQ(w.size(), 3u);
  expect_close(w[2], {(kLoss0 + kLoss1) / 2}, 1e-7);
}

TEST(EvaluateLoss, ResultTypes) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::BF16, {2, 3});
  Value t = b.param("t", DType::I64, {2});
  b.ret(cross_entropy(x, t));
  b.ret(cross_entropy(x, t, "none"));
  Graph g = finish(b);
  auto out = run(g, {logits_2x3(DType::BF16), itensor(DType::I64, {2}, {2, 0})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].type(), (TensorType{DType::BF16, {}}));  // mean: 0-d, the logits' dtype
  EXPECT_EQ(out[1].type(), (TensorType{DType::BF16, {2}}));
  expect_close(values(out[0]), {(kLoss0 + kLoss1) / 2}, 1.0 / 128);  // bf16: 8 bits
}

TEST(EvaluateLoss, IgnoreIndexCountsNothing) {
  // Row 1 ignored: its loss is 0 and the mean divides by 1.
  auto v = losses({2, -100});
  expect_close(v[0], {kLoss0, 0}, 1e-7);
  expect_close(v[1], {kLoss0}, 1e-7);
  expect_close(v[2], {kLoss0}, 1e-7);
  // ignore_index inside the classes: target 1 on row 0 is ignored, not picked.
  auto w = losses({1, 0}, 1);
  expect_close(w[0], {0, kLoss1}, 1e-7);
  expect_close(w[2], {kLoss1}, 1e-7);
  // Every target ignored: torch's mean is 0 / 0 = NaN; the sum is 0.
  auto all = losses({-100, -100});
  expect_close(all[0], {0, 0}, 0);
  expect_close(all[1], {0}, 0);
  expect_close(all[2], {kNaN});
}

TEST(EvaluateLoss, OutOfRangeTargetPicksTheRowMax) {
  // Targets 3 and -1 name no class of 3: the picked logit less the row max reads 0
  // (the gather's rule), so the loss is logsumexp - max (PyTorch raises): row 0's max
  // is its class 2 (3), row 1's every class (1).
  auto v = losses({3, -1});
  expect_close(v[0], {kLse0 - 3, kLoss1}, 1e-7);
  expect_close(v[2], {(kLoss0 + kLoss1) / 2}, 1e-7);
}

TEST(EvaluateLoss, UnbatchedLogits) {
  // logits [1, 2, 3] (class dim 0), a 0-d target 2: row 0 of the 2x3 case.
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {3});
  Value t = b.param("t", DType::I64, {});
  for (const char* red : {"none", "sum", "mean"}) b.ret(cross_entropy(x, t, red));
  b.ret(cross_entropy(x, t, "mean", 2));
  Graph g = finish(b);
  auto out = run(g, {tensor(DType::F32, {3}, {1, 2, 3}), itensor(DType::I64, {}, {2})});
  ASSERT_EQ(out.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].type(), (TensorType{DType::F32, {}}));
    expect_close(values(out[i]), {kLoss0}, 1e-7);
  }
  expect_close(values(out[3]), {kNaN});  // its one target ignored
}

// -log_softmax(x, dim=1) at the target, 0 where ignored: the same losses by another
// route through the evaluator (log_softmax, gather, where), on [N, C, d] logits with
// ignored and in-range targets.
TEST(EvaluateLoss, MatchesLogSoftmaxFormulation) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {3, 5, 2});
  Value t = b.param("t", DType::I64, {3, 2});
  b.ret(cross_entropy(x, t, "none", 4));
  Value picked = gather(log_softmax(x, 1), reshape(t, {3, 1, 2}), 1);
  b.ret(where(binary(OpKind::Ne, t, 4), -reshape(picked, {3, 2}), b.constant(0.0)));
  Graph g = finish(b);
  std::vector<double> xs;
  for (int i = 0; i < 30; ++i) xs.push_back(std::sin(1.7 * i) * 3);
  auto out = run(g, {tensor(DType::F32, {3, 5, 2}, xs), itensor(DType::I64, {3, 2}, {0, 4, 3, 1, 4, 2})});
  ASSERT_EQ(out.size(), 2u);
  expect_close(values(out[0]), values(out[1]), 1e-6);
  EXPECT_EQ(values(out[0])[1], 0.0);  // target 4 = ignore_index
  EXPECT_GT(values(out[0])[0], 0.0);
}

// decompose() (the graph every command propagates) computes what the reference does,
// for every reduction, unbatched and spatial logits, i32 targets, f16 and bf16.
TEST(EvaluateLoss, DecompositionMatchesTheReference) {
  struct Case {
    DType dt;
    Shape logits, target;
    const char* reduction;
    int64_t ignore;
    DType tdt = DType::I64;
  };
  const Case cases[] = {{DType::F32, {4, 6}, {4}, "mean", 2},  {DType::F32, {4, 6}, {4}, "sum", -100},
                        {DType::F32, {4, 6}, {4}, "none", 0},  {DType::F32, {2, 5, 3}, {2, 3}, "mean", 1, DType::I32},
                        {DType::F32, {6}, {}, "mean", -100},   {DType::F32, {6}, {}, "none", -100},
                        {DType::BF16, {3, 7}, {3}, "mean", 5}, {DType::F16, {3, 7}, {3}, "none", -100},
                        {DType::F32, {0, 4}, {0}, "sum", -100}};
  for (const Case& c : cases) {
    GraphBuilder b("g");
    Value x = b.param("x", c.dt, c.logits);
    Value t = b.param("t", c.tdt, c.target);
    b.ret(cross_entropy(x * 4.0, t, c.reduction, c.ignore));
    Graph g = finish(b);
    Graph d = decompose(g);
    Graph early = decompose_for_sharding(g);
    for (const Graph* dg : {&d, &early})
      for (const Node& n : dg->nodes()) EXPECT_NE(n.op, OpKind::CrossEntropy);
    for (uint64_t seed : {1u, 2u}) {
      std::vector<Tensor> in = random_inputs(g, seed);
      auto want = run(g, in);
      auto got = run(d, in);
      ASSERT_EQ(got.size(), 1u);
      ASSERT_EQ(got[0].type(), want[0].type());
      const double tol = c.dt == DType::F32 ? 1e-5 : 1.6e-2;
      expect_close(values(got[0]), values(want[0]), tol);
    }
  }
}

// decompose_for_sharding expands cross_entropy only; other composites stay for the
// per-rank decomposition, and params and outputs keep their names and placements.
TEST(EvaluateLoss, DecomposeForShardingKeepsOtherComposites) {
  GraphBuilder b("g", Mesh{{{"tp", 2}}});
  Value x = b.param("x", DType::F32, {4, 6}, b.spec({{"tp", Placement::shard(1)}}));
  Value t = b.param("t", DType::I64, {4});
  Value s = softmax(x, -1);
  b.name(s, "s");
  b.ret(s);
  b.ret(cross_entropy(x, t), b.spec({}));
  Graph g = finish(b);
  Graph e = decompose_for_sharding(g);
  int softmaxes = 0;
  for (const Node& n : e.nodes()) {
    EXPECT_NE(n.op, OpKind::CrossEntropy);
    softmaxes += n.op == OpKind::Softmax;
  }
  EXPECT_EQ(softmaxes, 1);
  ASSERT_EQ(e.params().size(), 2u);
  EXPECT_EQ(e.node(e.params()[0]).name, "x");
  EXPECT_EQ(e.node(e.params()[0]).placement, g.node(g.params()[0]).placement);
  ASSERT_EQ(e.outputs().size(), 2u);
  EXPECT_EQ(e.outputs()[0].name, g.outputs()[0].name);
  EXPECT_EQ(e.outputs()[1].placement, g.outputs()[1].placement);
  // A graph without cross_entropy comes back as it was.
  GraphBuilder b2("h");
  b2.ret(softmax(b2.param("x", DType::F32, {2, 3}), -1));
  Graph h = finish(b2);
  EXPECT_EQ(decompose_for_sharding(h).nodes().size(), h.nodes().size());
}

}  // namespace reference_evaluate_loss_test
}  // namespace sf
