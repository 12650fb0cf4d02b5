// The fused attention's register-resident form multiplying by wgmma on sm_90a
// (KernelConfig::wgmma; docs/kernels.md, "Attention"): the kernel built for the host
// and run on the simulated hardware (attention_sim.h; wgmma's A from registers placed
// by the PTX ISA's figure in ptx_isa_tables.h, B read through its matrix descriptor
// by the ISA's canonical layouts) against the float64 reference; what it refuses; and
// its PTX through ptxas.
#include <gtest/gtest.h>

#include "tests/autotune/autotune_test_util.h"
#include "tests/kernels/attention_sim.h"
#include "tests/sanitized.h"

#include <regex>
#include <string>
#include <vector>

#include "autotune/space.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/attention.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_flash_attention_wgmma_test {

Graph parse(const std::string& params, const std::string& body) {
  Result<Graph> g = parse_graph("graph attn(" + params + ") {\n" + body + "\n}\n", "attn.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

KernelConfig wg(int bm, int bn, int warps, int wgmma = 1) { return autotune_test::attention_tile(bm, bn, warps, wgmma); }
// wgmma = 2 with the warpgroups' ping-pong.
KernelConfig wgpp(int bm, int bn, int warps) {
  KernelConfig c = wg(bm, bn, warps, 2);
  c.pingpong = 1;
  return c;
}
// With a producer warpgroup (warp_specialize = 1).
KernelConfig producer(KernelConfig c) {
  c.warp_specialize = 1;
  return c;
}
// wgmma = 1 with `stages` k/v buffers (TMA's pipeline depth).
KernelConfig wgs(int bm, int bn, int warps, int stages) {
  KernelConfig c = wg(bm, bn, warps, 1);
  c.stages = stages;
  return c;
}

struct Case {
  const char* what;
  std::string params, body;
  std::vector<KernelConfig> configs;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      // The default tile's shape (128 rows on 8 warps: two warpgroups over one GQA
      // group's 2 heads x 64 rows) over 72 rows and keys: a whole tile and a cut one,
      // causal tiles skipped and masked; and one warpgroup over 64 rows (2 x 32).
      {"bf16 causal gqa, E = Ev = 64", "q: bf16[1, 2, 72, 64], k: bf16[1, 1, 72, 64], v: bf16[1, 1, 72, 64]",
       "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out",
       {wg(128, 64, 8), wg(64, 32, 4), wg(64, 16, 4), wg(128, 64, 8, 2), wg(64, 16, 4, 2), wg(64, 32, 4, 2)}},
      // Two 64-column panels of k (k steps 4..7 start in the second) and of v (the
      // descriptor's leading byte offset steps between them), 40 keys: the last key
      // tile partly past them.
      {"f16 with an additive mask, E = Ev = 128", "q: f16[1, 1, 64, 128], k: f16[1, 1, 40, 128], v: f16[1, 1, 40, 128], m: f16[64, 40]",
       "  out = scaled_dot_product_attention(q, k, v, m)\n  return out",
       {wg(64, 32, 4), wg(64, 16, 4), wg(64, 16, 4, 2), wg(64, 32, 4, 2)}},
      // Arithmetic in q's and k's prologues (loaded and stored by the threads, not
      // copied) and a view in v's, E 64 and Ev 128.
      {"bf16 with prologues, E 64, Ev 128", "q: bf16[1, 2, 64, 64], k: bf16[1, 2, 48, 64], v: bf16[1, 48, 2, 128]",
       "  out = scaled_dot_product_attention(mul(q, 1.5), neg(k), permute(v, dims=[0, 2, 1, 3]))\n  return out",
       {wg(64, 32, 4), wg(64, 16, 4), wg(64, 16, 4, 2)}},
      // sm_90a's default tile (256 rows on 16 warps: four warpgroups over the GQA
      // group's 2 heads x 128 rows) and its fallback, 192 x 96 on 12 warps (96-key
      // tiles: m64n96k16 scores, six k steps of 16 in the output), over 200 rows and
      // keys: whole 96-key tiles and a cut one of 8.
      {"bf16 causal gqa, 200 rows, E = Ev = 64", "q: bf16[1, 2, 200, 64], k: bf16[1, 1, 200, 64], v: bf16[1, 1, 200, 64]",
       "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out",
       {wg(192, 96, 12), wg(256, 64, 16), wg(192, 96, 12, 2)}},
  };
  return c;
}

// The kernel of every case and config on the simulated sm_90a, against the
// reference: every product a wgmma (none an mma.sync), the simulation's checks of
// the descriptors, the swizzle, the warpgroup's agreement and the copies' memory
// model all passed.
TEST(FlashAttentionWgmma, SimulatedKernelMatchesTheReference) {
  size_t index = 0;
  int ran = 0;
  for (const Case& c : cases()) {
    Graph g = parse(c.params, c.body);
    const Graph group = decompose(g);
    std::vector<Tensor> in = random_inputs(g, 5);
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    Result<AttentionKernelInfo> info = attention_info(group);
    ASSERT_TRUE(info.ok()) << c.what << ": " << info.error().str();
    for (const KernelConfig& cfg : c.configs) {
      const std::string what = std::string(c.what) + " " + config_str(KernelKind::Attention, ConfigTarget::Gpu, cfg);
      ASSERT_EQ(attention_block_shape(*info, cfg, true).mtiles, 1) << what << ": not 16 rows a warp";
      if (!test::in_sample(index++)) continue;  // the sanitizer build's sample (tests/sanitized.h)
      ++ran;
      attention_sim::SimRun run;
      Result<std::vector<Tensor>> got = attention_sim::run_simulated(group, in, cfg, &run);
      ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
      EXPECT_EQ(run.hw_error, "") << what;
      EXPECT_EQ(run.mma, 0) << what;
      // A key tile takes E / 16 products for the scores and bn / 16 for the output,
      // per warpgroup.
      const int64_t per_tile = int64_t{cfg.warps / 4} * (info->match.e / 16 + cfg.block_n / 16);
      EXPECT_GT(run.wgmma, 0) << what;
      EXPECT_EQ(run.wgmma % per_tile, 0) << what << ": " << run.wgmma << " wgmma";
      EXPECT_EQ(run.wavefronts, 0) << what << ": no ldmatrix (q too is read by wgmma)";
      EXPECT_GT(run.copies, 0) << what << ": v (a plain view of an aligned param) by cp.async";
      Comparison cmp = compare((*got)[0], (*want)[0], check_tolerance(g, g.outputs()[0].value));
      EXPECT_TRUE(cmp.ok()) << what << ": max_abs_err " << cmp.max_abs_err << ", first mismatch at " << cmp.first_mismatch;
    }
  }
  EXPECT_GE(ran, 3);
}

// Hardware whose wgmma read v's MN-major tile as K-major (imm-trans-b ignored) gives
// wrong results: the simulation's reading of the trans bit is what the test relies on.
TEST(FlashAttentionWgmma, HardwareThatIgnoresTransGivesWrongResults) {
  const Case& c = cases()[1];
  Graph g = parse(c.params, c.body);
  std::vector<Tensor> in = random_inputs(g, 5);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok());
  attention_sim::SimRun run;
  Result<std::vector<Tensor>> got = attention_sim::run_simulated(decompose(g), in, wg(64, 32, 4), &run, /*ignore_trans=*/true);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_FALSE(compare((*got)[0], (*want)[0], check_tolerance(g, g.outputs()[0].value)).ok());
}

// What wgmma cannot take is refused by name, on the GPU target and in the simulation.
TEST(FlashAttentionWgmma, RefusesWhatItCannotRun) {
  Graph g = parse("q: bf16[1, 1, 128, 64], k: bf16[1, 1, 128, 64], v: bf16[1, 1, 128, 64]",
                  "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  const KernelSpec spec{"sf_wg", KernelKind::Attention, decompose(g)};
  auto error = [&](const KernelConfig& c, const char* arch) {
    Result<EmittedKernel> k = emit_attention(spec, c, llvmb::Target::nvptx(arch));
    return k.ok() ? std::string("(emitted)") : k.error().message;
  };
  EXPECT_NE(error(wg(64, 32, 4), "sm_80").find("wgmma = 1: wgmma is sm_90a's, not sm_80's"), std::string::npos);
  EXPECT_NE(error(wg(64, 32, 4), "sm_90").find("not sm_90's"), std::string::npos);
  EXPECT_NE(error(wg(128, 32, 4), "sm_90a").find("128 rows on 4 warps is not 16 rows a warp"), std::string::npos);
  EXPECT_NE(error(wg(32, 32, 2), "sm_90a").find("2 warps are not whole warpgroups of 4"), std::string::npos);
  EXPECT_NE(error(wg(64, 32, 4, 3), "sm_90a").find("wgmma must be 0, 1 or 2, got 3"), std::string::npos);
  EXPECT_NE(error(wg(128, 32, 4, 2), "sm_90a").find("wgmma = 2: the tile of 128 rows"), std::string::npos);
  EXPECT_EQ(error(wg(64, 32, 4), "sm_90a"), "(emitted)");
  // Ping-pong: the pipelined form's warpgroups in pairs.
  EXPECT_NE(error(wgpp(64, 32, 4), "sm_90a").find("pingpong = 1: the warpgroups take turns in pairs in the pipelined wgmma "
                                                  "form: it needs wgmma = 2 and 8 or 16 warps, not wgmma = 2 on 4 warps"),
            std::string::npos);
  KernelConfig plain_pp = wg(128, 32, 8, 1);
  plain_pp.pingpong = 1;
  EXPECT_NE(error(plain_pp, "sm_90a").find("not wgmma = 1 on 8 warps"), std::string::npos);
  KernelConfig pp2 = wgpp(128, 32, 8);
  pp2.pingpong = 2;
  EXPECT_NE(error(pp2, "sm_90a").find("pingpong must be 0 or 1, got 2"), std::string::npos);
  EXPECT_EQ(error(wgpp(128, 32, 8), "sm_90a"), "(emitted)");
  // A producer warpgroup: two consumer warpgroups on wgmma, fed by TMA.
  EXPECT_NE(error(producer(wg(64, 32, 4)), "sm_90a").find("warp_specialize = 1: a producer warpgroup brings k and v by TMA "
                                                           "to two consumer warpgroups: it needs wgmma = 1 or 2 on 8 "
                                                           "warps, not wgmma = 1 on 4 warps"),
            std::string::npos);
  EXPECT_NE(error(producer(wg(128, 32, 8, 0)), "sm_90a").find("not wgmma = 0 on 8 warps"), std::string::npos);
  KernelConfig ws2 = producer(wg(128, 32, 8));
  ws2.warp_specialize = 2;
  EXPECT_NE(error(ws2, "sm_90a").find("warp_specialize must be 0 or 1, got 2"), std::string::npos);
  EXPECT_NE(error(producer(wg(128, 32, 8)), "sm_90a").find("its producer brings k and v by TMA, and here they do not"),
            std::string::npos)
      << "spec.tma is off here";
  // More than 2 k/v buffers: wgmma = 1's TMA pipeline only, 2 to 4 of them.
  EXPECT_NE(error(wgs(64, 32, 4, 5), "sm_90a").find("stages must be 2..4 (k/v buffers), got 5"), std::string::npos);
  KernelConfig pipelined3 = wg(64, 32, 4, 2);
  pipelined3.stages = 3;
  EXPECT_NE(error(pipelined3, "sm_90a").find("stages = 3: only the wgmma = 1 form"), std::string::npos);
  KernelConfig mma3 = wg(64, 32, 4, 0);
  mma3.stages = 3;
  EXPECT_NE(error(mma3, "sm_90a").find("stages = 3: only the wgmma = 1 form"), std::string::npos);
  EXPECT_NE(error(wgs(64, 32, 4, 3), "sm_90a").find("stages = 3: more than 2 k/v buffers need k and v brought by TMA"),
            std::string::npos)
      << "spec.tma is off here";
  Graph narrow = parse("q: bf16[1, 1, 64, 32], k: bf16[1, 1, 64, 32], v: bf16[1, 1, 64, 64]",
                       "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  Result<EmittedKernel> n =
      emit_attention_block_on_host(KernelSpec{"sf_wg", KernelKind::Attention, decompose(narrow)}, wg(64, 32, 4));
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("head dims 32 and 64 are not multiples of 64"), std::string::npos) << n.error().message;
  Graph f32 = parse("q: f32[1, 1, 64, 64], k: f32[1, 1, 64, 64], v: f32[1, 1, 64, 64]",
                    "  out = scaled_dot_product_attention(q, k, v)\n  return out");
  Result<EmittedKernel> s = emit_attention(KernelSpec{"sf_wg", KernelKind::Attention, decompose(f32)}, wg(64, 32, 4),
                                           llvmb::Target::nvptx("sm_90a"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("the tensor cores do not take this attention"), std::string::npos) << s.error().message;
}

// The bench block's attention shape (causal GQA, E = Ev = 128) in the default tile,
// 128 x 64 on 8 warps, with wgmma=1 for sm_90a: per key tile 8 m64n64k16 for the
// scores (q and k from shared memory) and 4 m64n128k16 for the output (p from
// registers), the copies fenced for the async proxy, no mma.sync or ldmatrix; q, k
// and v in swizzled panels; it assembles without spills.
TEST(FlashAttentionWgmma, PtxMultipliesByWgmmaAndAssembles) {
  Graph g = parse("q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  Result<EmittedKernel> k =
      emit_attention(KernelSpec{"sf_flash_wg", KernelKind::Attention, decompose(g)}, wg(128, 64, 8), llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  // q's 2 panels of 128 rows, then twice k's and v's 2 panels of 64 rows.
  EXPECT_EQ(k->launch.shared_bytes, 2 * 128 * 128 + 2 * (2 + 2) * 64 * 128);
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"), 8u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"), 4u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.fence.sync.aligned"), 2u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.wait_group.sync.aligned 0"), 2u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "fence.proxy.async.shared::cta"), 1u);
  EXPECT_EQ(ptx->find("mma.sync"), std::string::npos);
  EXPECT_EQ(ptx->find("ldmatrix"), std::string::npos) << "q too is read by wgmma";
  EXPECT_NE(ptx->find(".align 1024"), std::string::npos);
  if (!kernel_test::have_ptxas()) GTEST_SKIP() << "no ptxas";
  Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, "sm_90a");
  ASSERT_TRUE(res.ok()) << res.error().str();
  EXPECT_EQ((*res)[0].spill_store_bytes, 0) << (*res)[0].registers << " registers";
}

// The tuner's count of a register-resident tile's shared memory (attention_tile_bytes16,
// which its space rule checks against the arch's budget, so that tiles such as 192 x 96
// and 128 x 128 are measured rather than priced at f32 and dropped) is the emitter's:
// mma.sync's padded rows on sm_80 and sm_90a, wgmma's panels with TMA's mbarriers,
// two buffers or three pipelined. A tile over the budget the emitter refuses is over
// it in the count too.
TEST(FlashAttentionWgmma, TheTunersTileBytesAreTheEmittersSharedMemory) {
  Graph g = parse("q: bf16[1, 4, 512, 128], k: bf16[1, 2, 512, 128], v: bf16[1, 2, 512, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  KernelSpec spec{"sf_bytes", KernelKind::Attention, decompose(g)};
  spec.tma = true;
  struct Tile {
    KernelConfig cfg;
    std::string arch;
  };
  for (const Tile& t : {Tile{wg(128, 64, 8, 0), "sm_80"}, Tile{wg(128, 32, 4, 0), "sm_90a"}, Tile{wg(64, 128, 4, 0), "sm_90a"},
                        Tile{wg(256, 64, 16), "sm_90a"}, Tile{wg(192, 96, 12), "sm_90a"}, Tile{wg(128, 128, 8), "sm_90a"},
                        Tile{wg(128, 64, 8, 2), "sm_90a"}, Tile{wg(64, 16, 4, 2), "sm_90a"}, Tile{wgs(256, 64, 16, 3), "sm_90a"},
                        Tile{wgs(128, 64, 8, 4), "sm_90a"}}) {
    const std::string what = t.arch + " " + config_str(KernelKind::Attention, ConfigTarget::Gpu, t.cfg);
    Result<EmittedKernel> k = emit_attention(spec, t.cfg, llvmb::Target::nvptx(t.arch));
    ASSERT_TRUE(k.ok()) << what << ": " << k.error().str();
    EXPECT_EQ(k->launch.shared_bytes, attention_tile_bytes16(t.cfg.block_m, t.cfg.block_n, 128, 128, t.cfg.wgmma, t.cfg.stages))
        << what;
  }
  // 256 x 64 with 3 buffers: q's 2 panels of 256 rows, 3 x k's and v's 2 panels of 64
  // rows, 3 x 16 bytes of mbarriers.
  EXPECT_EQ(attention_tile_bytes16(256, 64, 128, 128, 1, 3), 2 * 256 * 128 + 3 * 4 * 64 * 128 + 3 * 16);
  Result<EmittedKernel> over = emit_attention(spec, wg(256, 128, 16, 2), llvmb::Target::nvptx("sm_90a"));
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message.find("over the 232448 a block may hold"), std::string::npos) << over.error().message;
  EXPECT_GT(attention_tile_bytes16(256, 128, 128, 128, 2), 232448);
}

// Case `c`'s kernel under `cfg` on the simulated sm_90a with TMA allowed and the last
// warpgroup held back at each wgmma, against the reference: nothing the simulated
// hardware refuses, k and v by TMA exactly where `tma`; `run` says what ran.
void expect_simulated_with_lag(const Case& c, const KernelConfig& cfg, bool tma, attention_sim::SimRun& run) {
  const std::string what = std::string(c.what) + " " + config_str(KernelKind::Attention, ConfigTarget::Gpu, cfg);
  Graph g = parse(c.params, c.body);
  std::vector<Tensor> in = random_inputs(g, 7);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok());
  Result<std::vector<Tensor>> got = attention_sim::run_simulated(decompose(g), in, cfg, &run, false, /*tma=*/true, /*lag_last=*/true);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  EXPECT_EQ(run.hw_error, "") << what;
  EXPECT_EQ(run.tensor_maps, tma ? 2u : 0u) << what;
  EXPECT_EQ(run.tma > 0, tma) << what;
  Comparison cmp = compare((*got)[0], (*want)[0], check_tolerance(g, g.outputs()[0].value));
  EXPECT_TRUE(cmp.ok()) << what << ": max_abs_err " << cmp.max_abs_err << ", first mismatch at " << cmp.first_mismatch;
}

// TMA (KernelSpec::tma, sm_90a's default): where k and v come from params whose heads
// are whole [S, E] slices (plain, or through GQA's repeat), thread 0 brings each key
// tile as boxes of 64 columns x bn keys of one head (3-D maps over [heads, S, E],
// keys past S as zeros) completing on the tile buffer's mbarrier, and every thread
// waits for its phase; no barrier in the key loop: thread 0 refills a buffer once
// every warp released it (its empty mbarrier). The simulation fails a wgmma that reads
// a box before its phase was waited for, and a box into a buffer an unretired wgmma
// still reads; the two-warpgroup runs hold the second warpgroup back at each wgmma,
// so that the first runs ahead as far as the mbarriers let it. Plain (with 2, 3 and 4
// k/v buffers) and pipelined. A
// k that computes (neg) keeps the copies and loads, and the launch lists no maps.
TEST(FlashAttentionWgmma, TmaBringsKAndV) {
  struct Run {
    size_t which;
    KernelConfig cfg;
    bool tma;
  };
  size_t index = 0;
  // 16-key tiles: 4 and 5 of them a block, so that buffers are refilled (the
  // sanitizer build's sample: the two-warpgroup runs and the fallback).
  for (const Run& r : {Run{0, wg(128, 16, 8, 1), true}, Run{1, wg(64, 16, 4, 1), true}, Run{0, wg(128, 16, 8, 2), true},
                       Run{1, wg(64, 32, 4, 2), true}, Run{2, wg(64, 16, 4, 2), false},
                       Run{3, wg(192, 96, 12, 1), true}, Run{0, wgs(128, 16, 8, 3), true}, Run{1, wgs(64, 16, 4, 4), true},
                       Run{0, wgs(64, 16, 4, 4), true}}) {
    if (!test::in_sample(index++)) continue;
    attention_sim::SimRun run;
    expect_simulated_with_lag(cases()[r.which], r.cfg, r.tma, run);
  }
}

// TMA through views (kv_tma_layout): k and v as heads of permuted projections
// ([batch, seq, heads, E] seen as [batch, heads, seq, E], the transformer blocks'
// layout), with GQA's repeat on top, and over two batch dims whose strides do not
// merge (a rank-5 map); the maps' dims and byte strides are the layouts written out
// here. Each runs on the simulated sm_90a against the reference, the GQA one also
// with a producer warpgroup bringing the tiles; q, k and v as slices of one fused
// projection, split as PyTorch's permute does and as nanoGPT's split does (the head
// dims' coordinates start past q's heads); k and v the first keys of a KV cache. A v
// sliced further into its keys keeps the copies.
TEST(FlashAttentionWgmma, TmaReadsHeadsOfPermutedProjections) {
  struct View {
    const char* what;
    std::string params, body;
    bool tma;
    std::array<int64_t, 5> kdims;
    std::array<int64_t, 4> kstrides;  // bytes
    int krank;
    std::vector<KernelConfig> configs;
  };
  const std::vector<View> views = {
      {"permuted projections, GQA 2 of 4 heads, 2 batches",
       "q: bf16[2, 72, 4, 64], k: bf16[2, 72, 2, 64], v: bf16[2, 72, 2, 64]",
       "  out = scaled_dot_product_attention(permute(q, dims=[0, 2, 1, 3]), permute(k, dims=[0, 2, 1, 3]), "
       "permute(v, dims=[0, 2, 1, 3]), is_causal=true, enable_gqa=true)\n  return out",
       true, {64, 72, 2, 2, 1}, {256, 128, 72 * 2 * 64 * 2, 0}, 4,
       {wg(64, 16, 4), wg(128, 16, 8), producer(wg(128, 16, 8))}},
      {"two batch dims in swapped order, permuted heads",
       "q: bf16[2, 2, 64, 2, 64], k: bf16[2, 2, 64, 2, 64], v: bf16[2, 2, 64, 2, 64]",
       "  out = scaled_dot_product_attention(permute(q, dims=[1, 0, 3, 2, 4]), permute(k, dims=[1, 0, 3, 2, 4]), "
       "permute(v, dims=[1, 0, 3, 2, 4]))\n  return out",
       true, {64, 64, 2, 2, 2}, {256, 128, 32768, 16384}, 5, {wg(64, 16, 4)}},
      // q, k and v of one fused projection [1, 64 rows, 3 x 2 heads of 64], as PyTorch
      // splits it (reshape to [B, S, 3, H, E], permute to [3, B, H, S, E], one slice
      // each): k's heads start 2 heads into each row (its head dim's coordinates from 2,
      // extent 4).
      {"q, k and v of a fused qkv projection", "qkv: bf16[1, 64, 384]",
       "  t = permute(reshape(qkv, shape=[1, 64, 3, 2, 64]), dims=[2, 0, 3, 1, 4])\n"
       "  q = reshape(slice(t, dim=0, start=0, end=1), shape=[1, 2, 64, 64])\n"
       "  k = reshape(slice(t, dim=0, start=1, end=2), shape=[1, 2, 64, 64])\n"
       "  v = reshape(slice(t, dim=0, start=2, end=3), shape=[1, 2, 64, 64])\n"
       "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n  return out",
       true, {64, 64, 4, 1, 1}, {768, 128, 0, 0}, 3, {wg(64, 16, 4)}},
      // nanoGPT's split of the same projection: along its last dim first (q, k, v =
      // qkv.split(C, dim=2)), then each viewed as heads and transposed, 2 batches: a
      // row's heads and columns share the slice's column digit; k's head dim starts
      // at 2 (extent 4), its batches 64 x 384 elements apart.
      {"nanoGPT's split of a fused qkv projection", "qkv: bf16[2, 64, 384]",
       "  q = transpose(reshape(slice(qkv, dim=2, start=0, end=128), shape=[2, 64, 2, 64]), 1, 2)\n"
       "  k = transpose(reshape(slice(qkv, dim=2, start=128, end=256), shape=[2, 64, 2, 64]), 1, 2)\n"
       "  v = transpose(reshape(slice(qkv, dim=2, start=256, end=384), shape=[2, 64, 2, 64]), 1, 2)\n"
       "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n  return out",
       true, {64, 64, 4, 2, 1}, {768, 128, 64 * 384 * 2, 0}, 4, {wg(64, 16, 4)}},
      // k and v the first 80 keys of a KV cache of 128: the keys' dim of 80 (keys
      // past it read as zeros), heads 128 keys apart.
      {"k and v a KV cache's first 80 of 128 keys", "q: bf16[1, 4, 80, 64], kc: bf16[1, 2, 128, 64], vc: bf16[1, 2, 128, 64]",
       "  out = scaled_dot_product_attention(q, slice(kc, dim=2, start=0, end=80), slice(vc, dim=2, start=0, end=80), "
       "is_causal=true, enable_gqa=true)\n  return out",
       true, {64, 80, 2, 1, 1}, {128, 128 * 64 * 2, 0, 0}, 3, {wg(64, 16, 4)}},
      // A v that starts 16 rows into its heads: keys past S would not read as zeros.
      {"v a slice of its input", "q: bf16[1, 2, 64, 64], k: bf16[1, 2, 64, 64], v: bf16[1, 2, 80, 64]",
       "  out = scaled_dot_product_attention(q, k, slice(v, dim=2, start=16))\n  return out",
       false, {}, {}, 0, {wg(64, 16, 4)}},
  };
  for (const View& v : views) {
    Graph g = parse(v.params, v.body);
    KernelSpec spec{"sf_flash_views", KernelKind::Attention, decompose(g)};
    spec.tma = true;
    Result<EmittedKernel> k = emit_attention(spec, wg(64, 16, 4), llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << v.what << ": " << k.error().str();
    ASSERT_EQ(k->launch.tensor_maps.size(), v.tma ? 2u : 0u) << v.what;
    if (v.tma) {
      const TensorMapSpec& km = k->launch.tensor_maps[0];
      EXPECT_EQ(km.rank, v.krank) << v.what;
      EXPECT_EQ(km.dims, v.kdims) << v.what;
      EXPECT_EQ(km.strides, v.kstrides) << v.what;
      EXPECT_EQ(km.box, (std::array<int, 5>{64, 16, 1, 1, 1})) << v.what;
      EXPECT_EQ(k->launch.tensor_maps[1].rank, v.krank) << v.what << ": v's map";
      Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      EXPECT_GT(kernel_test::count_of(*ptx, "cp.async.bulk.tensor." + std::to_string(v.krank) + "d.shared::cluster.global"), 0u)
          << v.what;
    }
    const Case c{v.what, v.params, v.body, {}};
    for (size_t i = 0; i < v.configs.size(); ++i) {
      const KernelConfig& cfg = v.configs[i];
      if (i > 0 && !test::in_sample(i)) continue;  // the sanitizer build: each view's first and every other
      attention_sim::SimRun run;
      expect_simulated_with_lag(c, cfg, v.tma, run);
    }
  }
}

// wgmma = 2, the same shape: FlashAttention-3's pipelining within a warpgroup. Tile 0's
// scores before the loop, each iteration's scores and the previous tile's output
// products in flight together (the scores waited for with one group still pending),
// the last tile's output after the loop; three k/v buffers. ptxas keeps the products
// asynchronous: no spills, and no note that it serialized the wgmma.
TEST(FlashAttentionWgmma, PipelinedPtxOverlapsTheSoftmaxWithTheProducts) {
  Graph g = parse("q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  KernelSpec spec{"sf_flash_wg2", KernelKind::Attention, decompose(g)};
  spec.tma = true;
  Result<EmittedKernel> k = emit_attention(spec, wg(128, 64, 8, 2), llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  // q's panels, three buffers of k's and v's, and their full and empty mbarriers.
  EXPECT_EQ(k->launch.shared_bytes, 2 * 128 * 128 + 3 * (2 + 2) * 64 * 128 + 3 * 16);
  ASSERT_EQ(k->launch.tensor_maps.size(), 2u);
  EXPECT_EQ(k->launch.tensor_maps[0].rank, 3);
  EXPECT_EQ(k->launch.tensor_maps[0].dims, (std::array<int64_t, 5>{128, 256, 2, 1, 1})) << "k as [heads, S, E]";
  EXPECT_EQ(k->launch.tensor_maps[0].box, (std::array<int, 5>{64, 64, 1, 1, 1}));
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"), 16u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"), 8u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.wait_group.sync.aligned 1"), 1u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.commit_group.sync.aligned"), 4u);
  EXPECT_EQ(ptx->find("mma.sync"), std::string::npos);
  // k and v by TMA, 2 panels each, at three sites (tiles 0 and 1 before the loop, the
  // next tile in it); q still by cp.async.
  EXPECT_EQ(kernel_test::count_of(*ptx, "cp.async.bulk.tensor.3d.shared::cluster.global"), 12u);
  EXPECT_NE(ptx->find("mbarrier.try_wait.parity.shared::cta.b64"), std::string::npos);
  // Each warp releases the buffer it is done with (no barrier in the key loop).
  EXPECT_EQ(kernel_test::count_of(*ptx, "mbarrier.arrive.shared::cta.b64"), 1u);
  EXPECT_NE(ptx->find("cp.async.cg.shared.global"), std::string::npos);
  if (!kernel_test::have_ptxas()) GTEST_SKIP() << "no ptxas";
  Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, "sm_90a");
  ASSERT_TRUE(res.ok()) << res.error().str();
  EXPECT_EQ((*res)[0].spill_store_bytes, 0) << (*res)[0].registers << " registers";
  for (const std::string& n : (*res)[0].notes) EXPECT_EQ(n.find("wgmma"), std::string::npos) << n;
}

// wgmma = 1 with 3 and 4 k/v buffers (stages), sm_90a's default tile at the bench's
// sdpa shape: the copies run stages - 1 tiles ahead, so tiles 0 .. stages - 2 are
// brought before the key loop and one in it (k's and v's 2 panels each a site); the
// shared memory holds that many buffers; no spills at 16 warps (128 registers).
TEST(FlashAttentionWgmma, MoreStagesBringKeyTilesFurtherAhead) {
  Graph g = parse("q: bf16[1, 4, 512, 128], k: bf16[1, 1, 512, 128], v: bf16[1, 1, 512, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  KernelSpec spec{"sf_flash_stages", KernelKind::Attention, decompose(g)};
  spec.tma = true;
  for (int stages : {2, 3, 4}) {
    SCOPED_TRACE("stages " + std::to_string(stages));
    Result<EmittedKernel> k = emit_attention(spec, wgs(256, 64, 16, stages), llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    EXPECT_EQ(k->launch.shared_bytes, 2 * 256 * 128 + stages * (2 + 2) * 64 * 128 + stages * 16);
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    EXPECT_EQ(kernel_test::count_of(*ptx, "cp.async.bulk.tensor.3d.shared::cluster.global"), static_cast<size_t>(4 * stages));
    EXPECT_EQ(kernel_test::count_of(*ptx, "mbarrier.arrive.shared::cta.b64"), 1u);
    EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.wait_group.sync.aligned 0"), 2u);
    if (stages == 2 || !kernel_test::have_ptxas()) continue;
    Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, "sm_90a");
    ASSERT_TRUE(res.ok()) << res.error().str();
    EXPECT_EQ((*res)[0].spill_store_bytes, 0) << (*res)[0].registers << " registers";
  }
}

// Ping-pong (pingpong = 1 with wgmma = 2; FlashAttention-3's): the two warpgroups of a
// pair issue their product groups in turns, by named barriers. On the simulated
// hardware, with the last warpgroup held back at each wgmma so that its partner
// reaches every turn first: the results match the reference, the turns complete (a
// turn that never comes is a deadlock the simulation reports), and no barrier is left
// with arrivals at a block's exit. One pair (8 warps) and two (16), k and v by TMA
// and by the copies (a k that computes: a barrier per key tile as well).
TEST(FlashAttentionWgmma, PingPongWarpgroupsTakeTurns) {
  struct Run {
    size_t which;
    KernelConfig cfg;
    bool tma;
  };
  size_t index = 0;
  // A k that computes (neg): copied by the threads, a barrier per key tile.
  const Case computed_k = {"bf16 with a computed k, 144 rows, E = Ev = 64",
                           "q: bf16[1, 1, 144, 64], k: bf16[1, 1, 144, 64], v: bf16[1, 1, 144, 64]",
                           "  out = scaled_dot_product_attention(q, neg(k), v, is_causal=true)\n  return out",
                           {}};
  for (const Run& r : {Run{0, wgpp(128, 16, 8), true}, Run{3, wgpp(256, 64, 16), true}, Run{0, wg(128, 16, 8, 2), true},
                       Run{99, wgpp(128, 32, 8), false}}) {
    const Case& c = r.which == 99 ? computed_k : cases()[r.which];
    if (!test::in_sample(index++)) continue;
    attention_sim::SimRun run;
    expect_simulated_with_lag(c, r.cfg, r.tma, run);
    EXPECT_EQ(run.named_barriers > 0, r.cfg.pingpong == 1) << c.what << " pingpong=" << r.cfg.pingpong;
  }
}

// The ping-pong's PTX at the bench's attention shape, 128 x 64 on 8 warps: the first
// turn given by the pair's second warpgroup (one bar.arrive), then at each of the
// three places the pipelined loop issues products (tile 0's scores, the loop's two
// groups, the last tile's output) a bar.sync on the warpgroup's own barrier before
// and a bar.arrive on the other's after, of 256 threads; ptxas keeps the products
// asynchronous and spills nothing.
TEST(FlashAttentionWgmma, PingPongPtxTakesTurnsAroundTheProducts) {
  Graph g = parse("q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  KernelSpec spec{"sf_flash_pp", KernelKind::Attention, decompose(g)};
  spec.tma = true;
  Result<EmittedKernel> k = emit_attention(spec, wgpp(128, 64, 8), llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_EQ(kernel_test::count_of(*ptx, "bar.arrive"), 4u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "bar.arrive %r"), 4u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "bar.sync %r"), 3u);
  const std::regex named(R"(bar\.(sync|arrive) %r\d+, 256;)");
  EXPECT_EQ(std::distance(std::sregex_iterator(ptx->begin(), ptx->end(), named), std::sregex_iterator()), 7)
      << "of 256 threads, the pair's";
  EXPECT_EQ(kernel_test::count_of(*ptx, "wgmma.commit_group.sync.aligned"), 4u);
  if (!kernel_test::have_ptxas()) GTEST_SKIP() << "no ptxas";
  Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, "sm_90a");
  ASSERT_TRUE(res.ok()) << res.error().str();
  EXPECT_EQ((*res)[0].spill_store_bytes, 0) << (*res)[0].registers << " registers";
  for (const std::string& n : (*res)[0].notes) EXPECT_EQ(n.find("wgmma"), std::string::npos) << n;
}

// A producer warpgroup (warp_specialize = 1, FlashAttention-3's): a third warpgroup
// whose first thread brings every key tile by TMA while the two consumer warpgroups
// only wait for the tiles, multiply and release them; the producer gives up its
// registers (setmaxnreg.dec 24, each of its 128 threads) and the consumers take them
// (setmaxnreg.inc 240, each of their 256). Simulated with the last consumer
// warpgroup held back at each wgmma: plain with 2 and 3 k/v buffers, and pipelined
// with the consumers' ping-pong, against the reference.
TEST(FlashAttentionWgmma, ProducerWarpgroupBringsTheKeyTiles) {
  KernelConfig s3 = producer(wgs(128, 64, 8, 3));
  size_t index = 0;
  for (const auto& [which, cfg] : {std::pair{size_t{0}, producer(wg(128, 16, 8))}, std::pair{size_t{3}, s3},
                                   std::pair{size_t{0}, producer(wgpp(128, 16, 8))}, std::pair{size_t{3}, producer(wg(128, 32, 8, 2))}}) {
    if (!test::in_sample(index++)) continue;
    attention_sim::SimRun run;
    expect_simulated_with_lag(cases()[which], cfg, /*tma=*/true, run);
    const std::string what = std::string(cases()[which].what) + " " + config_str(KernelKind::Attention, ConfigTarget::Gpu, cfg);
    ASSERT_EQ(run.regs_dec.size(), 1u) << what;
    ASSERT_EQ(run.regs_inc.size(), 1u) << what;
    EXPECT_GT(run.regs_dec[24], 0) << what;
    EXPECT_EQ(run.regs_dec[24] % 128, 0) << what;
    EXPECT_EQ(run.regs_inc[240], 2 * run.regs_dec[24]) << what << ": every consumer thread of every block";
  }
}

// The producer's PTX at the bench's attention shape, 128 x 128 pipelined with the
// consumers' ping-pong (FlashAttention-3's schedule): 384 threads, one block an SM so
// that ptxas gives each thread the 168 registers setmaxnreg shares out, the copies at
// one site (the producer's loop), the consumers' releases; it assembles without
// spills and without ptxas ignoring the reallocation.
TEST(FlashAttentionWgmma, ProducerPtxReallocatesRegisters) {
  Graph g = parse("q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]",
                  "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n  return out");
  KernelSpec spec{"sf_flash_ws", KernelKind::Attention, decompose(g)};
  spec.tma = true;
  Result<EmittedKernel> k = emit_attention(spec, producer(wgpp(128, 128, 8)), llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  EXPECT_EQ(k->launch.block[0], 384);
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_EQ(kernel_test::count_of(*ptx, "setmaxnreg.dec.sync.aligned.u32 24;"), 1u);
  EXPECT_EQ(kernel_test::count_of(*ptx, "setmaxnreg.inc.sync.aligned.u32 240;"), 1u);
  EXPECT_NE(ptx->find(".maxntid 384, 1, 1"), std::string::npos);
  EXPECT_NE(ptx->find(".minnctapersm 1"), std::string::npos);
  EXPECT_EQ(kernel_test::count_of(*ptx, "cp.async.bulk.tensor.3d.shared::cluster.global"), 4u) << "k's and v's 2 panels";
  EXPECT_EQ(kernel_test::count_of(*ptx, "mbarrier.arrive.shared::cta.b64"), 1u);
  // Every thread of the launch meets once, after the mbarriers' initialisation; from
  // then on the consumers' barriers are named barriers of their 256 threads (q's
  // copies published on barrier 5, the ping-pong's turns on 1 and 2).
  EXPECT_EQ(kernel_test::count_of(*ptx, "bar.sync \t0;"), 1u);
  EXPECT_NE(ptx->find("mov.b32 \t%r"), std::string::npos);
  const std::regex consumers(R"(bar\.sync %r\d+, 256;)");
  EXPECT_GE(std::distance(std::sregex_iterator(ptx->begin(), ptx->end(), consumers), std::sregex_iterator()), 4);
  if (!kernel_test::have_ptxas()) GTEST_SKIP() << "no ptxas";
  Result<std::vector<KernelResources>> res = kernel_test::assemble(*ptx, "sm_90a");
  ASSERT_TRUE(res.ok()) << res.error().str();
  EXPECT_EQ((*res)[0].registers, 168);
  EXPECT_EQ((*res)[0].spill_store_bytes, 0);
  for (const std::string& n : (*res)[0].notes) EXPECT_EQ(n.find("setmaxnreg"), std::string::npos) << n;
}

}  // namespace kernels_flash_attention_wgmma_test
}  // namespace sf
