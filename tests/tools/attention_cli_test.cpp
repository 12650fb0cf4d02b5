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

// explain --device cuda names the attention kernel's form: on sm_90a wgmma by default
// from 256 query rows a head; below that mma.sync, saying how to force wgmma, or why
// wgmma cannot take it (head dim 96); sm_80 has no wgmma to offer; f32 stays on FMA.
// A wide pointwise default says what compile takes where ptxas finds it spilling.
TEST(CliAttention, ExplainNamesTheFormOnTheGpu) {
  TempDir d;
  // explain --device cuda of an attention over q [1, hq, rows, e] and k, v [1, hk, rows, e].
  auto explain = [&](const std::string& dtype, int hq, int hk, int rows, int e, const std::string& arch) {
    auto t = [&](int heads) {
      return dtype + "[1, " + std::to_string(heads) + ", " + std::to_string(rows) + ", " + std::to_string(e) + "]";
    };
    write_file(d / "g.sf", "graph g(q: " + t(hq) + ", k: " + t(hk) + ", v: " + t(hk) + ") {\n" +
                               "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n"
                               "  return out\n}\n");
    CliResult r = shardfuse("explain " + (d / "g.sf") + " --device cuda --arch " + arch);
    EXPECT_EQ(r.code, 0) << r.out;
    return r.out;
  };
  const std::string h = explain("bf16", 4, 2, 256, 128, "sm_90a");
  EXPECT_NE(h.find("block_m=256 block_n=64 warps=16 wgmma=1  [default]\n    tensor cores, wgmma\n"
                   "    k and v by TMA (rank 3 and 3 tensor maps)\n"),
            std::string::npos)
      << h;
  CliResult nt = shardfuse("explain " + (d / "g.sf") + " --device cuda --arch sm_90a --no-tma");
  EXPECT_NE(nt.out.find("    tensor cores, wgmma\n    k and v by cp.async: TMA is off\n"), std::string::npos) << nt.out;
  // Causal: the blocks take the query tiles longest first, both kv heads' k and v
  // (256 keys x 256 x 2 bytes each) within 16 MiB. compile's report.txt says the
  // same of the order --attention-config gives it.
  EXPECT_NE(h.find("\n    blocks: query tiles longest first, 2 kv-head group(s) of 2 at a time (their k and v 0.2 MiB)\n"),
            std::string::npos)
      << h;
  CliResult c = shardfuse("compile " + (d / "g.sf") + " --arch sm_90a --no-ptxas --no-host --attention-config group_heads=1 -o " +
                          (d / "p"));
  ASSERT_EQ(c.code, 0) << c.out;
  const std::string report = read_text(d / "p/report.txt");
  EXPECT_NE(report.find("block_m=256 block_n=64 warps=16 wgmma=1 group_heads=1"), std::string::npos) << report;
  // ... and, last, where k and v come from: dense [heads, S, E] params, 3-D tensor maps.
  EXPECT_NE(report.find("; blocks: query tiles longest first, 1 kv-head group(s) of 2 at a time (their k and v 0.1 MiB)"
                        "; k and v by TMA (rank 3 and 3 tensor maps)\n"),
            std::string::npos)
      << report;
  // Without TMA, the form line says so.
  CliResult off = shardfuse("compile " + (d / "g.sf") + " --arch sm_90a --no-ptxas --no-host --no-tma -o " + (d / "p2"));
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_NE(read_text(d / "p2/report.txt").find("; k and v by cp.async: TMA is off\n"), std::string::npos)
      << read_text(d / "p2/report.txt");
  CliResult bad = shardfuse("compile " + (d / "g.sf") + " --arch sm_90a --no-ptxas --no-host --attention-config group_heads=-1 -o " +
                            (d / "q"));
  EXPECT_NE(bad.code, 0) << bad.out;
  EXPECT_NE(bad.out.find("group_heads must be 0"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(d / "q")) << "no half-written output";
  const std::string sh = explain("bf16", 4, 2, 128, 128, "sm_90a");
  EXPECT_NE(sh.find("tensor cores, mma.sync (the default takes wgmma from 256 query rows a head; compile "
                    "--attention-config \"wgmma=1\" forces it on this tile)"),
            std::string::npos)
      << sh;
  const std::string n = explain("bf16", 2, 2, 256, 96, "sm_90a");
  EXPECT_NE(n.find("tensor cores, mma.sync (not wgmma: head dims 96 and 96 are not multiples of 64)"), std::string::npos) << n;
  const std::string a = explain("bf16", 4, 2, 256, 128, "sm_80");
  EXPECT_NE(a.find("    tensor cores, mma.sync\n"), std::string::npos) << a;
  const std::string f = explain("f32", 2, 2, 64, 64, "sm_90a");
  EXPECT_NE(f.find("SIMT FMA, no tensor cores"), std::string::npos) << f;
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
