// cumsum and mean over a dim sharded unevenly (7 rows on 3 ranks: 3, 2, 2), argmax
// and argmin, run and checked against the reference on 3 ranks; the collectives
// chosen, as explain prints them: the cumsum's carry is one all_gather of the chunk
// totals (no gather of the operand), the mean over the shard is Partial(sum) (no
// gather of x either); located errors for bad arguments.
#include <gtest/gtest.h>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_scan_cli_test {

const char* kGraph =
    "mesh tp=3\n"
    "graph g(x: f32[7, 4] {tp: S(0)}, y: f32[5, 7] {tp: S(1)}) {\n"
    "  c = cumsum(x, dim=0) {tp: S(0)}\n"
    "  m = mean(x, dims=[0])\n"
    "  a = argmax(y, dim=1)\n"
    "  b = argmin(x, dim=1, keepdim=true)\n"
    "  return c, m, a, b\n"
    "}\n";

TEST(CliScan, RunChecksCumsumAndMeanOverAnUnevenShardOnThreeRanks) {
  TempDir d;
  write_file(d / "g.sf", kGraph);
  CliResult r = shardfuse("run " + (d / "g.sf") + " --world 3 --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("reference"), std::string::npos) << "a kernel fell back to the reference:\n" << r.out;
}

TEST(CliScan, ExplainShowsTheCarryAndThePartialMean) {
  TempDir d;
  write_file(d / "g.sf", kGraph);
  CliResult e = shardfuse("explain " + (d / "g.sf") + " --world 3");
  ASSERT_EQ(e.code, 0) << e.out;
  // cumsum stays on S(0): each rank scans its rows, then adds the totals before it.
  EXPECT_NE(e.out.find("c: f32[7, 4] {tp: S(0)}  = cumsum(x {tp: S(0)})"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("carry over tp"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("all_gather c_total -> c_totals [tp, dim 0]"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("all_gather x"), std::string::npos) << "x itself was gathered:\n" << e.out;
  EXPECT_NE(e.out.find("kernel k3_add c, c_carry -> c_scan"), std::string::npos) << e.out;
  // mean over the shard: each rank's sum over the global count, a Partial(sum).
  EXPECT_NE(e.out.find("m: f32[4] {tp: P}  = mean(x {tp: S(0)})"), std::string::npos) << e.out;
  // The mean and the scan's per-rank total both reduce x over dim 0: one kernel, which
  // reads x once (sibling reductions, docs/fusion.md).
  EXPECT_NE(e.out.find("kernel k1_sum_mean x -> c_total, m"), std::string::npos) << e.out;
}

TEST(CliScan, CheckRefusesBadArgumentsAtTheOp) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"cumsum(x, dim=2)", "g.sf:2:7: error: cumsum: dim 2 is out of range for a rank-2 operand"},
      {"argmax(x)", "g.sf:2:7: error: argmax: missing required attribute 'dim'"},
      {"argmin(x, dim=0, keepdim=2)", "g.sf:2:7: error: argmin: attribute 'keepdim' expects true or false"},
      {"argmax(gt(x, 0.0), dim=0)", "g.sf:2:7: error: argmax does not take bool operands"},
      {"mean(x, count=-3)", "g.sf:2:7: error: mean: count -3 is negative"},
  };
  for (const auto& [stmt, words] : cases) {
    write_file(d / "g.sf", "graph g(x: f32[3, 4]) {\n  y = " + std::string(stmt) + "\n  return y\n}\n");
    CliResult r = shardfuse("check " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << stmt << ": " << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << stmt << ": " << r.out;
  }
}

}  // namespace tools_scan_cli_test
}  // namespace sf
