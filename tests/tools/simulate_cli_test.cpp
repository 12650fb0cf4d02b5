// `shardfuse simulate` end to end: the acceptance command, its trace, located errors
// for bad system files, --world against the system's size, and measured kernel
// times taken from the tuning cache.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "autotune/cache.h"
#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_simulate_cli_test {

using json = nlohmann::json;

std::string system_file(const std::string& name) { return std::string(SF_SOURCE_DIR) + "/examples/systems/" + name; }

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

double field_us(const std::string& out, const std::string& label) {
  std::smatch m;
  std::regex re(label + R"(:\s+(-?[0-9.]+) us)");
  if (!std::regex_search(out, m, re)) return -1;
  return std::stod(m[1]);
}

TEST(SimulateCli, AcceptanceCommandPrintsTheTimesAndWritesATrace) {
  TempDir d;
  CliResult r = shardfuse("simulate " + example("tp_mlp.sf") + " --world 8 --system " +
                          system_file("h100x8_nvlink.json") + " --trace " + (d / "t.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"serial time:", "overlapped time:", "T_compute:", "ECT serial:", "ECT overlapped:",
                           "E_overlap:", "collectives:"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  double serial = field_us(r.out, "serial time"), overlapped = field_us(r.out, "overlapped time");
  EXPECT_GT(serial, 0) << r.out;
  EXPECT_GT(overlapped, 0) << r.out;
  EXPECT_LE(overlapped, serial + 0.01) << r.out;
  // tp_mlp's one all_reduce feeds the last kernel directly: nothing can hide it.
  EXPECT_NE(r.out.find("E_overlap:        0.000"), std::string::npos) << r.out;

  json t = read_json(d / "t.json");
  std::set<int> pids;
  std::set<std::pair<int, std::string>> threads;
  int kernels = 0, collectives = 0;
  for (const json& e : t.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      threads.insert({e.at("pid").get<int>(), e.at("args").at("name").get<std::string>()});
    if (e.at("ph") != "X") continue;
    EXPECT_TRUE(e.at("args").contains("bytes") && e.at("args").contains("flops") && e.at("args").contains("step"))
        << e.dump();
    if (e.at("cat") == "collective") ++collectives;
    if (e.at("cat") == "kernel") ++kernels;
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (int p = 0; p < 8; ++p) {
    EXPECT_TRUE(threads.count({p, "compute"})) << p;
    EXPECT_TRUE(threads.count({p, "comm"})) << p;
  }
  EXPECT_EQ(collectives, 8);   // one all_reduce per rank
  EXPECT_EQ(kernels, 3 * 8);   // three fused kernels per rank
}

TEST(SimulateCli, TwoNodesUseTheInfinibandLink) {
  TempDir d;
  CliResult r = shardfuse("simulate " + example("seq_parallel_mlp.sf") + " --world 16 --system " +
                          system_file("h100_2x8_ib.json") + " --trace " + (d / "t.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  bool ib = false;
  const json trace = read_json(d / "t.json");  // named: a range-for over a temporary's member dangles
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("args").value("link", "") == "ib") ib = true;
  EXPECT_TRUE(ib);
  // On one node of the same system the collectives stay on NVLink and are faster.
  CliResult one = shardfuse("simulate " + example("seq_parallel_mlp.sf") + " --world 8 --system " +
                            system_file("h100_2x8_ib.json"));
  ASSERT_EQ(one.code, 0) << one.out;
}

TEST(SimulateCli, BadSystemFilesGiveLocatedErrors) {
  TempDir d;
  write_file(d / "broken.json", "{\n  \"format\": \"shardfuse-system\",\n  \"version\": 1\n  \"name\": \"x\"\n}\n");
  CliResult r = shardfuse("simulate " + example("tp_mlp.sf") + " --system " + (d / "broken.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(d / "broken.json" + ":4:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: not valid JSON"), std::string::npos) << r.out;

  // A field out of range: the file, its line, and the field's path.
  std::ifstream in(system_file("h100x8_nvlink.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const std::string from = "\"sm_fraction\": 0.15";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"sm_fraction\": 2");
  write_file(d / "range.json", text);
  r = shardfuse("simulate " + example("tp_mlp.sf") + " --system " + (d / "range.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(r.out.rfind(d / "range.json" + ":", 0), 0u) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(range\.json:\d+:\d+: error: links\.nvlink\.sm_fraction: expected a number in \[0, 1\))")))
      << r.out;

  r = shardfuse("simulate " + example("tp_mlp.sf") + " --system " + (d / "missing.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("missing.json: error: cannot read the system file"), std::string::npos) << r.out;
}

TEST(SimulateCli, WorldLargerThanTheSystemIsAnError) {
  CliResult r = shardfuse("simulate " + example("tp_mlp.sf") + " --world 9 --system " + system_file("h100x8_nvlink.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--world 9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("has 8 GPU(s)"), std::string::npos) << r.out;
  // The graph's own mesh counts too (fsdp_tp_2d is dp=2 tp=2: 4 ranks fit).
  r = shardfuse("simulate " + example("fsdp_tp_2d.sf") + " --system " + system_file("h100x8_nvlink.json"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// Measured GPU times replace the roofline: tune on the host, then relabel the
// cache's entries as measured on the system's GPU, at 123 us each.
TEST(SimulateCli, MeasuredKernelTimesComeFromTheTuningCache) {
  TempDir d;
  CliResult t = shardfuse("tune " + example("tp_mlp.sf") + " --world 8 --cache " + d.str() +
                          " --top-k 1 --warmup-ms 1 --rep-ms 1 --max-reps 2");
  ASSERT_EQ(t.code, 0) << t.out;
  Result<std::unique_ptr<TuneCache>> cache = TuneCache::open(d.str());
  ASSERT_TRUE(cache.ok());
  int relabelled = 0;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(fs::path(d.str()) / "v1")) dirs.push_back(e.path());
  for (const fs::path& dir : dirs) {
    json kj = read_json((dir / "key.json").string());
    TuneKey host;
    host.kind = kj.at("kind").get<std::string>();
    host.signature = kj.at("signature").get<std::string>();
    host.shapes = kj.at("shapes").get<std::string>();
    host.target = kj.at("target").get<std::string>();
    host.toolchain = kj.at("toolchain").get<std::string>();
    TuneKey gpu = host;
    gpu.target = "sm_90a:NVIDIA H100 80GB HBM3";
    gpu.toolchain = "llvm 19; ptxas test; driver 13000";
    for (auto& [cfg, entry] : (*cache)->load(host)) {
      if (entry.status != CacheEntry::Status::Measured) continue;
      CacheEntry e = entry;
      e.measurement.median_us = 123;
      ASSERT_TRUE((*cache)->store(gpu, e).ok());
      ++relabelled;
    }
  }
  ASSERT_GT(relabelled, 0);

  CliResult r = shardfuse("simulate " + example("tp_mlp.sf") + " --world 8 --system " +
                          system_file("h100x8_nvlink.json") + " --cache " + d.str() + " --trace " + (d / "t.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"((\d+) step\(s\) from the roofline .*, (\d+) measured)"))) << r.out;
  EXPECT_EQ(std::stoi(m[1]), 0) << r.out;
  EXPECT_EQ(std::stoi(m[2]), 3 * 8) << r.out;
  const json trace = read_json(d / "t.json");
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X" && e.at("cat") == "kernel") {
      EXPECT_DOUBLE_EQ(e.at("args").at("work_us").get<double>(), 123) << e.dump();
    }
  }

  // Without --cache pointing at it, the roofline again (an empty cache directory).
  TempDir empty;
  r = shardfuse("simulate " + example("tp_mlp.sf") + " --world 8 --system " + system_file("h100x8_nvlink.json") +
                " --cache " + empty.str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(", 0 measured"), std::string::npos) << r.out;
}

}  // namespace tools_simulate_cli_test
}  // namespace sf
