// `shardfuse exec PLAN --device cpu`: a Plan directory runs on the host through the
// executor the GPU uses (runtime/plan/plan_exec.h's RankExec over runtime/plan/plan_host.h),
// its kernels from the host object `compile` writes beside the PTX. Every example
// checks against the reference; a broken or hostile host object is refused with
// its file named.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_exec_cpu_cli_test {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string compile_to(const TempDir& t, const std::string& graph, const std::string& name,
                       const std::string& extra = "") {
  std::string dir = t / name;
  CliResult r = shardfuse("compile " + graph + " --no-ptxas -o " + dir + " " + extra);
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

TEST(ExecCpu, EveryExamplePlanChecksOnTheHost) {
  TempDir t;
  for (const char* ex : {"tp_mlp.sf", "fsdp_mlp.sf", "fsdp_tp_2d.sf", "seq_parallel_mlp.sf", "tp_attention.sf",
                         "transformer_block.sf"}) {
    SCOPED_TRACE(ex);
    const std::string dir = compile_to(t, example(ex), ex);
    ASSERT_TRUE(fs::exists(dir + "/host_kernels.so"));
    CliResult r = shardfuse("exec " + dir + " --device cpu --check");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("on the host CPU"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("as host code (" + fs::absolute(dir + "/host_kernels.so").string() + ")"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  }
}

TEST(ExecCpu, UnevenShardsAndDecomposedCollectiveMatmuls) {
  TempDir t;
  // World 3 splits 16 rows 6/5/5; --decompose always turns the all_gather -> matmul
  // into ring steps (all_to_all of one chunk) and a concat, and matmul ->
  // reduce_scatter into ring steps of partial chunks, all run by the executor.
  for (const char* ex : {"transformer_block.sf", "seq_parallel_mlp.sf"})
    for (const char* world : {"3", "4"}) {
      SCOPED_TRACE(std::string(ex) + " world " + world);
      const std::string dir =
          compile_to(t, example(ex), std::string(ex) + world, std::string("--world ") + world + " --decompose always");
      const std::string json = read_text(dir + "/plan.json");
      // Ring steps are all_to_alls of one chunk (the undecomposed graphs have none).
      ASSERT_NE(json.find("\"op\": \"all_to_all\""), std::string::npos) << "no ring step in the Plan";
      CliResult r = shardfuse("exec " + dir + " --device cpu --check");
      EXPECT_EQ(r.code, 0) << r.out;
      EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
    }
}

TEST(ExecCpu, RanksAsProcessesMeetThroughADirectory) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p", "--world 2");
  fs::create_directory(t / "rv");
  std::string cmd;
  for (int r = 0; r < 2; ++r) {
    const std::string rs = std::to_string(r);
    cmd += "(" + std::string(SF_BINARY) + " exec " + dir + " --device cpu --check --rank " + rs + " --rendezvous " +
           (t / "rv") + " > " + (t / ("out" + rs)) + " 2>&1; echo $? > " + (t / ("rc" + rs)) + ") & ";
  }
  cmd += "wait";
  ASSERT_EQ(std::system(("sh -c '" + cmd + "'").c_str()), 0);
  for (int r = 0; r < 2; ++r) {
    const std::string rs = std::to_string(r);
    const std::string out = read_text(t / ("out" + rs));
    EXPECT_EQ(read_text(t / ("rc" + rs)), "0\n") << out;
    EXPECT_NE(out.find("rank " + rs + " of 2 as a process on the host CPU"), std::string::npos) << out;
    EXPECT_NE(out.find("rank " + rs + ": check: ok"), std::string::npos) << out;
  }
}

TEST(ExecCpu, TraceHasEveryKernelAndCollective) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  CliResult r = shardfuse("exec " + dir + " --device cpu --trace " + (t / "trace.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(read_text(t / "trace.json"));
  int kernels = 0, collectives = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "kernel") ++kernels;
    if (e.value("cat", "") == "collective") ++collectives;
  }
  // tp_mlp on 4 ranks: 2 kernels and one all_reduce each (plan.json's steps).
  const nlohmann::json plan = nlohmann::json::parse(read_text(dir + "/plan.json"));
  int want_kernels = 0, want_collectives = 0;
  for (const auto& rank : plan["ranks"])
    for (const auto& s : rank["steps"]) {
      want_kernels += s["op"] == "kernel";
      want_collectives += s["op"] == "wait";
    }
  EXPECT_EQ(kernels, want_kernels);
  EXPECT_EQ(collectives, want_collectives);
  EXPECT_GT(want_collectives, 0);
}

TEST(ExecCpu, GpuOnlyOptionsAreUsageErrors) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  CliResult r = shardfuse("exec " + dir + " --device cpu --cuda-graph");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--cuda-graph needs --device cuda"), std::string::npos) << r.out;
  r = shardfuse("exec " + dir + " --device cpu --collectives nccl");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--collectives nccl needs --device cuda"), std::string::npos) << r.out;
}

TEST(ExecCpu, ABrokenOrHostileHostObjectIsRefusedNamingIt) {
  TempDir t;
  const std::string good = compile_to(t, example("tp_mlp.sf"), "good");
  auto copy = [&](const std::string& name) {
    fs::copy(good, t / name, fs::copy_options::recursive);
    return t / name;
  };
  auto edit_json = [&](const std::string& dir, const std::string& from, const std::string& to) {
    std::string j = read_text(dir + "/plan.json");
    const std::string edited = std::regex_replace(j, std::regex(from), to);
    EXPECT_NE(edited, j) << "the edit " << from << " changed nothing";
    write_text(dir + "/plan.json", edited);
  };
  struct Case {
    std::string what, dir, want;
  };
  std::vector<Case> cases;
  {
    std::string d = copy("missing");
    fs::remove(d + "/host_kernels.so");
    cases.push_back({"missing", d, "host_kernels.so: error: missing: plan.json names it as the kernels' host code"});
  }
  {
    std::string d = copy("outside");
    edit_json(d, "\"host_object\": \"host_kernels.so\"", "\"host_object\": \"../good/host_kernels.so\"");
    cases.push_back({"outside the directory", d, "must be a file name inside the Plan directory"});
  }
  {
    std::string d = copy("none");
    edit_json(d, "\"host_object\": \"host_kernels.so\",", "");
    cases.push_back({"no host code", d, "the Plan has no host code"});
  }
  cases.push_back({"compiled with --no-host", compile_to(t, example("tp_mlp.sf"), "nohost", "--no-host"),
                   "compiled with --no-host"});
  {
    std::string d = copy("junk");
    write_text(d + "/host_kernels.so", "not an ELF file\n");
    cases.push_back({"not a shared object", d, "host_kernels.so: error: cannot load it:"});
  }
  {
    std::string d = copy("symbol");
    edit_json(d, "\"symbol\": \"sf_k0_", "\"symbol\": \"sf_nope_k0_");
    cases.push_back({"a symbol it lacks", d, "has no symbol sf_nope_k0_"});
  }
  {
    std::string d = copy("injected");
    edit_json(d, "\"symbol\": \"sf_k0_[a-z_]*\"", "\"symbol\": \"system\"");
    // dlsym on the object's handle also searches its dependencies (libc): a
    // plan.json naming `system` must not get libc's.
    cases.push_back({"a symbol from outside the object", d, "host symbol \"system\" is not a kernel's (sf_...)"});
  }
  {
    std::string d = copy("libm");
    edit_json(d, "\"symbol\": \"sf_k0_[a-z_]*\"", "\"symbol\": \"sf_expf\"");
    cases.push_back({"a symbol not defined by the object", d, "has no symbol sf_expf"});
  }
  {
    std::string d = copy("dir");
    fs::remove(d + "/host_kernels.so");
    fs::create_directory(d + "/host_kernels.so");
    cases.push_back({"a directory", d, "host_kernels.so: error: not a regular file"});
  }
  for (const Case& c : cases) {
    CliResult r = shardfuse("exec " + c.dir + " --device cpu --check");
    EXPECT_EQ(r.code, 1) << c.what << "\n" << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << c.what << ": want '" << c.want << "' in\n" << r.out;
    EXPECT_EQ(r.out.find("check: ok"), std::string::npos) << c.what << "\n" << r.out;
  }
}

TEST(ExecCpu, AnOlderPlanVersionAsksForARecompile) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  std::string j = read_text(dir + "/plan.json");
  write_text(dir + "/plan.json", std::regex_replace(j, std::regex("\"version\": *2"), "\"version\": 1"));
  CliResult r = shardfuse("exec " + dir + " --device cpu");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("plan version 1, this shardfuse reads version 2 (compile the graph again"), std::string::npos)
      << r.out;
}

}  // namespace tools_exec_cpu_cli_test
}  // namespace sf
