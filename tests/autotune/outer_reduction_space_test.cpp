// The tuner and outer reductions (X's innermost dim kept, TuneProblem::outer): the
// space's blocks of neighbouring rows, the rule that lets them leave SMs idle, and the
// cost model's charge for sectors a warp reads only part of (autotune/space.cpp,
// autotune/cost_model.cpp, docs/autotuning.md).
#include <gtest/gtest.h>

#include <limits>

#include "autotune/config.h"
#include "autotune/cost_model.h"
#include "autotune/problem.h"
#include "autotune/space.h"
#include "autotune/target.h"
#include "tests/autotune/autotune_test_util.h"

namespace sf {
namespace autotune_outer_reduction_test {

using namespace autotune_test;

// sum(x, dims=[0]) of an f32 [16384, 4096]: 4096 rows of 16384 elements a row apart.
TuneProblem column_sum() {
  TuneProblem p = reduction(4096, 16384);
  p.outer = true;
  p.splittable = true;
  return p;
}

TEST(OuterReductionSpace, BlocksOfNeighbouringRowsJoinTheSpace) {
  TargetInfo t = gpu("sm_90a");
  // 15 more thread shapes (threads_per_row 1..32 x rows 32, 64, 128 within 32..1024
  // threads: 3 + 3 + 3 + 3 + 2 + 1) x 3 splits x 2 grids beside the 162.
  std::vector<KernelConfig> space = config_space(column_sum(), t);
  EXPECT_EQ(space.size(), 162u + 90u);
  EXPECT_EQ(config_space(reduction(4096, 16384), t).size(), 162u) << "a row reduction's space is unchanged";
  bool found = false;
  for (const KernelConfig& c : space) found = found || (c.threads_per_row == 32 && c.rows_per_block == 32);
  EXPECT_TRUE(found) << "32 threads a row, 32 rows a block";
}

TEST(OuterReductionSpace, ThirtyTwoRowsABlockMayLeaveSmsIdle) {
  TargetInfo t = gpu("sm_90a");
  TuneProblem p = column_sum();
  // 128 blocks of 32 rows for 132 SMs: kept, the warps need the rows to read lines.
  EXPECT_FALSE(rule_reject(p, red_cfg(32, 32), t)) << *rule_reject(p, red_cfg(32, 32), t);
  // 64 rows a block leave 64 blocks: pruned as before.
  ASSERT_TRUE(rule_reject(p, red_cfg(16, 64), t));
  EXPECT_NE(rule_reject(p, red_cfg(16, 64), t)->find("leaves 64 blocks"), std::string::npos);
  // A row reduction keeps the old rule at 32 rows a block.
  TuneProblem r = reduction(4096, 16384);
  ASSERT_TRUE(rule_reject(r, red_cfg(32, 32), t));
}

TEST(OuterReductionSpace, TheCostModelChargesSectorsReadInPart) {
  TargetInfo t = gpu("sm_90a");
  TuneProblem p = column_sum();
  BuildResult b1024, b256;
  b1024.threads_per_block = 1024;
  b256.threads_per_block = 256;
  // One row a block: each lane of a warp reads 4 bytes of its own 32-byte sector.
  const double strided = predict_us(p, red_cfg(256, 1), t, b256);
  const double lines = predict_us(p, red_cfg(32, 32), t, b1024);
  EXPECT_GT(strided, 4 * lines) << strided << " vs " << lines;
  // The same config on a row reduction is not charged for it.
  TuneProblem r = reduction(4096, 16384);
  EXPECT_LT(predict_us(r, red_cfg(256, 1), t, b256), strided / 4);
  // Over the whole space (rules applied), the model's best puts a warp's lanes on
  // neighbouring rows.
  double best = std::numeric_limits<double>::infinity();
  KernelConfig winner;
  for (const KernelConfig& c : config_space(p, t)) {
    if (rule_reject(p, c, t)) continue;
    BuildResult b;
    b.threads_per_block = c.threads_per_row * c.rows_per_block;
    double us = predict_us(p, c, t, b);
    if (us < best) best = us, winner = c;
  }
  EXPECT_GE(winner.rows_per_block, 8) << config_str(KernelKind::Reduction, ConfigTarget::Gpu, winner);
  EXPECT_LT(best, strided / 4);
}

}  // namespace autotune_outer_reduction_test
}  // namespace sf
