// The tuner split across two machines (autotune/tune_split.h) from the CLI, with the
// fake driver as the GPU machine's device: --emit-candidates here, --measure there,
// --import back here, then compile --cache picks the imported choice. Edited or
// hostile files are refused naming the field.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "autotune/tune_split.h"
#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_tune_split_cli_test {

const char* kGraph =
    "graph pw(x: f32[1024, 512], y: f32[1024, 512]) {\n"
    "  z = relu(add(mul(x, y), x))\n"
    "  return z\n}\n";

std::string fake() { return std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA; }

std::string read(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(TuneSplitCli, EmitMeasureImportThenCompileUsesIt) {
  TempDir t;
  write_file(t / "g.sf", kGraph);
  const std::string cands = t / "cands";
  // Here: no GPU (a driver that cannot load), the candidates of the top 3 and the default.
  CliResult e = shardfuse_env("SHARDFUSE_LIBCUDA=/nonexistent/libcuda.so.1",
                              "tune " + (t / "g.sf") + " --device cuda --arch sm_90a --top-k 3 --emit-candidates " + cands +
                                  " --cache " + (t / "cache"));
  ASSERT_EQ(e.code, 0) << e.out;
  const std::string manifest = read(cands + "/candidates.json");
  const int n = count(manifest, "\"config\":");
  EXPECT_GE(n, 3) << manifest;
  EXPECT_LE(n, 4) << manifest;
  EXPECT_TRUE(fs::exists(cands + "/k0_c0.ptx"));
  EXPECT_NE(read(cands + "/k0_c0.ptx").find(".entry"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "cache")) << "emitting tunes into a throwaway cache, not --cache";

  // There: every candidate timed on GPU 0.
  CliResult m = shardfuse_env(fake(), "tune --measure " + cands + " --warmup-ms 0.1 --rep-ms 1 --max-reps 5");
  ASSERT_EQ(m.code, 0) << m.out;
  const std::string measured = read(cands + "/measurements.json");
  EXPECT_NE(measured.find("\"device\": \"shardfuse fake GPU\""), std::string::npos) << measured;
  EXPECT_EQ(count(measured, "\"median_us\""), n) << measured;

  // Here again, without a GPU: the tuner replays the times into the cache.
  CliResult i = shardfuse_env("SHARDFUSE_LIBCUDA=/nonexistent/libcuda.so.1",
                              "tune " + (t / "g.sf") + " --device cuda --arch sm_90a --top-k 3 --import " + cands +
                                  " --cache " + (t / "cache"));
  ASSERT_EQ(i.code, 0) << i.out;
  EXPECT_NE(i.out.find("measured on shardfuse fake GPU, driver 13000"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("measured " + std::to_string(n)), std::string::npos) << i.out;
  // compile here (no GPU: the arch-only key) and on the measuring GPU (its key) both use it.
  for (const std::string& env : {std::string("SHARDFUSE_LIBCUDA=/nonexistent/libcuda.so.1"), fake()}) {
    const std::string out = t / ("plan" + std::to_string(env.size()));
    CliResult c = shardfuse_env(env, "compile " + (t / "g.sf") + " --no-ptxas --arch sm_90a --cache " + (t / "cache") +
                                         " -o " + out);
    ASSERT_EQ(c.code, 0) << c.out;
    EXPECT_NE(read(out + "/plan.json").find("\"config_source\": \"cache\""), std::string::npos) << env;
  }
  // Emitting again replaces the directory it wrote.
  CliResult again = shardfuse("tune " + (t / "g.sf") + " --device cuda --arch sm_90a --top-k 2 --emit-candidates " + cands);
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_FALSE(fs::exists(cands + "/measurements.json"));
}

TEST(TuneSplitCli, AFaultThatLeavesCudaUnusableStartsTheMeasuringProcessAgain) {
  TempDir t;
  write_file(t / "g.sf", kGraph);
  const std::string cands = t / "cands";
  ASSERT_EQ(shardfuse_env("SHARDFUSE_LIBCUDA=/nonexistent/libcuda.so.1",
                          "tune " + (t / "g.sf") + " --device cuda --arch sm_90a --top-k 3 --emit-candidates " + cands)
                .code,
            0);
  // The second candidate faults (the fake faults entries named so); its code hash
  // is made again so that the directory stays consistent.
  Result<TuneCandidateSet> s = read_tune_candidates(cands);
  ASSERT_TRUE(s) << s.error().message;
  ASSERT_GE(s->kernels.at(0).candidates.size(), 3u);
  TuneCandidate& bad = s->kernels[0].candidates[1];
  const std::string entry = bad.artifact.entry;
  for (size_t at = bad.artifact.ptx.find(entry); at != std::string::npos; at = bad.artifact.ptx.find(entry, at + 1))
    bad.artifact.ptx.replace(at, entry.size(), "sf_fault_c1");
  bad.artifact.entry = "sf_fault_c1";
  bad.code = tune_code_hash(bad.artifact);
  ASSERT_TRUE(write_tune_candidates(*s, cands).ok());
  const size_t n = s->kernels[0].candidates.size();

  // As on driver 580: the fault outlives the context reset, so the process starts
  // itself again and measures the candidates after the faulting one.
  CliResult m = shardfuse_env(fake() + " FAKE_CUDA_STICKY_FOR_PROCESS=1",
                              "tune --measure " + cands + " --warmup-ms 0.1 --rep-ms 1 --max-reps 5");
  ASSERT_EQ(m.code, 0) << m.out;
  EXPECT_EQ(count(m.out, "starting again for the " + std::to_string(n - 2) + " candidate(s) left"), 1) << m.out;
  EXPECT_NE(m.out.find("wrote " + cands + "/measurements.json: " + std::to_string(n - 1) + " measured, 1 failed"),
            std::string::npos)
      << m.out;
  Result<TuneMeasurements> r = read_tune_measurements(cands);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->results.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(r->results[i].code, s->kernels[0].candidates[i].code) << i;
    EXPECT_EQ(r->results[i].time.has_value(), i != 1) << i << ": " << r->results[i].error;
  }
  EXPECT_NE(r->results[1].error.find("CUDA cannot be used again in this process"), std::string::npos)
      << r->results[1].error;
}

TEST(TuneSplitCli, BadUseAndHostileFilesAreRefused) {
  TempDir t;
  write_file(t / "g.sf", kGraph);
  const std::string g = t / "g.sf";
  struct Bad {
    std::string args, says;
    int code;
  };
  fs::create_directories(t / "mine");
  write_file(t / "mine/notes.txt", "my file\n");
  for (const Bad& b : {Bad{"tune " + g + " --device cuda --emit-candidates " + (t / "c"), "needs --arch", 2},
                       Bad{"tune " + g + " --emit-candidates " + (t / "c") + " --arch sm_90a", "for --device cuda", 2},
                       Bad{"tune " + g + " --measure " + (t / "c"), "takes no graph", 2},
                       Bad{"tune", "needs a graph file", 2},
                       Bad{"tune " + g + " --device cuda --arch sm_90a --emit-candidates " + (t / "mine"),
                           "did not write: refusing to replace it", 1}}) {
    CliResult r = shardfuse(b.args);
    EXPECT_EQ(r.code, b.code) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find(b.says), std::string::npos) << b.args << "\n" << r.out;
  }
  EXPECT_EQ(read(t / "mine/notes.txt"), "my file\n");

  const std::string cands = t / "cands";
  ASSERT_EQ(shardfuse("tune " + g + " --device cuda --arch sm_90a --top-k 2 --emit-candidates " + cands).code, 0);
  const std::string good = read(cands + "/candidates.json");
  struct Edit {
    std::string from, to, says;
    bool all = false;  // every occurrence, else the first
  };
  for (const Edit& e : {Edit{"\"k0_c0.ptx\"", "\"../../etc/passwd\"", "kernels[0].candidates[0].ptx"},
                        Edit{"\"shared_bytes\": 0", "\"shared_bytes\": -5", "kernels[0].candidates[0].shared_bytes"},
                        Edit{"\"version\": 2", "\"version\": 7", "version"},
                        Edit{"\"version\": 2", "\"version\": 1", "emit the candidates again"},
                        Edit{"\"entry\": \"", "\"entry\": \"x", "does not match the PTX"}}) {
    std::string edited = std::regex_replace(good, std::regex(std::regex_replace(e.from, std::regex(R"([\[\]\.\"])"), R"(\$&)")),
                                            e.to, e.all ? std::regex_constants::format_default
                                                        : std::regex_constants::format_first_only);
    ASSERT_NE(edited, good) << e.from;
    write_file(cands + "/candidates.json", edited);
    CliResult r = shardfuse_env(fake(), "tune --measure " + cands);
    EXPECT_EQ(r.code, 1) << e.from << "\n" << r.out;
    EXPECT_NE(r.out.find(e.says), std::string::npos) << e.from << "\n" << r.out;
    EXPECT_FALSE(fs::exists(cands + "/measurements.json")) << e.from;
  }
  // The kernel's params and outputs, which the GPU machine allocates and fills.
  struct JsonEdit {
    std::function<void(nlohmann::json&)> edit;
    std::string says;
  };
  const nlohmann::json parsed = nlohmann::json::parse(good);
  for (const JsonEdit& e :
       {JsonEdit{[](nlohmann::json& k) { k["params"][0]["shape"] = {1024, 256}; },
                 "kernels[0].candidates[0].inputs: are not the group's params"},
        JsonEdit{[](nlohmann::json& k) { for (auto& p : k["params"]) p["shape"] = {1048576, 1048576}; },
                 "more than the 64 GiB"},
        JsonEdit{[](nlohmann::json& k) { k["params"][0]["shape"] = {int64_t{1} << 30, int64_t{1} << 30}; },
                 "kernels[0].params[0].shape: is too large"},
        JsonEdit{[](nlohmann::json& k) { k["params"][1]["dtype"] = "f99"; }, "kernels[0].params[1].dtype"},
        JsonEdit{[](nlohmann::json& k) { k["params"][0]["int_bound"] = 0; }, "kernels[0].params[0].int_bound"},
        JsonEdit{[](nlohmann::json& k) { k["outputs"][0]["shape"] = {7}; }, "are not the group's outputs"},
        JsonEdit{[](nlohmann::json& k) { k.erase("params"); }, "kernels[0]"}}) {
    nlohmann::json j = parsed;
    e.edit(j["kernels"][0]);
    write_file(cands + "/candidates.json", j.dump(1));
    CliResult r = shardfuse_env(fake(), "tune --measure " + cands);
    EXPECT_EQ(r.code, 1) << e.says << "\n" << r.out;
    EXPECT_NE(r.out.find(e.says), std::string::npos) << e.says << "\n" << r.out;
    EXPECT_FALSE(fs::exists(cands + "/measurements.json")) << e.says;
  }
  write_file(cands + "/candidates.json", good);
  ASSERT_EQ(shardfuse_env(fake(), "tune --measure " + cands + " --warmup-ms 0.1 --rep-ms 1 --max-reps 5").code, 0);
  const std::string measured = read(cands + "/measurements.json");
  write_file(cands + "/measurements.json", std::regex_replace(measured, std::regex("\"median_us\": [0-9.e+-]+"),
                                                             "\"median_us\": \"fast\"", std::regex_constants::format_first_only));
  CliResult r = shardfuse("tune " + g + " --device cuda --arch sm_90a --import " + cands + " --cache " + (t / "cache"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("results[0].time.median_us"), std::string::npos) << r.out;
  write_file(cands + "/measurements.json", measured);
  r = shardfuse("tune " + g + " --device cuda --arch sm_80 --import " + cands + " --cache " + (t / "cache"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("was measured on shardfuse fake GPU (sm_90a)"), std::string::npos) << r.out;
}

}  // namespace tools_tune_split_cli_test
}  // namespace sf
