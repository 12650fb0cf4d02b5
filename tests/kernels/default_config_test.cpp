// The configs codegen uses when nothing was tuned (default_kernel_config), where they
// depend on the kernel's size: on sm_90a the warp-specialised persistent wgmma kernel
// for large 16-bit matmuls, and on sm_90 and later the persistent grid of wide blocks
// for large pointwise kernels. Each side of each threshold, what keeps the old
// default, and that the chosen configs build without spills and launch as persistent
// grids (which the runtime shrinks to what a smaller part holds).
#include <gtest/gtest.h>

#include "autotune/cuda_runner.h"
#include "autotune/ptxas.h"
#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/kernels/tune.h"
#include "tests/result_util.h"
#include "tests/sanitized.h"

namespace sf {
namespace kernels_default_config_test {

std::string s(int64_t v) { return std::to_string(v); }

// The one fused kernel of a one-rank graph.
LocalKernel kernel_of(const std::string& text) {
  Result<Graph> g = parse_graph(text);
  if (!g) throw std::runtime_error(g.error().str());
  DeviceMesh mesh(g->mesh());
  std::vector<LocalKernel> ks = ok_value(rank_programs(*g, propagate(*g, mesh), mesh))[0].kernels;
  if (ks.size() != 1) throw std::runtime_error("expected one kernel, got " + s(static_cast<int64_t>(ks.size())));
  return ks[0];
}

// nn.Linear + bias + GELU: x [m, k] times w [n, k] transposed.
LocalKernel linear(int64_t m, int64_t n, int64_t k, const std::string& dt) {
  return kernel_of("graph g(x: " + dt + "[" + s(m) + ", " + s(k) + "], w: " + dt + "[" + s(n) + ", " + s(k) + "], b: " +
                   dt + "[" + s(n) + "]) {\n  y = gelu(add(matmul(x, transpose(w, 0, 1)), b))\n  return y\n}\n");
}

LocalKernel bias_gelu(int64_t rows, int64_t cols, const std::string& dt, const std::string& body = "gelu(add(h, b))") {
  return kernel_of("graph g(h: " + dt + "[" + s(rows) + ", " + s(cols) + "], b: " + dt + "[" + s(cols) + "]) {\n  y = " +
                   body + "\n  return y\n}\n");
}

bool persistent_ws(const KernelConfig& c) {
  return c.warp_specialize == 1 && c.persistent == 132 && c.setmaxnreg == 232 && c.block_m == 128 &&
         c.block_n == 256 && c.block_k == 64 && c.warps == 8 && c.stages == 4 && c.split_k == 1 && c.pingpong == 0;
}

TEST(DefaultConfig, LargeSixteenBitMatmulsOnSm90aTakeTheWarpSpecialisedPersistentKernel) {
  for (const char* dt : {"bf16", "f16"}) {
    KernelConfig c = default_kernel_config(linear(4096, 4096, 4096, dt), ConfigTarget::Gpu, "sm_90a");
    EXPECT_TRUE(persistent_ws(c)) << dt << ": " << config_str(KernelKind::Matmul, ConfigTarget::Gpu, c);
  }
  // A wave of 128 x 256 tiles or more: 12 x 11 = 132 tiles takes it, 11 x 11 = 121 not.
  EXPECT_TRUE(persistent_ws(default_kernel_config(linear(12 * 128, 11 * 256, 1024, "bf16"), ConfigTarget::Gpu, "sm_90a")));
  KernelConfig few = default_kernel_config(linear(11 * 128, 11 * 256, 1024, "bf16"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(few.warp_specialize, 0);
  EXPECT_EQ(few.persistent, 0);
  EXPECT_EQ(few.block_n, 256) << "still Triton's Hopper tile";
  // Without TMA (--no-tma) there is no producer warpgroup to feed: the one-block-a-tile
  // kernel, as before.
  KernelConfig no_tma = default_kernel_config(linear(4096, 4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_90a", false, false);
  EXPECT_EQ(no_tma.warp_specialize, 0);
  EXPECT_EQ(no_tma.persistent, 0);
  EXPECT_EQ(no_tma.setmaxnreg, 0);
  EXPECT_EQ(no_tma.block_m, 128);
  // TF32 (unmeasured in that kernel), sm_80 (no wgmma) and a narrow N (a 128-wide
  // tile) keep their defaults.
  KernelConfig tf32 = default_kernel_config(linear(4096, 4096, 4096, "f32"), ConfigTarget::Gpu, "sm_90a", true);
  EXPECT_EQ(tf32.warp_specialize, 0);
  EXPECT_EQ(tf32.block_k, 32);
  KernelConfig a100 = default_kernel_config(linear(4096, 4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_80");
  EXPECT_EQ(a100.warp_specialize, 0);
  EXPECT_EQ(a100.persistent, 0);
  EXPECT_EQ(a100.block_n, 128);
  KernelConfig narrow = default_kernel_config(linear(65536, 128, 1024, "bf16"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(narrow.block_n, 128);
  EXPECT_EQ(narrow.persistent, 0);
  // A transformer's projection, x [8, 2048, 4096] times a shared weight: folded into
  // 16384 rows (fold_batch_into_rows), TMA reads it and it takes the kernel too.
  LocalKernel proj = kernel_of(
      "graph g(x: bf16[8, 2048, 4096], w: bf16[4096, 4096]) {\n  y = matmul(x, transpose(w, 0, 1))\n  return y\n}\n");
  EXPECT_TRUE(persistent_ws(default_kernel_config(proj, ConfigTarget::Gpu, "sm_90a")));
  // A decode-sized M still splits K rather than walking tiles.
  KernelConfig decode = default_kernel_config(linear(64, 4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(decode.split_k, 8);
  EXPECT_EQ(decode.persistent, 0);
  // At 128 rows its 64 x 64 tiles fill the SMs: those, unsplit, a producer warpgroup
  // bringing the operands (1.75x faster than split-K 4 on an H200, default_small_tiles).
  KernelConfig d128 = default_kernel_config(linear(128, 4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(d128.block_m, 64);
  EXPECT_EQ(d128.block_n, 64);
  EXPECT_EQ(d128.split_k, 1);
  EXPECT_EQ(d128.warp_specialize, 1);
  EXPECT_EQ(default_kernel_config(linear(128, 4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_90a", false, /*tma=*/false).split_k, 4)
      << "no producer warpgroup without TMA";
  EXPECT_EQ(default_kernel_config(linear(128, 4096, 4096, "f32"), ConfigTarget::Gpu, "sm_90a", true).warp_specialize, 0)
      << "TF32 keeps its default";
}

// The default builds as the kernel it names: a persistent launch of 132 blocks of 384
// threads, no spills under ptxas.
TEST(DefaultConfig, ThePersistentMatmulDefaultBuildsWithoutSpills) {
  LocalKernel k = linear(4096, 4096, 4096, "bf16");
  KernelConfig c = default_kernel_config(k, ConfigTarget::Gpu, "sm_90a");
  ASSERT_TRUE(persistent_ws(c));
  BuildResult r = make_ptx_builder(k, "sm_90a")->build(c);
  ASSERT_TRUE(r.artifact) << r.error;
  EXPECT_EQ(r.threads_per_block, 384);
  EXPECT_EQ(r.grid_blocks, 132);
  auto* ptx = dynamic_cast<PtxArtifact*>(r.artifact.get());
  ASSERT_NE(ptx, nullptr);
  EXPECT_NE(ptx->ptx.find("setmaxnreg.inc.sync.aligned.u32 232"), std::string::npos);
  if (!find_ptxas().ok()) GTEST_SKIP() << "ptxas not found: resources not checked";
  ASSERT_TRUE(r.resources);
  EXPECT_FALSE(r.resources->spills());
}

// The fused attention: 128-row blocks of 8 warps over 64 keys where the tensor cores
// take it, the head dims are at most 128 and a head has 128 query rows or more; on
// sm_90a from 256 rows a head, with head dims of 64 or 128, 256-row blocks of 16
// warps multiplying by wgmma; 64 x 64 tiles of 4 warps otherwise.
TEST(DefaultConfig, TensorCoreAttentionTakes128RowBlocksOf8Warps) {
  auto sdpa = [](const std::string& dt, int64_t l, int64_t e) {
    const std::string q = dt + "[2, 4, " + s(l) + ", " + s(e) + "]";
    LocalKernel k = kernel_of("graph g(q: " + q + ", k: " + q + ", v: " + q +
                              ") {\n  y = scaled_dot_product_attention(q, k, v, is_causal=true)\n  return y\n}\n");
    if (k.kind != KernelKind::Attention) throw std::runtime_error("not an attention kernel");
    return k;
  };
  auto shape = [](const KernelConfig& c) {
    return s(c.block_m) + "x" + s(c.block_n) + "/" + s(c.warps) + (c.wgmma ? " wgmma=" + s(c.wgmma) : "");
  };
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 128), ConfigTarget::Gpu, "sm_90a")), "256x64/16 wgmma=1");
  EXPECT_EQ(shape(default_kernel_config(sdpa("f16", 2048, 64), ConfigTarget::Gpu, "sm_90a")), "256x64/16 wgmma=1");
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 255, 128), ConfigTarget::Gpu, "sm_90a")), "128x64/8") << "255 rows";
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 96), ConfigTarget::Gpu, "sm_90a")), "128x64/8")
      << "head dim 96: not whole 64-column panels";
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 128), ConfigTarget::Gpu, "sm_90")), "128x64/8") << "sm_90: no wgmma";
  EXPECT_EQ(shape(default_kernel_config(sdpa("f16", 128, 64), ConfigTarget::Gpu, "sm_80")), "128x64/8");
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 64, 128), ConfigTarget::Gpu, "sm_90a")), "64x64/4") << "64 rows";
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 256), ConfigTarget::Gpu, "sm_90a")), "64x64/4") << "head dim 256";
  EXPECT_EQ(shape(default_kernel_config(sdpa("f32", 256, 128), ConfigTarget::Gpu, "sm_90a")), "64x64/4") << "no tensor cores";
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 128), ConfigTarget::Gpu, "sm_75")), "64x64/4");
  // The tile must fit: 102 KiB at E = 128 is over sm_86's 99 KiB, at E = 64 it is not.
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 128), ConfigTarget::Gpu, "sm_86")), "64x64/4");
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 64), ConfigTarget::Gpu, "sm_86")), "128x64/8");
  EXPECT_EQ(shape(default_kernel_config(sdpa("bf16", 256, 128), ConfigTarget::Host)), "64x64/4");
}

KernelConfig old_pointwise(int vector) {
  KernelConfig c;
  c.vector = vector;
  return c;
}

// Exact f32 (the SIMT kernel): 64 x 64 tiles on 2 warps, each thread an 8 x 8 register
// tile, as the tuner measured 1.4 to 1.5x faster than 4 warps on an H200; it builds
// without spills.
TEST(DefaultConfig, ExactF32MatmulsTakeTwoWarpsATile) {
  LocalKernel k = linear(4096, 4096, 4096, "f32");
  KernelConfig c = default_kernel_config(k, ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=64 block_n=64 block_k=16 warps=2 stages=2 group_m=8 split_k=1");
  BuildResult r = make_ptx_builder(k, "sm_90a")->build(c);
  ASSERT_TRUE(r.artifact) << r.error;
  EXPECT_EQ(r.threads_per_block, 64);
  if (!find_ptxas().ok()) GTEST_SKIP() << "ptxas not found: resources not checked";
  ASSERT_TRUE(r.resources);
  EXPECT_FALSE(r.resources->spills());
}

// A reduction's default launches a block for each group of rows (grid_stride 0), as
// the tuner measured fastest for the bench's softmax and layer_norm over 16384 rows
// (its loop over a capped grid of 4096 blocks 3 to 4% slower), up to 2^20 blocks;
// beyond, the grid-stride loop keeps the grid at max_blocks.
TEST(DefaultConfig, ReductionsLaunchABlockForEachGroupOfRows) {
  KernelConfig softmax = default_kernel_config(
      kernel_of("graph g(x: f32[16384, 4096]) {\n  y = softmax(x, dim=-1)\n  return y\n}\n"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(config_str(KernelKind::Reduction, ConfigTarget::Gpu, softmax),
            "rows_per_block=1 threads_per_row=256 split_reduction=1 grid_stride=0 max_blocks=4096");
  // 2^22 rows of 8, 32 rows a block: 2^17 blocks.
  KernelConfig narrow = default_kernel_config(
      kernel_of("graph g(x: f32[4194304, 8]) {\n  y = sum(x, dims=[1])\n  return y\n}\n"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_FALSE(narrow.grid_stride);
  // 2^26 rows of 2, 128 rows a block: 2^19 blocks, still one shot; 2^28 rows: 2^21
  // blocks, over the bound: the loop.
  KernelConfig many = default_kernel_config(
      kernel_of("graph g(x: f32[268435456, 2]) {\n  y = sum(x, dims=[1])\n  return y\n}\n"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_TRUE(many.grid_stride) << config_str(KernelKind::Reduction, ConfigTarget::Gpu, many);
  EXPECT_EQ(many.max_blocks, 4096);
}

TEST(DefaultConfig, LargePointwiseKernelsOnSm90TakeAPersistentGridOfWideBlocks) {
  // bf16: 1024 threads x 4 vectors of 8 = 32768 elements a block, 264 blocks: from
  // 8448 x 1024 elements on, the grid is full.
  KernelConfig big = default_kernel_config(bias_gelu(8448, 1024, "bf16"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(big.block, 1024);
  EXPECT_EQ(big.vector, 8);
  EXPECT_EQ(big.elems_per_thread, 4);
  EXPECT_TRUE(big.grid_stride);
  EXPECT_EQ(big.max_blocks, 264);
  EXPECT_EQ(default_kernel_config(bias_gelu(8447, 1024, "bf16"), ConfigTarget::Gpu, "sm_90a"), old_pointwise(8));
  EXPECT_EQ(default_kernel_config(bias_gelu(4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_90"), big);
  // f32: 2 vectors of 4 a thread, full from 2112 x 1024.
  KernelConfig f32 = default_kernel_config(bias_gelu(2112, 1024, "f32"), ConfigTarget::Gpu, "sm_90a");
  EXPECT_EQ(f32.block, 1024);
  EXPECT_EQ(f32.vector, 4);
  EXPECT_EQ(f32.elems_per_thread, 2);
  EXPECT_EQ(f32.max_blocks, 264);
  EXPECT_EQ(default_kernel_config(bias_gelu(2111, 1024, "f32"), ConfigTarget::Gpu, "sm_90a"), old_pointwise(4));
  // Unmeasured: an A100, no arch, i64's 2-element vectors.
  EXPECT_EQ(default_kernel_config(bias_gelu(4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_80"), old_pointwise(8));
  EXPECT_EQ(default_kernel_config(bias_gelu(4096, 4096, "bf16"), ConfigTarget::Gpu), old_pointwise(8));
  EXPECT_EQ(default_kernel_config(bias_gelu(4096, 4096, "i64", "add(h, b)"), ConfigTarget::Gpu, "sm_90a"),
            old_pointwise(2));
}

// A grid-stride launch no larger than an H100/H200 holds is persistent (the runtime
// may shrink it); the old default's cap of 4096 blocks of 256 is not, and a one-shot
// grid is not.
TEST(DefaultConfig, PersistentPointwiseGridsAreMarkedForTheRuntime) {
  KernelConfig c = default_kernel_config(bias_gelu(4096, 4096, "bf16"), ConfigTarget::Gpu, "sm_90a");
  LaunchShape l = pointwise_launch(int64_t{4096} * 4096, c);
  EXPECT_EQ(l.grid[0], 264);
  EXPECT_TRUE(l.persistent);
  // A small tensor under the same config launches fewer blocks, still a walk.
  EXPECT_EQ(pointwise_launch(100000, c).grid[0], 4);
  EXPECT_TRUE(pointwise_launch(100000, c).persistent);
  EXPECT_FALSE(pointwise_launch(int64_t{4096} * 4096, old_pointwise(8)).persistent);
  KernelConfig one_shot = c;
  one_shot.grid_stride = false;
  EXPECT_FALSE(pointwise_launch(int64_t{4096} * 4096, one_shot).persistent);
  // The tuner's persistent candidates on 132 SMs: 2048 resident threads an SM.
  KernelConfig tuned = old_pointwise(8);
  tuned.block = 128;
  tuned.max_blocks = 132 * 16;
  EXPECT_TRUE(pointwise_launch(int64_t{4096} * 4096, tuned).persistent);
  tuned.max_blocks += 1;
  EXPECT_FALSE(pointwise_launch(int64_t{4096} * 4096, tuned).persistent);
  // It builds without spills.
  BuildResult r = make_ptx_builder(bias_gelu(4096, 4096, "bf16"), "sm_90a")->build(c);
  ASSERT_TRUE(r.artifact) << r.error;
  if (!find_ptxas().ok()) GTEST_SKIP() << "ptxas not found: resources not checked";
  ASSERT_TRUE(r.resources);
  EXPECT_FALSE(r.resources->spills());
}

// Where the wide blocks' registers spill (sin and cos of every element, as a RoPE
// computes), compile builds the kernel with the narrow default instead, and with a
// narrower vector where that spills too; the bench's bias + GELU of the same size
// keeps the wide one. The Plan says which it got.
TEST(DefaultConfig, APointwiseKernelThatSpillsInWideBlocksTakesTheNarrowDefault) {
  if (!find_ptxas().ok()) GTEST_SKIP() << "ptxas not found: the fallback needs its spill count";
  auto plan_of = [](const std::string& body, const std::string& head = "graph g(h: bf16[4096, 4096], b: bf16[4096]) {\n  y = ",
                    const std::string& ret = "y") {
    Result<Graph> g = parse_graph(head + body + "\n  return " + ret + "\n}\n");
    if (!g) throw std::runtime_error(g.error().str());
    CompileOptions co;
    co.host = CompileOptions::HostCode::None;
    auto ch = std::make_shared<ConfigChooser>(TuneSetup{"cuda", "sm_90a", ShapeBuckets::Exact}, nullptr);
    co.choose = [ch](const LocalKernel& lk) { return ch->choose(lk); };
    Result<CompiledPlan> p = compile_plan(*g, co);
    if (!p) throw std::runtime_error(p.error().str());
    return p->plan.kernels;
  };
  const std::vector<PlanKernel> lights = plan_of("gelu(add(h, b))");
  ASSERT_EQ(lights.size(), 1u);
  const PlanKernel& light = lights[0];
  EXPECT_EQ(light.config, "block=1024 vector=8 elems_per_thread=4 grid_stride=1 max_blocks=264");
  EXPECT_EQ(light.spill_bytes, 0);
  EXPECT_TRUE(light.persistent);
  // Fusion gives sin and cos kernels of their own (k0_add_cos, k1_add_sin_mul); the
  // second spills in wide blocks under ptxas 13.0.
  const std::vector<PlanKernel> heavies = plan_of("mul(sin(add(h, b)), cos(add(h, b)))");
  ASSERT_EQ(heavies.size(), 2u);
  for (const PlanKernel& k : heavies) EXPECT_EQ(k.spill_bytes, 0) << k.id << ": " << k.config;
  const PlanKernel& heavy = heavies[1];
  ASSERT_EQ(heavy.id, "k1_add_sin_mul");
  EXPECT_EQ(heavy.config, "block=256 vector=8 elems_per_thread=1 grid_stride=1 max_blocks=4096");
  EXPECT_EQ(heavy.config_source, "default");
  EXPECT_EQ(heavy.spill_bytes, 0);
  EXPECT_EQ(heavy.block[0], 256);
  EXPECT_EQ(heavy.grid[0], 4096);
  EXPECT_FALSE(heavy.persistent);
  // A RoPE's cos table (returned, so written) and its product with x, too small for
  // the wide default: with 8 elements a thread libdevice's cos spills even in the
  // narrow one (its range reduction's cold path), with 4 it does not.
  const std::vector<PlanKernel> table = plan_of(
      "mul(x, c)",
      "graph g(x: bf16[2048, 128]) {\n  pos = reshape(arange(2048, dtype=f32), shape=[2048, 1])\n"
      "  angle = mul(pos, pow(10000.0, div(arange(128, step=2, dtype=f32), -128.0)))\n"
      "  c = cast(cos(concat(angle, angle, dim=-1)), dtype=bf16)\n  y = ",
      "c, y");
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table[0].config, "block=256 vector=4 elems_per_thread=1 grid_stride=1 max_blocks=4096");
  EXPECT_EQ(table[0].spill_bytes, 0);
}

// The bar for default configs: no spills. Every kernel of the bf16 bench
// blocks (under the sanitizers the LLaMA block, where its RoPE and its tables are the
// kernels that spilled, and the attention block) compiles for sm_90a with its default
// config, the fallbacks above included, and ptxas spills nothing. The blocks'
// attention takes k and v by TMA through 4-D maps over the permuted projections
// (kv_tma_layout; the LLaMA block's k is RoPE's dense output, a 3-D map) and with it
// sm_90a's wgmma default of 256 rows on 16 warps; when the copies' addresses held
// registers (before 2026-11-28) it spilled there (76 bytes in the attention block) and
// compile fell back to 192 x 96.
TEST(DefaultConfig, TheBf16BenchBlocksCompileWithoutSpills) {
  if (!find_ptxas().ok()) GTEST_SKIP() << "ptxas not found";
  for (const char* name : {"llama_block", "transformer_block", "mlp", "attention"}) {
    if (test::kSanitized && std::string(name) != "llama_block" && std::string(name) != "attention") continue;
    Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/bench/graphs/bf16/" + name + ".sf");
    ASSERT_TRUE(g) << g.error().str();
    CompileOptions co;
    co.host = CompileOptions::HostCode::None;
    auto ch = std::make_shared<ConfigChooser>(TuneSetup{"cuda", "sm_90a", ShapeBuckets::Exact}, nullptr);
    co.choose = [ch](const LocalKernel& lk) { return ch->choose(lk); };
    Result<CompiledPlan> p = compile_plan(*g, co);
    ASSERT_TRUE(p) << name << ": " << p.error().str();
    int attention = 0;
    for (const PlanKernel& k : p->plan.kernels) {
      EXPECT_EQ(k.spill_bytes, 0) << name << ": " << k.id << " (" << k.config << ")";
      EXPECT_EQ(k.config_source, "default") << name << ": " << k.id;
      if (k.kind != KernelKind::Attention) continue;
      ++attention;
      EXPECT_EQ(k.config, "block_m=256 block_n=64 warps=16 wgmma=1") << name << ": " << k.id;
      ASSERT_EQ(k.tensor_maps.size(), 2u) << name << ": " << k.id << ": k and v not by TMA";
      EXPECT_EQ(k.tensor_maps[1].rank, 4) << name << ": v as [batch, seq, heads, 128] is a 4-D map";
      EXPECT_EQ(k.tensor_maps[0].rank, std::string(name) == "llama_block" ? 3 : 4) << name << ": k";
    }
    EXPECT_EQ(attention, std::string(name) == "mlp" ? 0 : 1) << name;
  }
}

}  // namespace kernels_default_config_test
}  // namespace sf
