// measured_set(): which ranked configs tune_kernel measures. The first top_k and the
// default always; for a matmul also the best-ranked config of each schedule (plain,
// warp-specialised, persistent, ping-pong with 64-row and with 128-row tiles, each
// with its registers reallocated or not) the top_k lack, because the cost model
// prices tiles and not how the schedules overlap an epilogue with the next tile.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autotune/tuner.h"

namespace sf {
namespace autotune_measured_set_test {

const std::string kTile = "block_m=128 block_n=256 block_k=64 warps=8 group_m=8 split_k=1";

std::string mm(int stages, const std::string& schedule = "") {
  return kTile + " stages=" + std::to_string(stages) + (schedule.empty() ? "" : " " + schedule);
}

TEST(MeasuredSet, TopKTheDefaultAndTheBestOfEachMatmulSchedule) {
  const std::vector<std::string> ranked = {
      mm(4),                                                          // 0: top_k
      mm(3),                                                          // 1: top_k
      mm(5),                                                          // 2: plain, ranked out
      mm(4, "warp_specialize=1"),                                     // 3: first warp-specialised
      mm(3, "warp_specialize=1"),                                     // 4: ranked out
      mm(4, "warp_specialize=1 persistent=132"),                      // 5: first persistent
      "block_m=64 block_n=256 block_k=64 warps=8 group_m=8 split_k=1 stages=4 warp_specialize=1 persistent=132 "
      "pingpong=1",                                                   // 6: first ping-pong
      mm(4, "warp_specialize=1 persistent=132 pingpong=1"),           // 7: first 128-row ping-pong
      mm(2),                                                          // 8: the default
      "block_m=64 block_n=128 block_k=64 warps=8 group_m=8 split_k=1 stages=4 warp_specialize=1 persistent=132 "
      "pingpong=1",                                                   // 9: 64 rows again, ranked out
      mm(4, "warp_specialize=1 persistent=132 setmaxnreg=232"),       // 10: first with registers reallocated
      mm(3, "warp_specialize=1 persistent=132 setmaxnreg=232"),       // 11: ranked out
  };
  std::vector<bool> dflt(ranked.size(), false);
  dflt[8] = true;
  EXPECT_EQ(measured_set(ranked, 2, dflt),
            (std::vector<bool>{true, true, false, true, false, true, true, true, true, false, true, false}));
  // A top_k that already holds a schedule adds no other config of it.
  EXPECT_EQ(measured_set(ranked, 4, dflt),
            (std::vector<bool>{true, true, true, true, false, true, true, true, true, false, true, false}));
}

// Configs of other kinds (and texts no config parses, as a library's) have one
// schedule: exactly the top_k and the default.
TEST(MeasuredSet, OtherKindsTakeTheTopKAndTheDefault) {
  const std::vector<std::string> ranked = {"block=256 vector=4", "block=128 vector=4", "block=512 vector=2",
                                           "block=64 vector=1"};
  EXPECT_EQ(measured_set(ranked, 2, {false, false, false, true}), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(measured_set(ranked, 1, {}), (std::vector<bool>{true, false, false, false}));
}

}  // namespace autotune_measured_set_test
}  // namespace sf
