// The Plan executor on the host (runtime/plan/plan_exec.h's RankExec over
// runtime/plan/plan_host.h), as `run` uses it: a graph compiled to a host Plan in memory,
// every rank a thread over Gloo. It agrees with the reference evaluator on the
// examples, with generated kernels and on the reference evaluator; a failing or
// stalled rank ends every rank with an error instead of a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "codegen/dist/propagate.h"
#include "runtime/core/shard.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "runtime/plan/plan_exec.h"

namespace sf {
namespace kernels_plan_host_exec_test {

struct HostRun {
  Graph g;
  DeviceMesh mesh{Mesh{}};
  ShardingPlan sharding;
  CompiledPlan compiled;
  std::vector<Tensor> global;
  std::vector<std::vector<Tensor>> inputs;
};

HostRun make_run(const std::string& example_name, CompileOptions::HostCode host) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + example_name);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  HostRun s{std::move(g).value(), DeviceMesh(Mesh{}), {}, {}, {}, {}};
  s.mesh = DeviceMesh(s.g.mesh());
  s.sharding = propagate(s.g, s.mesh);
  CompileOptions co;
  co.arch = "host";
  co.ptx = false;
  co.host = host;
  Result<CompiledPlan> cp = compile_plan(s.g, co);
  if (!cp.ok()) throw std::runtime_error(cp.error().str());
  s.compiled = std::move(cp).value();
  s.global = random_inputs(s.g, 11);
  for (int r = 0; r < s.mesh.world(); ++r) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < s.g.params().size(); ++i)
      in.push_back(shard_tensor(s.global[i], s.sharding.nodes[static_cast<size_t>(s.g.params()[i])].output, s.mesh, r));
    s.inputs.push_back(in);
  }
  return s;
}

TEST(PlanHostExec, ExamplesAgreeWithTheReferenceGeneratedOrNot) {
  for (auto host : {CompileOptions::HostCode::Jit, CompileOptions::HostCode::Reference})
    for (const char* e : {"tp_mlp.sf", "seq_parallel_mlp.sf", "transformer_block.sf", "fsdp_tp_2d.sf"}) {
      const std::string what = std::string(e) + (host == CompileOptions::HostCode::Jit ? " (generated)" : " (reference)");
      HostRun s = make_run(e, host);
      // Generated code where the emitter built it, the evaluator elsewhere: here every kernel.
      for (const auto& [id, k] : s.compiled.host_kernels->by_id)
        EXPECT_EQ(k.generated, host == CompileOptions::HostCode::Jit) << what << " " << id;
      GpuRunStats stats;
      auto out = run_plan_on_host(s.compiled.plan, s.compiled.host_kernels, s.inputs, {}, &stats);
      ASSERT_TRUE(out.ok()) << what << ": " << out.error().str();
      EXPECT_EQ(stats.device, "host CPU");
      Result<std::vector<Tensor>> want = evaluate(s.g, s.global);
      ASSERT_TRUE(want.ok());
      for (size_t o = 0; o < s.g.outputs().size(); ++o) {
        std::vector<Tensor> locals;
        for (int r = 0; r < s.mesh.world(); ++r) locals.push_back((*out)[static_cast<size_t>(r)][o]);
        Result<Tensor> got =
            unshard_tensor(locals, s.g.node(s.g.outputs()[o].value).type, s.sharding.outputs[o], s.mesh);
        ASSERT_TRUE(got.ok()) << what;
        Comparison c = compare(*got, (*want)[o], check_tolerance(s.g, s.g.outputs()[o].value));
        EXPECT_TRUE(c.ok()) << what << ": max_abs_err " << c.max_abs_err;
      }
    }
}

TEST(PlanHostExec, AFailingRankStopsEveryRankWithItsError) {
  HostRun s = make_run("tp_attention.sf", CompileOptions::HostCode::Jit);
  GpuRunOptions opts;
  // 60 s against a bound of 30: aborted and timed-out runs stay far apart on a
  // loaded machine (tests/runtime/comm_test.cpp, kAtOnce).
  opts.timeout = std::chrono::seconds(60);
  opts.before_step = [](int rank, size_t step, const Comm*) -> Result<void> {
    if (rank == 1 && step == 3) throw std::runtime_error("injected failure");
    return {};
  };
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_plan_on_host(s.compiled.plan, s.compiled.host_kernels, s.inputs, opts);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("rank 1, step 3"), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("injected failure"), std::string::npos) << out.error().message;
  // The others were aborted, not left to the 60 s collective timeout.
  EXPECT_LT(secs, 30.0);
}

TEST(PlanHostExec, AStalledCollectiveTimesOutOnEveryRank) {
  HostRun s = make_run("tp_mlp.sf", CompileOptions::HostCode::Jit);
  GpuRunOptions opts;
  // The timeout also bounds connecting the 4 ranks, which must not run into it on a
  // loaded 2-core machine under ASan: only the all-reduce should.
  opts.timeout = std::chrono::seconds(3);
  // Rank 2 never reaches the all-reduce: it blocks before it until the run is aborted.
  const std::vector<PlanStep>& steps2 = s.compiled.plan.ranks[2].steps;
  opts.before_step = [&steps2](int rank, size_t step, const Comm* comm) -> Result<void> {
    if (rank == 2 && steps2[step].collective())
      while (!comm->aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return {};
  };
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_plan_on_host(s.compiled.plan, s.compiled.host_kernels, s.inputs, opts);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("timed out"), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("all_reduce"), std::string::npos) << out.error().message;
  EXPECT_LT(secs, 20.0);
}

}  // namespace kernels_plan_host_exec_test
}  // namespace sf
