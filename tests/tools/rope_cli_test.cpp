// examples/rope.sf end to end: RoPE on tensor-parallel heads, the rotation written
// with slice, neg and concat, checked against the reference on 2, 3 (an empty head
// shard) and 4 ranks, and `explain` shows each rotation as one pointwise kernel.
#include <gtest/gtest.h>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_rope_cli_test {

TEST(CliRope, ChecksOnTwoThreeAndFourRanks) {
  for (int world : {2, 3, 4}) {
    CliResult r = shardfuse("run " + example("rope.sf") + " --check --world " + std::to_string(world));
    EXPECT_EQ(r.code, 0) << "--world " << world << ":\n" << r.out;
    EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("on the reference evaluator"), std::string::npos) << "a kernel fell back:\n" << r.out;
  }
}

TEST(CliRope, ExplainShowsEachRotationAsOnePointwiseKernel) {
  CliResult r = shardfuse("explain " + example("rope.sf"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kernels (rank 0): 3 for 17 ops"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[pointwise]: mul slice neg slice concat mul add mul "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[pointwise]: mul slice neg slice concat mul add transpose "), std::string::npos) << r.out;
  // No communication before the scores: the rotation runs on each rank's heads.
  EXPECT_NE(r.out.find("  q_rot: f32[2, 4, 8, 8] {tp: S(1)}"), std::string::npos) << r.out;
}

TEST(CliRope, BadSlicesAndConcatsAreLocatedErrors) {
  TempDir d;
  write_file(d / "g.sf", "graph g(x: f32[4, 8]) {\n  y = slice(x, dim=1, start=0, end=4, step=0)\n  return y\n}\n");
  CliResult r = shardfuse("check " + (d / "g.sf"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("g.sf:2:7: error: slice: step must be positive, got 0 (as in torch)"), std::string::npos)
      << r.out;
  write_file(d / "h.sf", "graph g(x: f32[4, 8]) {\n  y = concat(x, dim=1)\n  return y\n}\n");
  r = shardfuse("check " + (d / "h.sf"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("h.sf:2:7: error: concat expects 2 or more operand(s), got 1"), std::string::npos) << r.out;
}

// 18 concats of a value with itself, nested: fused whole, each element would read
// 2^18 operands. The emitter says so and run gives them kernels of their own.
TEST(CliRope, NestedConcatsDoNotBlowUpTheKernel) {
  TempDir d;
  std::string text = "graph g(x: f32[2]) {\n  c0 = neg(x)\n";
  for (int i = 1; i <= 18; ++i)
    text += "  c" + std::to_string(i) + " = concat(c" + std::to_string(i - 1) + ", c" + std::to_string(i - 1) + ")\n";
  write_file(d / "g.sf", text + "  return c18\n}\n");
  CliResult r = shardfuse("run " + (d / "g.sf") + " --check --timeout 60");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
}

}  // namespace tools_rope_cli_test
}  // namespace sf
