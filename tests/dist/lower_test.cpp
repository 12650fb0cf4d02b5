// The lowering stage (codegen/dist/lower.h): which collectives each rank's program
// gets and where, on the shipped examples (each run also checked end to end against
// the reference).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/dist/explain.h"
#include "codegen/dist/schedule.h"
#include "tests/dist/pipeline_util.h"

namespace sf {
namespace dist_lower_test {

using namespace dist_test;

TEST(Lower, MegatronMlpNeedsOneAllReduce) {
  Ran r = run_and_check(example("tp_mlp.sf"), 3, "tp_mlp");
  std::vector<std::string> comms;
  for (const LocalStep& s : r.programs[0].steps)
    if (s.kind == LocalStep::Kind::Start || s.kind == LocalStep::Kind::Wait)
      comms.push_back(step_line(r.programs[0], s, DeviceMesh(example("tp_mlp.sf").mesh())));
  ASSERT_EQ(comms.size(), 2u) << "a start and a wait";
  EXPECT_EQ(comms[0].rfind("all_reduce ", 0), 0u) << comms[0];
}


TEST(Lower, AttentionGathersItsInputBeforeTheFirstMatmul) {
  Graph g = example("tp_attention.sf");
  Ran r = run_and_check(g, 4, "tp_attention");
  DeviceMesh mesh(g.mesh());
  std::vector<std::string> lines;
  for (const LocalStep& s : r.programs[0].steps) lines.push_back(step_line(r.programs[0], s, mesh));
  auto first = [&](const std::string& prefix) {
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].rfind(prefix, 0) == 0) return static_cast<int>(i);
    return -1;
  };
  int mm = -1;
  for (size_t i = 0; i < lines.size() && mm < 0; ++i)
    if (lines[i].rfind("kernel ", 0) == 0 && lines[i].find("matmul") != std::string::npos) mm = static_cast<int>(i);
  int ag = first("all_gather x "), wait = first("wait x_ag");
  ASSERT_GE(ag, 0);
  // The redistribute after the gather is no kernel of its own: the matmul reads x_ag.
  ASSERT_GE(mm, 0);
  EXPECT_NE(lines[static_cast<size_t>(mm)].find("x_ag"), std::string::npos) << lines[static_cast<size_t>(mm)];
  EXPECT_LT(ag, wait);
  EXPECT_LT(wait, mm);
}


}  // namespace dist_lower_test
}  // namespace sf
