// The invariant checker between pipeline stages (codegen/fusion/verify_programs.h):
// programs broken on purpose are refused with the stage and the defect named, and
// every example passes it after every stage, on several worlds and with collective
// matmuls decomposed or not.
#include <gtest/gtest.h>

#include <filesystem>

#include "codegen/fusion/pipeline.h"
#include "codegen/fusion/verify_programs.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "tests/result_util.h"

namespace sf {
namespace fusion_verify_programs_test {

DeviceMesh tp(int n) { return DeviceMesh(Mesh{{{"tp", n}}}); }

// Rank r of a world of `n`: param x (f32[rows[r]]) -> `collective` -> y, returned.
LocalProgram one_collective(int r, const std::vector<int64_t>& rows, CollectiveKind kind, bool with_collective = true) {
  LocalProgram p;
  p.rank = r;
  const int64_t mine = rows[static_cast<size_t>(r)];
  int64_t total = 0;
  for (int64_t x : rows) total += x;
  p.types = {{DType::F32, {mine, 8}}, {DType::F32, {kind == CollectiveKind::AllGather ? total : mine, 8}}};
  p.names = {"x", "y"};
  p.param_values = {0};
  if (!with_collective) {
    p.output_values = {0};
    p.output_specs = {PlacementSpec{}};
    return p;
  }
  LocalStep s;
  s.kind = LocalStep::Kind::Start;
  s.collective = kind;
  s.in = {0};
  s.handle = 0;
  if (kind == CollectiveKind::AllGather) s.sizes = rows;
  LocalStep w;
  w.kind = LocalStep::Kind::Wait;
  w.handle = 0;
  w.out = 1;
  p.steps = {s, w};
  p.num_handles = 1;
  p.output_values = {1};
  p.output_specs = {PlacementSpec{}};
  return p;
}

std::string verify(const std::vector<LocalProgram>& ps, const DeviceMesh& mesh, std::string_view stage) {
  Result<void> d = verify_programs(ps, mesh, stage);
  return d.ok() ? "" : d.error().message;
}

TEST(VerifyPrograms, SoundHandBuiltProgramsPass) {
  EXPECT_EQ(verify({one_collective(0, {4, 4}, CollectiveKind::AllReduce), one_collective(1, {4, 4}, CollectiveKind::AllReduce)},
                   tp(2), "lower"),
            "");
  // Uneven all_gather shards are legal: each member passes its own extent.
  EXPECT_EQ(verify({one_collective(0, {3, 2}, CollectiveKind::AllGather), one_collective(1, {3, 2}, CollectiveKind::AllGather)},
                   tp(2), "lower"),
            "");
}

TEST(VerifyPrograms, UseBeforeDefinitionNamesTheStageTheRankTheStepAndTheValue) {
  std::vector<LocalProgram> ps{one_collective(0, {4, 4}, CollectiveKind::AllReduce),
                               one_collective(1, {4, 4}, CollectiveKind::AllReduce)};
  // Rank 1's wait moved ahead of... nothing: its result read by a step before it.
  LocalStep neg;
  neg.kind = LocalStep::Kind::Compute;
  neg.node.op = OpKind::Neg;
  neg.node.type = {DType::F32, {4, 8}};
  neg.in = {1};  // y, which the wait after it defines
  neg.out = 2;
  ps[1].types.push_back({DType::F32, {4, 8}});
  ps[1].names.push_back("z");
  ps[1].steps.insert(ps[1].steps.begin() + 1, neg);
  const std::string m = verify(ps, tp(2), "fuse");
  EXPECT_EQ(m.rfind("after fuse: rank 1, step 1 (neg): uses %y (value 1) before it is defined", 0), 0u) << m;
}

TEST(VerifyPrograms, CollectiveShapesThatDifferBetweenTwoRanksAreNamed) {
  // Rank 0 all-reduces f32[4, 8], rank 1 f32[5, 8]: both well-formed alone.
  std::vector<LocalProgram> ps{one_collective(0, {4, 5}, CollectiveKind::AllReduce),
                               one_collective(1, {4, 5}, CollectiveKind::AllReduce)};
  const std::string m = verify(ps, tp(2), "schedule");
  EXPECT_EQ(m.rfind("after schedule: rank 1, step 0 (all_reduce h0): does not match rank 0's step 0", 0), 0u) << m;
  EXPECT_NE(m.find("all_reduce of f32[4, 8] meets one of f32[5, 8]"), std::string::npos) << m;
}

TEST(VerifyPrograms, ACollectiveMissingOnOneMemberIsNamed) {
  std::vector<LocalProgram> ps{one_collective(0, {4, 4}, CollectiveKind::AllReduce),
                               one_collective(1, {4, 4}, CollectiveKind::AllReduce, /*with_collective=*/false)};
  const std::string m = verify(ps, tp(2), "collective-matmul");
  EXPECT_EQ(m.rfind("after collective-matmul: rank 0, step 0 (all_reduce h0): has no partner on rank 1", 0), 0u) << m;
}

TEST(VerifyPrograms, AnAllGatherWhoseSizesDifferOrDoNotFitIsRefused) {
  std::vector<LocalProgram> ps{one_collective(0, {4, 4}, CollectiveKind::AllGather),
                               one_collective(1, {4, 4}, CollectiveKind::AllGather)};
  ps[1].steps[0].sizes = {4, 3};  // rank 1's own extent is 4, not 3
  std::string m = verify(ps, tp(2), "lower");
  EXPECT_NE(m.find("after lower: rank 1, step 0 (all_gather h0): sizes[1] = 3"), std::string::npos) << m;
  ps[1].steps[0].sizes = {4, 4};
  ps[1].steps[0].dim = 2;  // f32[4, 8] has no dim 2
  m = verify(ps, tp(2), "lower");
  EXPECT_NE(m.find("rank 1, step 0 (all_gather h0): all_gather along dim 2 of f32[4, 8]"), std::string::npos) << m;
}

TEST(VerifyPrograms, AWaitIntoAValueOfAnotherTypeAndAStartNeverWaitedForAreRefused) {
  std::vector<LocalProgram> ps{one_collective(0, {4, 4}, CollectiveKind::AllReduce),
                               one_collective(1, {4, 4}, CollectiveKind::AllReduce)};
  ps[0].types[1] = {DType::F32, {4, 9}};
  std::string m = verify(ps, tp(2), "fuse");
  EXPECT_NE(m.find("rank 0, step 1 (wait h0): receives into %y (value 1) of f32[4, 9], but the collective at step 0 "
                   "gives f32[4, 8]"),
            std::string::npos)
      << m;
  ps[0] = one_collective(0, {4, 4}, CollectiveKind::AllReduce);
  ps[0].steps.pop_back();
  ps[0].output_values = {0};
  m = verify(ps, tp(2), "fuse");
  EXPECT_NE(m.find("rank 0, step 0 (all_reduce h0): is started but never waited for"), std::string::npos) << m;
}

TEST(VerifyPrograms, AKernelStepWhoseOperandsAreNotTheKernelsTypesIsRefused) {
  // A real fused program, one operand of its first kernel retyped.
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/tp_mlp.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  const DeviceMesh mesh(g->mesh());
  std::vector<LocalProgram> ps = ok_value(rank_programs(*g, propagate(*g, mesh), mesh));
  ASSERT_EQ(verify(ps, mesh, "schedule"), "");
  LocalProgram& p = ps[2];
  auto k = std::find_if(p.steps.begin(), p.steps.end(), [](const LocalStep& s) { return s.kind == LocalStep::Kind::Kernel; });
  ASSERT_NE(k, p.steps.end());
  p.types[static_cast<size_t>(k->in[0])].shape.push_back(2);
  const std::string m = verify(ps, mesh, "fuse");
  EXPECT_NE(m.find("after fuse: rank 2, step " + std::to_string(k - p.steps.begin()) + " (kernel "), std::string::npos) << m;
  EXPECT_NE(m.find("operand 0"), std::string::npos) << m;
}

TEST(VerifyPrograms, ABrokenStageIsAnInternalErrorNotAnException) {
  // A program broken between two stages (rank 1's collective loses its Wait after
  // lowering) must come back from rank_programs as an internal Diag naming the
  // stage whose check caught it; nothing is thrown.
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/tp_mlp.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  const DeviceMesh mesh(g->mesh());
  RankPipelineOptions po;
  po.verify_each = true;
  po.after_stage = [](std::string_view stage, const std::vector<LocalProgram>& ps) {
    if (stage != "lower") return;
    auto& p = const_cast<LocalProgram&>(ps[1]);  // the test's corruption
    auto w = std::find_if(p.steps.begin(), p.steps.end(), [](const LocalStep& s) { return s.kind == LocalStep::Kind::Wait; });
    if (w != p.steps.end()) p.steps.erase(w);
  };
  Result<std::vector<LocalProgram>> ps = rank_programs(*g, propagate(*g, mesh), mesh, po);
  ASSERT_FALSE(ps.ok());
  EXPECT_TRUE(ps.error().internal);
  EXPECT_NE(ps.error().message.find("--verify-each: the programs are broken after decompose"), std::string::npos)
      << ps.error().message;
}

// Every example after every stage, through rank_programs' own hook, on the mesh it
// names and (1-D meshes) on 3 ranks too for uneven shards, with collective matmuls
// decomposed by the estimates, always and never.
TEST(VerifyPrograms, EveryExamplePassesAfterEveryStage) {
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(SF_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".sf") continue;
    Result<Graph> g = parse_file(e.path().string());
    ASSERT_TRUE(g.ok()) << g.error().str();
    std::vector<Mesh> meshes{g->mesh()};
    if (g->mesh().dims.size() == 1) meshes.push_back(Mesh{{{g->mesh().dims[0].name, 3}}});
    for (const Mesh& m : meshes) {
      Result<Graph> sized = g->mesh() == m ? Result<Graph>(*g) : remesh(*g, m);
      ASSERT_TRUE(sized.ok()) << e.path() << ": " << sized.error().str();
      const DeviceMesh mesh(sized->mesh());
      const ShardingPlan plan = propagate(*sized, mesh);
      for (DecomposeMode mode : {DecomposeMode::Auto, DecomposeMode::Always, DecomposeMode::Never}) {
        RankPipelineOptions po;
        po.verify_each = true;
        po.decompose.mode = mode;
        Result<std::vector<LocalProgram>> ps = rank_programs(*sized, plan, mesh, po);
        ASSERT_TRUE(succeeded(ps)) << e.path() << " on " << m.str();
        EXPECT_EQ(verify(*ps, mesh, "the end"), "") << e.path() << " on " << m.str();
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 7 * 3);
}

}  // namespace fusion_verify_programs_test
}  // namespace sf
