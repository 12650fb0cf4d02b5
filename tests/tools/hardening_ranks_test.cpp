// Issue 14, classes 3 and 4: no exception escapes a command (explicit per-rank
// collectives are refused at the op; anything left is an internal error with exit
// status 3), and the processes of a multi-process run that were started with
// different graphs, options or inputs all fail, naming what differs, before
// anything runs or is saved.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_hardening_ranks_test {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- class 3: uncaught exceptions ---------------------------------------------------------

// Before: `check` said ok, and run/explain/compile/tune/simulate aborted with
// "terminate called ... sf::DiagError" (exit 134).
TEST(HardeningCollectives, AllReduceIsRefusedAtTheOpByEveryCommand) {
  TempDir t;
  const std::string g = t / "ar.sf";
  write_file(g, "mesh tp=1\ngraph g(x: f32[4, 3]) {\n  y = all_reduce(x, tp)\n  return y\n}\n");
  const std::string want = g + ":3:7: error: all_reduce: explicit per-rank collectives are not supported";
  const std::vector<std::string> commands = {
      "check " + g,
      "explain " + g,
      "run " + g,
      "run " + g + " --kernels reference --check",
      "compile " + g + " --no-ptxas -o " + (t / "plan"),
      "tune " + g + " --cache " + (t / "cache"),
      "simulate " + g + " --world 1 --system " + std::string(SF_SOURCE_DIR) + "/examples/systems/h100x8_nvlink.json",
  };
  for (const std::string& c : commands) {
    CliResult r = shardfuse(c);
    EXPECT_EQ(r.code, 1) << c << "\n" << r.out;
    EXPECT_TRUE(has(r.out, want)) << c << "\n" << r.out;
    EXPECT_FALSE(has(r.out, "terminate")) << c << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(t / "plan"));
}

TEST(HardeningCollectives, EveryExplicitCollectiveIsRefusedOnAnyMesh) {
  TempDir t;
  const std::vector<std::string> ops = {"all_gather(x, tp, dim=0)", "reduce_scatter(x, tp, dim=0, op=sum)",
                                        "all_reduce(x, tp, op=max)", "all_to_all(x, tp, split_dim=0, concat_dim=1)"};
  for (int tp : {1, 2}) {
    for (const std::string& op : ops) {
      const std::string g = t / "c.sf";
      write_file(g, "mesh tp=" + std::to_string(tp) + "\ngraph g(x: f32[4, 2]) {\n  y = " + op + "\n  return y\n}\n");
      for (const char* cmd : {"check ", "run "}) {
        CliResult r = shardfuse(cmd + g);
        const std::string name = op.substr(0, op.find('('));
        EXPECT_EQ(r.code, 1) << cmd << op << " tp=" << tp << "\n" << r.out;
        EXPECT_TRUE(has(r.out, g + ":3:7: error: " + name + ": explicit per-rank collectives are not supported"))
            << r.out;
      }
    }
  }
  // redistribute, the global-view collective, still runs.
  const std::string g = t / "r.sf";
  write_file(g, "mesh tp=2\ngraph g(x: f32[4, 2] {tp: S(0)}) {\n  y = redistribute(x, {tp: R})\n  return y\n}\n");
  CliResult r = shardfuse("run " + g + " --kernels reference --check");
  EXPECT_EQ(r.code, 0) << r.out;
}

// Whatever still throws inside a command is reported, with exit status 3, not
// abort()'s 134. No input reaches it any more, so the test throws on purpose.
TEST(HardeningCollectives, AnExceptionLeftIsAnInternalErrorWithExitStatus3) {
  for (const char* kind : {"diag", "std", "other"}) {
    CliResult r = shardfuse_env(std::string("SHARDFUSE_TEST_THROW=") + kind, "check " + example("tp_mlp.sf"));
    EXPECT_EQ(r.code, 3) << kind << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "error: internal error")) << r.out;
    EXPECT_FALSE(has(r.out, "): error: ")) << "one 'error:' per message\n" << r.out;
    EXPECT_FALSE(has(r.out, "terminate")) << r.out;
  }
}

// ---- class 4: ranks that disagree -----------------------------------------------------------

// Starts one process per command line, all at once, rank r running
// `CMDS[r] --rank r --rendezvous DIR`, and returns each one's exit status and output.
std::vector<CliResult> start_ranks(const TempDir& t, const std::string& tag, const std::vector<std::string>& cmds) {
  const std::string rv = t / ("rv-" + tag);
  fs::create_directory(rv);
  std::string cmd;
  for (size_t r = 0; r < cmds.size(); ++r) {
    const std::string rs = std::to_string(r), base = t / (tag + "-" + rs);
    cmd += "(" + cmds[r] + " --rank " + rs + " --rendezvous " + rv + " > " + base + ".out 2>&1; echo $? > " + base +
           ".rc) & ";
  }
  cmd += "wait";
  std::system(("sh -c '" + cmd + "'").c_str());
  std::vector<CliResult> out;
  for (size_t r = 0; r < cmds.size(); ++r) {
    const std::string base = t / (tag + "-" + std::to_string(r));
    CliResult c;
    std::ifstream(base + ".rc") >> c.code;
    c.out = read_text(base + ".out");
    out.push_back(c);
  }
  return out;
}

// `shardfuse ARGS[r]` as rank r.
std::vector<CliResult> run_ranks(const TempDir& t, const std::string& tag, const std::vector<std::string>& args) {
  std::vector<std::string> cmds;
  for (const std::string& a : args) cmds.push_back(std::string(SF_BINARY) + " " + a);
  return start_ranks(t, tag, cmds);
}

const char* kReplicated =
    "mesh tp=2\ngraph g(x: f32[4, 3] {tp: S(0)}) {\n  y = neg(x)\n  return y {tp: R}\n}\n";
const char* kSharded =
    "mesh tp=2\ngraph g(x: f32[4, 3] {tp: S(0)}) {\n  y = neg(x)\n  return y {tp: S(0)}\n}\n";

// Before: both exited 0 and rank 0 saved a y.npy of the wrong graph; with --check
// one rank reported a mismatch and the other exited 0.
TEST(HardeningRanks, ProcessesStartedWithDifferentGraphsAllFailAndSaveNothing) {
  TempDir t;
  write_file(t / "a.sf", kReplicated);
  write_file(t / "b.sf", kSharded);
  for (const char* check : {"", " --check"}) {
    const std::string tag = *check ? "check" : "plain";
    const std::string out = t / ("out-" + tag);
    std::vector<CliResult> r = run_ranks(
        t, tag,
        {"run " + (t / "a.sf") + " --kernels reference --save-outputs " + out + check,
         "run " + (t / "b.sf") + " --kernels reference --save-outputs " + out + check});
    for (size_t k = 0; k < r.size(); ++k) {
      EXPECT_EQ(r[k].code, 1) << tag << " rank " << k << "\n" << r[k].out;
      EXPECT_TRUE(has(r[k].out, "the ranks disagree on what to run")) << r[k].out;
      EXPECT_TRUE(has(r[k].out, "rank 1's graph digest")) << r[k].out;
      EXPECT_FALSE(has(r[k].out, "rank 1's options")) << r[k].out;  // only what differs is named
    }
    EXPECT_FALSE(fs::exists(out + "/y.npy")) << tag;
  }
}

TEST(HardeningRanks, ProcessesWithDifferentInputsOrOptionsAllFail) {
  TempDir t;
  write_file(t / "a.sf", kReplicated);
  const std::string run = "run " + (t / "a.sf") + " --kernels reference --check";
  {
    std::vector<CliResult> r = run_ranks(t, "seed", {run, run + " --seed 7"});
    for (const CliResult& c : r) {
      EXPECT_EQ(c.code, 1) << c.out;
      EXPECT_TRUE(has(c.out, "rank 1's inputs digest")) << c.out;
    }
  }
  {
    std::vector<CliResult> r = run_ranks(t, "opts", {run, run + " --no-reorder"});
    for (const CliResult& c : r) {
      EXPECT_EQ(c.code, 1) << c.out;
      EXPECT_TRUE(has(c.out, "rank 1's options 'device=cpu kernels=reference precision=fused fuse=yes flash_attention=yes reorder=no")) << c.out;
      EXPECT_TRUE(has(c.out, "differs from rank 0's 'device=cpu kernels=reference precision=fused fuse=yes flash_attention=yes reorder=yes")) << c.out;
    }
  }
  {  // ranks whose kernels would round f16/bf16 values differently
    std::vector<CliResult> r = run_ranks(t, "precision", {run, run + " --precision eager"});
    for (const CliResult& c : r) {
      EXPECT_EQ(c.code, 1) << c.out;
      EXPECT_TRUE(has(c.out, "rank 1's options 'device=cpu kernels=reference precision=eager")) << c.out;
    }
  }
}

// Ranks that agree still run; with --check every rank checks (before: only rank 0
// did, and the others said "done" whatever rank 0 found).
TEST(HardeningRanks, AgreeingProcessesRunAndEveryRankChecks) {
  TempDir t;
  write_file(t / "a.sf", kSharded);
  const std::string run = "run " + (t / "a.sf") + " --kernels reference --check --save-outputs " + (t / "out");
  std::vector<CliResult> r = run_ranks(t, "ok", {run, run});
  for (size_t k = 0; k < r.size(); ++k) {
    EXPECT_EQ(r[k].code, 0) << r[k].out;
    EXPECT_TRUE(has(r[k].out, "check: ok")) << "rank " << k << "\n" << r[k].out;
  }
  EXPECT_TRUE(fs::exists(t / "out/y.npy"));
}

// A rendezvous directory used by an earlier run: every process says so and what to
// do, instead of Gloo's "!ifs.is_open(). File already exists: DIR/5591..." (which
// escaped as a gloo::EnforceNotMet, not the gloo::Exception that was caught).
TEST(HardeningRanks, AReusedRendezvousDirectoryIsNamedAndRefused) {
  TempDir t;
  write_file(t / "a.sf", kSharded);
  const std::string run = "run " + (t / "a.sf") + " --kernels reference --timeout 10";
  std::vector<CliResult> first = run_ranks(t, "again", {run, run});
  for (const CliResult& c : first) ASSERT_EQ(c.code, 0) << c.out;
  std::vector<CliResult> second = run_ranks(t, "again", {run, run});  // the same rv-again directory
  for (size_t k = 0; k < second.size(); ++k) {
    EXPECT_EQ(second[k].code, 1) << second[k].out;
    EXPECT_TRUE(has(second[k].out, "rank " + std::to_string(k) + ": connecting group 0 (ranks 0 1) failed"))
        << second[k].out;
    EXPECT_TRUE(has(second[k].out, "already holds this rank's keys")) << second[k].out;
    EXPECT_TRUE(has(second[k].out, "give every run a fresh, empty directory")) << second[k].out;
    EXPECT_FALSE(has(second[k].out, "ifs.is_open")) << second[k].out;
  }
}

#ifdef SF_FAKE_CUDA
// `exec PLAN --rank` compares the same way (here on the stand-in libcuda).
TEST(HardeningRanks, ExecProcessesWithDifferentInputsOrPlansAllFail) {
  TempDir t;
  write_file(t / "a.sf", kReplicated);
  write_file(t / "b.sf", kSharded);
  for (const char* g : {"a", "b"}) {
    CliResult c = shardfuse("compile " + (t / (std::string(g) + ".sf")) + " --no-ptxas --arch sm_90a -o " +
                            (t / (std::string("plan-") + g)));
    ASSERT_EQ(c.code, 0) << c.out;
  }
  const std::string env = std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA + " FAKE_CUDA_LOG=" + (t / "log") +
                          " FAKE_CUDA_DEVICES=2 ";
  auto exec = [&](const std::string& plan, const std::string& extra) {
    return env + SF_BINARY + " exec " + (t / plan) + " --device cuda --collectives host" + extra;
  };
  auto ranks = [&](const std::string& tag, const std::vector<std::string>& cmds) { return start_ranks(t, tag, cmds); };
  for (const CliResult& c : ranks("seed", {exec("plan-a", ""), exec("plan-a", " --seed 7")})) {
    EXPECT_EQ(c.code, 1) << c.out;
    EXPECT_TRUE(has(c.out, "rank 1's inputs digest")) << c.out;
  }
  for (const CliResult& c : ranks("plan", {exec("plan-a", ""), exec("plan-b", "")})) {
    EXPECT_EQ(c.code, 1) << c.out;
    EXPECT_TRUE(has(c.out, "rank 1's graph digest")) << c.out;
  }
  for (const CliResult& c : ranks("same", {exec("plan-a", ""), exec("plan-a", "")})) EXPECT_EQ(c.code, 0) << c.out;
}
#endif

}  // namespace tools_hardening_ranks_test
}  // namespace sf
