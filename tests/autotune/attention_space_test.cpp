// The fused attention's tuning: its GPU config space (the wgmma form on sm_90a), the
// cost model's ranking of its forms, and wgmma as a schedule of its own in what the
// tuner measures. No compiler, no GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autotune/config.h"
#include "autotune/cost_model.h"
#include "autotune/problem.h"
#include "autotune/space.h"
#include "autotune/target.h"
#include "autotune/tuner.h"
#include "tests/autotune/autotune_test_util.h"

namespace sf {
namespace autotune_attention_space_test {

using namespace autotune_test;

// The bench sdpa block's attention: 8 x 32 heads, 2048 x 2048, head dims E and Ev, bf16.
TuneProblem sdpa(int64_t e = 128, int64_t ev = 128, int operand_bytes = 2) {
  TuneProblem p;
  p.kind = KernelKind::Attention;
  p.batch = 8 * 32;
  p.m = 2048;
  p.n = 2048;
  p.k = e;
  p.cols = ev;
  p.elem_bytes = operand_bytes;
  p.operand_bytes = operand_bytes;
  p.bytes = int64_t{3} * p.batch * 2048 * 128 * 2;
  p.flops = int64_t{4} * p.batch * 2048 * 2048 * 128 / 2;  // causal
  return p;
}

KernelConfig cfg(int bm, int bn, int warps, int wgmma = 0) { return attention_tile(bm, bn, warps, wgmma); }

// sm_90a adds wgmma=1 and 2 on register-resident tiles of whole warpgroups (16 rows a
// warp: 64, 128, 192 and 256 rows on 4, 8, 12 and 16 warps) over 16, 32, 64, 96 and
// 128 keys, where both head dims are multiples of 64 and the operands 16-bit; other
// archs, head dims and dtypes keep the 48 mma.sync and FMA tiles.
TEST(AttentionSpace, Sm90aAddsTheWgmmaFormOfWholeWarpgroupTiles) {
  std::vector<KernelConfig> space = config_space(sdpa(), gpu("sm_90a"));
  ASSERT_EQ(space.size(), 48u + 40u);
  int wg = 0, big = 0;
  for (const KernelConfig& c : space) {
    if (!c.wgmma) continue;
    ++wg;
    big += c.block_m == 256 && c.block_n == 64 && c.wgmma == 1;
    EXPECT_EQ(c.block_m, 16 * c.warps) << config_str(KernelKind::Attention, ConfigTarget::Gpu, c);
    EXPECT_EQ(c.warps % 4, 0) << config_str(KernelKind::Attention, ConfigTarget::Gpu, c);
  }
  EXPECT_EQ(wg, 40) << "20 tiles, each plain and pipelined";
  EXPECT_EQ(big, 1) << "the sm_90a default, 256 x 64 on 16 warps, is in the space";
  EXPECT_EQ(config_space(sdpa(), gpu("sm_90")).size(), 48u) << "wgmma is sm_90a's";
  EXPECT_EQ(config_space(sdpa(96, 128), gpu("sm_90a")).size(), 48u) << "E = 96 is not whole 64-column panels";
  EXPECT_EQ(config_space(sdpa(128, 128, 4), gpu("sm_90a")).size(), 48u) << "f32 takes no tensor cores";
}

// The space rule counts a register-resident tile's shared memory as the tensor-core
// kernel holds it (16-bit q, k and v), not as the f32 tiles of the other forms: on
// sm_90a at E = Ev = 128, 192 x 96 on 12 warps (120 KiB) and 128 x 128 on 8 (160 KiB)
// are kept, which at f32 (304 and 320 KiB) would not fit 227 KiB; 256 x 128
// pipelined (256 KiB) is over even so, and a tile outside the register-resident form
// is still counted at f32.
TEST(AttentionSpace, RegisterResidentTilesAreCountedAtSixteenBits) {
  const TargetInfo t = gpu("sm_90a");
  EXPECT_GT(attention_tile_bytes(192, 96, 128, 128), t.max_shared_per_block);
  EXPECT_EQ(rule_reject(sdpa(), cfg(192, 96, 12, 1), t), std::nullopt);
  EXPECT_EQ(rule_reject(sdpa(), cfg(128, 128, 8, 1), t), std::nullopt);
  EXPECT_EQ(rule_reject(sdpa(), cfg(128, 128, 8, 0), t), std::nullopt) << "mma.sync's padded rows: 170 KiB";
  EXPECT_EQ(rule_reject(sdpa(), cfg(128, 128, 4, 0), t), std::nullopt) << "32 rows a warp";
  EXPECT_NE(rule_reject(sdpa(), cfg(256, 128, 16, 2), t), std::nullopt);
  EXPECT_NE(rule_reject(sdpa(), cfg(128, 128, 2, 0), t), std::nullopt) << "64 rows a warp, the shared form: f32, 322 KiB";
  EXPECT_NE(rule_reject(sdpa(128, 128, 4), cfg(128, 128, 8, 0), t), std::nullopt) << "f32: no tensor cores";
}

// An attention's wgmma configs are a schedule of their own: the best-ranked of them is
// measured beside the top-k even when the model ranks it out, and so is the best
// mma.sync config when wgmma configs fill the top-k.
TEST(AttentionSpace, WgmmaIsAScheduleTheTunerMeasures) {
  const std::vector<std::string> ranked = {"block_m=128 block_n=64 warps=8", "block_m=64 block_n=64 warps=4",
                                           "block_m=128 block_n=64 warps=8 wgmma=1",
                                           "block_m=64 block_n=64 warps=4 wgmma=1"};
  EXPECT_EQ(measured_set(ranked, 2, {}), (std::vector<bool>{true, true, true, false}));
  const std::vector<std::string> wg_first = {"block_m=128 block_n=64 warps=8 wgmma=1", "block_m=64 block_n=64 warps=4 wgmma=1",
                                             "block_m=128 block_n=32 warps=8", "block_m=64 block_n=32 warps=4"};
  EXPECT_EQ(measured_set(wg_first, 1, {}), (std::vector<bool>{true, false, true, false}));
  // Plain and pipelined wgmma are schedules apart.
  const std::vector<std::string> both = {"block_m=128 block_n=64 warps=8 wgmma=1", "block_m=64 block_n=64 warps=4 wgmma=1",
                                         "block_m=128 block_n=64 warps=8 wgmma=2", "block_m=64 block_n=64 warps=4 wgmma=2"};
  EXPECT_EQ(measured_set(both, 1, {}), (std::vector<bool>{true, false, true, false}));
}

// The tensor-core attention (bench sdpa's shape: 8 x 32 heads, 2048 x 2048, head dim
// 128, bf16): tiles of 16 or 32 rows a warp (the register-resident form) rank above
// the same tile on other warp counts, 32 rows a warp (two mma tiles sharing each k
// and v fragment) above 16, 32-key tiles above 16 (each key tile's fixed cost), and
// big query tiles above small ones (k and v are read once per query tile), so a
// tuner's top-k holds the forms worth measuring.
// The wgmma form ranks above the same tile on mma.sync, and plain above pipelined (as
// an H200 measured them in run 11).
TEST(CostModelTest, TensorCoreAttentionPrefersTheRegisterFormAndBigTiles) {
  TargetInfo t = gpu("sm_90a");
  TuneProblem p = sdpa();
  BuildResult tc;
  tc.tensor_cores = true;
  const double regs64 = predict_us(p, cfg(64, 64, 4), t, tc), shared64 = predict_us(p, cfg(64, 64, 8), t, tc);
  EXPECT_LT(predict_us(p, cfg(128, 32, 4), t, tc), predict_us(p, cfg(128, 32, 8), t, tc)) << "two mma tiles a warp";
  EXPECT_LT(predict_us(p, cfg(64, 64, 2), t, tc), predict_us(p, cfg(64, 64, 1), t, tc)) << "the shared form";
  EXPECT_LT(predict_us(p, cfg(128, 32, 4), t, tc), predict_us(p, cfg(128, 16, 4), t, tc)) << "a key tile's fixed cost";
  const double tiny = predict_us(p, cfg(16, 16, 1), t, tc), regs128 = predict_us(p, cfg(128, 64, 8), t, tc);
  EXPECT_LT(regs64, shared64);
  EXPECT_LT(regs64, tiny);
  EXPECT_LE(regs128, regs64 * 1.01);
  EXPECT_LT(regs64, predict_us(p, cfg(64, 64, 4), t, BuildResult{})) << "tensor cores priced above FMA";
  KernelConfig wg = cfg(128, 64, 8);
  wg.wgmma = 1;
  EXPECT_LT(predict_us(p, wg, t, tc), regs128) << "wgmma above mma.sync";
  KernelConfig piped = wg;
  piped.wgmma = 2;
  EXPECT_LT(predict_us(p, wg, t, tc), predict_us(p, piped, t, tc)) << "plain above pipelined";
}

}  // namespace autotune_attention_space_test
}  // namespace sf
