// The reduction emitter's NVPTX kernels: the verifier, compile_to_ptx, PTX text
// checks and ptxas; launch shapes, what it refuses, and emit and compile
// times. No GPU is needed. The helpers are reduction_test_util.h's.
#include "tests/kernels/reduction_test_util.h"

namespace sf {
namespace kernels_reduction_test {

// ---- NVPTX -------------------------------------------------------------------------------------



struct Ptx {
  std::string ptx;
  LaunchShape launch;
};

// Emits for `arch`; checks the verifier, compile_to_ptx and (where it exists) ptxas.
Ptx emit_ptx(const Graph& g, const std::string& arch, const KernelConfig& cfg = {}) {
  Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g, "red_kernel"), cfg, llvmb::Target::nvptx(arch));
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return {};
  }
  Ptx out;
  out.launch = k->launch;
  std::optional<std::string> bad = llvmb::verify(*k->module);
  EXPECT_FALSE(bad) << *bad;
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  if (!ptx) {
    ADD_FAILURE() << ptx.error().str();
    return out;
  }
  out.ptx = *ptx;
  if (have_ptxas()) {
    EXPECT_EQ(ptxas_failure(out.ptx, arch), "") << out.ptx;
  }
  return out;
}

TEST(ReductionNvptx, VerifiesCompilesAndAssemblesForSm80AndSm90a) {
  if (!have_ptxas()) std::printf("note: %s not found; ptxas checks skipped\n", SF_PTXAS_PATH);
  std::vector<std::pair<std::string, Graph>> groups;
  groups.emplace_back("softmax", composite_group(Composite::Softmax, DType::F32, {1000, 5000}, -1));
  groups.emplace_back("softmax_bf16", composite_group(Composite::Softmax, DType::BF16, {7, 3}, -1));
  groups.emplace_back("layer_norm_f16", composite_group(Composite::LayerNorm, DType::F16, {1000, 5000}, 1));
  groups.emplace_back("rms_norm", composite_group(Composite::RmsNorm, DType::F32, {7, 5000}, 1));
  groups.emplace_back("four_dim0", four_reductions(DType::F32, {5000, 7}, {0}, false));
  GraphBuilder b("ints");
  Value i = b.param("i", DType::I64, {7, 5000});
  b.ret(reduce(OpKind::Sum, i, {1}, false));
  b.ret(reduce(OpKind::Max, cast(i, DType::I32), {1}, false));
  groups.emplace_back("ints", finish(b));
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const auto& [name, g] : groups)
      for (const KernelConfig& cfg : sim_configs()) {
        SCOPED_TRACE(std::string(arch) + " " + name + " " + config_str(cfg));
        Ptx p = emit_ptx(g, arch, cfg);
        EXPECT_NE(p.ptx.find(".entry red_kernel("), std::string::npos);
        EXPECT_EQ(p.ptx.find("__nv_"), std::string::npos) << "libdevice calls left in the PTX";
        EXPECT_EQ(p.ptx.find("call"), std::string::npos) << "the PTX still calls a function";
        // four_dim0 keeps X's innermost dim: with several rows and threads a block
        // its threads take rows fastest, so a row's lanes lie rows_per_block apart,
        // every warp holds part of each row, and partials cross warps whenever the
        // block is wider than one.
        const bool outer = name == "four_dim0" && cfg.rows_per_block > 1 && cfg.threads_per_row > 1;
        const bool shared = outer ? cfg.threads_per_row * cfg.rows_per_block > 32 : cfg.threads_per_row > 32;
        if (cfg.threads_per_row > 1) {
          EXPECT_NE(p.ptx.find("shfl.sync.bfly"), std::string::npos);
        }
        if (shared) {
          EXPECT_NE(p.ptx.find("bar.sync"), std::string::npos);
          EXPECT_NE(p.ptx.find(".shared"), std::string::npos);
        } else {
          EXPECT_EQ(p.ptx.find("bar.sync"), std::string::npos) << "no barrier is needed within a warp";
        }
        std::string maxntid = ".maxntid " + std::to_string(cfg.threads_per_row * cfg.rows_per_block) + ", 1, 1";
        EXPECT_NE(p.ptx.find(maxntid), std::string::npos);
      }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The persistent form in PTX: 16-byte loads and stores, and softmax's exp once per
// element (once per register element in each of the vector and the scalar bodies),
// where the multi-pass form reads the row again (16 bytes at a time) in every pass
// and for the output.
TEST(ReductionNvptx, PersistentRowsLoadOnceWith128BitAccesses) {
  Graph sm = composite_group(Composite::Softmax, DType::F32, {256, 1024}, -1);
  Result<KernelConfig> cfg = suggest_reduction_config(spec_of(sm));
  ASSERT_TRUE(cfg.ok()) << cfg.error().str();
  Result<ReductionInfo> info = reduction_info(spec_of(sm), *cfg);
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->persistent);
  ASSERT_EQ(info->vector, 4);
  Ptx p = emit_ptx(sm, "sm_90a", *cfg);
  EXPECT_GE(count(p.ptx, ".v4.f32"), 2u) << "no 128-bit access";
  EXPECT_NE(p.ptx.find("st.global.v4.f32"), std::string::npos);
  EXPECT_EQ(count(p.ptx, "ex2.approx"), 2 * static_cast<size_t>(info->elems_per_thread)) << p.ptx;

  // Rows too long for registers (one thread per row of 1024): read per pass.
  KernelConfig looped = *cfg;
  looped.threads_per_row = 1;
  looped.rows_per_block = 64;
  Result<ReductionInfo> li = reduction_info(spec_of(sm), looped);
  ASSERT_TRUE(li.ok());
  EXPECT_FALSE(li->persistent);
  Ptx lp = emit_ptx(sm, "sm_90a", looped);
  EXPECT_EQ(li->vector, 4);
  EXPECT_GE(count(lp.ptx, "ld.global.v4.f32") + count(lp.ptx, "ld.global.nc.v4.f32"), 3u)
      << "one 128-bit read of x per pass and one for the output";
  EXPECT_GE(count(lp.ptx, "ex2.approx"), 2u) << "exp in the sum's pass and again for the output";

  // bf16 layer_norm: 8 elements (16 bytes) per access.
  Graph ln = composite_group(Composite::LayerNorm, DType::BF16, {64, 4096}, 1);
  Result<KernelConfig> lc = suggest_reduction_config(spec_of(ln));
  ASSERT_TRUE(lc.ok());
  Result<ReductionInfo> lni = reduction_info(spec_of(ln), *lc);
  ASSERT_TRUE(lni.ok());
  EXPECT_TRUE(lni->persistent);
  EXPECT_EQ(lni->vector, 8);
  Ptx lnp = emit_ptx(ln, "sm_90a", *lc);
  // (bf16 pairs come as 32-bit words, unpacked by a shift or a mask: .u32.)
  EXPECT_GE(count(lnp.ptx, "ld.global.v4.u32") + count(lnp.ptx, "ld.global.nc.v4.u32"), 1u) << "no 16-byte bf16 load";
  EXPECT_GE(count(lnp.ptx, "st.global.v4.b32"), 1u) << "no 16-byte bf16 store";
}

TEST(ReductionNvptx, PtxasAssemblesSoftmaxAndLayerNormForSm90a) {
  if (!have_ptxas()) GTEST_SKIP() << SF_PTXAS_PATH << " not found (no CUDA toolkit): PTX is not assembled";
  for (const Graph& g : {composite_group(Composite::Softmax, DType::F16, {64, 4096}, -1),
                         composite_group(Composite::LayerNorm, DType::F32, {64, 4096}, 1)}) {
    Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g, "red_kernel"), {}, llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    EXPECT_EQ(ptxas_failure(*ptx, "sm_90a"), "");
  }
}

TEST(ReductionNvptx, MaxPropagatesNaNWithTheNaNVariantsOnSm80) {
  GraphBuilder b("mx");
  b.ret(reduce(OpKind::Max, b.param("x", DType::F32, {64, 1024}), {1}, false));
  Ptx p = emit_ptx(finish(b), "sm_80");
  EXPECT_NE(p.ptx.find("max.NaN.f32"), std::string::npos) << p.ptx;
  EXPECT_NE(p.ptx.find("shfl.sync.bfly.b32"), std::string::npos);
}

TEST(ReductionNvptx, LaunchShapes) {
  Graph g = composite_group(Composite::Softmax, DType::F32, {1000, 3}, -1);
  KernelConfig cfg;
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.grid[0], 1000);  // one row per block
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.block[0], 256);
  cfg.threads_per_row = 32;
  cfg.rows_per_block = 8;
  Ptx p = emit_ptx(g, "sm_90a", cfg);
  EXPECT_EQ(p.launch.grid[0], 125);
  EXPECT_EQ(p.launch.block[0], 256);
  cfg.max_blocks = 16;
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.grid[0], 16);  // capped: the blocks loop
  cfg.grid_stride = false;
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.grid[0], 125);
  Result<ReductionInfo> info = reduction_info(spec_of(g), KernelConfig{});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->static_shared_bytes, 2 * 8 * 4);  // two reductions, 8 warps, f32
  EXPECT_EQ(info->launch.shared_bytes, 0);
}

// An outer reduction in PTX with its suggested config (a column sum of [16384, 4096]:
// 32 threads a row, 32 rows a block): the partials cross warps in 4 KiB of static
// shared memory behind a barrier, with no shuffle (a warp holds one thread of each of
// 32 rows); 1024-thread blocks, one per 32 rows, through ptxas for both arches.
TEST(ReductionNvptx, OuterReductionsCombineThroughSharedMemory) {
  GraphBuilder b("colsum");
  b.ret(reduce(OpKind::Sum, b.param("x", DType::F32, {16384, 4096}), {0}, false));
  Graph g = finish(b);
  Result<KernelConfig> cfg = suggest_reduction_config(spec_of(g));
  ASSERT_TRUE(cfg.ok()) << cfg.error().str();
  ASSERT_EQ(cfg->threads_per_row, 32);
  ASSERT_EQ(cfg->rows_per_block, 32);
  // 128 blocks leave SMs idle, so the suggestion splits each row in two (Split rows,
  // reduction_split_test.cpp); the layout is the same without it.
  ASSERT_EQ(cfg->split_reduction, 2);
  cfg->split_reduction = 1;
  for (const char* arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    Ptx p = emit_ptx(g, arch, *cfg);
    EXPECT_NE(p.ptx.find(".shared .align 8 .b8 red_kernel_smem[4096]"), std::string::npos) << p.ptx;
    EXPECT_NE(p.ptx.find("bar.sync"), std::string::npos);
    EXPECT_EQ(p.ptx.find("shfl.sync"), std::string::npos);
    EXPECT_EQ(p.launch.grid[0], 128);
    EXPECT_EQ(p.launch.block[0], 1024);
  }
  // 8 rows a block of 16 threads each: a warp's 4 lanes of a row (8 apart) meet by
  // shuffles of lane offsets 8 and 16, then 4 partials a row in shared memory.
  KernelConfig c8 = *cfg;
  c8.threads_per_row = 16;
  c8.rows_per_block = 8;
  Ptx p = emit_ptx(g, "sm_90a", c8);
  EXPECT_NE(p.ptx.find("shfl.sync.bfly.b32"), std::string::npos);
  EXPECT_NE(p.ptx.find(", 8, 31, -1;"), std::string::npos) << p.ptx;
  EXPECT_NE(p.ptx.find(", 16, 31, -1;"), std::string::npos);
  EXPECT_EQ(p.ptx.find(", 4, 31, -1;"), std::string::npos) << "lanes 4 apart hold other rows";
  EXPECT_NE(p.ptx.find("red_kernel_smem[128]"), std::string::npos);
}

// ---- errors --------------------------------------------------------------------------------

std::string emit_error(const Graph& g, const KernelConfig& cfg = {}, const llvmb::Target& t = llvmb::Target::host(),
                       const std::string& entry = "red", KernelKind kind = KernelKind::Reduction) {
  Result<EmittedKernel> k = reduction_emitter().emit(KernelSpec{entry, kind, g}, cfg, t);
  if (k.ok()) {
    ADD_FAILURE() << "expected a Diag";
    return "";
  }
  return k.error().message;
}

TEST(ReductionErrors, UnsupportedGroupsAndConfigsAreDiags) {
  {
    GraphBuilder b("pw");
    b.ret(b.param("x", DType::F32, {4}) + 1.0);
    EXPECT_NE(emit_error(finish(b)).find("no reduction"), std::string::npos);
  }
  {
    GraphBuilder b("mm");
    Value a = b.param("a", DType::F32, {4, 8});
    b.ret(sum(matmul(a, b.param("w", DType::F32, {8, 4})), {1}));
    EXPECT_NE(emit_error(finish(b)).find("matmul"), std::string::npos);
  }
  {
    GraphBuilder b("composite");
    b.ret(softmax(b.param("x", DType::F32, {4, 4})));
    EXPECT_NE(emit_error(finish(b)).find("decomposed"), std::string::npos);
  }
  {
    GraphBuilder b("shapes");
    Value x = b.param("x", DType::F32, {4, 6});
    b.ret(sum(x, {1}));
    b.ret(sum(reshape(x, {6, 4}), {1}));
    EXPECT_NE(emit_error(finish(b)).find("one shape"), std::string::npos);
  }
  {
    // The reduced value moved to another row by a transpose: not this kernel's.
    GraphBuilder b("other_row");
    Value x = b.param("x", DType::F32, {4, 4, 8});
    Value m = max(x, {2}, true);  // [4, 4, 1]
    b.ret(exp(x - transpose(m, 0, 1)));
    EXPECT_NE(emit_error(finish(b)).find("another row"), std::string::npos);
  }
  {
    GraphBuilder b("outputs");
    Value x = b.param("x", DType::F32, {4, 6});
    b.ret(sum(x, {1}));
    b.ret(b.param("y", DType::F32, {5}) * 2.0);
    EXPECT_NE(emit_error(finish(b)).find("neither one value per row"), std::string::npos);
  }
  GraphBuilder ok("ok");
  ok.ret(sum(ok.param("x", DType::F32, {16, 16}), {1}));
  Graph g = finish(ok);
  KernelConfig cfg;
  cfg.threads_per_row = 48;
  EXPECT_NE(emit_error(g, cfg).find("threads_per_row"), std::string::npos);
  cfg.threads_per_row = 12;
  EXPECT_NE(emit_error(g, cfg).find("threads_per_row"), std::string::npos);
  cfg.threads_per_row = 2048;
  EXPECT_NE(emit_error(g, cfg).find("threads_per_row"), std::string::npos);
  cfg = {};
  cfg.rows_per_block = 8;  // 8 * 256 threads
  EXPECT_NE(emit_error(g, cfg).find("rows_per_block"), std::string::npos);
  cfg = {};
  cfg.threads_per_row = 16;
  cfg.rows_per_block = 3;  // 48 threads: a part-warp after a whole one
  EXPECT_NE(emit_error(g, cfg).find("multiple of 32"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::nvptx("compute_90")).find("arch"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::host(), "not an identifier").find("C identifier"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::host(), "red", KernelKind::Pointwise).find("not a reduction"),
            std::string::npos);
}

TEST(ReductionRegistry, EmitterForReductionIsThisEmitter) {
  GraphBuilder b("r");
  b.ret(sum(b.param("x", DType::F32, {4, 4}), {1}));
  Graph g = finish(b);
  Result<EmittedKernel> k = emitter_for(KernelKind::Reduction).emit(spec_of(g), {}, llvmb::Target::host());
  ASSERT_TRUE(k.ok()) << k.error().str();
}

// ---- timings -------------------------------------------------------------------------------

void time_group(const char* what, const Graph& g) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  auto t0 = clock::now();
  Result<EmittedKernel> host = reduction_emitter().emit(spec_of(g, "timed_host"), {}, llvmb::Target::host());
  auto t1 = clock::now();
  ASSERT_TRUE(host.ok()) << host.error().str();
  Result<void*> fn = jit().add(std::move(host->module), std::move(host->context), host->entry);
  auto t2 = clock::now();
  ASSERT_TRUE(fn.ok()) << fn.error().str();
  auto t3 = clock::now();
  Result<EmittedKernel> gpu = reduction_emitter().emit(spec_of(g, "timed_gpu"), {}, llvmb::Target::nvptx("sm_90a"));
  auto t4 = clock::now();
  ASSERT_TRUE(gpu.ok()) << gpu.error().str();
  Result<std::string> ptx = llvmb::compile_to_ptx(*gpu->module, "sm_90a");
  auto t5 = clock::now();
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  std::printf("%s: host emit %.2f ms, JIT compile %.2f ms; NVPTX emit %.2f ms, compile_to_ptx %.2f ms\n", what,
              ms(t1 - t0), ms(t2 - t1), ms(t4 - t3), ms(t5 - t4));
  testing::Test::RecordProperty("host_emit_ms", std::to_string(ms(t1 - t0)));
  testing::Test::RecordProperty("host_compile_ms", std::to_string(ms(t2 - t1)));
  testing::Test::RecordProperty("ptx_emit_ms", std::to_string(ms(t4 - t3)));
  testing::Test::RecordProperty("ptx_compile_ms", std::to_string(ms(t5 - t4)));
}

TEST(ReductionTiming, SoftmaxEmitAndCompile) {
  time_group("softmax f32[1000, 5000]", composite_group(Composite::Softmax, DType::F32, {1000, 5000}, -1));
}

TEST(ReductionTiming, LayerNormEmitAndCompile) {
  time_group("layer_norm bf16[1000, 5000]", composite_group(Composite::LayerNorm, DType::BF16, {1000, 5000}, 1));
}

}  // namespace kernels_reduction_test
}  // namespace sf
