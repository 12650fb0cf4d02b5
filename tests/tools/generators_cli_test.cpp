// examples/causal_attention.sf (a causal mask built from full and tril, and a
// log_softmax head) run and checked on 2, 3 and 4 ranks and compiled to PTX; bad
// arange/full/tril arguments refused by `check` with a located error.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_generators_cli_test {

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

class CausalAttention : public ::testing::TestWithParam<int> {};

TEST_P(CausalAttention, RunChecksOnGeneratedKernels) {
  CliResult r = shardfuse("run " + example("causal_attention.sf") + " --world " + std::to_string(GetParam()) + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of generated host code"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("reference"), std::string::npos) << "a kernel fell back to the reference:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, CausalAttention, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(CliGenerators, CausalAttentionCompilesToPtxWithTheMaskInTheAttentionKernel) {
  TempDir d;
  // Every kernel's PTX, assembled by ptxas when the toolkit has it (its registers in
  // the report); no host code, which the run tests above cover.
  CliResult r = shardfuse("compile " + example("causal_attention.sf") + " --world 2 --arch sm_90a --no-host -o " + (d / "p"));
  ASSERT_EQ(r.code, 0) << r.out;
  int attention_ptx = 0;
  for (const auto& f : fs::directory_iterator(d / "p"))
    attention_ptx += f.path().filename().string().ends_with("_attention.ptx");
  EXPECT_EQ(attention_ptx, 1) << r.out;
  // report.txt says how the attention kernel computes: f32 on FMA tiles, the mask's
  // -1e9 fill (not -inf) leaving no key tile to skip.
  const std::string report = file_text(d / "p/report.txt");
  EXPECT_NE(report.find("form: FMA tiles (q, k and v are f32, not one 16-bit dtype (f16 or bf16)), online softmax over "
                        "key tiles of up to 64; no score matrix in memory"),
            std::string::npos)
      << report;
  CliResult e = shardfuse("explain " + example("causal_attention.sf"));
  ASSERT_EQ(e.code, 0) << e.out;
  // One attention kernel: the generated mask (recomputed), q's and k's head splits, the
  // scores, the softmax and the product with v, and the head merge it stores through.
  EXPECT_NE(e.out.find("k0_attention [attention]: full tril eq reshape permute reshape permute reshape permute "
                       "transpose matmul mul where max sub exp sum div matmul permute reshape"),
            std::string::npos)
      << e.out;
}

// --no-flash-attention keeps torch's math backend: the scores' matmul (with the mask
// in its epilogue), the softmax and the product with v as kernels of their own.
TEST(CliGenerators, NoFlashAttentionKeepsTheScoresMatmulAndSoftmax) {
  CliResult e = shardfuse("explain " + example("causal_attention.sf") + " --no-flash-attention");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out.find("[attention]"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("_matmul_mul_where [matmul]: full tril eq reshape permute reshape permute transpose matmul mul where"),
            std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("_max_sub_exp_sum [reduction]: max sub exp sum div "), std::string::npos) << e.out;
  CliResult r = shardfuse("run " + example("causal_attention.sf") + " --world 2 --no-flash-attention --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
}

TEST(CliGenerators, CheckRefusesBadArgumentsAtTheOp) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"arange(8, step=0)", "g.sf:2:7: error: arange: step must be nonzero"},
      {"arange(4611686018427387904)", "g.sf:2:7: error: arange: start=0, end=4611686018427387904, step=1 gives"},
      {"full([-2, 3], 1.0)", "g.sf:2:7: error: full: dimension -2 is negative"},
      {"full([1099511627776, 1099511627776], 1.0)", "g.sf:2:7: error: full: result"},
      {"tril(arange(4))", "g.sf:2:7: error: tril expects an operand of rank >= 2"},
  };
  for (const auto& [stmt, words] : cases) {
    write_file(d / "g.sf", "graph g() {\n  y = " + std::string(stmt) + "\n  return y\n}\n");
    CliResult r = shardfuse("check " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << stmt << ": " << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << stmt << ": " << r.out;
  }
}

}  // namespace tools_generators_cli_test
}  // namespace sf
