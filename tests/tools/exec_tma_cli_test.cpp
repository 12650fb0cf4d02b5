// `shardfuse exec` of matmul and attention Plans through the fake driver
// (tests/fake_cuda): the launch shapes of persistent and clustered kernels, the
// tensor maps over inputs and outputs, and the cluster configs compile refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/plan/plan.h"
#include "tests/tools/cli_util.h"
#include "tests/tools/exec_util.h"

namespace sf {
namespace tools_exec_tma_cli_test {

using namespace exec_test;

#ifdef SF_FAKE_CUDA
// t/g.sf: a bf16 4096 x 4096 x 4096 product, 512 tiles of sm_90a's 128 x 256.
void write_gemm(const TempDir& t) {
  write_file(t / "g.sf",
             "graph mm(x: bf16[4096, 4096], w: bf16[4096, 4096]) {\n"
             "  y = matmul(x, transpose(w, 0, 1))\n"
             "  return y\n}\n");
}

// A persistent matmul (plan.json "persistent": true) walks its items by the launch's
// width, so exec launches at most the blocks the device holds at once: compiled for
// 400 blocks over 512 tiles, 210 KiB of shared memory a block (one an SM on the fake's
// 228 KiB), it launches 132, one per SM of the fake. A plain kernel keeps its grid
// (exec_cli_test.cpp, LaunchesEveryKernelStepWithThePlansGridBlockAndArguments).
TEST(ExecFakeDriver, APersistentKernelLaunchesAtMostTheBlocksTheDeviceHolds) {
  TempDir t;
  write_gemm(t);
  const std::string dir = compile_to(t, t / "g.sf", "p",
                                     "--matmul-config \"block_m=128 block_n=256 block_k=64 warps=8 stages=4 "
                                     "warp_specialize=1 persistent=400\"");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_TRUE(p.kernels[0].persistent);
  EXPECT_EQ(p.kernels[0].grid[0], 400);
  EXPECT_NE(read_text(dir + "/plan.json").find("\"persistent\": true"), std::string::npos);
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Launch> got = launches_in(read_text(log));
  ASSERT_EQ(got.size(), 1u) << read_text(log);
  EXPECT_EQ(got[0].grid, "132,1,1") << read_text(log);
}

// A persistent matmul in clusters of two (cluster_m=2): plan.json says so, and exec
// launches whole clusters, at most the clusters the device holds at once: compiled
// for 401 blocks (200 clusters) over 256 pairs of tiles, it launches 132 (66 clusters
// of the fake's 132 SMs), each launch logged with its cluster.
TEST(ExecFakeDriver, AClusteredKernelLaunchesWholeClusters) {
  TempDir t;
  write_gemm(t);
  const std::string dir = compile_to(t, t / "g.sf", "p",
                                     "--matmul-config \"block_m=128 block_n=256 block_k=64 warps=8 stages=4 "
                                     "warp_specialize=1 persistent=401 cluster_m=2\"");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].cluster, 2);
  EXPECT_EQ(p.kernels[0].grid[0], 400);
  EXPECT_NE(read_text(dir + "/plan.json").find("\"cluster\": 2"), std::string::npos);
  EXPECT_NE(read_text(dir + "/" + p.kernels[0].ptx_file).find(".reqnctapercluster 2, 1, 1"), std::string::npos);
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Launch> got = launches_in(read_text(log));
  ASSERT_EQ(got.size(), 1u) << read_text(log);
  EXPECT_EQ(got[0].grid, "132,1,1") << read_text(log);
  EXPECT_NE(read_text(log).find(" cluster=2 "), std::string::npos) << read_text(log);
  // A plan.json whose grid is not whole clusters is refused, naming the field.
  std::string text = read_text(dir + "/plan.json");
  const size_t at = text.find("\"cluster\": 2");
  text.replace(at, 12, "\"cluster\": 3");
  write_file(dir + "/plan.json", text);
  CliResult bad = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("kernels[0].cluster: 3 does not divide grid[0] = 400"), std::string::npos) << bad.out;
}

// A cluster config where the kernel cannot take it is an error naming why, not a
// silent SIMT kernel, and no Plan is written: f32 without --allow-tf32 (exact FMA),
// clusters without the producer warpgroup, on sm_80 (no wgmma).
TEST(ExecFakeDriver, ClusterConfigsTheKernelCannotTakeAreRefused) {
  TempDir t;
  write_file(t / "f.sf",
             "graph mm(x: f32[512, 512], w: f32[512, 512]) {\n"
             "  y = matmul(x, transpose(w, 0, 1))\n"
             "  return y\n}\n");
  write_file(t / "b.sf",
             "graph mm(x: bf16[512, 512], w: bf16[512, 512]) {\n"
             "  y = matmul(x, transpose(w, 0, 1))\n"
             "  return y\n}\n");
  const std::string ws = "block_m=64 block_n=64 block_k=64 warps=4 stages=3 warp_specialize=1 persistent=4 cluster_m=2";
  CliResult f32 = shardfuse("compile " + (t / "f.sf") + " --no-ptxas --arch sm_90a -o " + (t / "p1") + " --matmul-config '" + ws + "'");
  EXPECT_NE(f32.code, 0);
  EXPECT_NE(f32.out.find("asks for the tensor-core kernel, which cannot compute it: f32 operands stay on exact FMA"),
            std::string::npos)
      << f32.out;
  CliResult plain = shardfuse("compile " + (t / "b.sf") + " --no-ptxas --arch sm_90a -o " + (t / "p2") +
                              " --matmul-config 'block_m=64 block_n=64 block_k=64 warps=4 stages=3 cluster_n=2'");
  EXPECT_NE(plain.code, 0);
  EXPECT_NE(plain.out.find("cluster_n = 2 needs warp_specialize = 1"), std::string::npos) << plain.out;
  CliResult sm80 = shardfuse("compile " + (t / "b.sf") + " --no-ptxas --arch sm_80 -o " + (t / "p3") + " --matmul-config '" + ws + "'");
  EXPECT_NE(sm80.code, 0);
  EXPECT_NE(sm80.out.find("warp_specialize = 1 needs the sm_90a wgmma kernel"), std::string::npos) << sm80.out;
  for (const char* d : {"p1", "p2", "p3"}) EXPECT_FALSE(fs::exists(t / d + "/plan.json")) << d;
}

// sm_90a matmuls read their operands by TMA: the Plan lists each kernel's tensor maps,
// exec encodes them over the step's input buffers once per rank and launches the
// kernel with their addresses after the outputs; --no-tma compiles the cp.async kernel
// with neither.
TEST(ExecFakeDriver, TmaKernelsTakeTheirTensorMapsAfterTheOutputs) {
  TempDir t;
  write_file(t / "g.sf",
             "graph lin(x: bf16[256, 512], w: bf16[384, 512], b: bf16[384]) {\n"
             "  y = relu(add(matmul(x, transpose(w, 0, 1)), b))\n"
             "  return y\n}\n");
  const std::string dir = compile_to(t, t / "g.sf", "tma");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  ASSERT_EQ(p.kernels[0].tensor_maps.size(), 2u);
  const PlanTensorMap& a = p.kernels[0].tensor_maps[0];  // A's map: x, whichever input x is
  EXPECT_EQ(p.ranks[0].buffers[static_cast<size_t>(p.ranks[0].steps[0].in[static_cast<size_t>(a.input)])].name, "x");
  EXPECT_EQ(a.dims[0], 512);
  EXPECT_EQ(a.dims[1], 256);
  EXPECT_EQ(a.strides[0], 512 * 2);
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string calls = read_text(log);
  EXPECT_NE(calls.find("tensormap rank=2 dims=512,256 box=64,128"), std::string::npos) << calls;  // x: K-major
  EXPECT_NE(calls.find("tensormap rank=2 dims=512,384 box=64,256"), std::string::npos) << calls;  // w: K-major
  std::vector<Launch> got = launches_in(calls);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].args, 3 + 1 + 2);
  const std::string plain = compile_to(t, t / "g.sf", "plain", "--no-tma");
  EXPECT_TRUE(read_plan(plain).kernels[0].tensor_maps.empty());
  CliResult q = shardfuse_env(fake_env(t / "log2"), "exec " + plain + " --device cuda");
  ASSERT_EQ(q.code, 0) << q.out;
  EXPECT_EQ(read_text(t / "log2").find("tensormap"), std::string::npos);
  EXPECT_EQ(launches_in(read_text(t / "log2"))[0].args, 3 + 1);
}

// TMA stores (tma_store=1): compile lists a third map, over the output, [N, M] with a
// box of 64 columns (128 bytes) by 16 rows; exec encodes it over the output's buffer
// (the allocation of y's 256 x 384 x 2 bytes) and launches with the three maps after
// the output.
TEST(ExecFakeDriver, TmaStoreMapsAreEncodedOverTheOutputBuffer) {
  TempDir t;
  write_file(t / "g.sf",
             "graph lin(x: bf16[256, 512], w: bf16[384, 512], b: bf16[384]) {\n"
             "  y = relu(add(matmul(x, transpose(w, 0, 1)), b))\n"
             "  return y\n}\n");
  const std::string dir =
      compile_to(t, t / "g.sf", "store",
                 "--matmul-config 'block_m=64 block_n=128 block_k=64 warps=4 stages=3 warp_specialize=1 persistent=4 "
                 "tma_store=1'");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  ASSERT_EQ(p.kernels[0].tensor_maps.size(), 3u);
  const PlanTensorMap& o = p.kernels[0].tensor_maps[2];
  EXPECT_EQ(o.output, 0);
  EXPECT_EQ(p.ranks[0].buffers[static_cast<size_t>(p.ranks[0].steps[0].out[0])].name, "y");
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string calls = read_text(log);
  const size_t alloc = calls.find("alloc 196608 ");
  ASSERT_NE(alloc, std::string::npos) << calls;
  const std::string y = calls.substr(alloc + 13, calls.find('\n', alloc) - alloc - 13);
  EXPECT_NE(calls.find("tensormap rank=2 dims=384,256 box=64,16 at=" + y + "\n"), std::string::npos) << calls;
  std::vector<Launch> got = launches_in(calls);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].args, 3 + 1 + 3);
}

// The attention over permuted projections (tests/gpu/attn_proj_bf16.sf's layout, a
// smaller shape): compile writes its k and v maps as 4-D (columns, keys, heads,
// batches; rows 512 bytes apart, heads 256), and exec encodes them through the
// driver with every dim, then launches the kernel with them after its output.
TEST(ExecFakeDriver, AttentionMapsOverPermutedHeadsReachTheDriver) {
  TempDir t;
  write_file(t / "g.sf",
             "graph attn(q: bf16[2, 64, 4, 128], k: bf16[2, 64, 2, 128], v: bf16[2, 64, 2, 128]) {\n"
             "  out = scaled_dot_product_attention(permute(q, dims=[0, 2, 1, 3]), permute(k, dims=[0, 2, 1, 3]),\n"
             "                                     permute(v, dims=[0, 2, 1, 3]), is_causal=true, enable_gqa=true)\n"
             "  return out\n}\n");
  const std::string dir = compile_to(t, t / "g.sf", "attn", "--attention-config 'block_m=64 block_n=64 warps=4 wgmma=1'");
  Plan p = read_plan(dir);
  ASSERT_EQ(p.kernels.size(), 1u);
  ASSERT_EQ(p.kernels[0].tensor_maps.size(), 2u);
  for (const PlanTensorMap& m : p.kernels[0].tensor_maps) {
    EXPECT_EQ(m.rank, 4);
    EXPECT_EQ(m.dims, (std::array<int64_t, 5>{128, 64, 2, 2, 1}));
    EXPECT_EQ(m.strides[0], 2 * 128 * 2);
    EXPECT_EQ(m.strides[1], 128 * 2);
    EXPECT_EQ(m.strides[2], 64 * 2 * 128 * 2);
  }
  const std::string log = t / "log";
  CliResult r = shardfuse_env(fake_env(log), "exec " + dir + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string calls = read_text(log);
  size_t maps = 0;
  for (size_t at = calls.find("tensormap rank=4 dims=128,64,2,2 box=64,64,1,1"); at != std::string::npos;
       at = calls.find("tensormap rank=4 dims=128,64,2,2 box=64,64,1,1", at + 1))
    ++maps;
  EXPECT_EQ(maps, 2u) << calls;
  std::vector<Launch> got = launches_in(calls);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].args, 3 + 1 + 2);
}
#endif

}  // namespace tools_exec_tma_cli_test
}  // namespace sf
