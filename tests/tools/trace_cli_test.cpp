// --trace on run (CPU ranks) and exec/run --device cuda (through the fake driver):
// the file is Chrome trace JSON with one process per rank, compute and comm threads,
// one event per kernel step and per collective.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_trace_cli_test {

using nlohmann::json;

struct Counts {
  std::map<int, int> kernels, collectives, waits;  // per rank
  std::map<int, std::string> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
};

Counts read_trace(const std::string& path) {
  std::ifstream in(path);
  json j = json::parse(in);  // throws (fails the test) if it is not JSON
  Counts c;
  for (const json& e : j.at("traceEvents")) {
    const int pid = e.at("pid");
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") c.process_names[pid] = e.at("args").at("name");
      if (e.at("name") == "thread_name") c.thread_names[{pid, e.at("tid")}] = e.at("args").at("name");
      continue;
    }
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    const std::string cat = e.at("cat");
    if (cat == "kernel") ++c.kernels[pid];
    if (cat == "collective") ++c.collectives[pid];
    if (cat == "wait") ++c.waits[pid];
  }
  return c;
}

void expect_ranks(const Counts& c, int world) {
  ASSERT_EQ(c.process_names.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(c.process_names.at(r), "rank " + std::to_string(r));
    std::set<std::string> threads;
    for (const auto& [key, name] : c.thread_names)
      if (key.first == r) threads.insert(name);
    EXPECT_EQ(threads, (std::set<std::string>{"compute", "comm"})) << "rank " << r;
  }
}

TEST(TraceCli, RunOnCpuRanksTracesEveryKernelAndCollective) {
  TempDir t;
  // tp_mlp on 4 ranks: 3 kernels and 1 all-reduce per rank (explain shows them).
  CliResult r = shardfuse("run " + example("tp_mlp.sf") + " --trace " + t / "t.json");
  ASSERT_EQ(r.code, 0) << r.out;
  Counts c = read_trace(t / "t.json");
  expect_ranks(c, 4);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(c.kernels[rank], 3) << rank;
    EXPECT_EQ(c.collectives[rank], 1) << rank;
    EXPECT_EQ(c.waits[rank], 1) << rank;
  }
  // A decomposed ring: 3 + 3 shifts per rank.
  r = shardfuse("run " + example("seq_parallel_mlp.sf") + " --decompose always --trace " + t / "d.json");
  ASSERT_EQ(r.code, 0) << r.out;
  c = read_trace(t / "d.json");
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(c.collectives[rank], 6) << rank;
  // Into a directory that does not exist: a clear error, not a crash.
  r = shardfuse("run " + example("tp_mlp.sf") + " --trace " + t / "no/such/dir/t.json");
  EXPECT_NE(r.out.find("error"), std::string::npos) << r.out;
}

#ifdef SF_FAKE_CUDA
TEST(TraceCli, ExecTracesKernelsWithCudaEventsAndGraphsAsOneEvent) {
  TempDir t;
  std::string dir = t / "p";
  ASSERT_EQ(shardfuse("compile " + example("tp_mlp.sf") + " --no-ptxas -o " + dir).code, 0);
  const std::string env = std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA;
  CliResult r = shardfuse_env(env, "exec " + dir + " --device cuda --trace " + t / "g.json");
  ASSERT_EQ(r.code, 0) << r.out;
  Counts c = read_trace(t / "g.json");
  expect_ranks(c, 4);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(c.kernels[rank], 3) << rank;
    EXPECT_EQ(c.collectives[rank], 1) << rank;
  }
  // The fake's clock moves 10 us per launch, any rank's (they share the device): a
  // kernel event spans its own launch and perhaps other ranks', so a whole multiple
  // of 10 us, at least one.
  std::ifstream in(t / "g.json");
  json j = json::parse(in);
  for (const json& e : j.at("traceEvents"))
    if (e.value("cat", "") == "kernel") {
      const double dur = e.at("dur").get<double>();
      EXPECT_GE(dur, 10.0 - 0.01) << e.dump();
      EXPECT_NEAR(dur / 10.0, std::round(dur / 10.0), 0.001) << e.dump();
    }
  // With --cuda-graph, one event per graph launch: tp_mlp's 3 kernels sit in 2
  // segments (before and after the all-reduce).
  r = shardfuse_env(env, "exec " + dir + " --device cuda --cuda-graph --trace " + t / "h.json");
  ASSERT_EQ(r.code, 0) << r.out;
  c = read_trace(t / "h.json");
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(c.kernels[rank], 2) << rank;
}
#endif

}  // namespace tools_trace_cli_test
}  // namespace sf
