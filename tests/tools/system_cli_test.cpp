// --system FILE on explain, compile, run and tune: the system's links choose the
// shardings (one performance model: autotune/perf_model.h), the Plan records the
// placements chosen, and exec shards and gathers by the Plan's, not by propagating
// again with default links.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/tools/cli_util.h"

namespace sf {
namespace tools_system_cli_test {

const std::string kDir = std::string(SF_SOURCE_DIR) + "/tests/tools/system/";
const std::string kGraph = kDir + "k_sharded_matmul.sf";
const std::string kSystem = kDir + "two_gpu_nodes.json";

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(SystemCli, TheLinksChooseWhichMeshDimCarriesTheCollective) {
  // Default links (one 8-GPU node): both dims are NVLink; a's rows are gathered over dp.
  CliResult d = shardfuse("explain " + kGraph);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_TRUE(has(d.out, "all_gather a -> a_ag [dp, dim 1]")) << d.out;
  EXPECT_TRUE(has(d.out, "return y {tp: P}")) << d.out;
  // Two GPUs a node: dp's groups span nodes over the slow link, so b is gathered
  // over tp instead and y is Partial over dp.
  CliResult s = shardfuse("explain " + kGraph + " --system " + kSystem);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_TRUE(has(s.out, "all_gather b -> b_ag [tp, dim 0]")) << s.out;
  EXPECT_TRUE(has(s.out, "return y {dp: P}")) << s.out;
  // --dump-after=propagate prints the same choice as the command makes.
  CliResult p = shardfuse("explain " + kGraph + " --system " + kSystem + " --dump-after=propagate");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_TRUE(has(p.out, "y: f32[64, 64] {dp: P}")) << p.out;
}

TEST(SystemCli, ACompiledPlanRunsByItsOwnPlacements) {
  TempDir t;
  const std::string dir = t / "plan";
  CliResult c = shardfuse("compile " + kGraph + " --no-ptxas --system " + kSystem + " -o " + dir);
  ASSERT_EQ(c.code, 0) << c.out;
  // The report prices with the system's GPU.
  EXPECT_TRUE(has(read_text(dir + "/report.txt"), "roofline estimate on H100 SXM (3350 GB/s HBM")) << read_text(dir + "/report.txt");
  nlohmann::json plan = nlohmann::json::parse(read_text(dir + "/plan.json"));
  EXPECT_EQ(plan["ranks"][0]["output_placements"][0], "{dp: P}");
  // exec reads the placements from the Plan: propagating again with the default
  // links would shard the output over tp and refuse (or gather it wrongly).
  CliResult e = shardfuse("exec " + dir + " --device cpu --check");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(has(e.out, "check: ok")) << e.out;
  CliResult r = shardfuse("run " + kGraph + " --system " + kSystem + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "check: ok")) << r.out;

  // A Plan whose output placement was edited is refused, naming the field.
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"{dp: Q}", "ranks[0].output_placements[0]: error: '{dp: Q}' is not a placement on mesh 'dp=2 tp=2'"},
           {"{dp: S(2)}", "ranks[0].output_placements[0]: error: '{dp: S(2)}' does not fit output y"},
           {"{dp: S(0)}", "output y is f32[64, 64] placed {dp: S(0)}, so rank 0 holds f32[32, 64]"}}) {
    nlohmann::json edited = plan;
    for (auto& rank : edited["ranks"]) rank["output_placements"][0] = text;
    std::ofstream(dir + "/plan.json") << edited.dump(2);
    CliResult bad = shardfuse("exec " + dir + " --device cpu --check");
    EXPECT_EQ(bad.code, 1) << text << "\n" << bad.out;
    EXPECT_TRUE(has(bad.out, want)) << "want '" << want << "' in:\n" << bad.out;
  }
}

TEST(SystemCli, AnArchOtherThanTheSystemsOrABadFileIsRefused) {
  TempDir t;
  CliResult a = shardfuse("compile " + kGraph + " --no-ptxas --system " + kSystem + " --arch sm_80 -o " + (t / "p"));
  EXPECT_EQ(a.code, 1) << a.out;
  EXPECT_TRUE(has(a.out, "has H100 SXM GPUs (sm_90a), but the kernels are for sm_80")) << a.out;
  EXPECT_FALSE(fs::exists(t / "p"));
  CliResult m = shardfuse("explain " + kGraph + " --system " + (t / "none.json"));
  EXPECT_EQ(m.code, 1) << m.out;
  EXPECT_TRUE(has(m.out, t / "none.json")) << m.out;
  write_file(t / "bad.json", "{\"format\": \"shardfuse-system\", \"version\": 1,\n \"name\": 3}");
  CliResult b = shardfuse("run " + kGraph + " --system " + (t / "bad.json"));
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_TRUE(has(b.out, t / "bad.json" + ":2:2: error: name: expected a string")) << b.out;
}

}  // namespace tools_system_cli_test
}  // namespace sf
