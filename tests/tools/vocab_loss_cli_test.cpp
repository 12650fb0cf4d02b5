// cross_entropy from the CLI: examples/vocab_parallel_loss.sf run and checked on 2, 3
// and 4 ranks (uneven class chunks), explained (the class-sharded logits are never
// gathered), a hand-computed loss with ignore_index and an out-of-range target in the
// inputs on 3 ranks (10 classes: 4, 4, 2), and bad arguments refused by `check`.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/io/npy.h"
#include "tests/result_util.h"
#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_vocab_loss_cli_test {

class VocabParallelLoss : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallelLoss, RunChecksOnGeneratedKernels) {
  CliResult r = shardfuse("run " + example("vocab_parallel_loss.sf") + " --world " + std::to_string(GetParam()) + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("reference"), std::string::npos) << "a kernel fell back to the reference:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, VocabParallelLoss, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(CliVocabLoss, ExplainNeverGathersTheLogits) {
  CliResult e = shardfuse("explain " + example("vocab_parallel_loss.sf") + " --world 3");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("logits: f32[8, 50] {tp: S(1)}"), std::string::npos) << e.out;
  // No all_gather step (redistributions and schedule lines start with two spaces; the
  // collective-matmul estimate only names one as an alternative).
  EXPECT_EQ(e.out.find("\n  all_gather "), std::string::npos) << "something was gathered:\n" << e.out;
  EXPECT_EQ(e.out.find("\n  all_to_all "), std::string::npos) << e.out;
  // The MLP's all-reduce, then the loss's: the row max once (an all-reduce of max),
  // the sum of exps and the picked logit (reduce-scattered, [8, 1] -> [3, 1]), and the
  // sum of the rows' losses (a scalar).
  EXPECT_NE(e.out.find("redistributions (5 collectives per rank):"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("v17: f32[8, 1] {tp: P(max)}  = max(logits {tp: S(1)})"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("all_reduce v17 -> v17_ar [tp, max]"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("gather(v18 {tp: S(1)}, v22 {tp: R})"), std::string::npos) << e.out;
}

// logits [4, 10] {tp: S(1)}: zeros but x[0, 2] = 1 and x[3, 5] = 2; targets
// [2, -100, 10, 7]:
//   row 0: log(9 + e) - 1       (its target's logit is 1)
//   row 1: ignored (-100 is the default ignore_index): neither summed nor counted
//   row 2: log(10) - 0          (10 names no class: the picked logit reads 0)
//   row 3: log(9 + e^2) - 0
TEST(CliVocabLoss, HandComputedLossWithIgnoredAndOutOfRangeTargets) {
  TempDir d;
  write_file(d / "g.sf",
             "mesh tp=3\n"
             "graph g(x: f32[4, 10] {tp: S(1)}, t: i64[4]) {\n"
             "  loss = cross_entropy(x, t)\n"
             "  each = cross_entropy(x, t, reduction=none)\n"
             "  return loss {tp: R}, each {tp: R}\n}\n");
  fs::create_directory(d / "in");
  Tensor x(DType::F32, {4, 10}), t(DType::I64, {4});
  x.set(0 * 10 + 2, 1.0);
  x.set(3 * 10 + 5, 2.0);
  const int64_t tv[] = {2, -100, 10, 7};
  for (int i = 0; i < 4; ++i) t.set_int(i, tv[i]);
  ASSERT_TRUE(succeeded(write_npy(d / "in/x.npy", x)));
  ASSERT_TRUE(succeeded(write_npy(d / "in/t.npy", t)));
  CliResult r = shardfuse("run " + (d / "g.sf") + " --world 3 --check --inputs " + (d / "in") + " --save-outputs " +
                          (d / "out"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  const double l0 = std::log(9 + std::exp(1.0)) - 1, l2 = std::log(10.0), l3 = std::log(9 + std::exp(2.0));
  Result<Tensor> loss = read_npy(d / "out/loss.npy", TensorType{DType::F32, {}});
  Result<Tensor> each = read_npy(d / "out/each.npy", TensorType{DType::F32, {4}});
  ASSERT_TRUE(loss.ok()) << loss.error().str();
  ASSERT_TRUE(each.ok()) << each.error().str();
  EXPECT_NEAR(loss->get(0), (l0 + l2 + l3) / 3, 1e-6);
  const double want[] = {l0, 0, l2, l3};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(each->get(i), want[i], 1e-6) << i;
  // The plan of that graph gathers nothing.
  CliResult e = shardfuse("explain " + (d / "g.sf"));
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out.find("all_gather x"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("x: f32[4, 10] {tp: S(1)}  param, as declared"), std::string::npos) << e.out;
}

TEST(CliVocabLoss, CheckRefusesBadArgumentsAtTheOp) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"cross_entropy(x, t, reduction=avg)", "g.sf:2:7: error: cross_entropy: reduction 'avg' is not one of mean, sum, none"},
      {"cross_entropy(x, x)", "g.sf:2:7: error: cross_entropy expects integer class indices (i32 or i64) as its target"},
      {"cross_entropy(x, u)", "g.sf:2:7: error: cross_entropy: target i64[4, 1] does not match logits f32[4, 5]"},
  };
  for (const auto& [stmt, words] : cases) {
    write_file(d / "g.sf", "graph g(x: f32[4, 5], t: i64[4], u: i64[4, 1]) {\n  y = " + std::string(stmt) + "\n  return y\n}\n");
    CliResult r = shardfuse("check " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << stmt << ": " << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << stmt << ": " << r.out;
  }
}

}  // namespace tools_vocab_loss_cli_test
}  // namespace sf
