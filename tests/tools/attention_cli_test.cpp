// examples/llama_block.sf (rms_norm, RoPE, causal GQA through
// scaled_dot_product_attention, SwiGLU, Megatron TP with sequence parallelism) run and
// checked on 2, 3 and 4 ranks on generated host code and compiled to PTX (assembled by
// ptxas when the toolkit has it); bad scaled_dot_product_attention calls refused by
// `check` with a located error.
#include <gtest/gtest.h>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_attention_cli_test {

class LlamaBlock : public ::testing::TestWithParam<int> {};

TEST_P(LlamaBlock, RunChecksOnGeneratedKernels) {
  CliResult r = shardfuse("run " + example("llama_block.sf") + " --world " + std::to_string(GetParam()) + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of generated host code"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("reference"), std::string::npos) << "a kernel fell back to the reference:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, LlamaBlock, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(CliAttention, LlamaBlockCompilesToPtx) {
  TempDir d;
  CliResult r = shardfuse("compile " + example("llama_block.sf") + " --world 2 --arch sm_90a --no-host -o " + (d / "p"));
  ASSERT_EQ(r.code, 0) << r.out;
  int ptx = 0;
  for (const auto& e : fs::directory_iterator(d / "p")) ptx += e.path().extension() == ".ptx";
  EXPECT_GT(ptx, 10) << r.out;
  // Head-parallel on 2 ranks: q, k and v each rank's heads (2 query heads, 1 kv head).
  CliResult e = shardfuse("explain " + example("llama_block.sf") + " --world 2");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("= scaled_dot_product_attention(q_rot {tp: S(1)}, k_rot {tp: S(1)}, v {tp: S(1)})"),
            std::string::npos)
      << e.out;
}

TEST(CliAttention, CheckRefusesBadCallsAtTheOp) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"scaled_dot_product_attention(q, q, q, m, is_causal=true)",
       "g.sf:2:7: error: scaled_dot_product_attention: is_causal=true together with an attn_mask is an error"},
      {"scaled_dot_product_attention(q, k, k)", "g.sf:2:7: error: scaled_dot_product_attention: q has 6 heads and k, v have 4"},
      {"scaled_dot_product_attention(q, k, k, enable_gqa=true)", "q's 6 heads must be a multiple of k's and v's 4"},
      {"scaled_dot_product_attention(q, q, q, k)", "attn_mask f32[4, 3, 2] does not broadcast"},
      {"scaled_dot_product_attention(q, q)", "g.sf:2:7: error: scaled_dot_product_attention expects 3 or 4 operand(s), got 2"},
  };
  for (const auto& [stmt, words] : cases) {
    write_file(d / "g.sf", "graph g(q: f32[6, 3, 2], k: f32[4, 3, 2], m: bool[3, 3]) {\n  y = " + std::string(stmt) +
                               "\n  return y\n}\n");
    CliResult r = shardfuse("check " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << stmt << ": " << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << stmt << ": " << r.out;
  }
}

}  // namespace tools_attention_cli_test
}  // namespace sf
