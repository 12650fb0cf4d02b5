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

// explain --device cuda names the attention kernel's form: mma.sync by default, with
// the wgmma configs sm_90a offers (not the default until timed on a GPU); sm_80 has no
// wgmma to offer; f32 stays on FMA. A wide pointwise default says what compile takes
// where ptxas finds it spilling.
TEST(CliAttention, ExplainNamesTheFormOnTheGpu) {
  TempDir d;
  write_file(d / "a.sf", "graph a(q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]) {\n"
                         "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out\n}\n");
  CliResult h = shardfuse("explain " + (d / "a.sf") + " --device cuda --arch sm_90a");
  ASSERT_EQ(h.code, 0) << h.out;
  EXPECT_NE(h.out.find("tensor cores, mma.sync (wgmma, not the default until a GPU has timed it: compile "
                       "--attention-config \"wgmma=1\" or \"wgmma=2\")"),
            std::string::npos)
      << h.out;
  CliResult a = shardfuse("explain " + (d / "a.sf") + " --device cuda --arch sm_80");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("    tensor cores, mma.sync\n"), std::string::npos) << a.out;
  write_file(d / "f.sf", "graph f(q: f32[1, 2, 64, 64], k: f32[1, 2, 64, 64], v: f32[1, 2, 64, 64]) {\n"
                         "  out = scaled_dot_product_attention(q, k, v)\n  return out\n}\n");
  CliResult f = shardfuse("explain " + (d / "f.sf") + " --device cuda --arch sm_90a");
  EXPECT_NE(f.out.find("SIMT FMA, no tensor cores"), std::string::npos) << f.out;
  CliResult p = shardfuse("explain " + std::string(SF_SOURCE_DIR) + "/bench/graphs/kernels/pointwise_bias_gelu_bf16_16384x4096.sf" +
                          " --device cuda --arch sm_90a");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("compile takes block=256 vector=8 elems_per_thread=1 grid_stride=1 max_blocks=4096 instead where "
                       "ptxas reports spills"),
            std::string::npos)
      << p.out;
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
