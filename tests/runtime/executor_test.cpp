// The threaded executor over Gloo: it agrees with the lockstep simulator, and a
// failing or stalled rank ends every rank with an error instead of a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "codegen/dist/lower.h"
#include "codegen/dist/schedule.h"
#include "codegen/dist/shard.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/evaluate.h"
#include "runtime/executor.h"
#include "runtime/simulate.h"

namespace sf {
namespace runtime_executor_test {

struct Ranks {
  Graph g;
  DeviceMesh mesh;
  std::vector<LocalProgram> programs;
  std::vector<std::vector<Tensor>> inputs;
};

Ranks make_ranks(const std::string& example_name) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + example_name);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  Ranks s{std::move(g).value(), DeviceMesh(Mesh{}), {}, {}};
  s.mesh = DeviceMesh(s.g.mesh());
  ShardingPlan plan = propagate(s.g, s.mesh);
  std::vector<Tensor> global = random_inputs(s.g, 11);
  for (int r = 0; r < s.mesh.world(); ++r) {
    s.programs.push_back(schedule(lower(s.g, plan, s.mesh, r)));
    std::vector<Tensor> in;
    for (size_t i = 0; i < s.g.params().size(); ++i)
      in.push_back(shard_tensor(global[i], plan.nodes[static_cast<size_t>(s.g.params()[i])].output, s.mesh, r));
    s.inputs.push_back(in);
  }
  return s;
}

TEST(Executor, ThreadsOverGlooAgreeWithTheLockstepSimulator) {
  for (const char* e : {"tp_mlp.sf", "seq_parallel_mlp.sf", "transformer_block.sf", "fsdp_tp_2d.sf"}) {
    Ranks s = make_ranks(e);
    auto threads = run_ranks_in_threads(s.programs, s.mesh, s.inputs);
    auto lockstep = simulate(s.programs, s.mesh, s.inputs);
    ASSERT_TRUE(threads.ok()) << e << ": " << threads.error().str();
    ASSERT_TRUE(lockstep.ok()) << e << ": " << lockstep.error().str();
    for (int r = 0; r < s.mesh.world(); ++r)
      for (size_t o = 0; o < s.g.outputs().size(); ++o) {
        const Tensor& a = (*threads)[static_cast<size_t>(r)][o];
        const Tensor& b = (*lockstep)[static_cast<size_t>(r)][o];
        ASSERT_EQ(a.type(), b.type()) << e;
        // Reductions may add in another order over Gloo; both round once from double.
        for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.get(i), b.get(i), 1e-5) << e << " rank " << r;
      }
  }
}

TEST(Executor, AFailingRankStopsEveryRankWithItsError) {
  Ranks s = make_ranks("tp_attention.sf");
  ExecOptions opts;
  // 60 s against a bound of 30: aborted and timed-out runs stay far apart on a
  // loaded machine (tests/runtime/comm_test.cpp, kAtOnce).
  opts.timeout = std::chrono::seconds(60);
  opts.before_step = [](int rank, size_t step, const std::atomic<bool>&) {
    if (rank == 1 && step == 3) throw std::runtime_error("injected failure");
  };
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_ranks_in_threads(s.programs, s.mesh, s.inputs, opts);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("rank 1, step 3"), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("injected failure"), std::string::npos) << out.error().message;
  // The others were aborted, not left to the 60 s collective timeout.
  EXPECT_LT(secs, 30.0);
}

TEST(Executor, AStalledCollectiveTimesOutOnEveryRank) {
  Ranks s = make_ranks("tp_mlp.sf");
  ExecOptions opts;
  // The timeout also bounds connecting the 4 ranks, which must not run into it on a
  // loaded 2-core machine under ASan: only the all-reduce should (1 s did not leave
  // that margin).
  opts.timeout = std::chrono::seconds(3);
  // Rank 2 never reaches the all-reduce: it blocks before its Start until the run is aborted.
  opts.before_step = [&s](int rank, size_t step, const std::atomic<bool>& aborted) {
    if (rank == 2 && s.programs[2].steps[step].kind == LocalStep::Kind::Start)
      while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_ranks_in_threads(s.programs, s.mesh, s.inputs, opts);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("timed out"), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("all_reduce"), std::string::npos) << out.error().message;
  EXPECT_LT(secs, 20.0);
}

}  // namespace runtime_executor_test
}  // namespace sf
