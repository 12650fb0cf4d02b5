// Outer reductions on NVPTX (X's innermost dim kept: sum(x, dims=[0]) of a [N, C]
// tensor, a bias gradient over [B, S, H]): with several rows and threads a block the
// kernel's threads take rows fastest, so a warp's lanes read neighbouring rows, which
// are neighbours in memory (docs/kernels.md, "Outer reductions"). The simulated
// kernel against the reference in every form the plan can take, and the X indices a
// warp's lanes read together, traced from the simulated kernel itself.
#include "tests/kernels/reduction_test_util.h"

#include <set>

namespace sf {
namespace kernels_reduction_test {
namespace {

// The forms of the outer plan (reduction_internal.h, Plan::outer):
//   (32, 32): no shuffles, 32 partials a row through shared memory;
//   (8, 64): rows_per_block above 32, 8 partials a row through shared memory;
//   (4, 8): one warp, a row's 4 lanes 8 apart meet by shuffles alone;
//   (16, 8): shuffles among a warp's 4 lanes of a row, then 4 partials in shared memory;
//   (2, 128): rows_per_block above 32, 2 partials a row;
//   (32, 3): rows_per_block not a power of two: every partial through shared memory;
//   (16, 16) with a grid of 2 looping over row groups (the shared slots reused);
//   (64, 2): 64 lanes a row, a warp's 16 of them by shuffles.
std::vector<KernelConfig> outer_configs() {
  return {rows_config(32, 32), rows_config(8, 64),  rows_config(4, 8),
          rows_config(16, 8),  rows_config(2, 128), rows_config(32, 3),
          rows_config(16, 16, /*grid_stride=*/true, /*max_blocks=*/2), rows_config(64, 2)};
}

TEST(ReductionOuter, EveryOpAndDimsPlacementMatchesTheReference) {
  struct Case {
    const char* what;
    DType dt;
    Shape shape;
    std::vector<int64_t> dims;
  };
  const Case cases[] = {
      {"first dim, rows of 300 (held in registers)", DType::F32, {300, 70}, {0}},
      {"first dim, rows of 2000 (multi-pass)", DType::F32, {2000, 40}, {0}},
      {"a bias gradient: [B, S] of [B, S, H]", DType::BF16, {3, 40, 33}, {0, 1}},
      {"a middle dim, the innermost kept", DType::F16, {6, 50, 20}, {1}},
      {"the outer two of four dims", DType::F32, {5, 7, 3, 9}, {0, 1}},
  };
  const std::vector<KernelConfig> all = outer_configs();
  for (size_t k = 0; k < std::size(cases); ++k)
    // Every form on the first two shapes, three of them (in turn) on the others.
    for (size_t f = 0; f < all.size(); ++f) {
      if (k >= 2 && (f + k) % 3 != 0) continue;
      const Case& c = cases[k];
      const KernelConfig& cfg = all[f];
      SCOPED_TRACE(std::string(c.what) + " " + config_str(cfg));
      Graph g = four_reductions(c.dt, c.shape, c.dims, /*keepdim=*/false);
      Result<ReductionInfo> info = reduction_info(spec_of(g), cfg);
      ASSERT_TRUE(info.ok()) << info.error().str();
      EXPECT_TRUE(info->inner_kept);
      EXPECT_TRUE(info->outer);
      expect_matches_reference(g, random_inputs_for(g, 51), cfg, Runner::Simulated);
    }
}

TEST(ReductionOuter, IntegerSumsMultiPassEpiloguesAndSplitRows) {
  // i64 sums (two 32-bit halves through shuffles and 8-byte shared slots) and i32 max.
  GraphBuilder bi("ints");
  Value i = bi.param("i", DType::I64, {700, 24});
  bi.ret(reduce(OpKind::Sum, i, {0}, false));
  bi.ret(reduce(OpKind::Max, cast(i, DType::I32), {0}, true));
  Graph gi = finish(bi);
  // softmax over dim 0: a max pass, a sum pass, then X-space outputs, rows strided.
  Graph sm = composite_group(Composite::Softmax, DType::F32, {1500, 24}, 0);
  // A two-pass normalisation over the leading dims with an X-space output and a
  // row-space output: mean, then the mean of squared deviations.
  GraphBuilder bn("norm");
  Value x = bn.param("x", DType::BF16, {30, 50, 12});
  Value mu = reduce(OpKind::Mean, x, {0, 1}, true);
  Value d = x - mu;
  Value var = reduce(OpKind::Mean, d * d, {0, 1}, true);
  bn.ret(d * unary(OpKind::Rsqrt, var + 1e-5));
  bn.ret(var);
  Graph gn = finish(bn);
  const std::vector<KernelConfig> all = outer_configs();
  for (size_t f = 0; f < all.size(); ++f) {
    SCOPED_TRACE(config_str(all[f]));
    // softmax in every form; the integers and the normalisation in every other one.
    expect_matches_reference(sm, random_inputs_for(sm, 53, -3, 3), all[f], Runner::Simulated);
    if (f % 2 == 0) expect_matches_reference(gi, random_inputs_for(gi, 52, -1, 1, /*wide=*/true), all[f], Runner::Simulated);
    else expect_matches_reference(gn, random_inputs_for(gn, 54), all[f], Runner::Simulated);
  }
  // A split f32 sum: 8 blocks along y share each row, adding their shares atomically.
  GraphBuilder bs("split");
  Value xs = bs.param("x", DType::F32, {4000, 48});
  bs.ret(reduce(OpKind::Sum, xs, {0}, false));
  Graph gs = finish(bs);
  for (const KernelConfig& cfg : {rows_config(32, 32, false, 4096, 8), rows_config(16, 8, true, 3, 8)}) {
    SCOPED_TRACE(config_str(cfg));
    expect_matches_reference(gs, random_inputs_for(gs, 55), cfg, Runner::Simulated);
  }
}

// The 32-byte sectors (memory's unit between L2 and the SMs) the lanes of each warp
// touch at each of their steps, over a launch: sectors[n] = how many warp steps
// touched n sectors. Lanes past the end of their trace (rows past the last) count
// for nothing.
std::map<size_t, int64_t> sectors_per_warp_step(const SimTrace& t, int elem_bytes) {
  std::map<size_t, int64_t> hist;
  for (const auto& block : t.blocks)
    for (size_t w = 0; w * 32 < block.size(); ++w) {
      size_t steps = 0;
      for (size_t l = w * 32; l < std::min(block.size(), w * 32 + 32); ++l) steps = std::max(steps, block[l].size());
      for (size_t s = 0; s < steps; ++s) {
        std::set<int64_t> sectors;
        for (size_t l = w * 32; l < std::min(block.size(), w * 32 + 32); ++l)
          if (s < block[l].size()) sectors.insert(block[l][s] * elem_bytes / 32);
        ++hist[sectors.size()];
      }
    }
  return hist;
}

TEST(ReductionOuter, AWarpsLanesReadNeighbouringRowsInWholeSectors) {
  // The suggested config of a column sum: 32 rows a block, so each warp step reads
  // 32 neighbouring f32 elements, 128 bytes: 4 sectors, whatever the step.
  GraphBuilder b("colsum");
  Value x = b.param("x", DType::F32, {1024, 64});
  b.ret(reduce(OpKind::Sum, x, {0}, false));
  Graph g = finish(b);
  Result<KernelConfig> cfg = suggest_reduction_config(spec_of(g));
  ASSERT_TRUE(cfg.ok()) << cfg.error().str();
  ASSERT_EQ(cfg->rows_per_block, 32);
  ASSERT_GT(cfg->threads_per_row, 1);
  std::vector<Tensor> in = random_inputs_for(g, 56);
  SimTrace coalesced;
  Result<std::vector<Tensor>> got = run_simulated(g, in, *cfg, false, &coalesced);
  ASSERT_TRUE(got.ok()) << got.error().str();
  std::map<size_t, int64_t> hist = sectors_per_warp_step(coalesced, 4);
  ASSERT_EQ(hist.size(), 1u) << "every warp step touches the same number of sectors";
  EXPECT_EQ(hist.begin()->first, 4u);
  // Every element was folded exactly once over the launch.
  std::vector<int> seen(static_cast<size_t>(numel(Shape{1024, 64})), 0);
  for (const auto& block : coalesced.blocks)
    for (const auto& lane : block)
      for (int64_t i : lane) ++seen[static_cast<size_t>(i)];
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(seen.size()));

  // One row a block (the suggestion before outer reductions had a form of their own):
  // each lane reads its own sector, 32 a warp step; the trace sees the difference.
  SimTrace strided;
  got = run_simulated(g, in, rows_config(256, 1), false, &strided);
  ASSERT_TRUE(got.ok()) << got.error().str();
  hist = sectors_per_warp_step(strided, 4);
  ASSERT_EQ(hist.size(), 1u);
  EXPECT_EQ(hist.begin()->first, 32u);

  // Rows held in registers (a short column) read the same way, bf16 in 64-byte runs:
  // 2 sectors a warp step.
  GraphBuilder bb("colsum16");
  Value xb = bb.param("x", DType::BF16, {64, 96});
  bb.ret(reduce(OpKind::Sum, xb, {0}, false));
  Graph gb = finish(bb);
  SimTrace held;
  got = run_simulated(gb, random_inputs_for(gb, 57), rows_config(8, 32), false, &held);
  ASSERT_TRUE(got.ok()) << got.error().str();
  Result<ReductionInfo> info = reduction_info(spec_of(gb), rows_config(8, 32));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->persistent);
  EXPECT_EQ(info->adjacent_lanes, 32);
  hist = sectors_per_warp_step(held, 2);
  ASSERT_EQ(hist.size(), 1u);
  EXPECT_EQ(hist.begin()->first, 2u);
}

TEST(ReductionOuter, WhatReductionInfoSaysOfTheForm) {
  GraphBuilder b("colsum");
  Value x = b.param("x", DType::F32, {1024, 256});
  b.ret(reduce(OpKind::Sum, x, {0}, false));
  Graph g = finish(b);
  struct Case {
    int tpr, rpb;
    bool outer;
    int adjacent;
    int shared;  // static shared bytes: f32 partials, one per (row of the block, slot)
  };
  const Case cases[] = {
      {32, 32, true, 32, 32 * 32 * 4},  // 32 slots a row
      {16, 8, true, 8, 4 * 8 * 4},      // a warp's 4 lanes of a row by shuffles, 4 slots
      {4, 8, true, 8, 0},               // one warp: shuffles only
      {256, 1, false, 1, 8 * 4},        // one row a block: lanes 256 elements apart
      {1, 256, false, 32, 0},           // a thread a row: lanes on neighbouring rows
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.tpr) + " x " + std::to_string(c.rpb));
    Result<ReductionInfo> info = reduction_info(spec_of(g), rows_config(c.tpr, c.rpb));
    ASSERT_TRUE(info.ok()) << info.error().str();
    EXPECT_TRUE(info->inner_kept);
    EXPECT_EQ(info->outer, c.outer);
    EXPECT_EQ(info->adjacent_lanes, c.adjacent);
    EXPECT_EQ(info->static_shared_bytes, c.shared);
  }
  // A row reduction is not outer, whatever the config.
  GraphBuilder br("rowsum");
  Value xr = br.param("x", DType::F32, {256, 1024});
  br.ret(reduce(OpKind::Sum, xr, {1}, false));
  Result<ReductionInfo> info = reduction_info(spec_of(finish(br)), rows_config(32, 32));
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->inner_kept);
  EXPECT_FALSE(info->outer);
}

TEST(ReductionOuter, PartialsOverStaticSharedMemoryAreADiag) {
  // 1024 threads of i64 partials for 7 reductions: 56 KiB of slots.
  GraphBuilder b("many");
  Value x = b.param("x", DType::I64, {4096, 64});
  Value v = x;
  for (int r = 0; r < 7; ++r, v = v * x) b.ret(reduce(OpKind::Sum, v, {0}, false));
  Result<ReductionInfo> info = reduction_info(spec_of(finish(b)), rows_config(32, 32));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.error().str().find("48 KiB of static shared memory"), std::string::npos) << info.error().str();
}

}  // namespace
}  // namespace kernels_reduction_test
}  // namespace sf
