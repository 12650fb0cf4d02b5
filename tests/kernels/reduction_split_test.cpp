// Split rows on NVPTX (KernelConfig::split_reduction; docs/kernels.md, "Split rows"):
// grid y shares each row's elements among blocks, each block stores its share's
// partials in the workspace, and a row group's last block combines them in share
// order and runs the epilogue. The simulated kernel against the reference for every
// fold, dtype and layout, the result's independence from which block comes last, the
// workspace left zero (run_simulated fails otherwise), the PTX of the protocol, what
// the plan refuses and where the suggestion splits.
#include "tests/kernels/reduction_test_util.h"

#include <cstring>

namespace sf {
namespace kernels_reduction_test {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

TEST(ReductionSplit, EveryFoldDtypeAndLayoutMatchesTheReference) {
  struct Case {
    const char* what;
    Graph g;
    std::vector<KernelConfig> configs;
  };
  GraphBuilder bi("ints");
  Value xi = bi.param("x", DType::I32, {5, 900});
  bi.ret(reduce(OpKind::Sum, xi, {1}, false));  // accumulated in i64
  bi.ret(reduce(OpKind::Max, xi, {1}, false));
  bi.ret(reduce(OpKind::Min, xi, {1}, false));
  GraphBuilder bb("bools");
  Value xb = bb.param("x", DType::Bool, {7, 700});
  bb.ret(reduce(OpKind::Sum, xb, {1}, false));  // a count, in i64 (max and min take numbers only)
  const Case cases[] = {
      {"f32 rows of 1000", four_reductions(DType::F32, {6, 1000}, {1}, false),
       {rows_config(64, 1, false, 4096, 2), rows_config(8, 4, false, 4096, 7), rows_config(256, 1, true, 2, 3)}},
      // 7 shares of 5: shares past the row's end fold nothing.
      {"bf16 columns of 333, 16-bit outputs", four_reductions(DType::BF16, {333, 5}, {0}, true),
       {rows_config(8, 4, false, 4096, 7), rows_config(64, 1, false, 4096, 3)}},
      // A warp's lanes on neighbouring rows (Plan::outer), 32 partials a row through
      // shared memory before the share is stored.
      {"f32 outer, rows of 2000", four_reductions(DType::F32, {2000, 40}, {0}, false),
       {rows_config(4, 32, false, 4096, 3), rows_config(32, 16, true, 2, 5)}},
      // 16-byte vectors of 8 bf16 a thread, shares of whole vectors.
      {"bf16 rows of 4096, vectors", four_reductions(DType::BF16, {3, 4096}, {1}, false),
       {rows_config(64, 1, false, 4096, 5), rows_config(32, 2, false, 4096, 4)}},
      {"i32 rows of 900", finish(bi), {rows_config(32, 1, false, 4096, 4), rows_config(8, 4, false, 4096, 3)}},
      {"bool rows of 700", finish(bb), {rows_config(32, 1, false, 4096, 5)}},
  };
  for (const Case& c : cases)
    for (const KernelConfig& cfg : c.configs) {
      SCOPED_TRACE(std::string(c.what) + " " + config_str(cfg) + " split " + std::to_string(cfg.split_reduction));
      Result<ReductionInfo> info = reduction_info(spec_of(c.g), cfg);
      ASSERT_TRUE(info.ok()) << info.error().str();
      EXPECT_EQ(info->split, cfg.split_reduction);
      EXPECT_EQ(info->launch.grid[1], cfg.split_reduction);
      EXPECT_GT(info->launch.workspace_bytes, 0);
      EXPECT_FALSE(info->launch.zero_outputs);
      expect_matches_reference(c.g, random_inputs_for(c.g, 61), cfg, Runner::Simulated);
    }
}

// The shares are combined in share order by whichever block comes last, so the bits
// do not depend on the order the blocks finish in (f32 addition is not associative:
// adding them in arrival order, as atomics do, would change the low bits).
TEST(ReductionSplit, TheResultDoesNotDependOnWhichShareComesLast) {
  Graph g = four_reductions(DType::F32, {4, 5000}, {1}, false);
  Graph cols = four_reductions(DType::F32, {3000, 33}, {0}, false);
  for (const Graph* h : {&g, &cols})
    for (int split : {3, 8}) {
      KernelConfig cfg = h == &g ? rows_config(64, 1, false, 4096, split) : rows_config(4, 32, false, 4096, split);
      SCOPED_TRACE(h->name() + " split " + std::to_string(split));
      std::vector<Tensor> in = random_inputs_for(*h, 62, -1, 1, /*wide=*/true);
      Result<std::vector<Tensor>> forward = run_simulated(*h, in, cfg);
      Result<std::vector<Tensor>> backward = run_simulated(*h, in, cfg, false, nullptr, /*shares_reversed=*/true);
      ASSERT_TRUE(forward.ok()) << forward.error().str();
      ASSERT_TRUE(backward.ok()) << backward.error().str();
      for (size_t o = 0; o < forward->size(); ++o) EXPECT_TRUE(same_bytes((*forward)[o], (*backward)[o])) << "output " << o;
      expect_matches_reference(*h, in, cfg, Runner::Simulated);
    }
}

// Several reductions of one pass and an epilogue on the row values, as a layer
// norm's backward computes its weight and bias gradients (sums over the tokens of
// dy * xhat and of dy, rounded to bf16 once) and an RMS over a row (sqrt of a mean,
// plus eps): the last block runs the epilogue on the whole row's values.
TEST(ReductionSplit, AnEpilogueRunsOnTheWholeRowsValues) {
  GraphBuilder b("ln_weight_grad");
  Value dy = b.param("dy", DType::BF16, {1500, 24});
  Value xhat = b.param("xhat", DType::BF16, {1500, 24});
  b.ret(sum(dy * xhat, {0}));
  b.ret(sum(dy, {0}));
  Graph wg = finish(b);
  GraphBuilder b2("rms");
  Value x = b2.param("x", DType::F32, {5, 3000});
  b2.ret(unary(OpKind::Sqrt, mean(x * x, {1}) + 1e-6));
  Graph rms = finish(b2);
  for (int split : {2, 6}) {
    SCOPED_TRACE("split " + std::to_string(split));
    expect_matches_reference(wg, random_inputs_for(wg, 63), rows_config(4, 32, false, 4096, split), Runner::Simulated);
    expect_matches_reference(rms, random_inputs_for(rms, 64), rows_config(128, 1, false, 4096, split), Runner::Simulated);
  }
}

TEST(ReductionSplit, LaunchPtxAndWhatItRefuses) {
  GraphBuilder b("split");
  Value x = b.param("in0", DType::BF16, {4, 100000});
  b.ret(reduce(OpKind::Sum, x, {1}, false));
  b.ret(reduce(OpKind::Max, x, {1}, false));
  Graph g = finish(b);
  KernelConfig c;
  c.split_reduction = 8;
  Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g), c, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  EXPECT_EQ(k->launch.grid[1], 8);
  EXPECT_FALSE(k->launch.zero_outputs);
  // 8 bytes a (reduction, share, row), then one u32 counter for the 4 row groups
  // (one row a block), rounded to 8 bytes.
  EXPECT_EQ(k->launch.workspace_bytes, 8 * 2 * 8 * 4 + 16);
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  // The count, the fences on both sides of it, the partials read back past L1, and no
  // atomic on the outputs.
  EXPECT_NE(ptx->find("atom.global.add.u32"), std::string::npos) << *ptx;
  EXPECT_NE(ptx->find("membar.gl"), std::string::npos);
  EXPECT_NE(ptx->find("ld.volatile.global"), std::string::npos);
  EXPECT_EQ(ptx->find("atom.global.add.f32"), std::string::npos);
  EXPECT_EQ(ptx->find("red.global.add.f32"), std::string::npos);
  EXPECT_NE(ptx->find("%ctaid.y"), std::string::npos);
  // The workspace: a fourth argument, after the input and the two outputs.
  EXPECT_NE(ptx->find("red_param_3"), std::string::npos);
  EXPECT_EQ(ptx->find("red_param_4"), std::string::npos);
  if (have_ptxas()) {
    EXPECT_EQ(ptxas_failure(*ptx, "sm_90a"), "");
  }
  Result<EmittedKernel> plain = reduction_emitter().emit(spec_of(g), {}, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->launch.workspace_bytes, 0);
  EXPECT_EQ(plain->launch.grid[1], 1);

  auto refused = [&](const Graph& h) {
    Result<EmittedKernel> r = reduction_emitter().emit(spec_of(h), c, llvmb::Target::nvptx("sm_90a"));
    return r.ok() ? std::string() : r.error().message;
  };
  Graph sm = composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1);
  EXPECT_NE(refused(sm).find("needs one pass over each row"), std::string::npos) << refused(sm);
  GraphBuilder bx("centred");
  Value y = bx.param("in0", DType::F32, {4, 100});
  bx.ret(y - mean(y, {1}, true));
  EXPECT_NE(refused(finish(bx)).find("has one per element of [4, 100]"), std::string::npos) << refused(finish(bx));
  c.split_reduction = 0;
  EXPECT_NE(refused(g).find("split_reduction = 0"), std::string::npos);
  c.split_reduction = 65536;
  EXPECT_NE(refused(g).find("outside 1..65535"), std::string::npos);
  // 2^24 rows x 65535 shares x 8 bytes: a Diag, not a workspace of 8 TiB.
  GraphBuilder bw("wide");
  bw.ret(reduce(OpKind::Sum, bw.param("in0", DType::F32, {1 << 24, 64}), {1}, false));
  c.split_reduction = 65535;
  EXPECT_NE(refused(finish(bw)).find("over 4 GiB in all: fewer shares"), std::string::npos) << refused(finish(bw));
}

// The suggestion splits rows where its blocks would leave an H100's 132 SMs idle and
// the shares stay long (64 elements a thread or more), and only where the group
// allows a split.
TEST(ReductionSplit, TheSuggestionSplitsRowsThatLeaveSMsIdle) {
  auto suggested = [](const Graph& g) {
    Result<KernelConfig> c = suggest_reduction_config(spec_of(g));
    EXPECT_TRUE(c.ok()) << c.error().str();
    Result<ReductionInfo> info = reduction_info(spec_of(g), *c);
    EXPECT_TRUE(info.ok()) << info.error().str();
    return std::make_pair(*c, info->launch);
  };
  auto one = [](DType dt, const Shape& s, std::vector<int64_t> dims) {
    GraphBuilder b("one");
    b.ret(sum(b.param("x", dt, s), std::move(dims)));
    return finish(b);
  };
  // A whole-tensor sum: one row, 256 threads; 256 shares of 65536 elements.
  auto [all, all_launch] = suggested(one(DType::F32, {4096, 4096}, {0, 1}));
  EXPECT_EQ(all.split_reduction, 256);
  EXPECT_EQ(all_launch.grid[0] * all_launch.grid[1], 256);
  // A layer norm's weight gradient at hidden 1024: 32 blocks of 32 rows, 8 shares of
  // 2048 tokens (64 a thread).
  auto [ln, ln_launch] = suggested(one(DType::BF16, {16384, 1024}, {0}));
  EXPECT_EQ(ln.rows_per_block, 32);
  EXPECT_EQ(ln.threads_per_row, 32);
  EXPECT_EQ(ln.split_reduction, 8);
  EXPECT_EQ(ln_launch.grid[0], 32);
  // The column sum over 4096 columns: 128 blocks, 2 shares.
  EXPECT_EQ(suggested(one(DType::F32, {16384, 4096}, {0})).first.split_reduction, 2);
  // Enough blocks already, or rows too short to share: no split.
  EXPECT_EQ(suggested(one(DType::F32, {16384, 4096}, {1})).first.split_reduction, 1);
  EXPECT_EQ(suggested(one(DType::F32, {7, 5000}, {1})).first.split_reduction, 1);
  // Softmax takes two passes and writes every element: never split, however few rows.
  EXPECT_EQ(suggested(composite_group(Composite::Softmax, DType::F32, {2, 1 << 20}, -1)).first.split_reduction, 1);
  // The suggestion starts from no split whatever the base says.
  KernelConfig base;
  base.split_reduction = 4;
  Result<KernelConfig> sm = suggest_reduction_config(spec_of(composite_group(Composite::Softmax, DType::F32, {64, 64}, -1)), base);
  ASSERT_TRUE(sm.ok()) << sm.error().str();
  EXPECT_EQ(sm->split_reduction, 1);
}

}  // namespace
}  // namespace kernels_reduction_test
}  // namespace sf
