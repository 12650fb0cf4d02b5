// --decompose / --no-decompose from the CLI: explain shows the ring, run checks it
// against the reference (threads and processes), compile writes it into the Plan.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_decompose_cli_test {

TEST(DecomposeCli, ExplainShowsTheRingAndTheDecision) {
  CliResult r = shardfuse("explain " + example("seq_parallel_mlp.sf") + " --decompose always");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ring_shift x -> x_ag_r1 [tp, dim 1, step 1/3, to -1]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_gather x -> matmul -> a: decomposed into ring steps"), std::string::npos) << r.out;
  // The reduce-scatter's chunks are the gathered shards: no concat, and the first
  // chunk's matmul reads shard 1's result straight from the gather half.
  EXPECT_EQ(r.out.find("concat "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kernel k4_matmul w2, a_s1 -> v11_c1"), std::string::npos) << r.out;
  // The reduce-scatter's steps send each chunk to its owner, t places on.
  EXPECT_NE(r.out.find("ring_shift v11_c1 -> v11_r1 [tp, dim 1, step 1/3, to +1]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ring_shift v11_c3 -> v11_r3 [tp, dim 1, step 3/3, to +3]"), std::string::npos) << r.out;
  CliResult a = shardfuse("explain " + example("seq_parallel_mlp.sf"));
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("kept whole (estimated"), std::string::npos) << "auto keeps tiny collectives whole\n" << a.out;
  EXPECT_EQ(a.out.find("ring_shift"), std::string::npos) << a.out;
  CliResult n = shardfuse("explain " + example("seq_parallel_mlp.sf") + " --decompose always --no-decompose");
  EXPECT_EQ(n.out.find("ring_shift"), std::string::npos) << "--no-decompose wins\n" << n.out;
  CliResult bad = shardfuse("explain " + example("seq_parallel_mlp.sf") + " --decompose sometimes");
  EXPECT_EQ(bad.code, 2) << bad.out;
}

TEST(DecomposeCli, DecomposedRunsMatchTheReference) {
  for (const char* world : {"2", "3", "4"}) {
    CliResult r = shardfuse("run " + example("seq_parallel_mlp.sf") + " --decompose always --check --world " + world);
    EXPECT_EQ(r.code, 0) << world << "\n" << r.out;
    EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  }
  // One process per rank, meeting through a directory.
  TempDir t;
  std::string cmd;
  for (int rank = 0; rank < 3; ++rank)
    cmd += std::string(SF_BINARY) + " run " + example("seq_parallel_mlp.sf") + " --world 3 --decompose always --check" +
           " --rank " + std::to_string(rank) + " --rendezvous " + t.str() + " > " + t / ("r" + std::to_string(rank)) +
           " 2>&1 & ";
  ASSERT_EQ(std::system(("(" + cmd + "wait)").c_str()), 0);
  std::ifstream in(t / "r0");
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("check: ok"), std::string::npos) << out;
}

TEST(DecomposeCli, AnFsdpWeightGatherBecomesARingOfColumnBlocks) {
  CliResult r = shardfuse("explain " + example("fsdp_mlp.sf") + " --decompose always");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("all_gather w1 -> matmul -> a: decomposed into ring steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ring_shift w1 -> w1_ag_r1 [dp, dim 0, step 1/3, to -1]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("concat a_s0, a_s1, a_s2, a_s3 -> a [dim 1]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("concat y_s0, y_s1, y_s2, y_s3 -> y [dim 1]"), std::string::npos) << r.out;
  for (const char* world : {"3", "4"}) {
    CliResult run = shardfuse("run " + example("fsdp_mlp.sf") + " --decompose always --check --world " + world);
    EXPECT_EQ(run.code, 0) << world << "\n" << run.out;
    EXPECT_NE(run.out.find("check: ok"), std::string::npos) << run.out;
  }
}

TEST(DecomposeCli, ThePlanCarriesTheRingAndItsConcat) {
  TempDir t;
  CliResult r = shardfuse("compile " + example("fsdp_mlp.sf") + " --decompose always --no-ptxas -o " + t / "p");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(t / "p/plan.json");
  std::string plan((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t concats = 0, shifts = 0;
  for (size_t at = plan.find("\"op\": \"concat\""); at != std::string::npos; at = plan.find("\"op\": \"concat\"", at + 1))
    ++concats;
  for (size_t at = plan.find("\"op\": \"all_to_all\""); at != std::string::npos;
       at = plan.find("\"op\": \"all_to_all\"", at + 1))
    ++shifts;
  EXPECT_EQ(concats, 8u) << "two per rank: one per weight gathered";
  EXPECT_EQ(shifts, 24u) << "3 + 3 shifts per rank";
}

}  // namespace tools_decompose_cli_test
}  // namespace sf
