// --dump-after=STAGE|all prints the stages the command itself runs (the pipeline's one
// list, codegen/fusion/pipeline.h), in order, as they run: options that shape the
// list (--no-reorder, --no-fuse, --decompose) shape what is printed.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_dump_after_cli_test {

// The "; ---- after NAME[ (unchanged)] ----" headers, in order.
std::vector<std::string> headers(const std::string& out) {
  std::vector<std::string> h;
  std::regex re("^; ---- after ([a-z-]+)( \\(unchanged\\))?");
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) h.push_back(m[1].str() + (m[2].matched ? " (unchanged)" : ""));
  }
  return h;
}

// The section after stage `name`, up to the next header.
std::string section(const std::string& out, const std::string& name) {
  size_t at = out.find("; ---- after " + name);
  if (at == std::string::npos) return "";
  size_t end = out.find("; ---- after ", at + 1);
  return out.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

TEST(DumpAfterCli, AllPrintsEveryStageTheCommandRunsInOrder) {
  CliResult r = shardfuse("explain " + example("tp_mlp.sf") + " --dump-after=all");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> want{"parse",     "propagate", "lower",    "decompose",
                                     "collective-matmul", "fuse", "schedule", "emit"};
  std::vector<std::string> got = headers(r.out);
  ASSERT_EQ(got.size(), want.size()) << r.out;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].substr(0, want[i].size()), want[i]) << r.out;
  // tp_mlp has no composite op and no collective matmul worth a ring at this size.
  EXPECT_EQ(got[3], "decompose (unchanged)");
  EXPECT_EQ(got[4], "collective-matmul (unchanged)");
  EXPECT_EQ(got[5], "fuse");
  EXPECT_NE(section(r.out, "fuse").find("kernels (rank 0): 3 for 7 ops"), std::string::npos) << r.out;
}

TEST(DumpAfterCli, OptionsShapeTheList) {
  // --no-reorder: no schedule stage is run, so none is printed.
  CliResult r = shardfuse("explain " + example("tp_mlp.sf") + " --dump-after=all --no-reorder");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string& h : headers(r.out)) EXPECT_NE(h.rfind("schedule", 0), 0u) << r.out;
  // compile --no-fuse: the fuse stage compile runs makes one kernel per op.
  TempDir t;
  CliResult c = shardfuse("compile " + example("tp_mlp.sf") + " --no-ptxas --no-fuse --dump-after=fuse -o " + (t / "p"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(section(c.out, "fuse").find("kernels (rank 0): 7 for 7 ops"), std::string::npos) << c.out;
  EXPECT_EQ(headers(c.out), std::vector<std::string>{"fuse"}) << c.out;
  // --decompose always: the collective-matmul stage rewrites the program into ring steps.
  CliResult d = shardfuse("explain " + example("seq_parallel_mlp.sf") + " --decompose always --dump-after=collective-matmul");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(headers(d.out), std::vector<std::string>{"collective-matmul"}) << d.out;
  EXPECT_NE(section(d.out, "collective-matmul").find("ring_shift"), std::string::npos) << d.out;
}

TEST(DumpAfterCli, AnUnknownStageIsRefusedWithTheList) {
  CliResult r = shardfuse("explain " + example("tp_mlp.sf") + " --dump-after=lower,bogus");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("unknown stage 'bogus'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parse, propagate, lower, decompose, collective-matmul, fuse, schedule, emit"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("; ---- after"), std::string::npos) << r.out;
}

}  // namespace tools_dump_after_cli_test
}  // namespace sf
