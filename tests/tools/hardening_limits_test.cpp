// Sizes that overflow and unbounded work (issue 14, classes 2 and 6), end to end:
// values, meshes and worlds above the documented limits (docs/graph-format.md#limits,
// runtime/comm/comm.h's kMaxThreadRanks) are refused at once with a clear message and a
// non-zero exit, never summed as 0, written as an empty .npy, crashed on or waited
// for. Commands that could hang on the old code run under `timeout 60`, so a
// regression fails here (exit 124) instead of stalling the suite; no assertion
// depends on how long anything takes.
#include <gtest/gtest.h>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_hardening_limits_test {

// A command that must end at once; 60 s only bounds a regression.
CliResult bounded(const std::string& args) { return shardfuse_with_prefix("timeout 60 ", args); }

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The first case: check said ok; run summed nothing, printed 0 and "check: ok".
TEST(HardeningLimits, ExpandToAnOverflowingShapeIsALocatedErrorEverywhere) {
  TempDir d;
  write_file(d / "g.sf",
             "graph g(x: f32[1, 4]) {\n  y = expand(x, shape=[4611686018427387904, 4])\n  s = sum(y)\n  return s\n}\n");
  CliResult c = shardfuse("check " + (d / "g.sf"));
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_EQ(c.out.rfind(d / "g.sf:2:7: error: expand: result f32[4611686018427387904, 4]", 0), 0u) << c.out;
  for (const char* cmd : {"run", "explain"}) {
    CliResult r = bounded(std::string(cmd) + " " + (d / "g.sf") + (std::string(cmd) == "run" ? " --check" : ""));
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_TRUE(contains(r.out, d / "g.sf:2:7: error: expand: result")) << cmd << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "check: ok")) << r.out;
  }
}

// Returning such a value wrote a .npy header with no data, and exit 0.
TEST(HardeningLimits, NoOutputIsWrittenForAValueAboveTheLimit) {
  TempDir d;
  write_file(d / "g.sf", "graph g(x: f32[1, 4]) {\n  y = expand(x, shape=[4611686018427387904, 4])\n  return y\n}\n");
  CliResult r = bounded("run " + (d / "g.sf") + " --save-outputs " + (d / "out"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "g.sf:2:7: error: expand: result")) << r.out;
  EXPECT_FALSE(fs::exists(d / "out/y.npy"));
}

// Operands within the limits whose product is not: the matmul segfaulted.
TEST(HardeningLimits, MatmulOfExpandedOperandsIsRefusedNotCrashed) {
  TempDir d;
  write_file(d / "g.sf",
             "graph g(x: f32[1, 1], w: f32[1, 1]) {\n"
             "  a = expand(x, shape=[2097152, 1])\n"
             "  b = expand(w, shape=[1, 2097152])\n"
             "  y = matmul(a, b)\n"
             "  return y\n}\n");
  CliResult r = bounded("run " + (d / "g.sf"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, d / "g.sf:4:7: error: matmul: result f32[2097152, 2097152] has more than 2^40 elements"))
      << r.out;
}

// 2^32 * 2^32 wrapped to 0: check printed "(0 ranks)" and run aborted (exit 134).
TEST(HardeningLimits, MeshWhoseProductWrapsIsRefusedByCheckAndRun) {
  TempDir d;
  write_file(d / "g.sf", "mesh a=4294967296 b=4294967296\ngraph g(x: f32[4]) {\n  y = relu(x)\n  return y\n}\n");
  for (const char* cmd : {"check", "run"}) {
    CliResult r = bounded(std::string(cmd) + " " + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_TRUE(contains(r.out, d / "g.sf:1:1: error: mesh 'a=4294967296 b=4294967296' has more than 2^63 - 1 ranks"))
        << cmd << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "0 ranks")) << r.out;
  }
}

// explain's work grows as world^2 (tp=5000: 3.9 s; 20000: past 50 s): a mesh above
// the limit is refused by every command that reads the graph, before any lowering.
TEST(HardeningLimits, MeshAboveTheLimitIsRefusedAtOnce) {
  TempDir d;
  write_file(d / "g.sf", "mesh tp=20000\ngraph g(x: f32[40000] {tp: S(0)}) {\n  y = relu(x)\n  return y\n}\n");
  for (const char* cmd : {"check", "explain", "compile", "run"}) {
    std::string args = std::string(cmd) + " " + (d / "g.sf") + (std::string(cmd) == "compile" ? " -o " + (d / "p") : "");
    CliResult r = bounded(args);
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_TRUE(contains(r.out, d / "g.sf:1:1: error: mesh 'tp=20000' has 20000 ranks, above the limit of 1024"))
        << cmd << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(d / "p"));
}

// `run`/`compile --world 1000000` hung. --world above the mesh limit is a usage
// error (exit 2) for every command that takes it.
TEST(HardeningLimits, WorldAboveTheLimitIsAUsageError) {
  TempDir d;
  for (const std::string& args : {"run " + example("tp_mlp.sf") + " --world 1000000",
                                   "compile " + example("tp_mlp.sf") + " --world 1000000 -o " + (d / "p"),
                                   "explain " + example("tp_mlp.sf") + " --world 5000",
                                   "tune " + example("tp_mlp.sf") + " --world 1000000 --cache " + (d / "c"),
                                   "simulate " + example("tp_mlp.sf") + " --world 1000000 --system " +
                                       std::string(SF_SOURCE_DIR) + "/examples/systems/h100x8_nvlink.json"}) {
    CliResult r = bounded(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "--world: Value")) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "not in range 1 to 1024")) << args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(d / "p"));
}

// `run` on tp=1000 with --timeout 2 was still starting its 1000 rank threads (and
// a million sockets) at 60 s. Ranks as threads are limited; the refusal comes
// before inputs are read or anything is compiled.
TEST(HardeningLimits, RunRefusesMoreRankThreadsThanTheLimit) {
  TempDir d;
  write_file(d / "g.sf", "mesh tp=1000\ngraph g(x: f32[4000] {tp: S(0)}) {\n  y = relu(x)\n  return y {tp: R}\n}\n");
  CliResult r = bounded("run " + (d / "g.sf") + " --timeout 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, d / "g.sf: error: 1000 ranks as threads of one process is above the limit of 64")) << r.out;
  EXPECT_TRUE(contains(r.out, "--rank and --rendezvous")) << r.out;
  CliResult w = bounded("run " + example("tp_mlp.sf") + " --world 65 --kernels reference --timeout 2");
  EXPECT_EQ(w.code, 1) << w.out;
  EXPECT_TRUE(contains(w.out, "65 ranks as threads of one process is above the limit of 64")) << w.out;
}

// Out of file descriptors, the rank threads of the old code waited on each other
// past any --timeout (24 ranks under `ulimit -n 256` still ran at 60 s with the
// default 60 s timeout). Now the run says what it needs, at once.
TEST(HardeningLimits, RunSaysWhenTheRanksNeedMoreDescriptorsThanAllowed) {
  TempDir d;
  write_file(d / "g.sf", "mesh tp=24\ngraph g(x: f32[48] {tp: S(0)}) {\n  y = relu(x)\n  return y {tp: R}\n}\n");
  CliResult r = shardfuse_with_prefix("ulimit -n 256; timeout 60 ", "run " + (d / "g.sf") + " --timeout 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "24 rank(s) of mesh 'tp=24' need about")) << r.out;
  EXPECT_TRUE(contains(r.out, "file descriptors")) << r.out;
  EXPECT_TRUE(contains(r.out, "(ulimit -n)")) << r.out;
}

// One process of a 1000-rank run whose peers never start: Gloo made a listening pair
// per member before it waited for them, and destroying the 999 pairs of the context
// it gave up on took 10 ms each, so `--timeout 2` ended after 12.7 s with a message
// listing all 1000 ranks and blaming "not every member called Comm::create". Now
// the members announce themselves before any pair is made: the first missing one is
// named, and the group is shortened.
// (100 ranks here: lowering all 1000 ranks' programs takes about 17 s of a process's
// set-up in the ASan build, and --timeout counts set-up too.)
TEST(HardeningLimits, AProcessWhosePeersNeverStartNamesTheFirstMissingRank) {
  TempDir d;
  write_file(d / "g.sf", "mesh tp=100\ngraph g(x: f32[100] {tp: S(0)}) {\n  y = relu(x)\n  return y {tp: R}\n}\n");
  fs::create_directory(d / "rv");
  CliResult r = bounded("run " + (d / "g.sf") + " --timeout 5 --rank 0 --rendezvous " + (d / "rv"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 0: connecting group 0 (ranks 0 1 2 3 4 5 6 7 ... 96 97 98 99 (100 ranks))"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "timed out after 5 s: rank 1 never joined")) << r.out;
  EXPECT_LT(r.out.size(), 400u) << r.out;
}

}  // namespace tools_hardening_limits_test
}  // namespace sf
