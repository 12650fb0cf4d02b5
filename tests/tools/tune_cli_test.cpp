// `shardfuse tune` end to end, and the cache's use by run, explain and compile.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_tune_cli_test {

// Short measurements: these tests check what is measured and cached, not how fast.
const std::string kQuick = " --top-k 2 --warmup-ms 1 --rep-ms 2 --max-reps 5";

// "tuned K kernels: H cache hits, M measured" -> {K, H, M}; {-1,-1,-1} when absent.
std::array<int, 3> summary(const std::string& out) {
  std::smatch m;
  static const std::regex re(R"(tuned (\d+) kernels: (\d+) cache hits, (\d+) measured)");
  if (!std::regex_search(out, m, re)) return {-1, -1, -1};
  return {std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3])};
}

// kernel name -> the best config text tune printed for it.
std::map<std::string, std::string> best_configs(const std::string& out) {
  std::map<std::string, std::string> r;
  std::istringstream in(out);
  std::string line, kernel;
  static const std::regex k(R"(^kernel (\S+) \[)"), b(R"(^  best: (.*?)  [0-9.]+ us median)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, k)) kernel = m[1];
    else if (std::regex_search(line, m, b)) r[kernel] = m[1];
  }
  return r;
}

TEST(TuneCli, MeasuresThenTheSameCommandIsAllCacheHits) {
  TempDir d;
  CliResult first = shardfuse("tune " + example("tp_mlp.sf") + " --world 4 --cache " + d.str() + kQuick);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_EQ(summary(first.out), (std::array<int, 3>{3, 0, 3})) << first.out;
  EXPECT_NE(first.out.find("space "), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("speedup "), std::string::npos) << first.out;
  EXPECT_EQ(best_configs(first.out).size(), 3u) << first.out;
  // Not a terminal: plain progress lines, no carriage returns.
  EXPECT_NE(first.out.find("[kernel 1/3] "), std::string::npos) << first.out;
  EXPECT_EQ(first.out.find('\r'), std::string::npos) << first.out;

  CliResult second = shardfuse("tune " + example("tp_mlp.sf") + " --world 4 --cache " + d.str() + kQuick);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_EQ(summary(second.out), (std::array<int, 3>{3, 3, 0})) << second.out;
  EXPECT_EQ(second.out.find("built 1"), std::string::npos) << "nothing may be rebuilt:\n" << second.out;
  // Same choices as measured the first time.
  EXPECT_EQ(best_configs(second.out), best_configs(first.out)) << first.out << "\n---\n" << second.out;
}

TEST(TuneCli, EveryRankReportsTheSameChoices) {
  TempDir d;
  CliResult r = shardfuse("tune " + example("tp_mlp.sf") + " --world 4 --cache " + d.str() + kQuick);
  ASSERT_EQ(r.code, 0) << r.out;
  static const std::regex line(R"(rank (\d+): (\d+) kernel\(s\), config table ([0-9a-f]{16}), own configs ([0-9a-f]{16}))");
  std::set<int> ranks;
  std::set<std::string> tables, own;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line); it != std::sregex_iterator(); ++it) {
    ranks.insert(std::stoi((*it)[1]));
    tables.insert((*it)[3]);
    own.insert((*it)[4]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3})) << r.out;
  EXPECT_EQ(tables.size(), 1u) << r.out;
  EXPECT_EQ(own.size(), 1u) << "tp_mlp's shards are even: every rank runs the same kernels\n" << r.out;
}

TEST(TuneCli, RunAndExplainUseTheCachedChoice) {
  TempDir d;
  CliResult t = shardfuse("tune " + example("tp_mlp.sf") + " --cache " + d.str() + kQuick);
  ASSERT_EQ(t.code, 0) << t.out;
  std::map<std::string, std::string> best = best_configs(t.out);
  ASSERT_EQ(best.size(), 3u) << t.out;

  CliResult e = shardfuse("explain " + example("tp_mlp.sf") + " --cache " + d.str());
  ASSERT_EQ(e.code, 0) << e.out;
  for (const auto& [kernel, config] : best)
    EXPECT_NE(e.out.find("  " + kernel + ": " + config + "  [cache]"), std::string::npos) << kernel << "\n" << e.out;

  CliResult run = shardfuse("run " + example("tp_mlp.sf") + " --check --cache " + d.str());
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("configs: 0 tuned 3 cache 0 default"), std::string::npos) << run.out;

  // Another cache: nothing known, everything default.
  TempDir empty;
  CliResult e2 = shardfuse("explain " + example("tp_mlp.sf") + " --cache " + empty.str());
  EXPECT_EQ(e2.out.find("[cache]"), std::string::npos) << e2.out;
  EXPECT_NE(e2.out.find("[default]"), std::string::npos) << e2.out;
}

TEST(TuneCli, RunAutotuneTunesWhatIsMissingAndStillMatchesTheReference) {
  TempDir d;
  CliResult r = shardfuse("run " + example("tp_mlp.sf") + " --check --autotune --cache " + d.str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("configs: 3 tuned 0 cache 0 default"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  CliResult again = shardfuse("run " + example("tp_mlp.sf") + " --check --autotune --cache " + d.str());
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("3 cache hit(s), 0 measured"), std::string::npos) << again.out;
}

TEST(TuneCli, RanksAsProcessesAgreeOnRankZerosTable) {
  TempDir d, rv;
  std::string cmd;
  for (int r = 0; r < 4; ++r)
    cmd += std::string(SF_BINARY) + " run " + example("tp_mlp.sf") + " --autotune --check --timeout 60 --cache " +
           d.str() + " --rank " + std::to_string(r) + " --rendezvous " + rv.str() + " > " + (d / ("out" + std::to_string(r))) +
           " 2>&1 & ";
  cmd += "wait";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(d / "out0");
  std::string out0((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out0.find("check: ok"), std::string::npos) << out0;
  EXPECT_NE(out0.find("autotune: 3 kernel(s)"), std::string::npos) << out0;
  for (int r = 1; r < 4; ++r) {
    std::ifstream f(d / ("out" + std::to_string(r)));
    std::string o((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(o.find("rank " + std::to_string(r) + ": done"), std::string::npos) << o;
    EXPECT_EQ(o.find("autotune:"), std::string::npos) << "only rank 0 tunes:\n" << o;
  }
}

TEST(TuneCli, ACorruptEntryIsReportedOnceAndTunedAgain) {
  TempDir d;
  ASSERT_EQ(shardfuse("tune " + example("tp_mlp.sf") + " --cache " + d.str() + kQuick).code, 0);
  // Damage every entry of one key.
  std::string victim;
  for (const auto& key : fs::directory_iterator(fs::path(d.str()) / "v1")) {
    for (const auto& f : fs::directory_iterator(key.path()))
      if (f.path().extension() == ".json" && f.path().filename() != "key.json") {
        write_file(f.path().string(), "{ not json");
        if (victim.empty()) victim = f.path().string();
      }
    break;
  }
  ASSERT_FALSE(victim.empty());
  CliResult r = shardfuse("tune " + example("tp_mlp.sf") + " --cache " + d.str() + kQuick);
  ASSERT_EQ(r.code, 0) << r.out;
  size_t first = r.out.find(victim);
  ASSERT_NE(first, std::string::npos) << "the damaged file is named:\n" << r.out;
  EXPECT_EQ(r.out.find(victim, first + 1), std::string::npos) << "reported once:\n" << r.out;
  EXPECT_EQ(summary(r.out)[2], 1) << "the damaged key is measured again:\n" << r.out;
  CliResult again = shardfuse("tune " + example("tp_mlp.sf") + " --cache " + d.str() + kQuick);
  EXPECT_EQ(summary(again.out), (std::array<int, 3>{3, 3, 0})) << again.out;
  EXPECT_EQ(again.out.find("tuning cache:"), std::string::npos) << again.out;
}

TEST(TuneCli, TwoTunersAtOnceMeasureEachKernelOnce) {
  TempDir d;
  std::string tune = std::string(SF_BINARY) + " tune " + example("tp_mlp.sf") + " --cache " + d.str() + kQuick;
  std::string cmd = tune + " > " + (d / "a") + " 2>&1 & " + tune + " > " + (d / "b") + " 2>&1 & wait";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto read = [&](const std::string& f) {
    std::ifstream in(d / f);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  std::array<int, 3> a = summary(read("a")), b = summary(read("b"));
  ASSERT_EQ(a[0], 3) << read("a");
  ASSERT_EQ(b[0], 3) << read("b");
  EXPECT_EQ(a[2] + b[2], 3) << "each kernel is measured by one of them:\n" << read("a") << "\n---\n" << read("b");
  EXPECT_EQ(a[1] + b[1], 3) << read("a") << "\n---\n" << read("b");
}

TEST(TuneCli, BadArgumentsAreClearErrors) {
  TempDir d;
  write_file(d / "file", "x");
  CliResult r = shardfuse("tune " + example("tp_mlp.sf") + " --cache " + (d / "file"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(d / "file"), std::string::npos) << r.out;
  // Without a driver library: the reason, named.
  CliResult cuda = shardfuse("tune " + example("tp_mlp.sf") + " --device cuda --cache " + d.str());
  EXPECT_EQ(cuda.code, 1) << cuda.out;
  EXPECT_TRUE(cuda.out.find("no CUDA device: ") != std::string::npos || cuda.out.find("--device cuda") != std::string::npos)
      << cuda.out;
  // The driver library the loader opens can be named: a missing one is the reason given.
  setenv("SHARDFUSE_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  CliResult nolib = shardfuse("run " + example("tp_mlp.sf") + " --device cuda");
  unsetenv("SHARDFUSE_LIBCUDA");
  EXPECT_NE(nolib.out.find("error: no CUDA device: cannot load the CUDA driver library /nonexistent/libcuda.so.1"),
            std::string::npos)
      << nolib.out;
  EXPECT_EQ(nolib.code, 1) << nolib.out;
  CliResult k = shardfuse("tune " + example("tp_mlp.sf") + " --top-k 0 --cache " + d.str());
  EXPECT_EQ(k.code, 2) << k.out;
  CliResult missing = shardfuse("tune " + (d / "nope.sf") + " --cache " + d.str());
  EXPECT_EQ(missing.code, 1) << missing.out;
}

std::string relu_graph(int rows) {
  return "graph g(x: f32[" + std::to_string(rows) + ", 60]) {\n  y = relu(mul(x, 2.0))\n  return y\n}\n";
}

TEST(TuneCli, Pow2BucketsShareResultsAcrossNearbyShapes) {
  TempDir d;
  write_file(d / "a.sf", relu_graph(100));
  write_file(d / "b.sf", relu_graph(120));
  std::string cache = " --cache " + (d / "cache") + kQuick;
  CliResult a = shardfuse("tune " + (d / "a.sf") + " --shape-buckets pow2" + cache);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(summary(a.out), (std::array<int, 3>{1, 0, 1})) << a.out;
  // 120 x 60 rounds to 128 x 64 as 100 x 60 does: the same key.
  CliResult b = shardfuse("tune " + (d / "b.sf") + " --shape-buckets pow2" + cache);
  EXPECT_EQ(summary(b.out), (std::array<int, 3>{1, 1, 0})) << b.out;
  // Exact shapes: a new key.
  CliResult exact = shardfuse("tune " + (d / "b.sf") + cache);
  EXPECT_EQ(summary(exact.out), (std::array<int, 3>{1, 0, 1})) << exact.out;
}

TEST(TuneCli, ABudgetStopsMeasuringAndSaysSo) {
  TempDir d;
  write_file(d / "a.sf", relu_graph(64));
  CliResult r = shardfuse("tune " + (d / "a.sf") + " --cache " + d.str() + " --tune-budget 0.000001 --top-k 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tuning budget of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("measured 0 "), std::string::npos) << r.out;
}

}  // namespace tools_tune_cli_test
}  // namespace sf
