// Hostile files and options at the CLI (issue 14, classes 1, 7 and 8): nothing the
// user did not ask shardfuse to write is deleted or replaced; only regular files of
// bounded size are read (a FIFO, a device or a directory is refused at once); every
// error names its file and ends with the documented exit status (1 bad input,
// 2 usage); outputs are written all or none.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "runtime/io/npy.h"
#include "tests/result_util.h"
#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_hardening_files_test {

// A bound on commands that would block forever on the unfixed code (a FIFO opened
// for reading): they then fail with timeout's 124 instead of hanging the suite.
// The fixed code refuses at once, so no verdict depends on how long anything takes.
const std::string kBounded = "timeout 60 ";

const char* kSmallGraph =
    "graph g(x: f32[4, 2]) {\n"
    "  y = relu(x)\n"
    "  return y\n"
    "}\n";

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

void make_fifo(const std::string& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path; }

// --- 1. Data loss: compile -o never deletes or replaces what it did not write ----------

class HardeningCompileTarget : public ::testing::Test {
 protected:
  void SetUp() override { write_file(d / "g.sf", kSmallGraph); }
  CliResult compile_to(const std::string& out, const std::string& prefix = "") {
    return shardfuse_with_prefix(prefix, "compile " + (d / "g.sf") + " --no-ptxas -o " + out);
  }
  TempDir d;
};

TEST_F(HardeningCompileTarget, RefusesANonEmptyDirectoryThatIsNotAPlan) {
  fs::create_directory(d / "mine");
  write_file(d / "mine/notes.txt", "precious");
  CliResult r = compile_to(d / "mine");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "mine") + ": error: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "not a Plan directory")) << r.out;
  EXPECT_EQ(read_text(d / "mine/notes.txt"), "precious");
  EXPECT_FALSE(fs::exists(d / "mine/plan.json"));
}

TEST_F(HardeningCompileTarget, RefusesADirectoryNamedLikeAPlan) {
  // The name or a plan.json does not make a directory ours: only our marker does.
  fs::create_directory(d / "plan");
  write_file(d / "plan/plan.json", "{}");
  write_file(d / "plan/data.bin", "keep me");
  CliResult r = compile_to(d / "plan");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(read_text(d / "plan/data.bin"), "keep me");
}

TEST_F(HardeningCompileTarget, RefusesARegularFile) {
  write_file(d / "out", "a file of the user's");
  CliResult r = compile_to(d / "out");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "out") + ": error: ")) << r.out;
  ASSERT_TRUE(fs::is_regular_file(d / "out"));
  EXPECT_EQ(read_text(d / "out"), "a file of the user's");
}

TEST_F(HardeningCompileTarget, RefusesASymbolicLink) {
  fs::create_directory(d / "real");
  fs::create_directory_symlink(d / "real", d / "link");
  CliResult r = compile_to(d / "link");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(fs::is_symlink(d / "link"));
  EXPECT_TRUE(contains(r.out, "symbolic link")) << r.out;
}

TEST_F(HardeningCompileTarget, RefusesTheWorkingDirectoryHoweverNamed) {
  fs::create_directories(d / "work/sub");
  write_file(d / "work/keep.txt", "k");
  write_file(d / "work/sub/keep.txt", "s");
  const std::string in_work = "cd " + (d / "work") + " && ";
  const std::string in_sub = "cd " + (d / "work/sub") + " && ";
  for (const auto& [prefix, out] : std::vector<std::pair<std::string, std::string>>{
           {in_work, "."}, {in_work, "\"$PWD\""}, {in_work, (d / "work")}, {in_sub, ".."}, {in_work, "./"}}) {
    CliResult r = compile_to(out, prefix);
    EXPECT_EQ(r.code, 1) << out << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "error: ")) << out << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "Success")) << out << ": " << r.out;
  }
  EXPECT_EQ(read_text(d / "work/keep.txt"), "k");
  EXPECT_EQ(read_text(d / "work/sub/keep.txt"), "s");
  EXPECT_FALSE(fs::exists(d / "work/plan.json"));
}

TEST_F(HardeningCompileTarget, ReplacesItsOwnPlanButNotAFileAddedToIt) {
  CliResult first = compile_to(d / "p");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_TRUE(fs::is_regular_file(d / "p/.shardfuse-plan"));
  CliResult again = compile_to(d / "p");  // a Plan we wrote: replaced
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(fs::is_regular_file(d / "p/plan.json"));
  // The user saved something into the Plan directory: it is no longer ours alone.
  write_file(d / "p/results.csv", "1,2,3");
  CliResult third = compile_to(d / "p");
  EXPECT_EQ(third.code, 1) << third.out;
  EXPECT_TRUE(contains(third.out, "results.csv")) << third.out;
  EXPECT_EQ(read_text(d / "p/results.csv"), "1,2,3");
}

TEST_F(HardeningCompileTarget, WritesIntoAnEmptyDirectory) {
  fs::create_directory(d / "empty");
  CliResult r = compile_to(d / "empty");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_regular_file(d / "empty/plan.json"));
}

// --- 7. Non-regular files: refused at once with a clear message -------------------------

TEST(HardeningNonRegular, AFifoAsTheGraphIsRefused) {
  TempDir d;
  make_fifo(d / "g.sf");
  for (const char* cmd : {"check ", "explain ", "run "}) {
    CliResult r = shardfuse_with_prefix(kBounded, cmd + (d / "g.sf"));
    EXPECT_EQ(r.code, 1) << cmd << r.out;
    EXPECT_TRUE(contains(r.out, (d / "g.sf") + ": error: is a FIFO")) << cmd << r.out;
  }
}

TEST(HardeningNonRegular, ADirectoryOrDeviceAsTheGraphIsRefused) {
  TempDir d;
  CliResult dir = shardfuse("check " + d.str());
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_TRUE(contains(dir.out, d.str() + ": error: is a directory")) << dir.out;
  CliResult dev = shardfuse_with_prefix(kBounded, "check /dev/zero");
  EXPECT_EQ(dev.code, 1) << dev.out;
  EXPECT_TRUE(contains(dev.out, "/dev/zero: error: is a character device")) << dev.out;
}

TEST(HardeningNonRegular, AGraphFileOverTheCapIsRefusedUnread) {
  TempDir d;
  // Sparse: 3 GiB that take no disk space; refused by its size, not read.
  write_file(d / "big.sf", kSmallGraph);
  fs::resize_file(d / "big.sf", uint64_t{3} << 30);
  CliResult r = shardfuse("check " + (d / "big.sf"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "big.sf") + ": error: file is 3 GiB, over the 16 MiB limit")) << r.out;
}

TEST(HardeningNonRegular, AFifoAsAnInputIsRefused) {
  TempDir d;
  write_file(d / "g.sf", kSmallGraph);
  fs::create_directory(d / "in");
  make_fifo(d / "in/x.npy");
  CliResult r = shardfuse_with_prefix(kBounded, "run " + (d / "g.sf") + " --inputs " + (d / "in"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "in/x.npy") + ": error: is a FIFO")) << r.out;
}

TEST(HardeningNonRegular, AFifoAsTheSystemFileIsRefused) {
  TempDir d;
  write_file(d / "g.sf", kSmallGraph);
  make_fifo(d / "sys.json");
  CliResult r = shardfuse_with_prefix(kBounded, "simulate " + (d / "g.sf") + " --system " + (d / "sys.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "sys.json") + ": error: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "FIFO")) << r.out;
}

class HardeningPlanFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(d / "g.sf", kSmallGraph);
    CliResult r = shardfuse("compile " + (d / "g.sf") + " --no-ptxas -o " + (d / "p"));
    ASSERT_EQ(r.code, 0) << r.out;
    for (const auto& e : fs::directory_iterator(d / "p"))
      if (e.path().extension() == ".ptx") ptx = e.path().string();
    ASSERT_FALSE(ptx.empty());
  }
  CliResult exec() { return shardfuse_with_prefix(kBounded, "exec " + (d / "p") + " --device cuda"); }
  TempDir d;
  std::string ptx;
};

TEST_F(HardeningPlanFiles, AFifoAsPlanJsonIsRefused) {
  fs::remove(d / "p/plan.json");
  make_fifo(d / "p/plan.json");
  CliResult r = exec();
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "p/plan.json") + ": error: is a FIFO")) << r.out;
}

TEST_F(HardeningPlanFiles, AFifoAsAPtxFileIsRefused) {
  fs::remove(ptx);
  make_fifo(ptx);
  CliResult r = exec();
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, ptx + ": error: is a FIFO")) << r.out;
}

TEST_F(HardeningPlanFiles, APtxLinkedToDevZeroIsRefused) {
  fs::remove(ptx);
  fs::create_symlink("/dev/zero", ptx);
  CliResult r = exec();
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, ptx + ": error: is a character device")) << r.out;
}

TEST_F(HardeningPlanFiles, AHugeSparsePtxIsRefusedUnread) {
  fs::resize_file(ptx, uint64_t{3} << 30);
  CliResult r = exec();
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, ptx + ": error: file is 3 GiB, over the 256 MiB limit")) << r.out;
}

// --- 8. Messages and exit codes ----------------------------------------------------------

TEST(HardeningMessages, EvaluatorErrorsNameTheGraphFile) {
  TempDir d;
  // An integer to a negative integer power (torch raises); an embedding index out of
  // range is no longer an evaluator error (it reads zeros, docs/graph-format.md).
  write_file(d / "g.sf",
             "graph g(a: i32[2], b: i32[2]) {\n"
             "  e = pow(a, b)\n"
             "  return e\n"
             "}\n");
  fs::create_directory(d / "in");
  Tensor a(DType::I32, {2}), b(DType::I32, {2});
  a.set_int(0, 2);
  a.set_int(1, 3);
  b.set_int(0, 1);
  b.set_int(1, -1);
  ASSERT_TRUE(succeeded(write_npy(d / "in/a.npy", a)));
  ASSERT_TRUE(succeeded(write_npy(d / "in/b.npy", b)));
  for (const char* opts : {" --kernels reference", " --check"}) {
    CliResult r = shardfuse("run " + (d / "g.sf") + " --inputs " + (d / "in") + opts);
    EXPECT_EQ(r.code, 1) << opts << r.out;
    EXPECT_TRUE(contains(r.out, (d / "g.sf") + ":2:")) << opts << r.out;
    EXPECT_TRUE(contains(r.out, "negative integer powers")) << opts << r.out;
  }
}

TEST(HardeningMessages, ATraceThatCannotBeWrittenFailsTheRun) {
  TempDir d;
  write_file(d / "g.sf", kSmallGraph);
  CliResult r = shardfuse("run " + (d / "g.sf") + " --trace " + (d / "no/such/dir/t.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "cannot write the trace")) << r.out;
  // A directory in the trace's place is not replaced.
  fs::create_directory(d / "t.json");
  write_file(d / "t.json/keep", "k");
  CliResult dir = shardfuse("run " + (d / "g.sf") + " --trace " + (d / "t.json"));
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_EQ(read_text(d / "t.json/keep"), "k");
}

TEST(HardeningMessages, RankWithoutRendezvousIsAUsageError) {
  TempDir d;
  write_file(d / "g.sf", kSmallGraph);
  CliResult r = shardfuse("run " + (d / "g.sf") + " --rank 0");
  EXPECT_EQ(r.code, 2) << r.out;
  CliResult rv = shardfuse("run " + (d / "g.sf") + " --rendezvous " + (d / "rv"));
  EXPECT_EQ(rv.code, 2) << rv.out;
}

TEST(HardeningMessages, WorldZeroIsAUsageErrorEverywhereWithOneMessage) {
  for (const char* cmd : {"run ", "explain ", "compile "}) {
    std::string args = cmd + example("tp_mlp.sf") + " --world 0";
    if (std::string(cmd) == "compile ") args += " -o /nonexistent-sf-out";
    CliResult r = shardfuse(args);
    EXPECT_EQ(r.code, 2) << cmd << r.out;
    EXPECT_EQ(r.out.find("error"), r.out.rfind("error")) << cmd << "one error, not two: " << r.out;
  }
}

TEST(HardeningMessages, TimeoutMustBeAFiniteNumberInRange) {
  for (const char* t : {"nan", "NaN", "inf", "-1", "0", "1e9", "abc", "''"}) {
    CliResult r = shardfuse("run " + example("tp_mlp.sf") + " --timeout " + t);
    EXPECT_EQ(r.code, 2) << t << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "--timeout")) << t << ": " << r.out;
  }
}

TEST(HardeningMessages, SeedMustFitInAnUnsigned64BitInteger) {
  for (const char* s : {"-1", "18446744073709551616", "1e3", "''", "0x10"}) {
    CliResult r = shardfuse("run " + example("tp_mlp.sf") + " --seed " + s);
    EXPECT_EQ(r.code, 2) << s << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "--seed")) << s << ": " << r.out;
  }
  CliResult max = shardfuse("run " + example("tp_mlp.sf") + " --world 1 --kernels reference --seed 18446744073709551615");
  EXPECT_EQ(max.code, 0) << max.out;
  EXPECT_TRUE(contains(max.out, "seed 18446744073709551615")) << max.out;
}

TEST(HardeningMessages, EmptyPathOptionsAreUsageErrors) {
  TempDir d;
  write_file(d / "g.sf", kSmallGraph);
  for (const char* opt : {"--save-outputs", "--trace", "--cache"}) {
    CliResult r = shardfuse("run " + (d / "g.sf") + " " + opt + " ''");
    EXPECT_EQ(r.code, 2) << opt << ": " << r.out;
    EXPECT_TRUE(contains(r.out, opt)) << opt << ": " << r.out;
  }
  CliResult c = shardfuse("compile " + (d / "g.sf") + " -o ''");
  EXPECT_EQ(c.code, 2) << c.out;
}

TEST(HardeningMessages, NumbersThatUnderflowAreValidAndThoseThatOverflowAreNot) {
  TempDir d;
  write_file(d / "tiny.sf",
             "graph g(x: f32[2]) {\n"
             "  y = add(x, 1e-400)\n"
             "  z = mul(y, -2.5e-330)\n"
             "  return z\n"
             "}\n");
  CliResult tiny = shardfuse("check " + (d / "tiny.sf"));
  EXPECT_EQ(tiny.code, 0) << tiny.out;
  write_file(d / "huge.sf",
             "graph g(x: f32[2]) {\n"
             "  y = add(x, 1e400)\n"
             "  return y\n"
             "}\n");
  CliResult huge = shardfuse("check " + (d / "huge.sf"));
  EXPECT_EQ(huge.code, 1) << huge.out;
  EXPECT_TRUE(contains(huge.out, (d / "huge.sf") + ":2:")) << huge.out;
  EXPECT_TRUE(contains(huge.out, "1e400")) << huge.out;
}

TEST(HardeningMessages, OutputsLandAllOrNone) {
  TempDir d;
  write_file(d / "g.sf",
             "graph g(x: f32[2, 3]) {\n"
             "  y = relu(x)\n"
             "  s = sum(x, dims=[1])\n"
             "  return y, s\n"
             "}\n");
  fs::create_directories(d / "out/s.npy");  // s cannot be written: a directory holds its name
  write_file(d / "out/s.npy/keep", "k");
  CliResult r = shardfuse("run " + (d / "g.sf") + " --save-outputs " + (d / "out"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (d / "out/s.npy") + ": error: ")) << r.out;
  EXPECT_FALSE(fs::exists(d / "out/y.npy")) << "y.npy was saved without s.npy";
  EXPECT_EQ(read_text(d / "out/s.npy/keep"), "k");
  for (const auto& e : fs::directory_iterator(d / "out"))
    EXPECT_EQ(e.path().filename(), "s.npy") << "left behind: " << e.path();
}

}  // namespace tools_hardening_files_test
}  // namespace sf
