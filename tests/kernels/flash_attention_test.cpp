// The fused attention emitter (codegen/kernels/attention.h) on its own: a group graph
// is the decomposed scaled_dot_product_attention (or attention written out), emitted
// as one host kernel with tiles that divide the rows and keys and tiles that do not,
// and compared with the float64 reference evaluator on the undecomposed graph (the
// reference never runs the emitter's code). Causal masks with tiles skipped, GQA
// through the repeat views, boolean and additive masks, bf16, rows with every key
// masked (NaN, as the reference), and the NVPTX kernel through ptxas.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/attention_sim.h"
#include "tests/sanitized.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "autotune/space.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/attention.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_flash_attention_test {

Graph parse(const std::string& params, const std::string& body) {
  Result<Graph> g = parse_graph("graph attn(" + params + ") {\n" + body + "\n}\n", "attn.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

KernelConfig tiles(int bm, int bn) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  return c;
}

// The fused kernel of `g` (decomposed: the group fusion gives the emitter) with config
// `c` on the host, against the reference on `g` itself.
void expect_matches(const Graph& g, const KernelConfig& c, uint64_t seed, const std::string& what,
                    const std::vector<Tensor>* given = nullptr) {
  const Graph group = decompose(g);
  std::vector<Tensor> in = given ? *given : random_inputs(g, seed);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  KernelSpec spec{"sf_attention_test", KernelKind::Attention, group};
  Result<std::vector<Tensor>> got =
      kernel_test::run_emitted(emit_attention(spec, c, llvmb::Target::host()), group, in);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  const ValueId out = g.outputs()[0].value;
  Comparison cmp = compare((*got)[0], (*want)[0], check_tolerance(g, out));
  EXPECT_TRUE(cmp.ok()) << what << " block_m " << c.block_m << " block_n " << c.block_n << ": max_abs_err "
                        << cmp.max_abs_err << ", first mismatch at " << cmp.first_mismatch;
}

// Tiles of one row and one key, tiles that divide neither 7 rows nor 9 keys, and one
// tile larger than both.
TEST(FlashAttention, MatchesTheReferenceForEveryTileShape) {
  Graph g = parse("q: f32[2, 3, 7, 5], k: f32[2, 3, 9, 5], v: f32[2, 3, 9, 4]",
                  "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  for (auto [bm, bn] : {std::pair{1, 1}, {2, 3}, {4, 4}, {7, 9}, {3, 16}, {64, 64}}) expect_matches(g, tiles(bm, bn), 1, "plain");
}

// Causal: key j is seen by row i when j <= i. With 2-row tiles, the first block sees
// keys 0..1 only, so key tiles past them are skipped; the result is still softmax over
// the keys each row may see.
TEST(FlashAttention, CausalSkipsKeyTilesAndStillMatches) {
  Graph g = parse("q: f32[1, 2, 10, 4], k: f32[1, 2, 10, 4], v: f32[1, 2, 10, 3]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n  return out");
  for (auto [bm, bn] : {std::pair{1, 1}, {2, 3}, {4, 4}, {3, 7}, {16, 16}}) expect_matches(g, tiles(bm, bn), 2, "causal");
  // The key loop's bound is the clamped diagonal (no such bound without the mask).
  KernelSpec spec{"sf_causal", KernelKind::Attention, decompose(g)};
  Result<EmittedKernel> k = emit_attention(spec, tiles(2, 2), llvmb::Target::host());
  ASSERT_TRUE(k.ok()) << k.error().str();
  EXPECT_NE(kernel_test::module_text(*k->module).find("kv_end"), std::string::npos);
  Result<AttentionKernelInfo> info = attention_info(decompose(g));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->match.causal_diagonal, std::optional<int64_t>(0));
  Graph plain = parse("q: f32[1, 2, 10, 4], k: f32[1, 2, 10, 4], v: f32[1, 2, 10, 3]",
                      "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  Result<AttentionKernelInfo> no_mask = attention_info(decompose(plain));
  ASSERT_TRUE(no_mask.ok());
  EXPECT_FALSE(no_mask->match.causal_diagonal.has_value());
}

// A rank holding query rows from 3 on (query_offset 3: row i sees keys j <= i + 3), and
// one whose first two rows see no key at all (query_offset -2): softmax of a row of
// -inf is NaN in the reference, and 0 / 0 in the kernel.
TEST(FlashAttention, CausalRowsOfAShardMaskByTheirGlobalRow) {
  for (int64_t off : {3, -2}) {
    Graph g = parse("q: f32[1, 1, 4, 3], k: f32[1, 1, 9, 3], v: f32[1, 1, 9, 2]",
                    "  out = scaled_dot_product_attention(q, k, v, is_causal=true, query_offset=" +
                        std::to_string(off) + ")\n  return out");
    for (auto [bm, bn] : {std::pair{1, 2}, {3, 4}, {4, 16}}) expect_matches(g, tiles(bm, bn), 3, "offset " + std::to_string(off));
    if (off < 0) {
      const Graph group = decompose(g);
      std::vector<Tensor> in = random_inputs(g, 3);
      Result<std::vector<Tensor>> got = kernel_test::run_emitted(
          emit_attention(KernelSpec{"sf_nan", KernelKind::Attention, group}, tiles(2, 2), llvmb::Target::host()), group, in);
      ASSERT_TRUE(got.ok()) << got.error().str();
      EXPECT_TRUE(std::isnan((*got)[0].get(0)) && std::isnan((*got)[0].get(3))) << "rows 0 and 1 see no key";
      EXPECT_FALSE(std::isnan((*got)[0].get(4))) << "row 2 sees key 0";
    }
  }
}

// 4 query heads over 2 kv heads: query head h reads kv head h / 2 through the
// decomposition's repeat views, which the kernel reads in place.
TEST(FlashAttention, GroupedQueryHeadsReadTheirKvHead) {
  Graph g = parse("q: f32[2, 4, 5, 3], k: f32[2, 2, 6, 3], v: f32[2, 2, 6, 4]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  for (auto [bm, bn] : {std::pair{2, 2}, {5, 6}, {8, 4}}) expect_matches(g, tiles(bm, bn), 4, "gqa");
  // A block takes both query heads of a kv head (block_m 8: 4 rows of each), so each
  // k and v tile is read once per group: 2 batches x 2 kv heads x 2 row tiles of 4
  // (5 rows) = 8 blocks where one head per block would take 16 (block_m 5, not a
  // multiple of the group, keeps one head per block: 2 x 4 x 1).
  Result<AttentionKernelInfo> info = attention_info(decompose(g));
  ASSERT_TRUE(info.ok()) << info.error().str();
  EXPECT_EQ(info->heads_per_kv, 2);
  KernelConfig c = tiles(8, 4);
  c.warps = 2;
  for (auto [bm, blocks] : {std::pair{8, 8}, {5, 8}, {16, 4}}) {
    c.block_m = bm;
    Result<EmittedKernel> k =
        emit_attention(KernelSpec{"sf_gqa", KernelKind::Attention, decompose(g)}, c, llvmb::Target::nvptx("sm_80"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    EXPECT_EQ(k->launch.grid[0], blocks) << "block_m " << bm;
  }
  // A rank whose query heads start inside a group (head_offset 1: its heads 0, 1, 2
  // read kv heads 0, 1, 1) keeps one head per block.
  Graph odd = parse("q: f32[1, 3, 4, 2], k: f32[1, 2, 5, 2], v: f32[1, 2, 5, 2]",
                    "  out = scaled_dot_product_attention(q, k, v, enable_gqa=true, head_offset=1, gqa_group=2)\n"
                    "  return out");
  Result<AttentionKernelInfo> oi = attention_info(decompose(odd));
  ASSERT_TRUE(oi.ok()) << oi.error().str();
  EXPECT_EQ(oi->heads_per_kv, 1);
  for (auto [bm, bn] : {std::pair{2, 2}, {4, 8}}) expect_matches(odd, tiles(bm, bn), 14, "gqa, offset 1");
}

// A boolean mask (true: takes part) broadcast over batch and heads, and an additive
// float mask, through the kernel's score chain.
TEST(FlashAttention, BooleanAndAdditiveMasks) {
  Graph b = parse("q: f32[2, 2, 5, 3], k: f32[2, 2, 6, 3], v: f32[2, 2, 6, 2], m: bool[5, 6]",
                  "  out = scaled_dot_product_attention(q, k, v, m)\n  return out");
  std::vector<Tensor> in = random_inputs(b, 5);
  for (int64_t i = 0; i < 5; ++i) in[3].set(i * 6 + i % 6, 1.0);  // every row keeps a key
  for (auto [bm, bn] : {std::pair{2, 4}, {5, 6}}) expect_matches(b, tiles(bm, bn), 5, "bool mask", &in);
  Graph a = parse("q: f32[2, 2, 5, 3], k: f32[2, 2, 6, 3], v: f32[2, 2, 6, 2], m: f32[2, 1, 5, 6]",
                  "  out = scaled_dot_product_attention(q, k, v, m, scale=0.3)\n  return out");
  for (auto [bm, bn] : {std::pair{2, 4}, {4, 3}}) expect_matches(a, tiles(bm, bn), 6, "additive mask");
}

// bf16 operands are widened as loaded; the output is rounded once at the store (within
// the dtype's check tolerance of the float64 reference).
TEST(FlashAttention, Bf16WithinItsTolerance) {
  Graph g = parse("q: bf16[1, 2, 9, 8], k: bf16[1, 2, 9, 8], v: bf16[1, 2, 9, 8]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n  return out");
  for (auto [bm, bn] : {std::pair{4, 4}, {16, 8}}) expect_matches(g, tiles(bm, bn), 7, "bf16");
}

// Attention written out (transformer_block.sf's form, with causal_attention.sf's
// where-mask of -1e9 from a generated tril): the same kernel, the chain evaluated per
// score. The -1e9 fill is not -inf, so no key tile is skipped.
TEST(FlashAttention, WrittenOutAttentionWithAGeneratedMask) {
  Graph g = parse("q: f32[2, 3, 6, 4], k: f32[2, 3, 6, 4], v: f32[2, 3, 6, 4]",
                  "  causal = tril(full([6, 6], 1.0))\n"
                  "  s = mul(matmul(q, transpose(k, -2, -1)), 0.5)\n"
                  "  p = softmax(where(eq(causal, 0.0), -1e9, s), dim=-1)\n"
                  "  out = matmul(p, v)\n  return out");
  for (auto [bm, bn] : {std::pair{1, 1}, {4, 4}, {6, 6}}) expect_matches(g, tiles(bm, bn), 8, "written out");
  Result<AttentionKernelInfo> info = attention_info(decompose(g));
  ASSERT_TRUE(info.ok()) << info.error().str();
  EXPECT_FALSE(info->match.causal_diagonal.has_value());
  EXPECT_EQ(info->match.e, 4);
  EXPECT_EQ(info->match.l, 6);
}

TEST(FlashAttention, RefusesWhatItCannotHold) {
  // No attention in the group.
  Graph mm = parse("a: f32[4, 4], b: f32[4, 4]", "  out = matmul(a, b)\n  return out");
  Result<EmittedKernel> none = emit_attention(KernelSpec{"sf_x", KernelKind::Attention, mm}, {}, llvmb::Target::host());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("holds no attention"), std::string::npos) << none.error().message;
  // Tiles over the host's budget, and a block_m out of range, named.
  Graph g = parse("q: f32[1, 1, 256, 256], k: f32[1, 1, 256, 256], v: f32[1, 1, 256, 256]",
                  "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  KernelSpec spec{"sf_big", KernelKind::Attention, decompose(g)};
  Result<EmittedKernel> big = emit_attention(spec, tiles(256, 256), llvmb::Target::host());
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find(std::to_string(attention_tile_bytes(256, 256, 256, 256)) + " bytes"),
            std::string::npos)
      << big.error().message;
  Result<EmittedKernel> zero = emit_attention(spec, tiles(0, 16), llvmb::Target::host());
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("block_m and block_n must be 1..256, got 0, 16"), std::string::npos);
  // A tile past the rows and keys is cut to them: 64 x 64 over 4 rows and 6 keys takes
  // the shared memory of a 4 x 6 tile.
  Graph small = parse("q: bf16[1, 1, 4, 8], k: bf16[1, 1, 6, 8], v: bf16[1, 1, 6, 8]",
                      "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  Result<EmittedKernel> cut =
      emit_attention(KernelSpec{"sf_cut", KernelKind::Attention, decompose(small)}, tiles(64, 64), llvmb::Target::nvptx("sm_80"));
  ASSERT_TRUE(cut.ok()) << cut.error().str();
  EXPECT_EQ(cut->launch.shared_bytes, attention_tile_bytes(4, 6, 8, 8));
}

KernelConfig tc(int bm, int bn, int warps) {
  KernelConfig c = tiles(bm, bn);
  c.warps = warps;
  return c;
}

TEST(FlashAttention, TensorCoreKernelSimulatedMatchesTheReference) {
  struct Case {
    const char* what;
    std::string params, body;
    std::vector<KernelConfig> configs;
  } cases[] = {
      // The register-resident form where the cut tile is 16 rows a warp (16 x 1,
      // 64 = 2 heads x 32 rows on 4 warps, 32 on 2) or 32 (two mma tiles a warp: 32 x 1,
      // 64 on 2; the f16 case's 20 rows cut to 32 on 1 warp, its second mma tile
      // partly past the rows), the shared-memory one elsewhere.
      {"bf16 causal gqa, 40 rows in 16- and 32-row tiles",
       "q: bf16[1, 4, 40, 16], k: bf16[1, 2, 40, 16], v: bf16[1, 2, 40, 16]",
       "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out",
       {tc(16, 16, 1), tc(32, 16, 4), tc(16, 32, 2), tc(64, 16, 4), tc(32, 32, 2), tc(32, 16, 1), tc(64, 32, 2)}},
      {"f16 with an additive mask, E 32, Ev 8", "q: f16[2, 1, 20, 32], k: f16[2, 1, 24, 32], v: f16[2, 1, 24, 8], m: f16[20, 24]",
       "  out = scaled_dot_product_attention(q, k, v, m)\n  return out",
       {tc(16, 16, 2), tc(32, 32, 4), tc(32, 32, 2), tc(32, 16, 1)}},
      // nanoGPT's written-out mask, its diagonal moved by 8 (row r sees keys up to
      // r + 8) over 40 keys, E 32 and Ev 16: the chain's tril reads the fragment's
      // (row, key) coordinates.
      {"bf16 written-out mask with a diagonal, 16 rows a warp",
       "q: bf16[1, 2, 16, 32], k: bf16[1, 2, 40, 32], v: bf16[1, 2, 40, 16]",
       "  s = mul(matmul(q, transpose(k, 2, 3)), 0.17677669529663687)\n"
       "  keep = tril(full([16, 40], 1.0), diagonal=8)\n"
       "  p = softmax(where(eq(keep, 0.0), -1e9, s), dim=-1)\n  out = matmul(p, v)\n  return out",
       {tc(16, 16, 1), tc(16, 32, 1), tc(32, 32, 2)}},  // the last cut to 16 rows on 2 warps: shared
      // Arithmetic in q's and k's prologues and a view in v's: the 16-byte loads'
      // lanes computed on, then rounded to the tile (a plain view's lanes are stored
      // as loaded).
      {"bf16 with prologues, E 16", "q: bf16[2, 2, 32, 16], k: bf16[2, 2, 24, 16], v: bf16[2, 24, 2, 16]",
       "  out = scaled_dot_product_attention(mul(q, 1.5), neg(k), permute(v, dims=[0, 2, 1, 3]))\n  return out",
       {tc(32, 16, 2), tc(16, 16, 1), tc(32, 16, 1)}},
      // The tensor-core default where a head has 128 rows or more: 128 rows on 8 warps
      // (16 a warp) over 64 keys, here as 2 query heads x 64 rows of one GQA group,
      // a whole tile and a cut one over 72 rows (the sanitizer build's sample runs
      // the 128 x 64).
      {"bf16 causal gqa, the default's 128 x 64 on 8 warps",
       "q: bf16[1, 2, 72, 16], k: bf16[1, 1, 72, 16], v: bf16[1, 1, 72, 16]",
       "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out",
       {tc(128, 32, 8), tc(128, 64, 8)}},
  };
  int registers = 0, shared = 0, two_tiles = 0;
  size_t config_index = 0;
  for (const Case& c : cases) {
    Graph g = parse(c.params, c.body);
    const Graph group = decompose(g);
    std::vector<Tensor> in = random_inputs(g, 9);
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    Result<AttentionKernelInfo> info = attention_info(group);
    ASSERT_TRUE(info.ok()) << c.what << ": " << info.error().str();
    for (const KernelConfig& cfg : c.configs) {
      const AttentionBlockShape shape = attention_block_shape(*info, cfg, true);
      const bool regs = shape.registers;
      ++(regs ? registers : shared);
      two_tiles += shape.mtiles == 2;
      // The sanitizer build's sample (tests/sanitized.h): every other config (every
      // case, and both forms, still run).
      if (!test::in_sample(config_index++)) continue;
      // The kernel on the simulated hardware (attention_sim.h), every block of the grid.
      attention_sim::SimRun run;
      Result<std::vector<Tensor>> got = attention_sim::run_simulated(group, in, cfg, &run);
      ASSERT_TRUE(got.ok()) << c.what << ": " << got.error().str();
      EXPECT_EQ(run.hw_error, "") << c.what;
      const int wavefronts = run.wavefronts;
      const int64_t copies = run.copies;
      EXPECT_GT(run.mma, 0) << c.what;
      EXPECT_EQ(run.wgmma, 0) << c.what;
      // The register-resident form reads its fragments with ldmatrix.x4 from rows
      // padded by 8 elements: every phase one wavefront.
      EXPECT_EQ(wavefronts, regs ? 1 : 0) << c.what << " " << cfg.block_m << "x" << cfg.block_n;
      // ... and copies k and v (plain views of 16-byte aligned params: each case's v,
      // and k where no arithmetic reads it) into double buffers by cp.async, which
      // the simulation checks are waited for and published before any ldmatrix reads
      // them; the shared-memory form loads with its threads.
      if (regs)
        EXPECT_GT(copies, 0) << c.what << " " << cfg.block_m << "x" << cfg.block_n;
      else
        EXPECT_EQ(copies, 0) << c.what << " " << cfg.block_m << "x" << cfg.block_n;
      Comparison cmp = compare((*got)[0], (*want)[0], check_tolerance(g, g.outputs()[0].value));
      EXPECT_TRUE(cmp.ok()) << c.what << " " << cfg.block_m << "x" << cfg.block_n << " warps " << cfg.warps
                            << ": max_abs_err " << cmp.max_abs_err << ", first mismatch at " << cmp.first_mismatch;
    }
  }
  EXPECT_EQ(registers, 14) << "configs in the register-resident form";
  EXPECT_EQ(two_tiles, 4) << "of them with two mma tiles a warp";
  EXPECT_EQ(shared, 5) << "configs in the shared-memory form";
  // What the tensor cores cannot take is named.
  Graph f32 = parse("q: f32[1, 1, 16, 16], k: f32[1, 1, 16, 16], v: f32[1, 1, 16, 16]",
                    "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  EXPECT_NE(attention_mma_unfit(decompose(f32), tc(16, 16, 4)).value_or("").find("not one 16-bit dtype"), std::string::npos);
  Graph odd = parse("q: bf16[1, 1, 16, 12], k: bf16[1, 1, 16, 12], v: bf16[1, 1, 16, 16]",
                    "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  EXPECT_NE(attention_mma_unfit(decompose(odd), tc(16, 16, 4)).value_or("").find("head dims 12, 16"), std::string::npos);
  EXPECT_NE(attention_mma_unfit(decompose(f32), tc(8, 16, 4)).value_or("").find("not one 16-bit"), std::string::npos);
}

// A causal attention's blocks take the query tiles longest first (the tiles of the
// last rows see the most keys), group_heads kv-head groups side by side at a time
// (KernelConfig::group_heads; FlashAttention-3's longest-first order): the simulated
// GPU runs the blocks in the order of their index, and each block's output rows say
// which (kv-head group, query tile) it took. The expected order is written out here
// from the rule; the results still match the reference.
TEST(FlashAttention, CausalBlocksTakeTheLongestQueryTilesFirst) {
  // 2 batches x 4 query heads in GQA groups of 2: 4 kv-head groups; a block takes a
  // group's 2 heads x 16 rows (32 rows on 2 warps, the register-resident form), 3
  // query tiles over 48 rows.
  const std::string params = "q: bf16[2, 4, 48, 16], k: bf16[2, 2, 48, 16], v: bf16[2, 2, 48, 16]";
  struct Case {
    const char* what;
    bool causal;
    int group_heads;
    std::vector<std::pair<int, int>> order;  // block bx's (kv-head group, query tile)
  } cases[] = {
      // Sections of 3 groups, then the 1 left: each walks its tiles from the last.
      {"causal, group_heads=3", true, 3, {{0, 2}, {1, 2}, {2, 2}, {0, 1}, {1, 1}, {2, 1}, {0, 0}, {1, 0}, {2, 0}, {3, 2}, {3, 1}, {3, 0}}},
      // 0: as many groups as keep their k and v within 16 MiB: all 4 here.
      {"causal, group_heads=0", true, 0, {{0, 2}, {1, 2}, {2, 2}, {3, 2}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {0, 0}, {1, 0}, {2, 0}, {3, 0}}},
      // Without a causal mask every tile costs the same: the grid's plain order.
      {"not causal", false, 0, {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}, {2, 0}, {2, 1}, {2, 2}, {3, 0}, {3, 1}, {3, 2}}},
  };
  for (const Case& c : cases) {
    Graph g = parse(params, std::string("  out = scaled_dot_product_attention(q, k, v") +
                                (c.causal ? ", is_causal=true" : "") + ", enable_gqa=true)\n  return out");
    const Graph group = decompose(g);
    std::vector<Tensor> in = random_inputs(g, 4);
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    KernelConfig cfg = tc(32, 16, 2);
    cfg.group_heads = c.group_heads;
    Result<AttentionKernelInfo> info = attention_info(group);
    ASSERT_TRUE(info.ok()) << info.error().str();
    const AttentionBlockOrder order = attention_block_order(group, *info, cfg, attention_block_shape(*info, cfg, true));
    EXPECT_EQ(order.groups, 4) << c.what;
    EXPECT_EQ(order.query_tiles, 3) << c.what;
    EXPECT_EQ(order.width, c.causal ? (c.group_heads ? c.group_heads : 4) : 0) << c.what;
    // Which block wrote each output row (batch x head, row): -1 until one did. The
    // output starts as 0x7f bytes (attention_sim.h).
    std::vector<int64_t> writer(8 * 48, -1);
    std::string bad;
    attention_sim::SimRun run;
    Result<std::vector<Tensor>> got = attention_sim::run_simulated(
        group, in, cfg, &run, false, false, false, [&](int64_t bx, const std::vector<Tensor>& out) {
          const auto* bits = reinterpret_cast<const uint16_t*>(out[0].data());
          for (int64_t row = 0; row < 8 * 48; ++row) {
            if (writer[static_cast<size_t>(row)] >= 0 || bits[row * 16] == 0x7f7f) continue;
            writer[static_cast<size_t>(row)] = bx;
          }
        });
    ASSERT_TRUE(got.ok()) << c.what << ": " << got.error().str();
    EXPECT_EQ(run.hw_error, "") << c.what;
    ASSERT_EQ(c.order.size(), 12u);
    for (int64_t row = 0; row < 8 * 48; ++row) {
      const int64_t head = row / 48, r = row % 48;  // head = batch x 4 + query head
      const std::pair<int, int> took{static_cast<int>(head / 2), static_cast<int>(r / 16)};
      const auto at = std::find(c.order.begin(), c.order.end(), took);
      const int64_t want_bx = at - c.order.begin();
      if (writer[static_cast<size_t>(row)] != want_bx && bad.empty())
        bad = "row " + std::to_string(r) + " of head " + std::to_string(head) + " written by block " +
              std::to_string(writer[static_cast<size_t>(row)]) + ", expected block " + std::to_string(want_bx);
    }
    EXPECT_EQ(bad, "") << c.what;
    Comparison cmp = compare((*got)[0], (*want)[0], check_tolerance(g, g.outputs()[0].value));
    EXPECT_TRUE(cmp.ok()) << c.what << ": max_abs_err " << cmp.max_abs_err << ", first mismatch at " << cmp.first_mismatch;
  }
  // A negative group_heads is refused by name.
  Graph g = parse(params, "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  KernelConfig neg = tc(32, 16, 2);
  neg.group_heads = -2;
  Result<EmittedKernel> k = emit_attention(KernelSpec{"sf_neg", KernelKind::Attention, decompose(g)}, neg, llvmb::Target::nvptx("sm_90a"));
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().message.find("group_heads must be 0"), std::string::npos) << k.error().message;
  EXPECT_NE(k.error().message.find("got -2"), std::string::npos) << k.error().message;
}

// The register-resident form folds the attention's scale into the softmax's exp2
// where the logits are the scaled scores under masks alone, in fused precision: the
// PTX of a causal sdpa at head dim 64 multiplies no score by 1/8 (0f3E000000), its
// exps taking 1/8 log2 e (0f3E38AA3B); in eager precision every node rounds, and the
// product stays. On the simulated GPU the folded kernel and one whose mask reads the
// scaled scores (where(s > 0.5, s, -inf): folding there would test the raw scores)
// match the reference.
TEST(FlashAttention, TheScaleFoldsIntoTheExpWhereOnlyMasksFollowIt) {
  Graph g = parse("q: bf16[1, 2, 64, 64], k: bf16[1, 2, 64, 64], v: bf16[1, 2, 64, 64]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n  return out");
  for (Precision p : {Precision::Fused, Precision::Eager}) {
    KernelSpec spec{"sf_fold", KernelKind::Attention, decompose(g), p};
    Result<EmittedKernel> k = emit_attention(spec, tc(64, 64, 4), llvmb::Target::nvptx("sm_80"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_80");
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    // A thread's 32 scores a key tile (16 rows a warp, 64 keys), on the masked and the
    // unmasked tiles' paths; folded, only the two rows' rescaling exponents are
    // multiplied by 1/8.
    const size_t by_scale = kernel_test::count_of(*ptx, "0f3E000000;");
    if (p == Precision::Fused) {
      EXPECT_LE(by_scale, 4u) << "fused";
      EXPECT_GE(kernel_test::count_of(*ptx, "0f3E38AA3B"), 24u) << "fused";
    } else {
      EXPECT_GE(by_scale, 24u) << "eager";
      EXPECT_EQ(kernel_test::count_of(*ptx, "0f3E38AA3B"), 0u) << "eager";
    }
  }
  // where(s > 0.5, s, -inf) (built here: the format has no inf literal).
  GraphBuilder b("reads");
  auto bf = [&](const char* n) { return b.param(n, DType::BF16, {1, 2, 32, 16}); };
  Value q = bf("q"), kk = bf("k"), v = bf("v");
  Value sc = b.op(OpKind::Mul, {b.op(OpKind::Matmul, {q, b.op(OpKind::Transpose, {kk}, {int64_t{2}, int64_t{3}})}), b.constant(0.25)});
  Value masked = b.op(OpKind::Where, {b.op(OpKind::Gt, {sc, b.constant(0.5)}), sc, b.constant(-INFINITY)});
  b.ret(b.op(OpKind::Matmul, {b.op(OpKind::Softmax, {masked}, {int64_t{-1}}), v}));
  Result<Graph> built = b.finish();
  ASSERT_TRUE(built.ok()) << built.error().str();
  const Graph reads = std::move(built).value();
  for (const Graph* gr : std::vector<const Graph*>{&g, &reads}) {
    const Graph group = decompose(*gr);
    ASSERT_TRUE(attention_info(group).ok()) << attention_info(group).error().str();
    std::vector<Tensor> in = random_inputs(*gr, 3);
    // q and k of -0.5, 0 and 0.5: every score a multiple of 1/16, exact in bf16, so
    // that rounding moves none across the mask's 0.5 (a scale applied twice would).
    for (size_t t = 0; t < 2; ++t) {
      auto* bits = reinterpret_cast<uint16_t*>(in[t].data());
      for (int64_t i = 0; i < in[t].numel(); ++i)
        bits[i] = std::array<uint16_t, 3>{0xBF00, 0, 0x3F00}[(static_cast<uint64_t>(i + 1000 * t) * 2654435761u >> 13) % 3];
    }
    Result<std::vector<Tensor>> want = evaluate(*gr, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    attention_sim::SimRun run;
    Result<std::vector<Tensor>> got = attention_sim::run_simulated(group, in, tc(32, 16, 2), &run);
    ASSERT_TRUE(got.ok()) << got.error().str();
    EXPECT_EQ(run.hw_error, "");
    Comparison cmp = compare((*got)[0], (*want)[0], check_tolerance(*gr, gr->outputs()[0].value));
    EXPECT_TRUE(cmp.ok()) << gr->name() << ": max_abs_err " << cmp.max_abs_err << ", first mismatch at " << cmp.first_mismatch;
  }
}

// The bench's sdpa block (8 x 32 query heads over 8 kv heads, 2048 rows and keys, E =
// Ev = 128, bf16, causal): a kv head's k and v are 2048 x 256 x 2 bytes = 1 MiB, so the
// default takes 16 of the 64 groups at a time; at sm_90a's default tile (4 heads x 64
// rows) each has 32 query tiles.
TEST(FlashAttention, TheDefaultOrderKeepsSixteenMibOfKeysAndValuesInL2) {
  Graph g = parse("q: bf16[8, 32, 2048, 128], k: bf16[8, 8, 2048, 128], v: bf16[8, 8, 2048, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  const Graph group = decompose(g);
  Result<AttentionKernelInfo> info = attention_info(group);
  ASSERT_TRUE(info.ok()) << info.error().str();
  KernelConfig cfg = tc(256, 64, 16);
  cfg.wgmma = 1;
  const AttentionBlockOrder o = attention_block_order(group, *info, cfg, attention_block_shape(*info, cfg, true));
  EXPECT_EQ(o.kv_bytes_per_group, int64_t{1} << 20);
  EXPECT_EQ(o.width, 16);
  EXPECT_EQ(o.groups, 64);
  EXPECT_EQ(o.query_tiles, 32);
  EXPECT_EQ(attention_order_str(o), "blocks: query tiles longest first, 16 kv-head group(s) of 64 at a time (their k and v 16.0 MiB)");
  cfg.group_heads = 100;  // more than there are: all of them
  EXPECT_EQ(attention_block_order(group, *info, cfg, attention_block_shape(*info, cfg, true)).width, 64);
}

// The NVPTX kernel (causal GQA with RoPE-free views) assembles for sm_80 and sm_90a,
// with its tiles in dynamic shared memory and no spills at the default config; bf16
// multiplies on the tensor cores, f32 in FMA.
TEST(FlashAttention, PtxPassesPtxasForSm80AndSm90a) {
  if (!kernel_test::have_ptxas()) GTEST_SKIP() << "no ptxas";
  Graph g = parse("q: bf16[2, 4, 64, 64], k: bf16[2, 2, 64, 64], v: bf16[2, 2, 64, 64]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  const Graph group = decompose(g);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    KernelSpec spec{"sf_flash", KernelKind::Attention, group};
    Result<EmittedKernel> k = emit_attention(spec, tiles(32, 32), llvmb::Target::nvptx(arch));
    ASSERT_TRUE(k.ok()) << k.error().str();
    EXPECT_EQ(k->launch.shared_bytes, attention_tile_bytes(32, 32, 64, 64));
    EXPECT_EQ(k->launch.grid[0], 2 * 4 * 2) << "one block per (batch, head, 32-row tile)";
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    EXPECT_NE(ptx->find("bar.sync"), std::string::npos);
    EXPECT_NE(ptx->find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), std::string::npos) << arch;
    Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, arch);
    ASSERT_TRUE(res.ok()) << arch << ": " << res.error().str();
    ASSERT_EQ(res->size(), 1u);
    EXPECT_EQ((*res)[0].spill_store_bytes, 0) << arch;
  }
  // The default tile (64 x 64, 4 warps: 16 rows a warp) at the bench block's head dim
  // takes the register-resident form: only q, k and v in shared memory, 16-bit (52
  // KiB with the rows padded), loaded 16 bytes at a time, fragments by ldmatrix.x4, the row statistics over quads by shuffles; no
  // f32 tile read back, no spills.
  Graph big = parse("q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]",
                    "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  for (const char* arch : {"sm_80", "sm_90a"}) {
    KernelSpec spec{"sf_flash_regs", KernelKind::Attention, decompose(big)};
    Result<EmittedKernel> k = emit_attention(spec, tc(64, 64, 4), llvmb::Target::nvptx(arch));
    ASSERT_TRUE(k.ok()) << k.error().str();
    EXPECT_EQ(k->launch.shared_bytes, 2 * (64 * 136 + 2 * (64 * 136 + 64 * 136))) << arch << ": rows padded by 8, k and v twice";
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    EXPECT_NE(ptx->find("shfl.sync.bfly"), std::string::npos) << arch;
    EXPECT_NE(ptx->find("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), std::string::npos) << arch;
    // Each row half's running max is max.f32 (not a compare and a select): two
    // scores of each of the 8 n8 tiles and the two shuffled maxima, for rows g and
    // g + 8.
    EXPECT_EQ(kernel_test::count_of(*ptx, "max.f32"), 2u * (2 * 8 + 2)) << arch;
    EXPECT_EQ(ptx->find("ld.shared.f32"), std::string::npos) << arch << ": an f32 tile read back";
    // q, k and v (plain params, through GQA's views) are copied by cp.async: q's tile
    // in key tile 0's group, k's and v's double-buffered, the next tile's copies in
    // flight during this tile's products and waited for at the top of the next
    // iteration (5 copy sites: q, then k and v before the loop and in it). The
    // threads' loads stay for misaligned pointers (element by element, stored 16
    // bytes at a time); 16-byte register loads are for operands that compute (below).
    size_t copies = 0;
    for (size_t at = ptx->find("cp.async.cg.shared.global"); at != std::string::npos;
         at = ptx->find("cp.async.cg.shared.global", at + 1))
      ++copies;
    EXPECT_EQ(copies, 5u) << arch;
    EXPECT_NE(ptx->find("cp.async.wait_group 0"), std::string::npos) << arch;
    EXPECT_EQ(ptx->find("ld.global.nc.v4.u32"), std::string::npos) << arch;
    EXPECT_NE(ptx->find("st.shared.v4.b32"), std::string::npos) << arch;
    Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, arch);
    ASSERT_TRUE(res.ok()) << arch << ": " << res.error().str();
    EXPECT_EQ((*res)[0].spill_store_bytes, 0) << arch << ", " << (*res)[0].registers << " registers";
  }
  // Two mma tiles a warp (32 rows, FlashAttention-2's 128 x 32 on 4 warps): the same
  // ldmatrix.x4 of k and v feeds both, so a key tile's code issues 128 mma for 48
  // ldmatrix where 16 rows a warp (64 x 32) issue 64 for 40; both assemble, and 128 x
  // 32 spills nothing on sm_80 (on sm_90a ptxas spilled 16 bytes at 255 registers).
  for (const char* arch : {"sm_80", "sm_90a"}) {
    size_t mma[2] = {0, 0}, ldsm[2] = {0, 0};
    for (int two = 0; two < 2; ++two) {
      KernelSpec spec{"sf_flash_tiles", KernelKind::Attention, decompose(big)};
      Result<EmittedKernel> k = emit_attention(spec, tc(two ? 128 : 64, 32, 4), llvmb::Target::nvptx(arch));
      ASSERT_TRUE(k.ok()) << k.error().str();
      Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      mma[two] = kernel_test::count_of(*ptx, "mma.sync.aligned.m16n8k16");
      ldsm[two] = kernel_test::count_of(*ptx, "ldmatrix.sync.aligned");
      Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, arch);
      ASSERT_TRUE(res.ok()) << arch << ": " << res.error().str();
      if (two && std::string(arch) == "sm_80") {
        EXPECT_EQ((*res)[0].spill_store_bytes, 0) << (*res)[0].registers << " registers";
      }
    }
    EXPECT_EQ(mma[0], 64u) << arch;
    EXPECT_EQ(ldsm[0], 40u) << arch;
    EXPECT_EQ(mma[1], 128u) << arch;
    EXPECT_EQ(ldsm[1], 48u) << arch;
  }
  // A q that computes (a scale, as RoPE's arithmetic would) is loaded by the threads,
  // 16 bytes at a time, the lanes computed on and stored; k and v are still copied.
  Graph scaled = parse("q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]",
                       "  out = scaled_dot_product_attention(mul(q, 1.5), k, v, is_causal=true, enable_gqa=true)\n  return out");
  Result<EmittedKernel> sk = emit_attention(KernelSpec{"sf_flash_scaled", KernelKind::Attention, decompose(scaled)}, tc(64, 64, 4),
                                            llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(sk.ok()) << sk.error().str();
  Result<std::string> sptx = llvmb::compile_to_ptx(*sk->module, "sm_90a");
  ASSERT_TRUE(sptx.ok()) << sptx.error().str();
  EXPECT_NE(sptx->find("ld.global.nc.v4.u32"), std::string::npos);
  EXPECT_NE(sptx->find("cp.async.cg.shared.global"), std::string::npos);
  Graph f32 = parse("q: f32[1, 2, 64, 64], k: f32[1, 2, 64, 64], v: f32[1, 2, 64, 64]",
                    "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  Result<EmittedKernel> simt =
      emit_attention(KernelSpec{"sf_simt", KernelKind::Attention, decompose(f32)}, tiles(32, 32), llvmb::Target::nvptx("sm_80"));
  ASSERT_TRUE(simt.ok()) << simt.error().str();
  Result<std::string> ptx = llvmb::compile_to_ptx(*simt->module, "sm_80");
  ASSERT_TRUE(ptx.ok());
  EXPECT_EQ(ptx->find("mma.sync"), std::string::npos) << "f32 attention multiplies in FMA";
  EXPECT_EQ(kernel_test::ptxas_failure(*ptx, "sm_80"), "");
}

}  // namespace kernels_flash_attention_test
}  // namespace sf
