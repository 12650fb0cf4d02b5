// Issue 14, class 5: a Plan directory edited by hand (or by an attacker) is refused
// by `exec` with the offending field's JSON path or the graph.sf mismatch named,
// exit 1, before any device is opened; with the fake driver none of them runs.
// And --verify-each on the commands that run the pipeline.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_hardening_plan_test {

using nlohmann::json;

// One compiled Plan per graph and world, copied and edited per case.
class HardeningPlan : public ::testing::Test {
 protected:
  std::string compiled(const std::string& example_name, int world) {
    const std::string dir = t_ / (example_name + std::to_string(world));
    if (!fs::exists(dir)) {
      CliResult r = shardfuse("compile " + example(example_name) + " --world " + std::to_string(world) +
                              " --no-ptxas -o " + dir);
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return dir;
  }
  // A copy of the Plan with plan.json edited by `edit`.
  std::string edited(const std::string& from, const std::string& name, const std::function<void(json&)>& edit) {
    const std::string dir = t_ / name;
    fs::copy(from, dir, fs::copy_options::recursive);
    json j = json::parse(read_text(dir + "/plan.json"));
    edit(j);
    write_file(dir + "/plan.json", j.dump(1));
    return dir;
  }
  // A copy of the Plan with graph.sf's text edited (a regex replacement).
  std::string regraphed(const std::string& from, const std::string& name, const std::string& re, const std::string& by) {
    const std::string dir = t_ / name;
    fs::copy(from, dir, fs::copy_options::recursive);
    const std::string text = read_text(dir + "/graph.sf");
    const std::string changed = std::regex_replace(text, std::regex(re), by);
    EXPECT_NE(changed, text) << re;
    write_file(dir + "/graph.sf", changed);
    return dir;
  }
  // `exec` refuses `dir` with exit 1 and `want` in its message, without a GPU and
  // (where the fake driver is built) with one, before anything opens the device.
  void refused(const std::string& what, const std::string& dir, const std::string& want) {
    std::vector<std::string> envs{""};
#ifdef SF_FAKE_CUDA
    envs.push_back(std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA + " FAKE_CUDA_LOG=" + (t_ / "fake.log"));
#endif
    for (const std::string& env : envs) {
      CliResult r = env.empty() ? shardfuse("exec " + dir + " --device cuda")
                                : shardfuse_env(env, "exec " + dir + " --device cuda");
      EXPECT_EQ(r.code, 1) << what << (env.empty() ? "" : " (fake driver)") << ":\n" << r.out;
      EXPECT_NE(r.out.find(want), std::string::npos) << what << ": want '" << want << "' in:\n" << r.out;
      EXPECT_EQ(r.out.find("no CUDA device"), std::string::npos) << what << ": the Plan is checked first\n" << r.out;
      EXPECT_EQ(r.out.find("graph mlp:"), std::string::npos) << what << ": it ran\n" << r.out;
    }
  }
  // The index of the first step of rank `r` whose op is `op`.
  static size_t first(const json& j, int r, const std::string& op) {
    const json& steps = j["ranks"][static_cast<size_t>(r)]["steps"];
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i]["op"] == op) return i;
    ADD_FAILURE() << "no " << op << " step on rank " << r;
    return 0;
  }

  TempDir t_;
};

TEST_F(HardeningPlan, TheUneditedPlanPassesValidation) {
  // The fake driver runs it to the end: what the cases below refuse is their edit.
#ifdef SF_FAKE_CUDA
  const std::string dir = compiled("tp_mlp.sf", 2);
  CliResult r = shardfuse_env(std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA + " FAKE_CUDA_LOG=" + (t_ / "log"),
                              "exec " + dir + " --device cuda");
  EXPECT_EQ(r.code, 0) << r.out;
#else
  GTEST_SKIP() << "the fake driver is not built";
#endif
}

TEST_F(HardeningPlan, AGraphWhoseOpsShapesOrPlacementsDifferFromThePlanIsRefused) {
  const std::string good = compiled("tp_mlp.sf", 2);
  refused("another op", regraphed(good, "op", "relu", "gelu"), "graph.sf: error: its ops are not the ones plan.json");
  refused("another shape", regraphed(good, "shape", "x: f32\\[20, 10\\]", "x: f32[21, 10]"),
          "graph.sf: error: param x is f32[21, 10] placed {tp: R}, so rank 0 holds f32[21, 10], but");
  refused("another placement", regraphed(good, "placement", "b2: f32\\[10\\]", "b2: f32[10] {tp: S(0)}"),
          "graph.sf: error: param b2 is placed {tp: S(0)}, but");
  refused("another output placement", regraphed(good, "out", "return y \\{tp: R\\}", "return y {tp: S(0)}"),
          "graph.sf: error: output y is placed {tp: S(0)}");
  // An edited digest does not make an edited graph pass: shapes are re-derived.
  const std::string shape = regraphed(good, "shape2", "x: f32\\[20, 10\\]", "x: f32[22, 10]");
  json j = json::parse(read_text(shape + "/plan.json"));
  j["graph_digest"] = "0000000000000000";
  write_file(shape + "/plan.json", j.dump(1));
  refused("another shape and digest", shape, "param x is f32[22, 10]");
  refused("no digest", edited(good, "nodigest", [](json& p) { p.erase("graph_digest"); }),
          "plan.json: error: graph_digest: missing");
}

TEST_F(HardeningPlan, DuplicateRankOrKernelIdsAreRefused) {
  const std::string good = compiled("tp_mlp.sf", 2);
  refused("a duplicate rank", edited(good, "rank", [](json& p) { p["ranks"][1]["rank"] = 0; }),
          "plan.json: error: ranks[1].rank: rank 0 appears twice (also ranks[0])");
  refused("a duplicate kernel id", edited(good, "kernel", [](json& p) {
            ASSERT_GE(p["kernels"].size(), 2u);
            p["kernels"][1]["id"] = p["kernels"][0]["id"];
          }),
          "plan.json: error: kernels[1].id: \"");
  refused("ranks out of order", edited(good, "order", [](json& p) { std::swap(p["ranks"][0], p["ranks"][1]); }),
          "ranks[0].rank: is 1, but the ranks are listed in order");
}

TEST_F(HardeningPlan, TheWorldMustBeAnIntegerInRangeThatTheMeshAndRanksAgreeWith) {
  const std::string good = compiled("tp_mlp.sf", 2);
  refused("world 0", edited(good, "w0", [](json& p) { p["world"] = 0; }),
          "plan.json: error: world: 0 is out of range [1, 65536]");
  refused("world 1e30", edited(good, "w1e30", [](json& p) { p["world"] = 1e30; }),
          "plan.json: error: world: 1e+30 is not an integer");
  refused("world 2^64-1", edited(good, "wbig", [](json& p) { p["world"] = UINT64_MAX; }),
          "world: 18446744073709551615 is out of range");
  refused("world 4 on tp=2", edited(good, "w4", [](json& p) { p["world"] = 4; }),
          "mesh: \"tp=2\" is not a mesh of the world's 4 rank(s)");
  refused("one rank listed for two", edited(good, "r1", [](json& p) { p["ranks"].erase(1); }),
          "ranks: 1 rank(s) for a world of 2");
  refused("a mesh that wraps", edited(good, "mwrap", [](json& p) { p["mesh"] = "a=65536 b=65536 c=65536 d=65536"; }),
          "is not a mesh of the world's 2 rank(s)");
}

TEST_F(HardeningPlan, BuffersInputsAndOutputsAreChecked) {
  const std::string good = compiled("tp_mlp.sf", 2);
  refused("a negative dim", edited(good, "neg", [](json& p) { p["ranks"][0]["buffers"][0]["shape"][0] = -4; }),
          "plan.json: error: ranks[0].buffers[0].shape[0]: -4 is out of range");
  refused("a fractional dim", edited(good, "frac", [](json& p) { p["ranks"][0]["buffers"][0]["shape"][0] = 2.5; }),
          "ranks[0].buffers[0].shape[0]: 2.5 is not an integer");
  refused("an element count that overflows", edited(good, "numel", [](json& p) {
            p["ranks"][0]["buffers"][0]["shape"] = json::array({int64_t{1} << 40, int64_t{1} << 40, 16});
          }),
          "ranks[0].buffers[0].shape: f32[1099511627776, 1099511627776, 16] has more than 2^40 elements");
  refused("an empty input list", edited(good, "noin", [](json& p) { p["ranks"][1]["inputs"] = json::array(); }),
          "plan.json: error: ranks[1].inputs: 0 entries for the graph's 5 param(s)");
  refused("an input buffer out of range", edited(good, "inrange", [](json& p) { p["ranks"][0]["inputs"][0] = 999; }),
          "ranks[0].inputs[0]: buffer 999 does not exist");
  refused("an output never written", edited(good, "unwritten", [](json& p) {
            json& r = p["ranks"][0];
            r["buffers"].push_back({{"name", "spare"}, {"dtype", "f32"}, {"shape", {20, 10}}});
            r["outputs"][0] = r["buffers"].size() - 1;
          }),
          "ranks[0].outputs[0]: buffer");
  refused("a step reading an undefined buffer", edited(good, "undef", [](json& p) {
            json& r = p["ranks"][1];
            r["buffers"].push_back({{"name", "spare"}, {"dtype", "f32"}, {"shape", {20, 10}}});
            const size_t k = first(p, 1, "kernel");
            r["steps"][k]["in"][0] = r["buffers"].size() - 1;
          }),
          "before any step writes it");
}

TEST_F(HardeningPlan, StepsStreamsHandlesAndKernelsAreChecked) {
  const std::string good = compiled("tp_mlp.sf", 2);
  refused("an unknown stream", edited(good, "stream", [](json& p) { p["ranks"][0]["steps"][0]["stream"] = "gpu7"; }),
          "ranks[0].steps[0].stream: \"gpu7\"");
  refused("an unknown kernel", edited(good, "kid", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "kernel")]["kernel"] = "k999";
          }),
          "unknown kernel \"k999\"");
  refused("a wait without a start", edited(good, "wait", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "wait")]["handle"] = 77;
          }),
          "waits for handle 77, which no earlier step started");
  refused("a kernel launched on other shapes on one rank", edited(good, "ksig", [](json& p) {
            json& r = p["ranks"][1];
            const size_t k = first(p, 1, "kernel");
            const int b = r["steps"][k]["out"][0];
            r["buffers"][static_cast<size_t>(b)]["shape"][0] = 3;
          }),
          "(a kernel is compiled for one set of shapes)");
  refused("a kernel passed more buffers than its entry takes", edited(good, "arity", [](json& p) {
            for (int r = 0; r < 2; ++r) {
              json& s = p["ranks"][static_cast<size_t>(r)]["steps"][first(p, r, "kernel")];
              s["in"].push_back(s["in"][0]);
            }
          }),
          "'s entry takes ");
  refused("a block of 2048 threads", edited(good, "block", [](json& p) { p["kernels"][0]["block"] = {2048, 1, 1}; }),
          "kernels[0].block: beyond CUDA's block limits");
}

TEST_F(HardeningPlan, CollectivesMustNameTheirGroupAndCutTheirBuffersAlikeOnEveryMember) {
  const std::string tp = compiled("tp_mlp.sf", 2);
  refused("a group naming a rank outside the world", edited(tp, "group", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "all_reduce")]["group"][1] = 7;
          }),
          "ranks[0].steps[" );
  refused("a group naming a rank outside the world (message)", edited(tp, "group2", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "all_reduce")]["group"][1] = 7;
          }),
          ".group[1]: rank 7 is outside the world of 2");
  refused("another rank's group", edited(tp, "group3", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "all_reduce")]["group"] = {1, 0};
          }),
          ".group: is not rank 0's group along tp ([0, 1])");
  refused("an unknown mesh dim", edited(tp, "md", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "all_reduce")]["mesh_dim"] = "dp";
          }),
          ".mesh_dim: \"dp\" is not a dim of the mesh \"tp=2\"");
  refused("another reduction on one member", edited(tp, "rop", [](json& p) {
            p["ranks"][1]["steps"][first(p, 1, "all_reduce")]["reduce_op"] = "max";
          }),
          "all_reduce reducing by sum meets one by max");
  refused("a collective missing on one member", edited(tp, "missing", [](json& p) {
            // Rank 1 waits on nothing and reads its operand instead of the sum.
            json& r = p["ranks"][1];
            const size_t s = first(p, 1, "all_reduce"), w = first(p, 1, "wait");
            const json in = r["steps"][s]["in"][0], sum = r["steps"][w]["out"][0];
            r["steps"].erase(w);
            r["steps"].erase(s);
            for (json& st : r["steps"])
              if (st.contains("in"))
                for (json& b : st["in"])
                  if (b == sum) b = in;
            for (json& b : r["outputs"])
              if (b == sum) b = in;
          }),
          "has no partner on rank 1");
  // seq_parallel_mlp all-gathers and reduce-scatters along dim 0 with sizes.
  const std::string sp = compiled("seq_parallel_mlp.sf", 2);
  refused("sizes that do not cut the operand", edited(sp, "sizes", [](json& p) {
            json& s = p["ranks"][0]["steps"][first(p, 0, "all_gather")];
            s["sizes"][0] = s["sizes"][0].get<int64_t>() + 1;
          }),
          "sizes[0] = ");
  refused("negative sizes", edited(sp, "negsizes", [](json& p) {
            json& s = p["ranks"][1]["steps"][first(p, 1, "reduce_scatter")];
            s["sizes"][0] = s["sizes"][0].get<int64_t>() + s["sizes"][1].get<int64_t>() + 1;
            s["sizes"][1] = -1;
          }),
          "sizes has the entry -1");
  refused("a dim out of range", edited(sp, "dim", [](json& p) {
            p["ranks"][0]["steps"][first(p, 0, "all_gather")]["dim"] = 5;
          }),
          "all_gather along dim 5 of");
  refused("a wait into a buffer of another shape", edited(sp, "waitshape", [](json& p) {
            json& r = p["ranks"][0];
            const int b = r["steps"][first(p, 0, "wait")]["out"][0];
            r["buffers"][static_cast<size_t>(b)]["shape"][0] = 1;
          }),
          "but the all_gather started at step");
}

TEST_F(HardeningPlan, VerifyEachIsAFlagOfEveryCommandThatRunsThePipeline) {
  TempDir t;
  for (const std::string& cmd :
       {"explain " + example("seq_parallel_mlp.sf") + " --verify-each",
        "run " + example("tp_mlp.sf") + " --verify-each --check",
        "compile " + example("tp_mlp.sf") + " --no-ptxas --verify-each -o " + (t / "p"),
        "tune " + example("tp_mlp.sf") + " --verify-each --cache " + (t / "c") + " --top-k 1 --warmup-ms 1 --rep-ms 1 --max-reps 1",
        "simulate " + example("tp_mlp.sf") + " --verify-each --world 4 --system " +
            std::string(SF_SOURCE_DIR) + "/examples/systems/h100x8_nvlink.json"}) {
    CliResult r = shardfuse(cmd);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  }
}

}  // namespace tools_hardening_plan_test
}  // namespace sf
