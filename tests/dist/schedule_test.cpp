// The scheduling stage (codegen/dist/schedule.h): independent compute placed between
// a collective's start and its wait (each run also checked end to end).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/dist/explain.h"
#include "codegen/dist/schedule.h"
#include "tests/dist/pipeline_util.h"

namespace sf {
namespace dist_schedule_test {

using namespace dist_test;

TEST(Schedule, IndependentComputeRunsBetweenStartAndWait) {
  Graph g = example("seq_parallel_mlp.sf");
  Ran r = run_and_check(g, 5, "seq_parallel_mlp");
  const auto& st = r.programs[0].steps;
  ASSERT_EQ(st[0].kind, LocalStep::Kind::Start);
  size_t wait = 1;
  while (st[wait].kind != LocalStep::Kind::Wait) ++wait;
  // Unfused, both weight transposes run while the all-gather is in flight.
  Ran unfused = run_and_check(g, 5, "seq_parallel_mlp unfused", /*fused=*/false);
  const auto& su = unfused.programs[0].steps;
  ASSERT_EQ(su[0].kind, LocalStep::Kind::Start);
  size_t w = 1;
  while (su[w].kind != LocalStep::Kind::Wait) ++w;
  EXPECT_GE(w, 3u);
  for (size_t i = 1; i < w; ++i) {
    ASSERT_EQ(su[i].kind, LocalStep::Kind::Kernel);
    EXPECT_EQ(unfused.programs[0].kernels[static_cast<size_t>(su[i].kernel)].ops, std::vector<std::string>{"transpose"});
  }
  (void)wait;
}


}  // namespace dist_schedule_test
}  // namespace sf
