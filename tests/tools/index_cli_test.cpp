// examples/vocab_parallel_embedding.sf run and checked on 2, 3 and 4 ranks (uneven row
// chunks), explained (the table is never gathered: one all-reduce of the lookup), and
// bad gather/index_select/scatter_add arguments refused by `check` with a located error.
#include <gtest/gtest.h>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_index_cli_test {

class VocabParallel : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallel, RunChecksOnGeneratedKernels) {
  CliResult r = shardfuse("run " + example("vocab_parallel_embedding.sf") + " --world " + std::to_string(GetParam()) + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("reference"), std::string::npos) << "a kernel fell back to the reference:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, VocabParallel, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

size_t count(const std::string& s, const std::string& w) {
  size_t n = 0;
  for (size_t at = s.find(w); at != std::string::npos; at = s.find(w, at + 1)) ++n;
  return n;
}

TEST(CliIndex, ExplainShowsTheTableIsNeverGathered) {
  CliResult e = shardfuse("explain " + example("vocab_parallel_embedding.sf") + " --world 3");
  ASSERT_EQ(e.code, 0) << e.out;
  // The masked lookups' Partial, from the row-sharded table and whole indices.
  EXPECT_NE(e.out.find("tok: f32[2, 6, 8] {tp: P}  = embedding(tokens {tp: R}, wte {tp: S(0)})"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("all_gather"), std::string::npos) << "the table was gathered:\n" << e.out;
  // One collective per rank: the all-reduce of the [2, 6, 8] lookup (listed once under
  // redistributions and once in the schedule).
  EXPECT_NE(e.out.find("redistributions (1 collective per rank):\n  all_reduce tok -> tok_ar [tp, sum]"), std::string::npos)
      << e.out;
  EXPECT_EQ(count(e.out, "all_reduce"), 2u) << e.out;
  EXPECT_EQ(count(e.out, "reduce_scatter"), 0u) << e.out;
  // Rank 1 holds rows 17..33 of the 50 (17, 17, 16 on 3 ranks): its lookup's offset.
  CliResult l = shardfuse("explain " + example("vocab_parallel_embedding.sf") + " --world 3 --rank 1 --dump-after lower");
  ASSERT_EQ(l.code, 0) << l.out;
  EXPECT_NE(l.out.find("embedding tokens, wte offset=17 -> tok  f32[2, 6, 8]"), std::string::npos) << l.out;
}

TEST(CliIndex, CheckRefusesBadArgumentsAtTheOp) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"gather(x, i, dim=2)", "g.sf:2:7: error: gather: dim 2 is out of range for a rank-2 operand"},
      {"gather(x, x, dim=0)", "g.sf:2:7: error: gather expects integer indices (i32 or i64)"},
      {"index_select(x, i, dim=0)", "g.sf:2:7: error: index_select expects a 1-D index, got i64[4, 2]"},
      {"scatter_add(x, i, i, dim=0)", "g.sf:2:7: error: scatter_add: src i64[4, 2] and x f32[4, 5] differ in dtype"},
  };
  for (const auto& [stmt, words] : cases) {
    write_file(d / "g.sf", "graph g(x: f32[4, 5], i: i64[4, 2]) {\n  y = " + std::string(stmt) + "\n  return y\n}\n");
    CliResult r = shardfuse("check " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << stmt << ": " << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << stmt << ": " << r.out;
  }
}

}  // namespace tools_index_cli_test
}  // namespace sf
