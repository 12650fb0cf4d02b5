#include "autotune/target.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

namespace sf {

namespace {

// name, model, SMs, threads/SM, blocks/SM, shared/SM, max shared/block, DRAM GB/s, FP32 GFLOP/s,
// dense f16/bf16 tensor-core GFLOP/s (f32 accumulation; 0: none), dense TF32 GFLOP/s.
// From NVIDIA's architecture whitepapers and datasheets (the CUDA C++ Programming
// Guide's "Technical Specifications per Compute Capability" table for the limits).
struct Row {
  const char* arch;
  const char* model;
  int sms, threads, blocks;
  int64_t smem_sm, smem_block;
  double gbps, gflops, tensor16, tf32;
};
constexpr Row kGpus[] = {
    {"sm_75", "NVIDIA T4", 40, 1024, 16, 64 * 1024, 64 * 1024, 320, 8100, 65000, 0},
    {"sm_80", "NVIDIA A100 (SXM, 80 GB)", 108, 2048, 32, 164 * 1024, 163 * 1024, 2039, 19500, 312000, 156000},
    {"sm_86", "NVIDIA A40", 84, 1536, 16, 100 * 1024, 99 * 1024, 696, 37400, 149700, 74800},
    {"sm_89", "NVIDIA L40S", 142, 1536, 24, 100 * 1024, 99 * 1024, 864, 91600, 362000, 183000},
    {"sm_90", "NVIDIA H100 (SXM)", 132, 2048, 32, 228 * 1024, 227 * 1024, 3350, 67000, 989000, 494000},
    {"sm_100", "NVIDIA B200", 148, 2048, 32, 228 * 1024, 227 * 1024, 8000, 80000, 2250000, 1100000},
};

std::string cpu_model_and_flags(std::string* flags) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model;
  while (std::getline(in, line)) {
    auto value = [&] {
      size_t c = line.find(':');
      return c == std::string::npos ? std::string() : line.substr(std::min(c + 2, line.size()));
    };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    if (flags->empty() && line.rfind("flags", 0) == 0) *flags = " " + value() + " ";
    if (!model.empty() && !flags->empty()) break;
  }
  return model.empty() ? "unknown CPU" : model;
}

}  // namespace

Result<TargetInfo> gpu_target_info(const std::string& arch) {
  // sm_90a / sm_100a run on the same silicon as sm_90 / sm_100.
  std::string base = arch;
  if (!base.empty() && (base.back() == 'a' || base.back() == 'f')) base.pop_back();
  for (const Row& r : kGpus) {
    if (base != r.arch) continue;
    TargetInfo t;
    t.name = arch;
    t.model = r.model;
    t.kind = ConfigTarget::Gpu;
    t.sms = r.sms;
    t.max_threads = r.threads;
    t.max_blocks = r.blocks;
    t.shared_bytes = r.smem_sm;
    t.max_shared_per_block = r.smem_block;
    t.dram_gbps = r.gbps;
    t.fp32_gflops = r.gflops;
    // Tensor cores for 16-bit operands from sm_80 on in shardfuse's kernels
    // (mma.sync m16n8k16); the T4's sm_75 units are not used.
    int sm = std::stoi(std::string(r.arch).substr(3));
    t.tensor16_gflops = sm >= 80 ? r.tensor16 : 0;
    t.tf32_gflops = sm >= 80 ? r.tf32 : 0;
    return t;
  }
  std::string known;
  for (const Row& r : kGpus) known += std::string(known.empty() ? "" : ", ") + r.arch;
  return Diag{"", {}, "no occupancy table for arch '" + arch + "' (known: " + known + ", with an optional 'a')"};
}

const TargetInfo& host_target_info() {
  static const TargetInfo info = [] {
    TargetInfo t;
    t.name = "host";
    t.kind = ConfigTarget::Host;
    t.tensor16_gflops = 0;
    t.tf32_gflops = 0;
    std::string flags;
    t.model = cpu_model_and_flags(&flags);
    t.simd_bytes = flags.find(" avx512f ") != std::string::npos ? 64
                   : flags.find(" avx2 ") != std::string::npos ? 32
                                                               : 16;
    auto cache = [](int name, int64_t fallback) {
      long v = sysconf(name);
      return v > 0 ? static_cast<int64_t>(v) : fallback;
    };
#ifdef _SC_LEVEL1_DCACHE_SIZE
    t.l1_bytes = cache(_SC_LEVEL1_DCACHE_SIZE, t.l1_bytes);
    t.l2_bytes = cache(_SC_LEVEL2_CACHE_SIZE, t.l2_bytes);
    t.llc_bytes = cache(_SC_LEVEL3_CACHE_SIZE, t.l2_bytes);
#endif
    // One core: kernels run in one thread. Conservative figures for a server core:
    // ~10 GB/s of streaming bandwidth, two FMA ports at 2.5 GHz.
    t.sms = 1;
    t.dram_gbps = 10;
    t.fp32_gflops = 2.0 * 2 * (t.simd_bytes / 4) * 2.5;
    t.launch_us = 0.05;
    return t;
  }();
  return info;
}

int blocks_per_sm(const TargetInfo& t, int threads, int regs, int64_t shared) {
  if (threads < 1 || threads > 1024 || regs > t.max_registers_per_thread || shared > t.max_shared_per_block) return 0;
  const int warps = (threads + 31) / 32;
  int by_threads = t.max_threads / (warps * 32);
  // Registers are allocated per warp, rounded up to the allocation unit.
  const int per_warp = std::max(1, (regs * 32 + t.register_alloc_unit - 1) / t.register_alloc_unit) * t.register_alloc_unit;
  int by_regs = regs > 0 ? t.registers / (per_warp * warps) : t.max_blocks;
  int by_smem = static_cast<int>(t.shared_bytes / (shared + t.reserved_shared_per_block));
  return std::max(0, std::min({t.max_blocks, by_threads, by_regs, by_smem}));
}

}  // namespace sf
