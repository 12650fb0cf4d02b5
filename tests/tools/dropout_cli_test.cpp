// dropout from the command line: examples/dropout_mlp.sf run and checked on 2, 3
// and 4 ranks; the sharding guarantee (one graph run on 1 rank and on 3 ranks with
// uneven row and column shards writes the same outputs, bit for bit); bad
// attributes refused by `check` with a located error.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/io/npy.h"
#include "tests/result_util.h"
#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_dropout_cli_test {

class DropoutMlp : public ::testing::TestWithParam<int> {};

TEST_P(DropoutMlp, RunChecksOnGeneratedKernels) {
  CliResult r = shardfuse("run " + example("dropout_mlp.sf") + " --world " + std::to_string(GetParam()) + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("reference"), std::string::npos) << "a kernel fell back to the reference:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, DropoutMlp, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// x (7 rows on 3 ranks: 3, 3, 1) dropped out by rows, y (10 columns on 3 ranks: 4, 4,
// 2) by columns, each kept sharded: every rank draws its block's mask at its origin.
const char* kSharded =
    "mesh tp=3\n"
    "graph g(x: f32[7, 11] {tp: S(0)}, y: f32[5, 10] {tp: S(1)}) {\n"
    "  a = dropout(x, p=0.5, seed=11)\n"
    "  b = dropout(y, p=0.25, seed=12)\n"
    "  return a {tp: S(0)}, b {tp: S(1)}\n"
    "}\n";

TEST(CliDropout, OneRankAndThreeUnevenShardsWriteTheSameOutputs) {
  TempDir d;
  write_file(d / "g.sf", kSharded);
  fs::create_directory(d / "in");
  Tensor x(DType::F32, {7, 11}), y(DType::F32, {5, 10});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i + 1));
  for (int64_t i = 0; i < y.numel(); ++i) y.set(i, -static_cast<double>(i + 1));
  ASSERT_TRUE(succeeded(write_npy(d / "in/x.npy", x)));
  ASSERT_TRUE(succeeded(write_npy(d / "in/y.npy", y)));
  // Each rank runs its block of the dropout at its origin: rank 1 holds rows 3..5 of x
  // and columns 4..7 of y.
  CliResult e = shardfuse("explain " + (d / "g.sf") + " --dump-after lower --rank 1");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("dropout x seed=11 p=0.5 origin=[3, 0] global_shape=[7, 11] -> a  f32[3, 11]"), std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("dropout y seed=12 p=0.25 origin=[0, 4] global_shape=[5, 10] -> b  f32[5, 4]"), std::string::npos)
      << e.out;
  for (const char* world : {"1", "3"}) {
    CliResult r = shardfuse("run " + (d / "g.sf") + " --world " + world + " --inputs " + (d / "in") +
                            " --save-outputs " + (d / ("out" + std::string(world))) + " --check");
    ASSERT_EQ(r.code, 0) << world << ": " << r.out;
  }
  for (const auto& [name, type] : {std::pair{"a", TensorType{DType::F32, {7, 11}}}, std::pair{"b", TensorType{DType::F32, {5, 10}}}}) {
    Result<Tensor> one = read_npy(d / ("out1/" + std::string(name) + ".npy"), type);
    Result<Tensor> three = read_npy(d / ("out3/" + std::string(name) + ".npy"), type);
    ASSERT_TRUE(one.ok()) << one.error().str();
    ASSERT_TRUE(three.ok()) << three.error().str();
    EXPECT_EQ(std::memcmp(one->data(), three->data(), static_cast<size_t>(one->nbytes())), 0)
        << name << ": 1 rank and 3 ranks drew different masks";
    // A mask: each element dropped, or multiplied in f32 by 1 / (1 - p) rounded to f32
    // (2, and 4/3), as the generated kernel computes it.
    const Tensor& in = std::string(name) == "a" ? x : y;
    const float scale = std::string(name) == "a" ? 2.0f : static_cast<float>(4.0 / 3.0);
    int64_t kept = 0;
    for (int64_t i = 0; i < in.numel(); ++i) {
      if (one->get(i) == 0) continue;
      ++kept;
      EXPECT_EQ(one->get(i), static_cast<double>(static_cast<float>(in.get(i)) * scale)) << name << " " << i;
    }
    EXPECT_GT(kept, in.numel() / 4) << name;
    EXPECT_LT(kept, in.numel()) << name;
  }
}

TEST(CliDropout, CheckRefusesBadArgumentsAtTheOp) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"dropout(x, p=1.5, seed=1)", "g.sf:2:7: error: dropout: p must be in [0, 1]"},
      {"dropout(x, p=0.1)", "g.sf:2:7: error: dropout: missing required attribute 'seed'"},
      {"dropout(x, p=0.1, seed=-4)", "g.sf:2:7: error: dropout: seed must be a non-negative integer"},
      {"dropout(cast(x, i32), seed=2)", "g.sf:2:7: error: dropout expects a floating-point operand"},
  };
  for (const auto& [stmt, words] : cases) {
    write_file(d / "g.sf", "graph g(x: f32[4]) {\n  y = " + std::string(stmt) + "\n  return y\n}\n");
    CliResult r = shardfuse("check " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << stmt << ": " << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << stmt << ": " << r.out;
  }
}

}  // namespace tools_dropout_cli_test
}  // namespace sf
