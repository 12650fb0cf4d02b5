// `shardfuse exec PLAN_DIR` and `run --device cuda`: Plan validation (no GPU
// needed), the clear error without a GPU, the launches a Plan makes through the
// fake driver (tests/fake_cuda: it runs no kernel code), and, on a machine with a
// GPU, every example against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "runtime/gpu/cuda_driver.h"
#include "runtime/plan/plan.h"
#include "tests/tools/cli_util.h"
#include "tests/tools/exec_util.h"

namespace sf {
namespace tools_exec_cli_test {

using namespace exec_test;

TEST(ExecCli, ValidatesThePlanBeforeLookingForAGpu) {
  TempDir t;
  const std::string good = compile_to(t, example("tp_mlp.sf"), "good");
  const Plan plan = read_plan(good);
  ASSERT_FALSE(plan.kernels.empty());
  const PlanKernel& k0 = plan.kernels[0];
  auto copy = [&](const std::string& name) {
    fs::copy(good, t / name, fs::copy_options::recursive);
    return t / name;
  };
  struct Case {
    std::string what, dir, want;
  };
  std::vector<Case> cases;
  cases.push_back({"no directory", t / "nope", t / "nope" + ": error: not a Plan directory"});
  {
    std::string d = copy("no_json");
    fs::remove(d + "/plan.json");
    cases.push_back({"no plan.json", d, d + "/plan.json: error: cannot read it"});
  }
  {
    std::string d = copy("bad_json");
    write_file(d + "/plan.json", "{\n  \"version\": 1,\n  \"graph\": \n");
    cases.push_back({"truncated JSON", d, d + "/plan.json:"});
  }
  {
    std::string d = copy("version");
    std::string j = read_text(d + "/plan.json");
    j = std::regex_replace(j, std::regex("\"version\": *2"), "\"version\": 99");
    write_file(d + "/plan.json", j);
    cases.push_back({"another version", d, "version"});
  }
  {
    std::string d = copy("no_ptx");
    fs::remove(d + "/" + k0.ptx_file);
    cases.push_back({"a missing .ptx", d, d + "/" + k0.ptx_file + ": error: missing: plan.json names it as kernel " + k0.id});
  }
  {
    std::string d = copy("no_entry");
    std::string ptx = read_text(d + "/" + k0.ptx_file);
    write_file(d + "/" + k0.ptx_file, std::regex_replace(ptx, std::regex(k0.entry), "renamed_entry"));
    cases.push_back({"a .ptx without the entry", d, d + "/" + k0.ptx_file + ": error: has no `.entry " + k0.entry + "`"});
  }
  {
    std::string d = copy("no_graph");
    fs::remove(d + "/graph.sf");
    cases.push_back({"no graph.sf", d, d + "/graph.sf: error: missing"});
  }
  {
    std::string d = copy("other_graph");
    fs::copy_file(example("tp_attention.sf"), d + "/graph.sf", fs::copy_options::overwrite_existing);
    cases.push_back({"another graph", d, "is not the graph plan.json was compiled from"});
  }
  for (const Case& c : cases) {
    CliResult r = shardfuse("exec " + c.dir + " --device cuda");
    EXPECT_EQ(r.code, 1) << c.what << ":\n" << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << c.what << ": want '" << c.want << "' in:\n" << r.out;
    EXPECT_EQ(r.out.find("no CUDA device"), std::string::npos) << c.what << ": the Plan is checked first\n" << r.out;
  }
}

TEST(ExecCli, WithoutAGpuItSaysSoAndWithOneTheExampleChecks) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "plan");
  CliResult r = shardfuse("exec " + dir + " --device cuda --check");
  Result<const cuda::Driver*> d = cuda::driver();
  if (!d) {
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("error: no CUDA device: "), std::string::npos) << r.out;
    CliResult run = shardfuse("run " + example("tp_mlp.sf") + " --device cuda");
    EXPECT_EQ(run.code, 1) << run.out;
    EXPECT_NE(run.out.find("error: no CUDA device: "), std::string::npos) << run.out;
    GTEST_SKIP() << d.error().message;
  }
  // A real GPU (sm_90a Plans need compute capability 9.0: elsewhere compile for it).
  Result<cuda::DeviceInfo> info = cuda::device_info(0);
  ASSERT_TRUE(info);
  if (info->arch() != "sm_90a") {
    std::string other = compile_to(t, example("tp_mlp.sf"), "plan_dev", "", info->arch());
    r = shardfuse("exec " + other + " --device cuda --check");
  }
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
}

// --- on a GPU --------------------------------------------------------------------------

void skip_without_gpu() {
  Result<const cuda::Driver*> d = cuda::driver();
  if (!d) GTEST_SKIP() << d.error().message;
}

TEST(GpuRun, EveryExampleMatchesTheReference) {
  skip_without_gpu();
  if (testing::Test::IsSkipped()) return;
  for (const char* ex : {"tp_mlp.sf", "tp_attention.sf", "seq_parallel_mlp.sf", "transformer_block.sf", "fsdp_tp_2d.sf",
                         "fsdp_mlp.sf"})
    for (const char* extra : {"", " --cuda-graph", " --world 2", " --no-fuse"}) {
      if (std::string(ex) == "fsdp_tp_2d.sf" && std::string(extra) == " --world 2") continue;  // a 2-D mesh
      CliResult r = shardfuse(std::string("run ") + example(ex) + " --device cuda --check" + extra);
      EXPECT_EQ(r.code, 0) << ex << extra << "\n" << r.out;
      EXPECT_NE(r.out.find("check: ok"), std::string::npos) << ex << extra << "\n" << r.out;
    }
}

TEST(GpuRun, APlanCompiledElsewhereRunsAndChecks) {
  skip_without_gpu();
  if (testing::Test::IsSkipped()) return;
  Result<cuda::DeviceInfo> info = cuda::device_info(0);
  ASSERT_TRUE(info);
  TempDir t;
  for (const char* ex : {"transformer_block.sf", "fsdp_tp_2d.sf"}) {
    std::string dir = compile_to(t, example(ex), std::string("p_") + ex, "", info->arch());
    for (const char* extra : {"", " --cuda-graph"}) {
      CliResult r = shardfuse("exec " + dir + " --device cuda --check" + extra);
      EXPECT_EQ(r.code, 0) << ex << extra << "\n" << r.out;
      EXPECT_NE(r.out.find("check: ok"), std::string::npos) << ex << extra << "\n" << r.out;
    }
  }
}

// --- through the fake driver -----------------------------------------------------------

#ifdef SF_FAKE_CUDA
// What the Plan says every rank launches, one entry per kernel step.
std::vector<Launch> planned(const Plan& p) {
  std::map<std::string, const PlanKernel*> by_id;
  for (const PlanKernel& k : p.kernels) by_id[k.id] = &k;
  std::vector<Launch> out;
  auto dims = [](const auto& a) {
    return std::to_string(a[0]) + "," + std::to_string(a[1]) + "," + std::to_string(a[2]);
  };
  for (const PlanRank& r : p.ranks)
    for (const PlanStep& s : r.steps)
      if (s.op == "kernel") {
        const PlanKernel& k = *by_id.at(s.kernel);
        out.push_back({k.entry, dims(k.grid), dims(k.block), k.shared_bytes,
                       static_cast<int>(s.in.size() + s.out.size() + k.tensor_maps.size()), false});
      }
  std::sort(out.begin(), out.end());
  return out;
}


TEST(ExecFakeDriver, LaunchesEveryKernelStepWithThePlansGridBlockAndArguments) {
  TempDir t;
  for (const char* ex : {"tp_mlp.sf", "transformer_block.sf", "fsdp_tp_2d.sf"}) {
    const std::string dir = compile_to(t, example(ex), std::string("p_") + ex);
    const std::string log = t / (std::string(ex) + ".log");
    CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
    ASSERT_EQ(r.code, 0) << ex << "\n" << r.out;
    EXPECT_NE(r.out.find("on 1 GPU(s) (shardfuse fake GPU, sm_90a)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("collectives: host-staged (Gloo)"), std::string::npos) << r.out;
    std::vector<Launch> got = launches_in(read_text(log));
    std::sort(got.begin(), got.end());
    std::vector<Launch> want = planned(read_plan(dir));
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size()) << ex << ": one launch per kernel step of every rank\n" << read_text(log);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].entry, want[i].entry) << ex;
      EXPECT_EQ(got[i].grid, want[i].grid) << ex << " " << want[i].entry;
      EXPECT_EQ(got[i].block, want[i].block) << ex << " " << want[i].entry;
      EXPECT_EQ(got[i].shared, want[i].shared) << ex << " " << want[i].entry;
      EXPECT_EQ(got[i].args, want[i].args) << ex << " " << want[i].entry;
    }
    EXPECT_NE(r.out.find("kernels: " + std::to_string(want.size()) + " launch(es)"), std::string::npos) << r.out;
  }
}

// compile --matmul-config: every matmul kernel takes the given config (config_source
// "flag"): a persistent warp-specialised one launches its 384 threads on a grid of
// min(persistent, tiles) blocks, and exec launches it so on the fake driver; so does a
// ping-pong one. A config
// whose tensor-core knobs the kernel cannot take, or a text with a field that is not a
// matmul's, a repeated field or a bad value, is an error naming it.
TEST(ExecFakeDriver, MatmulConfigFromTheCommandLine) {
  TempDir t;
  write_file(t / "g.sf",
             "graph lin(x: bf16[512, 512], w: bf16[1024, 512]) {\n"
             "  y = matmul(x, transpose(w, 0, 1))\n"
             "  return y\n}\n");
  const std::string dir = compile_to(t, t / "g.sf", "pers", "--matmul-config 'block_m=128 block_n=256 block_k=64 warps=8 "
                                                         "stages=4 warp_specialize=1 persistent=12'");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].config_source, "flag");
  EXPECT_NE(p.kernels[0].config.find("persistent=12"), std::string::npos) << p.kernels[0].config;
  EXPECT_EQ(p.kernels[0].grid[0], 12);  // 4 x 4 = 16 tiles over 12 blocks
  EXPECT_EQ(p.kernels[0].block[0], 384);
  CliResult r = shardfuse_env(fake_env(t / "log"), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Launch> got = launches_in(read_text(t / "log"));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].grid, "12,1,1");
  EXPECT_EQ(got[0].block, "384,1,1");
  // Ping-pong: the same 384 threads, 64 x 128 tiles (8 x 8 = 64 of them) over 12 blocks.
  const std::string pp = compile_to(t, t / "g.sf", "pp", "--matmul-config 'block_m=64 block_n=128 block_k=64 warps=8 "
                                                        "stages=3 warp_specialize=1 persistent=12 pingpong=1'");
  Plan pplan = read_plan(pp);
  ASSERT_EQ(pplan.kernels.size(), 1u);
  EXPECT_NE(pplan.kernels[0].config.find("pingpong=1"), std::string::npos) << pplan.kernels[0].config;
  EXPECT_EQ(pplan.kernels[0].grid[0], 12);
  EXPECT_EQ(pplan.kernels[0].block[0], 384);
  struct Bad {
    std::string flags, says;
  };
  for (const Bad& b : {Bad{"--no-tma --matmul-config 'block_m=128 block_n=128 warps=8 block_k=64 stages=4 warp_specialize=1'", "not TMA: --no-tma"},
                       Bad{"--matmul-config 'block=128'", "'block' is not a matmul field"},
                       Bad{"--matmul-config 'pingpong=2'", "pingpong = 2 is not 0 or 1"},
                       Bad{"--matmul-config 'block_m=64 block_n=64 block_k=64 warps=4 stages=3 warp_specialize=1 persistent=3 pingpong=1'",
                           "pingpong = 1 needs two consumer warpgroups (warps = 8)"},
                       Bad{"--matmul-config 'warps=4 warps=8'", "warps given twice"},
                       Bad{"--matmul-config 'warps=x'", "'x' is not an integer"},
                       Bad{"--matmul-config ' '", "no field given"}}) {
    CliResult q = shardfuse("compile " + (t / "g.sf") + " --no-ptxas -o " + (t / "bad") + " " + b.flags);
    EXPECT_NE(q.code, 0) << b.flags;
    EXPECT_NE(q.out.find(b.says), std::string::npos) << b.flags << ": " << q.out;
    EXPECT_FALSE(std::filesystem::exists(t / "bad")) << b.flags;
  }
}

// compile --attention-config: the fields given go over each fused attention kernel's
// own config (here sm_90a's default for a head of 256 rows, 256 x 64 on 16 warps by
// wgmma), so "block_m=128 warps=8" gives the wgmma kernel on 128 x 64 (config_source
// "flag", q's, k's and v's panels: 98 KiB of shared memory, k and v by TMA), which
// report.txt names and exec launches on the fake driver. A field that is not an
// attention's, or wgmma where the kernel cannot take it (sm_80), is an error naming
// it, and no Plan is written.
TEST(ExecFakeDriver, AttentionConfigFromTheCommandLine) {
  TempDir t;
  write_file(t / "a.sf",
             "graph attn(q: bf16[1, 4, 256, 128], k: bf16[1, 2, 256, 128], v: bf16[1, 2, 256, 128]) {\n"
             "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n"
             "  return out\n}\n");
  const std::string dir = compile_to(t, t / "a.sf", "wg", "--attention-config 'block_m=128 warps=8'");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].config_source, "flag");
  EXPECT_EQ(p.kernels[0].config, "block_m=128 block_n=64 warps=8 wgmma=1");
  EXPECT_EQ(p.kernels[0].block[0], 256);
  // q's panels, k's and v's twice, and a full and an empty mbarrier for each of those
  // two buffers: k and v come by TMA, sm_90a's default, through two tensor maps that
  // exec encodes.
  EXPECT_EQ(p.kernels[0].shared_bytes, 2 * 128 * 128 + 2 * 4 * 64 * 128 + 2 * 16);
  EXPECT_EQ(p.kernels[0].tensor_maps.size(), 2u);
  EXPECT_NE(read_text(dir + "/report.txt").find("wgmma.mma_async m64nNk16"), std::string::npos);
  CliResult r = shardfuse_env(fake_env(t / "log"), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(launches_in(read_text(t / "log")).size(), 1u);
  struct Bad {
    std::string flags, says;
  };
  for (const Bad& b : {Bad{"--attention-config 'block=128'", "--attention-config: 'block' is not an attention field"},
                       Bad{"--attention-config 'wgmma=1' --arch sm_80", "wgmma = 1: wgmma is sm_90a's, not sm_80's"},
                       Bad{"--attention-config 'wgmma=1 block_m=64' --arch sm_90a", "is not 16 rows a warp"},
                       Bad{"--attention-config ' '", "no field given"}}) {
    CliResult q = shardfuse("compile " + (t / "a.sf") + " --no-ptxas -o " + (t / "bad") + " " + b.flags);
    EXPECT_NE(q.code, 0) << b.flags;
    EXPECT_NE(q.out.find(b.says), std::string::npos) << b.flags << ": " << q.out;
    EXPECT_FALSE(std::filesystem::exists(t / "bad")) << b.flags;
  }
}

TEST(ExecFakeDriver, ZeroOutputsAreClearedBeforeTheirLaunch) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  // Mark the first kernel as a split-K one (its outputs are accumulated into).
  std::string j = read_text(dir + "/plan.json");
  Plan p = read_plan(dir);
  p.kernels[0].zero_outputs = true;
  write_file(dir + "/plan.json", plan_to_json(p));
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  // Every launch of that kernel follows a memset of its output. Ranks share the log,
  // so another rank's lines may come in between: count instead. At every point in
  // the log there have been at least as many zeroing memsets as launches of it, and
  // in all there is one per launch (tp_mlp has one output per kernel, and nothing
  // else memsets).
  std::istringstream in(read_text(log));
  std::string line;
  int launches = 0, cleared = 0;
  bool ordered = true;
  while (std::getline(in, line)) {
    if (line.rfind("memset8 ", 0) == 0 && line.find(" 0 ") != std::string::npos) ++cleared;
    if (line.rfind("launch " + p.kernels[0].entry + " ", 0) == 0) ordered = ordered && cleared > launches++;
  }
  EXPECT_GT(launches, 0);
  EXPECT_TRUE(ordered) << read_text(log);
  EXPECT_EQ(cleared, launches) << read_text(log);
}

// What a fake-driver log says of a kernel with a workspace of `ws_bytes`: its launch
// lines, the memsets that zeroed the workspace before each of them and in all, and
// the other memsets (outputs cleared).
struct WorkspaceLog {
  std::vector<std::string> launches;
  std::vector<int> zeroed_before;  // per launch: workspace memsets before it
  int zeroings = 0, other_memsets = 0;
};
WorkspaceLog read_workspace_log(const std::string& log, const std::string& entry, int64_t ws_bytes) {
  WorkspaceLog w;
  std::istringstream in(read_text(log));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("memset8 ", 0) == 0) {
      if (line.find(" 0 " + std::to_string(ws_bytes)) != std::string::npos) ++w.zeroings;
      else ++w.other_memsets;
    }
    if (line.rfind("launch " + entry + " ", 0) == 0) {
      w.launches.push_back(line);
      w.zeroed_before.push_back(w.zeroings);
    }
  }
  return w;
}

// A split-K bf16 matmul + bias + GELU (the tensor-core kernel sums its partials in a
// workspace): plan.json records the workspace's size, exec allocates it once, zeroes
// it once before the first launch (the kernel leaves it zero), and passes it after
// the kernel's inputs and outputs; the fake driver checks that every argument is an
// allocation. Plain and as a CUDA graph.
TEST(ExecFakeDriver, ASplitKKernelGetsItsWorkspaceZeroedOnce) {
  TempDir t;
  write_file(t / "g.sf",
             "graph g(x: bf16[64, 512], w: bf16[512, 64], b: bf16[64]) {\n"
             "  y = gelu(add(matmul(x, w), b))\n"
             "  return y\n"
             "}\n");
  const std::string dir =
      compile_to(t, t / "g.sf", "p",
                 "--matmul-config 'block_m=64 block_n=64 block_k=32 warps=4 stages=3 group_m=8 split_k=4'", "sm_80");
  Plan p = read_plan(dir);
  auto k = std::find_if(p.kernels.begin(), p.kernels.end(), [](const PlanKernel& pk) { return pk.kind == KernelKind::Matmul; });
  ASSERT_NE(k, p.kernels.end());
  EXPECT_EQ(k->grid[2], 4);
  EXPECT_FALSE(k->zero_outputs);
  const int64_t ws = 4 * (64 * 64 + 1);  // the f32 sums, one counter
  EXPECT_EQ(k->workspace_bytes, ws);
  EXPECT_NE(read_text(dir + "/plan.json").find("\"workspace_bytes\": " + std::to_string(ws)), std::string::npos);
  for (const char* mode : {"", " --cuda-graph"}) {
    const std::string log = t / (std::string("log") + (*mode ? "g" : ""));
    CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda" + mode);
    ASSERT_EQ(r.code, 0) << mode << ": " << r.out;
    const WorkspaceLog w = read_workspace_log(log, k->entry, ws);
    for (size_t i = 0; i < w.launches.size(); ++i) {
      EXPECT_EQ(w.zeroed_before[i], 1) << mode << "\n" << read_text(log);
      EXPECT_NE(w.launches[i].find(" args=5 "), std::string::npos) << w.launches[i];  // x, w, b, y, then the workspace
    }
    EXPECT_GT(w.launches.size(), 0u) << mode;
    EXPECT_EQ(w.zeroings, 1) << mode << "\n" << read_text(log);
  }
}

// A whole-tensor sum, which the default config splits over blocks (docs/kernels.md,
// "Split rows"): report.txt says so, plan.json records the workspace (8 bytes a share's
// partial, one counter), and exec passes it after the input and the output, zeroed
// once, to a launch of the split's grid y; the outputs are not cleared (the last block
// stores them). Plain and as a CUDA graph.
TEST(ExecFakeDriver, ASplitReductionGetsItsWorkspaceZeroedOnce) {
  TempDir t;
  write_file(t / "g.sf", "graph g(x: f32[2048, 4096]) {\n  s = sum(x)\n  return s\n}\n");
  const std::string dir = compile_to(t, t / "g.sf", "p");
  EXPECT_NE(read_text(dir + "/report.txt").find("each row split over 256 blocks (grid y)"), std::string::npos)
      << read_text(dir + "/report.txt");
  Plan p = read_plan(dir);
  auto k = std::find_if(p.kernels.begin(), p.kernels.end(), [](const PlanKernel& pk) { return pk.kind == KernelKind::Reduction; });
  ASSERT_NE(k, p.kernels.end());
  EXPECT_EQ(k->grid[1], 256);
  EXPECT_FALSE(k->zero_outputs);
  const int64_t ws = 8 * 256 + 8;  // a partial a share, then the one group's counter (rounded to 8)
  EXPECT_EQ(k->workspace_bytes, ws);
  for (const char* mode : {"", " --cuda-graph"}) {
    const std::string log = t / (std::string("log") + (*mode ? "g" : ""));
    CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda" + mode);
    ASSERT_EQ(r.code, 0) << mode << ": " << r.out;
    const WorkspaceLog w = read_workspace_log(log, k->entry, ws);
    for (size_t i = 0; i < w.launches.size(); ++i) {
      EXPECT_EQ(w.zeroed_before[i], 1) << w.launches[i];
      EXPECT_NE(w.launches[i].find(" grid=1,256,1 "), std::string::npos) << w.launches[i];
      EXPECT_NE(w.launches[i].find(" args=3 "), std::string::npos) << w.launches[i];  // x, s, then the workspace
    }
    EXPECT_GT(w.launches.size(), 0u) << mode;
    EXPECT_EQ(w.zeroings, 1) << mode << "\n" << read_text(log);
    EXPECT_EQ(w.other_memsets, 0) << mode << "\n" << read_text(log);
  }
}

// exec --check of a Plan compiled under --precision fused (plan.json says so) checks an
// output of f16/bf16 origin that misses the eager reference against the one without
// 16-bit rounding, as run --check does: the bf16 softmax of a fused matmul + GELU
// passes. A Plan that does not say its precision is checked against the eager
// reference alone, and misses; one compiled under --precision eager meets it.
TEST(ExecCli, AFusedPlanMeetsTheUnroundedReference) {
  TempDir t;
  write_file(t / "g.sf",
             "graph mlp16(x: bf16[64, 256], w: bf16[512, 256], b: bf16[512]) {\n"
             "  h = gelu(add(matmul(x, transpose(w, 0, 1)), b))\n"
             "  y = softmax(h, dim=-1)\n"
             "  return h, y\n}\n");
  const std::string fused = compile_to(t, t / "g.sf", "fused");
  EXPECT_EQ(read_plan(fused).precision, "fused");
  CliResult r = shardfuse("exec " + fused + " --device cpu --check --seed 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok against the reference without 16-bit rounding"), std::string::npos) << r.out;
  Plan unsaid = read_plan(fused);
  unsaid.precision.clear();
  write_file(fused + "/plan.json", plan_to_json(unsaid));
  CliResult strict = shardfuse("exec " + fused + " --device cpu --check --seed 1");
  EXPECT_EQ(strict.code, 1) << strict.out;
  EXPECT_NE(strict.out.find("MISMATCH"), std::string::npos) << strict.out;
  const std::string eager = compile_to(t, t / "g.sf", "eager", "--precision eager");
  EXPECT_EQ(read_plan(eager).precision, "eager");
  CliResult e = shardfuse("exec " + eager + " --device cpu --check --seed 1");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out.find("without 16-bit rounding"), std::string::npos) << e.out;
}

TEST(ExecFakeDriver, CudaGraphCapturesOnceAndReplaysEveryKernel) {
  TempDir t;
  const std::string dir = compile_to(t, example("transformer_block.sf"), "p");
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda --cuda-graph");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Launch> got = launches_in(read_text(log));
  size_t from_graph = static_cast<size_t>(std::count_if(got.begin(), got.end(), [](const Launch& l) { return l.graph; }));
  EXPECT_EQ(from_graph, planned(read_plan(dir)).size()) << "every kernel launch is a graph replay\n" << read_text(log);
  EXPECT_NE(read_text(log).find("capture begin"), std::string::npos);
  EXPECT_NE(r.out.find("replayed from"), std::string::npos) << r.out;
}

TEST(ExecFakeDriver, TheJitLogAndArchMismatchesAreReported) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  const Plan p = read_plan(dir);
  {
    std::string bad = t / "jit";
    fs::copy(dir, bad, fs::copy_options::recursive);
    std::ofstream(bad + "/" + p.kernels[0].ptx_file, std::ios::app) << "\n// FAKE_JIT_ERROR\n";
    CliResult r = shardfuse_env(fake_env(t / "log1"), "exec " + bad + " --device cuda");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(p.kernels[0].ptx_file + ": the driver's JIT rejected the PTX"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fake JIT error"), std::string::npos) << "the JIT's own log\n" << r.out;
  }
  {
    std::string newer = t / "newer";
    fs::copy(dir, newer, fs::copy_options::recursive);
    Plan q = p;
    q.arch = "sm_100a";
    write_file(newer + "/plan.json", plan_to_json(q));
    CliResult r = shardfuse_env(fake_env(t / "log2"), "exec " + newer + " --device cuda");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("recompile with --arch sm_90a"), std::string::npos) << r.out;
  }
  {
    // PTX for an older arch is JIT-compiled for the newer GPU.
    std::string older = compile_to(t, example("tp_mlp.sf"), "older", "", "sm_80");
    CliResult r = shardfuse_env(fake_env(t / "log3"), "exec " + older + " --device cuda");
    EXPECT_EQ(r.code, 0) << r.out;
  }
}

TEST(ExecFakeDriver, RanksAsProcessesOnePerGpu) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  fs::create_directory(t / "rv");
  const std::string log = t / "log";
  // Four processes, rank r on fake GPU r, collectives over Gloo between them.
  std::string cmd;
  for (int r = 0; r < 4; ++r) {
    const std::string rs = std::to_string(r);
    cmd += "(" + fake_env(log) + " FAKE_CUDA_DEVICES=4 " + SF_BINARY + " exec " + dir +
           " --device cuda --collectives host --rank " + rs + " --rendezvous " + (t / "rv") + " > " + (t / ("out" + rs)) +
           " 2>&1; echo $? > " + (t / ("rc" + rs)) + ") & ";
  }
  cmd += "wait";
  ASSERT_EQ(std::system(("sh -c '" + cmd + "'").c_str()), 0);
  for (int r = 0; r < 4; ++r) {
    const std::string rs = std::to_string(r);
    const std::string out = read_text(t / ("out" + rs));
    EXPECT_EQ(read_text(t / ("rc" + rs)), "0\n") << out;
    EXPECT_NE(out.find("rank " + rs + " of 4 as a process on GPU " + rs), std::string::npos) << out;
    EXPECT_NE(out.find("collectives: host-staged (Gloo)"), std::string::npos) << out;
  }
  // Every rank's kernels, once each, across the processes.
  EXPECT_EQ(launches_in(read_text(log)).size(), planned(read_plan(dir)).size()) << read_text(log);
  // --rank without --rendezvous, and --save-outputs (it needs every rank's outputs).
  CliResult a = shardfuse_env(fake_env(t / "log2"), "exec " + dir + " --device cuda --rank 0");
  EXPECT_EQ(a.code, 2);  // a usage error
  EXPECT_NE(a.out.find("--rank requires --rendezvous"), std::string::npos) << a.out;
  CliResult b = shardfuse_env(fake_env(t / "log3"), "exec " + dir + " --device cuda --rank 0 --rendezvous " +
                                                        (t / "rv2") + " --save-outputs " + (t / "o"));
  EXPECT_EQ(b.code, 1);
  EXPECT_NE(b.out.find("--save-outputs needs every rank's outputs"), std::string::npos) << b.out;
}

TEST(RunFakeDriver, RunCompilesForTheDevicesArchAndLaunches) {
  TempDir t;
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "run " + example("tp_mlp.sf") + " --device cuda --world 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 rank(s) as threads on 1 GPU(s) (shardfuse fake GPU, sm_90a)"), std::string::npos) << r.out;
  EXPECT_FALSE(launches_in(read_text(log)).empty());
  // What the fake cannot do: run kernel code. So --check must not pass by accident.
  CliResult c = shardfuse_env(fake_env(t / "log2"), "run " + example("tp_mlp.sf") + " --device cuda --check");
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("MISMATCH"), std::string::npos) << c.out;
  // One process of a multi-process run (here a world of one).
  CliResult p = shardfuse_env(fake_env(t / "log3"), "run " + example("tp_mlp.sf") +
                                                        " --world 1 --device cuda --rank 0 --rendezvous " + (t / "rv"));
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("rank 0 of 1 as a process on GPU 0"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("collectives: host-staged"), std::string::npos) << p.out;
}
#endif

#if defined(SF_FAKE_CUDA)
// Four ranks on one GPU with the collectives replaced by copies (issue 16's
// stand-in for timing overlap where NCCL cannot run): each collective is one
// device-to-device copy of its bus bytes on the rank's comm stream.
TEST(ExecFakeDriver, CopyStandinTimesEachCollectiveAsACopyOfItsBusBytesOnTheCommStream) {
  TempDir t;
  const std::string dir = compile_to(t, example("seq_parallel_mlp.sf"), "p");
  const std::string trace = t / "t.json";
  CliResult r = shardfuse_env(fake_env(t / "log") + " FAKE_CUDA_DEVICES=1 SHARDFUSE_LIBNCCL=/nonexistent/libnccl.so.2",
                              "exec " + dir + " --device cuda --collectives copy-standin --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("on 1 GPU(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("collectives: a device-to-device copy of each collective's bus bytes on a comm stream (a "
                       "stand-in"),
            std::string::npos)
      << r.out;
  const Plan plan = read_plan(dir);
  nlohmann::json j = nlohmann::json::parse(read_text(trace));
  int copies = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "collective") continue;
    ++copies;
    EXPECT_EQ(e["tid"], 1) << "on the comm track: " << e.dump();
    EXPECT_EQ(e["args"].value("via", ""), "d2d copy stand-in") << e.dump();
    // The bytes: the larger of the step's input and output, times the bus factor
    // of a ring over the 4 members.
    const PlanRank& pr = plan.ranks.at(e["pid"].get<size_t>());
    const PlanStep& st = pr.steps.at(e["args"]["step"].get<size_t>());
    ASSERT_TRUE(st.collective()) << e.dump();
    int64_t payload = 0;
    for (int b : {st.in.at(0), pr.steps.at(e["args"]["step"].get<size_t>() + 1).out.at(0)})
      payload = std::max(payload, numel(pr.buffers.at(static_cast<size_t>(b)).shape) * 4);
    const double want = static_cast<double>(payload) * (st.collective() == CollectiveKind::AllReduce ? 1.5 : 0.75);
    EXPECT_EQ(e["args"].value("bytes", int64_t{0}), static_cast<int64_t>(want)) << e.dump();
  }
  EXPECT_EQ(copies, 8) << "seq_parallel_mlp: an all_gather and a reduce_scatter on each of 4 ranks\n" << j.dump();
  EXPECT_EQ(j["otherData"].value("collectives", ""), "copy-standin");

  // The outputs are not the graph's, so nothing claims they are.
  for (const char* bad : {" --check", " --save-outputs out"}) {
    CliResult c = shardfuse_env(fake_env(t / "log2") + " FAKE_CUDA_DEVICES=1",
                                "exec " + dir + " --device cuda --collectives copy-standin" + bad);
    EXPECT_EQ(c.code, 2) << c.out;
    EXPECT_NE(c.out.find("the outputs are not the graph's"), std::string::npos) << c.out;
  }
  CliResult cpu = shardfuse("exec " + dir + " --device cpu --collectives copy-standin");
  EXPECT_EQ(cpu.code, 2) << cpu.out;
  EXPECT_NE(cpu.out.find("--collectives copy-standin needs --device cuda"), std::string::npos) << cpu.out;
}
#endif

#if defined(SF_FAKE_CUDA) && defined(SF_FAKE_NCCL)
// The fake NCCL (tests/fake_nccl) over the fake driver with a GPU per rank.
std::string nccl_env(const std::string& log, int gpus = 4) {
  return fake_env(log) + " SHARDFUSE_LIBNCCL=" + SF_FAKE_NCCL + " FAKE_CUDA_DEVICES=" + std::to_string(gpus);
}

// The fields of a log line: "key=value" pairs, the first word as "@", the other
// words as "#0", "#1", ...
std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> f;
  std::istringstream in(line);
  std::string w;
  in >> w;
  f["@"] = w;
  std::vector<std::string> words;
  while (in >> w) {
    size_t eq = w.find('=');
    if (eq != std::string::npos) f[w.substr(0, eq)] = w.substr(eq + 1);
    else words.push_back(w);
  }
  for (size_t i = 0; i < words.size(); ++i) f["#" + std::to_string(i)] = words[i];
  return f;
}

TEST(ExecFakeNccl, CollectivesGoOnACommStreamOrderedByEventsBothWays) {
  TempDir t;
  for (const char* ex : {"tp_mlp.sf", "seq_parallel_mlp.sf"}) {
    SCOPED_TRACE(ex);
    const std::string dir = compile_to(t, example(ex), std::string("p_") + ex);
    const std::string log = t / (std::string(ex) + ".log");
    CliResult r = shardfuse_env(nccl_env(log), "exec " + dir + " --device cuda --collectives nccl");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("on 4 GPU(s) (shardfuse fake GPU, sm_90a)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("collectives: NCCL 2.28.9 on a comm stream"), std::string::npos) << r.out;

    // Replay the log: which streams launch kernels, where each event was last
    // recorded, and what every stream has waited for so far.
    std::istringstream in(read_text(log));
    std::string line;
    std::set<std::string> compute;                       // streams that launch kernels
    std::map<std::string, std::string> recorded_on;      // event -> stream
    std::map<std::string, std::set<std::string>> waited;  // stream -> events it waited for
    std::map<std::string, std::string> waited_last;      // stream -> its last awaited event
    std::vector<std::pair<std::string, std::string>> ops;  // (comm stream, the event it waited for)
    std::map<std::string, std::string> done_of;           // comm stream -> event recorded after its last op
    int nccl_ops = 0, launches_after_wait = 0;
    while (std::getline(in, line)) {
      auto f = fields(line);
      if (f["@"] == "launch") {
        compute.insert(f["stream"]);
        if (!waited[f["stream"]].empty()) ++launches_after_wait;
      } else if (f["@"] == "record") {
        recorded_on[f["#0"]] = f["#1"];
        done_of[f["#1"]] = f["#0"];
      } else if (f["@"] == "streamwait") {
        waited[f["#0"]].insert(f["#1"]);
        waited_last[f["#0"]] = f["#1"];
      } else if (f["@"] == "nccl" && (f["#0"] == "all_reduce" || f["#0"] == "all_gather" ||
                                       f["#0"] == "reduce_scatter" || f["#0"] == "send")) {
        ++nccl_ops;
        ops.push_back({f["stream"], waited_last[f["stream"]]});
      }
    }
    ASSERT_GT(nccl_ops, 0) << read_text(log);
    for (const auto& [stream, ready] : ops) {
      // Not on a stream that launches kernels: on each rank's comm stream.
      EXPECT_EQ(compute.count(stream), 0u) << "an NCCL call on a compute stream " << stream;
      // After waiting for an event recorded on a compute stream (its operand).
      ASSERT_FALSE(ready.empty()) << "an NCCL call on " << stream << " that waited for nothing";
      EXPECT_EQ(compute.count(recorded_on[ready]), 1u) << "the event " << ready << " is not from a compute stream";
    }
    // Every compute stream waits on the device for an event its comm stream
    // recorded (the collective's wait step), and kernels come after it.
    std::set<std::string> comm_streams;
    for (const auto& op : ops) comm_streams.insert(op.first);
    EXPECT_EQ(comm_streams.size(), 4u) << "one comm stream per rank";
    int compute_waits_on_comm = 0;
    for (const auto& [stream, events] : waited)
      if (compute.count(stream))
        for (const std::string& e : events) compute_waits_on_comm += comm_streams.count(recorded_on[e]) ? 1 : 0;
    EXPECT_GE(compute_waits_on_comm, 4) << read_text(log);
    EXPECT_GT(launches_after_wait, 0);
  }
}

TEST(ExecFakeNccl, TraceTimesCollectivesOnTheCommTrack) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  const std::string trace = t / "t.json";
  CliResult r = shardfuse_env(nccl_env(t / "log"), "exec " + dir + " --device cuda --collectives nccl --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(read_text(trace));
  std::map<int, int> per_rank;
  int kernels = 0, with_flops = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("cat", "") == "collective") {
      EXPECT_EQ(e["tid"], 1) << "on the comm track: " << e.dump();
      EXPECT_EQ(e["args"].value("via", ""), "nccl") << e.dump();
      EXPECT_GT(e["args"].value("bytes", 0), 0) << e.dump();
      ++per_rank[e["pid"].get<int>()];
    }
    if (e.value("ph", "") == "X" && e.value("cat", "") == "kernel") {
      ++kernels;
      EXPECT_EQ(e["tid"], 0) << "on the compute track: " << e.dump();
      EXPECT_GT(e["args"].value("bytes", 0), 0) << e.dump();
      with_flops += e["args"].value("flops", 0) > 0;
    }
  }
  EXPECT_EQ(per_rank.size(), 4u) << j.dump();
  EXPECT_EQ(kernels, static_cast<int>(planned(read_plan(dir)).size())) << "every kernel of every rank, timed";
  EXPECT_GT(with_flops, 0) << "the matmuls count their FLOPs";
}

TEST(ExecFakeNccl, NcclMaxCtasReachesEveryCommunicator) {
  TempDir t;
  const std::string dir = compile_to(t, example("fsdp_tp_2d.sf"), "p");  // dp=2 tp=2: two communicators a rank
  const std::string log = t / "log";
  CliResult r = shardfuse_env(nccl_env(log), "exec " + dir + " --device cuda --collectives nccl --nccl-max-ctas 4");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream in(read_text(log));
  std::string line;
  int inits = 0, capped = 0;
  while (std::getline(in, line))
    if (line.rfind("nccl init ", 0) == 0) {
      ++inits;
      capped += line.find(" max_ctas=4") != std::string::npos;
    }
  EXPECT_EQ(inits, 8) << "a communicator per mesh dim for each of 4 ranks\n" << read_text(log);
  EXPECT_EQ(capped, inits);
}

TEST(ExecFakeNccl, AskingForNcclWithTooFewGpusSaysSo) {
  TempDir t;
  const std::string dir = compile_to(t, example("tp_mlp.sf"), "p");
  CliResult r = shardfuse_env(nccl_env(t / "log", 2), "exec " + dir + " --device cuda --collectives nccl");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--collectives nccl needs a GPU per rank: world 4, 2 GPU(s)"), std::string::npos) << r.out;
  // auto falls back to the host with too few GPUs, and picks NCCL with enough.
  CliResult a = shardfuse_env(nccl_env(t / "log2", 2), "exec " + dir + " --device cuda");
  EXPECT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("on 2 GPU(s)"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("collectives: host-staged (Gloo)"), std::string::npos) << a.out;
  CliResult b = shardfuse_env(nccl_env(t / "log3", 4), "exec " + dir + " --device cuda");
  EXPECT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("collectives: NCCL"), std::string::npos) << b.out;
}
#endif

}  // namespace tools_exec_cli_test
}  // namespace sf
