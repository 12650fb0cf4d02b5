// Config spaces, rule pruning, occupancy and the cost model's rankings (config text
// and tuning keys: config_test.cpp). No compiler, no GPU: every number an assertion
// compares against is computed by hand in the comment beside it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "autotune/config.h"
#include "autotune/cost_model.h"
#include "autotune/problem.h"
#include "autotune/space.h"
#include "autotune/target.h"
#include "tests/autotune/autotune_test_util.h"

namespace sf {
namespace autotune_space_test {

using namespace autotune_test;

// ---------------------------------------------------------------------------------
// Spaces

TEST(SpaceTest, SizesPerKindAndTarget) {
  struct Case {
    KernelKind kind;
    bool gpu;
    size_t size;
    const char* why;
  };
  const Case cases[] = {
      {KernelKind::Pointwise, true, 96, "4 blocks x 4 vectors x 3 elems_per_thread x 2 grids"},
      // threads_per_row x rows_per_block with 32 <= threads <= 1024: 3 (tpr 8: rows 4..16) + 4 (16) + 5 (32)
      // + 5 (64) + 4 (128) + 3 (256) + 2 (512) + 1 (1024) = 27, x 3 splits x 2 grids
      {KernelKind::Reduction, true, 162, "27 thread shapes x 3 split_reduction x 2 grids"},
      {KernelKind::Matmul, true, 1458, "3 block_m x 3 block_n x 3 block_k x 3 warps x 3 stages x 2 group_m x 3 split_k"},
      {KernelKind::Gather, true, 4, "4 blocks"},
      {KernelKind::Pointwise, false, 30, "6 host_vector x 5 host_interleave"},
      {KernelKind::Reduction, false, 30, "6 host_vector x 5 host_interleave"},
      {KernelKind::Matmul, false, 150, "5 host_tile_n x 6 host_vector x 5 host_interleave"},
      {KernelKind::Gather, false, 30, "6 host_vector x 5 host_interleave"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(kernel_kind_name(c.kind)) + (c.gpu ? " gpu: " : " host: ") + c.why);
    TargetInfo t = c.gpu ? gpu("sm_90a") : host();
    EXPECT_EQ(config_space(problem_of(c.kind), t).size(), c.size);
  }
  // The real host target gives the same host spaces (they do not depend on SIMD width).
  EXPECT_EQ(config_space(problem_of(KernelKind::Matmul), host_target_info()).size(), 150u);
}

TEST(SpaceTest, NoDuplicateConfigTextInAnySpace) {
  std::vector<TargetInfo> targets = {gpu("sm_75"), gpu("sm_80"), gpu("sm_86"), gpu("sm_90"), gpu("sm_100"),
                                     host(16), host(64), host_target_info()};
  for (const TargetInfo& t : targets)
    for (KernelKind k : kKinds) {
      SCOPED_TRACE(t.name + " " + std::string(kernel_kind_name(k)));
      std::vector<KernelConfig> space = config_space(problem_of(k), t);
      ASSERT_FALSE(space.empty());
      std::set<std::string> seen;
      for (const KernelConfig& c : space)
        EXPECT_TRUE(seen.insert(config_str(k, t.kind, c)).second) << "duplicate: " << config_str(k, t.kind, c);
    }
}

TEST(SpaceTest, SpacesAreDeterministic) {
  for (KernelKind k : kKinds) {
    EXPECT_EQ(config_space(problem_of(k), gpu("sm_90")), config_space(problem_of(k), gpu("sm_90")));
    EXPECT_EQ(config_space(problem_of(k), host()), config_space(problem_of(k), host()));
  }
}

TEST(SpaceTest, PersistentGridIsSmsTimesBlocksByThreads) {
  // Hand-computed: SMs x min(blocks/SM, threads/SM / block).
  struct Case {
    const char* arch;
    int block;
    int max_blocks;
  };
  const Case cases[] = {
      {"sm_90", 128, 132 * 16},   // 2048 / 128 = 16
      {"sm_90", 256, 132 * 8},    // 2048 / 256 = 8
      {"sm_90", 1024, 132 * 2},   // 2048 / 1024 = 2
      {"sm_80", 512, 108 * 4},    // 2048 / 512 = 4
      {"sm_86", 512, 84 * 3},     // 1536 / 512 = 3
      {"sm_86", 1024, 84 * 1},    // 1536 / 1024 = 1
      {"sm_75", 1024, 40 * 1},    // 1024 / 1024 = 1
      {"sm_75", 128, 40 * 8},     // 1024 / 128 = 8
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.arch) + " block " + std::to_string(c.block));
    TargetInfo t = gpu(c.arch);
    int found = 0;
    for (const KernelConfig& k : config_space(pointwise(1 << 24), t)) {
      if (k.block != c.block) continue;
      if (k.grid_stride) {
        EXPECT_EQ(k.max_blocks, c.max_blocks);
        ++found;
      } else {
        EXPECT_EQ(k.max_blocks, KernelConfig{}.max_blocks) << "a one-shot grid keeps the default cap";
      }
    }
    EXPECT_EQ(found, 12) << "4 vectors x 3 elems_per_thread persistent configs per block";
  }
  // Reduction: the threads of a block are threads_per_row x rows_per_block; 32 threads
  // on sm_90 are capped by the 32 blocks/SM limit, not 2048 / 32 = 64.
  TargetInfo h100 = gpu("sm_90");
  for (const KernelConfig& k : config_space(reduction(1 << 16, 1024), h100)) {
    if (!k.grid_stride) continue;
    int threads = k.threads_per_row * k.rows_per_block;
    int per_sm = std::min(32, 2048 / threads);
    EXPECT_EQ(k.max_blocks, 132 * per_sm) << config_str(KernelKind::Reduction, ConfigTarget::Gpu, k);
    // The same count blocks_per_sm gives by threads alone (no registers, no shared memory).
    EXPECT_EQ(k.max_blocks, 132 * blocks_per_sm(h100, threads, 0, 0));
  }
}

// ---------------------------------------------------------------------------------
// Rule pruning

KernelConfig pw_cfg(int block, int vector, int ept, bool grid_stride, int max_blocks = 4096) {
  KernelConfig c;
  c.block = block;
  c.vector = vector;
  c.elems_per_thread = ept;
  c.grid_stride = grid_stride;
  c.max_blocks = max_blocks;
  return c;
}

KernelConfig red_cfg(int tpr, int rows, bool grid_stride, int max_blocks = 4096) {
  KernelConfig c;
  c.threads_per_row = tpr;
  c.rows_per_block = rows;
  c.grid_stride = grid_stride;
  c.max_blocks = max_blocks;
  return c;
}

KernelConfig host_cfg(int vector, int interleave, int tile_n = 0) {
  KernelConfig c;
  c.host_vector = vector;
  c.host_interleave = interleave;
  c.host_tile_n = tile_n;
  return c;
}

TEST(SpaceTest, RuleRejectTable) {
  struct Case {
    const char* name;
    TuneProblem p;
    TargetInfo t;
    KernelConfig c;
    std::string reason;  // "" = must pass
  };
  const TargetInfo h100 = gpu("sm_90");
  const Case cases[] = {
      // --- GPU pointwise
      {"vector 8 x f32 is 32 bytes", pointwise(1 << 24), h100, pw_cfg(256, 8, 1, false),
       "vector 8 x 4 bytes exceeds one 16-byte load"},
      {"vector 8 x f16 is one 16-byte load", pointwise(1 << 24, 2), h100, pw_cfg(256, 8, 1, false), ""},
      {"vector 4 x f32", pointwise(1 << 24), h100, pw_cfg(256, 4, 1, false), ""},
      {"vector 4 x f64 is 32 bytes", pointwise(1 << 24, 8), h100, pw_cfg(256, 4, 1, false),
       "vector 4 x 8 bytes exceeds one 16-byte load"},
      // tile 128 x 4 = 512 > 2 x ceil_pow2(100) = 256
      {"tile 512 for 100 elements", pointwise(100), h100, pw_cfg(128, 4, 1, false),
       "a block covers 512 elements, over twice the 100 there are"},
      {"tile 128 for 100 elements (small tiles always pass)", pointwise(100), h100, pw_cfg(128, 1, 1, false), ""},
      // 256 x 4 = 1024 > 2 x 256 = 512; but 2 x ceil_pow2(257) = 1024 is not exceeded
      {"tile 1024 for 256 elements", pointwise(256), h100, pw_cfg(256, 4, 1, false),
       "a block covers 1024 elements, over twice the 256 there are"},
      {"tile 1024 for 257 elements", pointwise(257), h100, pw_cfg(256, 4, 1, false), ""},
      // 1056 blocks x 1024 elements = 1081344 >= 2^20
      {"persistent grid covers 2^20 in one pass", pointwise(1 << 20), h100, pw_cfg(256, 4, 1, true, 1056),
       "the persistent grid of 1056 blocks already covers the problem in one pass"},
      {"persistent grid loops over 2^24", pointwise(1 << 24), h100, pw_cfg(256, 4, 1, true, 1056), ""},
      // --- GPU reduction
      {"1024 threads for rows of 100", reduction(4096, 100), h100, red_cfg(1024, 1, false),
       "threads_per_row 1024 is over twice the row length 100"},
      {"32 threads for rows of 8 (one warp always passes)", reduction(4096, 8), h100, red_cfg(32, 1, false), ""},
      {"256 threads for rows of 128", reduction(4096, 128), h100, red_cfg(256, 1, false), ""},
      // 1024 rows / 16 = 64 blocks < 132 SMs
      {"16 rows a block leaves SMs idle", reduction(1024, 1024), h100, red_cfg(64, 16, false),
       "rows_per_block 16 leaves 64 blocks for 132 SMs"},
      {"16 rows a block of a problem smaller than the SMs", reduction(100, 1024), h100, red_cfg(64, 16, false), ""},
      {"persistent grid covers 1000 rows", reduction(1000, 1024), h100, red_cfg(256, 1, true, 1056),
       "the persistent grid of 1056 blocks already covers the rows in one pass"},
      {"persistent grid loops over 2^20 rows", reduction(1 << 20, 1024), h100, red_cfg(256, 1, true, 1056), ""},
      // --- GPU matmul
      {"block_m 128 for M = 16", matmul(16, 4096, 4096), h100, mm_cfg(128, 64, 16, 4, 1),
       "block_m 128 is over twice M = 16"},
      {"block_m 32 for M = 16", matmul(16, 4096, 4096), h100, mm_cfg(32, 64, 16, 4, 1), ""},
      {"block_n 64 for N = 16", matmul(4096, 16, 4096), h100, mm_cfg(64, 64, 16, 4, 8),
       "block_n 64 is over twice N = 16"},
      {"block_k 16 for K = 4", matmul(4096, 4096, 4), h100, mm_cfg(64, 64, 16, 4, 8),
       "block_k 16 is over twice K = 4"},
      {"block_k 8 for K = 4", matmul(4096, 4096, 4), h100, mm_cfg(64, 64, 8, 4, 8), ""},
      // 16 x 16 = 256 outputs < 2 x 256 threads
      {"16x16 tile for 8 warps", matmul(4096, 4096, 4096), h100, mm_cfg(16, 16, 16, 8, 8),
       "16x16 tile has fewer than 2 outputs per thread for 256 threads"},
      // 128 x 128 / 64 threads = 256 outputs per thread
      {"128x128 tile for 2 warps", matmul(4096, 4096, 4096), h100, mm_cfg(128, 128, 16, 2, 8),
       "256 outputs per thread need more than 255 registers"},
      {"128x128 tile for 4 warps (128 outputs each)", matmul(4096, 4096, 4096), h100, mm_cfg(128, 128, 16, 4, 8),
       ""},
      {"group_m 8 with one tile row", matmul(64, 4096, 4096), h100, mm_cfg(64, 64, 16, 4, 8),
       "group_m 8 swizzles nothing with one row of tiles"},
      {"group_m 8 with two tile rows", matmul(65, 4096, 4096), h100, mm_cfg(64, 64, 16, 4, 8), ""},
      {"group_m 1 with one tile row", matmul(64, 4096, 4096), h100, mm_cfg(64, 64, 16, 4, 1), ""},
      // --- gather: no rules
      {"gather", gather(10), h100, pw_cfg(1024, 4, 1, true, 1), ""},
      // --- host
      {"host_vector 16 x f64 is four AVX2 registers", pointwise(1 << 20, 8), host(32), host_cfg(16, 0),
       "host_vector 16 x 8 bytes exceeds two 32-byte SIMD registers"},
      {"host_vector 16 x f32 is two AVX2 registers", pointwise(1 << 20, 4), host(32), host_cfg(16, 0), ""},
      {"host_vector 16 x f32 is four SSE registers", pointwise(1 << 20, 4), host(16), host_cfg(16, 4),
       "host_vector 16 x 4 bytes exceeds two 16-byte SIMD registers"},
      {"host_vector 0 is LLVM's choice", pointwise(1 << 20, 8), host(16), host_cfg(0, 8), ""},
      // 2 x ceil_pow2(20) = 64
      {"host_tile_n 128 for N = 20", matmul(256, 20, 256), host(32), host_cfg(8, 2, 128),
       "host_tile_n 128 is over twice N = 20"},
      {"host_tile_n 64 for N = 20", matmul(256, 20, 256), host(32), host_cfg(8, 2, 64), ""},
      {"host_tile_n 16 for N = 4 (16 always passes)", matmul(256, 4, 256), host(32), host_cfg(8, 2, 16), ""},
      {"host_tile_n is not a pointwise knob", pointwise(4), host(32), host_cfg(8, 2, 256), ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::optional<std::string> why = rule_reject(c.p, c.c, c.t);
    if (c.reason.empty())
      EXPECT_EQ(why, std::nullopt);
    else
      EXPECT_EQ(why.value_or("(passed)"), c.reason);
  }
}

TEST(SpaceTest, RulesKeepSomeOfEverySpace) {
  // A large problem of each kind keeps most of its space; none may lose all of it.
  for (KernelKind k : kKinds)
    for (const TargetInfo& t : {gpu("sm_90"), gpu("sm_80"), host()}) {
      SCOPED_TRACE(t.name + " " + std::string(kernel_kind_name(k)));
      TuneProblem p = k == KernelKind::Matmul      ? matmul(4096, 4096, 4096)
                      : k == KernelKind::Reduction ? reduction(1 << 16, 4096)
                                                   : pointwise(int64_t{1} << 28);
      p.kind = k;
      size_t kept = 0;
      std::vector<KernelConfig> space = config_space(p, t);
      for (const KernelConfig& c : space) kept += !rule_reject(p, c, t);
      EXPECT_GT(kept, space.size() / 4);
    }
}

// ---------------------------------------------------------------------------------
// Targets and occupancy

TEST(TargetTest, BlocksPerSmFollowsCudaOccupancyRules) {
  struct Case {
    const char* arch;
    int threads, regs;
    int64_t shared;
    int blocks;
    const char* why;
  };
  const Case cases[] = {
      {"sm_90", 256, 32, 0, 8, "threads: 2048 / 256 (regs: 65536 / (1024 x 8 warps) = 8 too)"},
      {"sm_90", 256, 128, 0, 2, "regs: 128 x 32 = 4096 a warp, x 8 warps = 32768; 65536 / 32768"},
      {"sm_90", 256, 33, 0, 6, "regs: 33 x 32 = 1056 rounds up to 1280 a warp; 65536 / 10240"},
      {"sm_90", 96, 40, 0, 17, "regs: 1280 a warp x 3 warps = 3840; 65536 / 3840 = 17 < 2048 / 96 = 21"},
      {"sm_90", 128, 255, 0, 2, "regs: 255 x 32 = 8160 rounds to 8192 a warp, x 4 warps; 65536 / 32768"},
      {"sm_90", 1024, 64, 0, 1, "regs: 2048 a warp x 32 warps = 65536"},
      {"sm_90", 1024, 65, 0, 0, "regs: 65 x 32 rounds to 2304 a warp x 32 warps > 65536"},
      {"sm_90", 256, 256, 0, 0, "256 registers a thread is over the 255 limit"},
      {"sm_90", 32, 16, 0, 32, "the 32 blocks/SM limit (threads allow 64)"},
      {"sm_90", 256, 32, 100 * 1024, 2, "shared: 228 KiB / (100 + 1 reserved) KiB = 2"},
      {"sm_80", 256, 32, 100 * 1024, 1, "shared: 164 KiB / 101 KiB = 1"},
      {"sm_90", 128, 32, 45 * 1024, 4, "shared: 228 / (45 + 1) = 4.96; without the driver's 1 KiB it would be 5"},
      {"sm_80", 128, 32, 32 * 1024, 4, "shared: 164 / (32 + 1) = 4.97; without the driver's 1 KiB it would be 5"},
      {"sm_90", 256, 32, 227 * 1024, 1, "shared: the opt-in maximum, 227 + 1 KiB = 228 KiB"},
      {"sm_90", 256, 32, 227 * 1024 + 1, 0, "shared: over the per-block maximum"},
      {"sm_80", 256, 32, 164 * 1024, 0, "shared: over sm_80's 163 KiB per block"},
      {"sm_86", 1024, 32, 0, 1, "threads: 1536 / 1024"},
      {"sm_86", 512, 32, 0, 3, "threads: 1536 / 512"},
      {"sm_89", 128, 32, 0, 12, "threads: 1536 / 128 = 12 < 24 blocks"},
      {"sm_75", 1024, 32, 0, 1, "threads: T4 has 1024 threads an SM"},
      {"sm_75", 64, 32, 0, 16, "the 16 blocks/SM limit of sm_75"},
      {"sm_90", 33, 32, 0, 32, "33 threads take 2 warps: 2048 / 64 = 32"},
      {"sm_90", 1025, 32, 0, 0, "over 1024 threads a block"},
      {"sm_90", 0, 32, 0, 0, "no threads"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.arch) + ": " + std::to_string(c.threads) + " threads x " + std::to_string(c.regs) +
                 " regs, " + std::to_string(c.shared) + " bytes shared: " + c.why);
    EXPECT_EQ(blocks_per_sm(gpu(c.arch), c.threads, c.regs, c.shared), c.blocks);
  }
}

TEST(TargetTest, GpuTargetInfoKnownArchs) {
  TargetInfo a100 = gpu("sm_80");
  EXPECT_EQ(a100.name, "sm_80");
  EXPECT_EQ(a100.kind, ConfigTarget::Gpu);
  EXPECT_EQ(a100.sms, 108);
  EXPECT_EQ(a100.shared_bytes, 164 * 1024);
  EXPECT_EQ(a100.max_shared_per_block, 163 * 1024);
  EXPECT_DOUBLE_EQ(a100.dram_gbps, 2039);

  TargetInfo h100 = gpu("sm_90");
  EXPECT_EQ(h100.sms, 132);
  EXPECT_EQ(h100.max_threads, 2048);
  EXPECT_EQ(h100.max_blocks, 32);
  EXPECT_EQ(h100.shared_bytes, 228 * 1024);

  // sm_90a is the same silicon: every limit and rate equal, only the name differs.
  TargetInfo h100a = gpu("sm_90a");
  EXPECT_EQ(h100a.name, "sm_90a");
  h100a.name = h100.name;
  EXPECT_EQ(h100a.model, h100.model);
  EXPECT_EQ(h100a.sms, h100.sms);
  EXPECT_EQ(h100a.max_threads, h100.max_threads);
  EXPECT_EQ(h100a.max_blocks, h100.max_blocks);
  EXPECT_EQ(h100a.registers, h100.registers);
  EXPECT_EQ(h100a.shared_bytes, h100.shared_bytes);
  EXPECT_EQ(h100a.max_shared_per_block, h100.max_shared_per_block);
  EXPECT_DOUBLE_EQ(h100a.dram_gbps, h100.dram_gbps);
  EXPECT_DOUBLE_EQ(h100a.fp32_gflops, h100.fp32_gflops);
  EXPECT_EQ(gpu("sm_100a").sms, gpu("sm_100").sms);

  for (const char* arch : {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"}) EXPECT_TRUE(gpu_target_info(arch).ok()) << arch;
}

TEST(TargetTest, GpuTargetInfoUnknownArchListsKnown) {
  for (const char* arch : {"sm_42", "sm_9", "", "compute_90", "sm_900"}) {
    SCOPED_TRACE(arch);
    Result<TargetInfo> t = gpu_target_info(arch);
    ASSERT_FALSE(t.ok());
    const std::string& msg = t.error().message;
    EXPECT_NE(msg.find("'" + std::string(arch) + "'"), std::string::npos) << msg;
    for (const char* known : {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"})
      EXPECT_NE(msg.find(known), std::string::npos) << known << " missing from: " << msg;
  }
}

TEST(TargetTest, HostTargetInfo) {
  const TargetInfo& h = host_target_info();
  EXPECT_EQ(&h, &host_target_info()) << "computed once per process";
  EXPECT_EQ(h.kind, ConfigTarget::Host);
  EXPECT_EQ(h.name, "host");
  EXPECT_FALSE(h.model.empty());
  EXPECT_TRUE(h.simd_bytes == 16 || h.simd_bytes == 32 || h.simd_bytes == 64) << h.simd_bytes;
  EXPECT_EQ(h.sms, 1);
  EXPECT_GT(h.fp32_gflops, 0);
  EXPECT_GT(h.dram_gbps, 0);
  EXPECT_GT(h.l1_bytes, 0);
}

// ---------------------------------------------------------------------------------
// Cost model

TEST(CostModelTest, MatmulSmallTileSlowerOnLargeProblem) {
  // 16x16 tiles reload A and B panels 4x as often as 64x64 and hold 2 outputs a
  // thread (few FMAs per shared-memory load): the model must rank them well behind.
  TuneProblem p = matmul(4096, 4096, 4096);
  TargetInfo t = gpu("sm_90");
  double small = predict_us(p, mm_cfg(16, 16, 16, 4, 8), t, BuildResult{});
  double big = predict_us(p, mm_cfg(64, 64, 16, 4, 8), t, BuildResult{});
  EXPECT_GT(small, 2 * big) << small << " vs " << big;
  // And 64x64 is not absurd: 2 x 4096^3 flops at 67 TFLOP/s is ~2050 us.
  EXPECT_GT(big, 2000);
  EXPECT_LT(big, 20000);
  // A single stage waits on global loads every K step.
  KernelConfig one_stage = mm_cfg(64, 64, 16, 4, 8);
  one_stage.stages = 1;
  EXPECT_GT(predict_us(p, one_stage, t, BuildResult{}), big);
}

// Tensor-core tiles are in the GPU matmul space for 16-bit operands (whatever the
// output dtype) and for f32 ones under --allow-tf32 (TuneProblem::tf32), not for exact
// f32; sm_90a's default wgmma tile (128 x 256 x 64, 8 warps, 4 stages) is among them.
TEST(SpaceTest, TensorCoreTilesForSixteenBitAndTf32Matmuls) {
  TargetInfo t = gpu("sm_90a");
  auto has = [&](const TuneProblem& p, int bm, int bn, int bk, int warps, int stages) {
    for (const KernelConfig& c : config_space(p, t))
      if (c.block_m == bm && c.block_n == bn && c.block_k == bk && c.warps == warps && c.stages == stages && c.split_k == 1)
        return true;
    return false;
  };
  TuneProblem f32 = matmul(4096, 4096, 4096);
  EXPECT_FALSE(has(f32, 128, 256, 64, 8, 4));
  TuneProblem bf16_out_f32 = f32;
  bf16_out_f32.operand_bytes = 2;  // a bf16 matmul whose epilogue casts to f32: elem_bytes stays 4
  EXPECT_TRUE(has(bf16_out_f32, 128, 256, 64, 8, 4));
  TuneProblem tf32 = f32;
  tf32.tf32 = true;
  EXPECT_TRUE(has(tf32, 128, 256, 32, 8, 4));
}

// The tensor-core tiles ahead of the SIMT space's 1458 (docs/autotuning.md): 3 x 3
// tiles x 2 block_k x 2 warps x 4 stages, each with split-K 1, 2 and 4: 432 on sm_80;
// on sm_90a the 3+ stage ones also warp-specialised, plain and persistent (x3 splits),
// and the persistent 8-warp unsplit ones also ping-pong: 1134; the persistent 8-warp
// ones with 128 accumulators a consumer thread also setmaxnreg=232 (128 x 256 and
// 256 x 128 cooperative with 3 splits, 64 x 256, 128 x 128 and 256 x 64 ping-pong,
// each x 2 block_k x 3 stages): 54 more; and those 54 again with tma_store=1.
TEST(SpaceTest, TensorCoreSpaceSizes) {
  TuneProblem bf16 = matmul(4096, 4096, 4096);
  bf16.operand_bytes = 2;
  bf16.elem_bytes = 2;
  EXPECT_EQ(config_space(bf16, gpu("sm_80")).size(), 1458u + 432u);
  EXPECT_EQ(config_space(bf16, gpu("sm_90a")).size(), 1458u + 1188u + 54u + 60u + 108u);
  int stores = 0, along_m = 0, along_n = 0, tile_m = 0;
  for (const KernelConfig& c : config_space(bf16, gpu("sm_90a"))) {
    if (c.tma_store) {
      ++stores;
      EXPECT_EQ(c.setmaxnreg, 232);
    }
    if (c.cluster_m * c.cluster_n > 1) {
      EXPECT_EQ(c.tma_store, 0);
      EXPECT_EQ(c.cluster_m * c.cluster_n, 2);
      EXPECT_EQ(c.warp_specialize, 1);
      EXPECT_EQ(c.split_k, 1);
      if (c.persistent > 0) {
        EXPECT_EQ(c.setmaxnreg, 232);
      }
      (c.cluster_m > 1 ? c.persistent > 0 ? along_m : tile_m : along_n)++;
    }
  }
  EXPECT_EQ(stores, 54);
  EXPECT_EQ(along_m, 30);  // beside each setmaxnreg=232 config without split-K, one along M, one along N
  EXPECT_EQ(along_n, 30);
  EXPECT_EQ(tile_m, 108);  // beside each warp-specialised one-block-a-tile config, along M
  for (const KernelConfig& c : config_space(bf16, gpu("sm_80"))) EXPECT_EQ(c.cluster_m * c.cluster_n, 1);
}

// Persistent tensor-core configs: on sm_90a the warp-specialised ones also come with a
// persistent grid of the SMs times the blocks one SM's shared memory holds (128 x 256
// x 64, 4 bf16 stages: 192 KiB, one block on each of 132 SMs; 64 x 64 x 64, 3 stages:
// 48 KiB, four); never without warp specialisation, never on sm_80.
TEST(SpaceTest, PersistentWarpSpecialisedTensorCoreConfigs) {
  TuneProblem bf16 = matmul(4096, 4096, 4096);
  bf16.operand_bytes = 2;
  bf16.elem_bytes = 2;
  auto grid = [&](const std::string& arch, int bm, int bn, int bk, int stages) {
    int found = -1;
    for (const KernelConfig& c : config_space(bf16, gpu(arch))) {
      EXPECT_TRUE(c.persistent == 0 || c.warp_specialize == 1) << arch;
      if (c.block_m == bm && c.block_n == bn && c.block_k == bk && c.stages == stages && c.persistent > 0) found = c.persistent;
    }
    return found;
  };
  EXPECT_EQ(grid("sm_90a", 128, 256, 64, 4), 132);
  EXPECT_EQ(grid("sm_90a", 64, 64, 64, 3), 4 * 132);
  EXPECT_EQ(grid("sm_80", 128, 256, 64, 4), -1);
  // Ping-pong: only persistent, warp-specialised, 8 warps (two consumer warpgroups),
  // on sm_90a; 64 x 256 x 64 with 4 stages (160 KiB) among them, one block an SM.
  int pingpong = 0;
  bool found = false;
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (const KernelConfig& c : config_space(bf16, gpu(arch))) {
      if (!c.pingpong) continue;
      ++pingpong;
      EXPECT_EQ(arch, "sm_90a");
      EXPECT_TRUE(c.persistent > 0 && c.warp_specialize == 1 && c.warps == 8 && c.split_k == 1);
      if (c.block_m == 64 && c.block_n == 256 && c.block_k == 64 && c.stages == 4) found = c.persistent == 132;
    }
  EXPECT_GT(pingpong, 0);
  EXPECT_TRUE(found);
  // Register reallocation: setmaxnreg=232 beside the persistent 8-warp configs whose
  // consumer threads hold 128 accumulators (128 x 256 cooperative: 64 x 256 a
  // warpgroup; 128 x 128 ping-pong: the whole tile), nowhere else.
  int realloc = 0;
  bool coop = false, pp = false;
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (const KernelConfig& c : config_space(bf16, gpu(arch))) {
      if (!c.setmaxnreg) continue;
      ++realloc;
      EXPECT_EQ(arch, "sm_90a");
      EXPECT_EQ(c.setmaxnreg, 232);
      EXPECT_TRUE(c.persistent > 0 && c.warp_specialize == 1 && c.warps == 8);
      EXPECT_EQ((c.pingpong ? c.block_m : c.block_m / 2) * c.block_n, 128 * 128) << c.block_m << "x" << c.block_n;
      if (c.block_m == 128 && c.block_n == 256 && c.block_k == 64 && c.stages == 4 && !c.pingpong) coop = true;
      if (c.block_m == 128 && c.block_n == 128 && c.stages == 4 && c.pingpong) pp = true;
    }
  EXPECT_GT(realloc, 0);
  EXPECT_TRUE(coop);
  EXPECT_TRUE(pp);
}

// Split-K on the tensor cores: a matmul whose output tiles leave most SMs idle (a
// 256 x 256 output, K = 8192) gets tensor-core split-K configs that pass the rules,
// bare TF32 (adding into its output) and bf16 with an epilogue (summing in a
// workspace) alike; at 4096 x 4096 the tiles fill the SMs and none passes; exact f32
// has no tensor-core tiles (its SIMT configs split too, but none is 4-stage).
TEST(SpaceTest, SplitKTensorCoreConfigs) {
  TargetInfo t = gpu("sm_90a");
  auto splits = [&](const TuneProblem& p) {
    int n = 0;
    for (const KernelConfig& c : config_space(p, t))
      // 4 stages and block_k 64: tensor-core tiles, not the SIMT space's.
      if (c.split_k > 1 && c.block_k == 64 && c.stages == 4 && !rule_reject(p, c, t)) ++n;
    return n;
  };
  TuneProblem tf32 = matmul(256, 256, 8192);
  tf32.tf32 = true;
  tf32.bare = true;
  EXPECT_GT(splits(tf32), 0);
  TuneProblem bf16 = tf32;
  bf16.tf32 = false;
  bf16.bare = false;
  bf16.operand_bytes = 2;
  bf16.elem_bytes = 2;
  EXPECT_GT(splits(bf16), 0);
  TuneProblem big = bf16;
  big.m = big.n = 4096;
  EXPECT_EQ(splits(big), 0);
  TuneProblem f32_epi = tf32;
  f32_epi.tf32 = false;
  f32_epi.bare = false;
  EXPECT_EQ(splits(f32_epi), 0);
}

TEST(CostModelTest, OccupancyMattersForMemoryBoundPointwise) {
  TuneProblem p = pointwise(int64_t{64} << 20);
  TargetInfo t = gpu("sm_90");
  KernelConfig c = pw_cfg(256, 4, 1, false);
  BuildResult eight, one;
  eight.resources = KernelResources{};
  eight.resources->registers = 32;
  one.resources = KernelResources{};
  one.resources->registers = 255;  // 8192 a warp x 8 warps = 65536: one block
  ASSERT_EQ(blocks_per_sm(t, 256, 32, 0), 8);
  ASSERT_EQ(blocks_per_sm(t, 256, 255, 0), 1);
  double slow = predict_us(p, c, t, one), fast = predict_us(p, c, t, eight);
  EXPECT_GT(slow, 1.5 * fast) << slow << " vs " << fast;
  // 512 MiB at 3350 GB/s is ~160 us: with full occupancy the model is near the roofline.
  EXPECT_GT(fast, 150);
  EXPECT_LT(fast, 250);
}

// A reduction the emitter builds in its multi-pass form reads each row once per pass
// (BuildResult::row_reads, from reduction_info): priced about that many times the
// bytes of the form that holds rows in registers.
TEST(CostModelTest, MultiPassReductionsPayForEveryPass) {
  TuneProblem p = reduction(4096, 8192);
  TargetInfo t = gpu("sm_90a");
  KernelConfig c;
  c.threads_per_row = 256;
  c.grid_stride = false;
  BuildResult once, thrice;
  once.threads_per_block = thrice.threads_per_block = 256;
  thrice.row_reads = 3;
  double a = predict_us(p, c, t, once), b = predict_us(p, c, t, thrice);
  EXPECT_GT(b, 2.5 * a) << a << " vs " << b;
  EXPECT_LT(b, 3.2 * a) << a << " vs " << b;
}

TEST(CostModelTest, WaveQuantisation) {
  // One block an SM (shared memory), same bytes per block: SMs + 1 blocks take two
  // waves, the second with one busy SM, so about twice the time of SMs blocks.
  TargetInfo t = gpu("sm_90");
  const int64_t per_block = int64_t{4} << 20;
  BuildResult b;
  b.resources = KernelResources{};
  b.resources->registers = 32;
  b.resources->shared_bytes = 150 * 1024;
  b.threads_per_block = 256;
  ASSERT_EQ(blocks_per_sm(t, 256, 32, 150 * 1024), 1);
  auto predict = [&](int64_t grid) {
    TuneProblem p = pointwise(grid * per_block / 8);
    p.bytes = grid * per_block;
    b.grid_blocks = grid;
    return predict_us(p, pw_cfg(256, 4, 1, false), t, b);
  };
  double full = predict(t.sms), tail = predict(t.sms + 1);
  EXPECT_NEAR(tail / full, 2.0, 0.1) << tail << " vs " << full;
  // Two full waves cost the same as SMs + 1 blocks.
  EXPECT_NEAR(predict(2 * t.sms) / tail, 1.0, 0.05);
}

TEST(CostModelTest, PointwiseRanksWiderVectorsAndMoreElementsPerThreadFirst) {
  // bf16 bias + GELU at 16384 x 4096 (two inputs): enough bytes are in flight for
  // every config below, so the memory term ties them; what tune --measure found on an
  // H200 (tune-h200-run7: vector 8 85 us, 4 102, 2 with 4/2/1 elements 108/110/120,
  // 1 153) is the issue slots of the loads, stores and loop. The model keeps that
  // order, and puts more elements per thread ahead at one vector width.
  TargetInfo t = gpu("sm_90a");
  TuneProblem p = pointwise(int64_t{16384} * 4096, 2);
  p.num_inputs = 2;
  p.bytes = 3 * p.n * 2;
  auto us = [&](int vector, int ept) { return predict_us(p, pw_cfg(256, vector, ept, false), t, BuildResult{}); };
  EXPECT_LT(us(8, 1), us(4, 1));
  EXPECT_LT(us(4, 1), us(2, 4));
  EXPECT_LT(us(2, 4), us(2, 2));
  EXPECT_LT(us(2, 2), us(2, 1));
  EXPECT_LT(us(2, 1), us(1, 4));
  EXPECT_LT(us(8, 2), us(8, 1));
}

TEST(CostModelTest, HostVectorWidth) {
  // Compute-bound f32: 2^30 flops over 2^20 elements, 8 MiB of traffic.
  TuneProblem p = pointwise(1 << 20);
  p.flops = int64_t{1} << 30;
  p.bytes = 8 << 20;
  for (const TargetInfo& t : {host(32), host(64), host_target_info()}) {
    SCOPED_TRACE(t.name + " simd " + std::to_string(t.simd_bytes));
    double scalar = predict_us(p, host_cfg(1, 0), t, BuildResult{});
    double v8 = predict_us(p, host_cfg(8, 0), t, BuildResult{});
    // 8 lanes do 8x the work of one per instruction where a register holds 8 f32
    // (AVX2, AVX-512); SSE's 4 lanes split a width of 8 into two instructions.
    EXPECT_GT(scalar, (t.simd_bytes >= 32 ? 4 : 2) * v8) << scalar << " vs " << v8;
    // A full register of f32 lanes beats half of one.
    const int lanes = t.simd_bytes / 4;
    EXPECT_LT(predict_us(p, host_cfg(lanes, 0), t, BuildResult{}), predict_us(p, host_cfg(lanes / 2, 0), t, BuildResult{}));
  }
}

TEST(CostModelTest, HostReductionNeedsVectorHint) {
  // An f32 sum: LLVM keeps FP adds in order unless the loop is hinted, so the
  // default (0, 0) is one scalar chain bound by the add latency; 8 lanes x 4
  // chains is limited by memory instead.
  TuneProblem p = reduction(1024, 4096);
  for (const TargetInfo& t : {host(32), host(64)}) {
    double dflt = predict_us(p, host_cfg(0, 0), t, BuildResult{});
    double vec = predict_us(p, host_cfg(8, 4), t, BuildResult{});
    EXPECT_GT(dflt, 2 * vec) << t.simd_bytes << ": " << dflt << " vs " << vec;
  }
}

TEST(CostModelTest, HostMatmulTileRanking) {
  // A column tile narrower than one vector body (host_vector x host_interleave = 64
  // elements here) runs in the scalar remainder, and A is re-read N / tile times.
  TuneProblem p = matmul(1024, 1024, 1024);
  TargetInfo t = host(64);
  double t16 = predict_us(p, host_cfg(16, 4, 16), t, BuildResult{});
  double t64 = predict_us(p, host_cfg(16, 4, 64), t, BuildResult{});
  EXPECT_GT(t16, 1.5 * t64) << t16 << " vs " << t64;
}

TEST(CostModelTest, ResourceReject) {
  TuneProblem p = pointwise(1 << 24);
  TargetInfo t = gpu("sm_90");
  KernelConfig c = pw_cfg(256, 4, 1, false);
  BuildResult ok;
  ok.resources = KernelResources{};
  ok.resources->registers = 64;
  EXPECT_EQ(resource_reject(p, c, t, ok), std::nullopt);
  EXPECT_EQ(resource_reject(p, c, t, BuildResult{}), std::nullopt) << "no ptxas report: assume it fits";

  BuildResult regs = ok;
  regs.resources->registers = 256;
  std::optional<std::string> why = resource_reject(p, c, t, regs);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("no block fits"), std::string::npos) << *why;
  EXPECT_NE(why->find("256 registers"), std::string::npos) << *why;

  BuildResult smem = ok;
  smem.resources->shared_bytes = 200 * 1024;
  smem.dynamic_shared_bytes = 100 * 1024;  // 300 KiB in all
  why = resource_reject(p, c, t, smem);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("no block fits"), std::string::npos) << *why;
  EXPECT_NE(why->find(std::to_string(300 * 1024) + " bytes of shared memory"), std::string::npos) << *why;

  // The launch's threads, not the config's block, decide.
  BuildResult wide = ok;
  wide.threads_per_block = 1024;
  wide.resources->registers = 128;  // 4096 a warp x 32 warps = 131072 > 65536
  why = resource_reject(p, c, t, wide);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("1024 threads"), std::string::npos) << *why;

  EXPECT_EQ(resource_reject(p, host_cfg(8, 2), host(), regs), std::nullopt) << "hosts have no occupancy";

  // A register reallocation ptxas dropped (C7508) is refused with ptxas's words; the
  // note does not matter to a config without setmaxnreg.
  BuildResult dropped = ok;
  dropped.resources->notes = {"(C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register "
                              "count at entry."};
  KernelConfig realloc = c;
  realloc.setmaxnreg = 232;
  why = resource_reject(p, realloc, t, dropped);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rfind("ptxas: (C7508)", 0), 0u) << *why;
  EXPECT_EQ(resource_reject(p, c, t, dropped), std::nullopt);
  EXPECT_EQ(resource_reject(p, realloc, t, ok), std::nullopt);
}

TEST(CostModelTest, PredictionsAreFinitePositiveOnEverySpace) {
  for (const TargetInfo& t : {gpu("sm_75"), gpu("sm_90"), host(32), host_target_info()})
    for (KernelKind k : kKinds)
      for (const TuneProblem& p : {problem_of(k), k == KernelKind::Matmul ? matmul(1, 1, 1) : problem_of(k)}) {
        TuneProblem q = p;
        if (k == KernelKind::Reduction) q = reduction(1, 3);
        for (const KernelConfig& c : config_space(q, t)) {
          double us = predict_us(q, c, t, BuildResult{});
          ASSERT_TRUE(std::isfinite(us) && us > 0)
              << t.name << " " << kernel_kind_name(k) << " " << config_str(k, t.kind, c) << ": " << us;
        }
      }
}

}  // namespace autotune_space_test
}  // namespace sf

namespace sf {
namespace autotune_space_test {

// Split-K only where the output tiles leave SMs idle and it divides the K tiles into
// parts of two or more; any group (a bare f32 matmul adds into its output, any other
// sums in a workspace).
TEST(SpaceTest, SplitKRules) {
  TargetInfo t = gpu_target_info("sm_90a").value();
  TuneProblem p;
  p.kind = KernelKind::Matmul;
  p.m = 128;
  p.n = 128;
  p.k = 4096;
  p.bare = true;
  KernelConfig c;  // 64x64x16: 4 output tiles, 256 K tiles
  c.split_k = 4;
  EXPECT_FALSE(rule_reject(p, c, t)) << *rule_reject(p, c, t);
  p.bare = false;
  EXPECT_FALSE(rule_reject(p, c, t)) << *rule_reject(p, c, t);
  p.bare = true;
  p.m = p.n = 4096;  // 4096 tiles fill 132 SMs
  ASSERT_TRUE(rule_reject(p, c, t));
  EXPECT_NE(rule_reject(p, c, t)->find("already fill 132 SMs"), std::string::npos);
  p.m = p.n = 128;
  p.k = 96;  // 6 K tiles: 4 does not divide them
  ASSERT_TRUE(rule_reject(p, c, t));
  EXPECT_NE(rule_reject(p, c, t)->find("does not split 6 K tiles"), std::string::npos);
  c.split_k = 2;  // 3 tiles each
  EXPECT_FALSE(rule_reject(p, c, t));
}

}  // namespace autotune_space_test
}  // namespace sf

namespace sf {
namespace autotune_space_test {

// Split reduction only for a group of one pass with outputs per row (its shares meet
// in a workspace) whose rows leave SMs idle, with shares no shorter than a row's
// threads.
TEST(SpaceTest, SplitReductionRules) {
  TargetInfo t = gpu_target_info("sm_90a").value();
  TuneProblem p;
  p.kind = KernelKind::Reduction;
  p.rows = 4;
  p.cols = 1 << 20;
  p.splittable = true;
  p.elem_bytes = 4;
  p.num_inputs = 1;
  p.bytes = 4 * p.rows * p.cols;
  KernelConfig c;
  c.threads_per_row = 256;
  c.grid_stride = false;
  c.split_reduction = 64;
  EXPECT_FALSE(rule_reject(p, c, t)) << *rule_reject(p, c, t);
  p.splittable = false;  // softmax: two passes, an output per element
  ASSERT_TRUE(rule_reject(p, c, t));
  EXPECT_NE(rule_reject(p, c, t)->find("needs one pass over each row and outputs per row only"), std::string::npos);
  p.splittable = true;
  p.rows = 1000;  // 1000 row blocks fill 132 SMs
  ASSERT_TRUE(rule_reject(p, c, t));
  EXPECT_NE(rule_reject(p, c, t)->find("already fill 132 SMs"), std::string::npos);
  p.rows = 4;
  p.cols = 4096;  // shares of 64 elements for 256 threads
  ASSERT_TRUE(rule_reject(p, c, t));
  EXPECT_NE(rule_reject(p, c, t)->find("fewer than the 256 threads"), std::string::npos);
  // The model prefers splitting 4 long rows over 132 SMs to running them on 4.
  p.cols = 1 << 20;
  KernelConfig one = c;
  one.split_reduction = 1;
  BuildResult b;
  b.threads_per_block = 256;
  EXPECT_LT(predict_us(p, c, t, b), predict_us(p, one, t, b) / 4);
}

}  // namespace autotune_space_test
}  // namespace sf
