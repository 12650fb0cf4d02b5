// What the autotuner's pruning and cost model know of a target: occupancy limits
// and peak rates of a GPU arch, or the host CPU. Numbers are the vendors'
// published figures for the flagship part of each arch (docs/autotuning.md);
// they rank configs, they do not predict absolute times.
#pragma once

#include <cstdint>
#include <string>

#include "autotune/config.h"

namespace sf {

struct TargetInfo {
  std::string name;        // "sm_90a", or "host"
  std::string model;       // "NVIDIA H100 (SXM)", or the CPU's model name
  ConfigTarget kind = ConfigTarget::Gpu;
  // GPU limits (per SM unless said otherwise)
  int sms = 132;
  int max_threads = 2048;
  int max_blocks = 32;
  int registers = 65536;
  int max_registers_per_thread = 255;
  int64_t shared_bytes = 228 * 1024;          // per SM
  int64_t max_shared_per_block = 227 * 1024;  // opt-in maximum
  int64_t reserved_shared_per_block = 1024;   // the driver's share of each block
  int register_alloc_unit = 256;              // registers are allocated per warp in units of this
  // rates (the whole device, or one host core)
  double dram_gbps = 3350;       // GB/s
  double fp32_gflops = 67000;    // FMA = 2 flops, no tensor cores
  // Dense tensor-core rates the kernels can reach (0: none used on this arch):
  // f16/bf16 operands with f32 accumulation, and TF32. Datasheet figures.
  double tensor16_gflops = 989000;
  double tf32_gflops = 494000;
  double launch_us = 3.0;        // fixed cost of one launch
  // host
  int simd_bytes = 32;           // widest vector register (AVX2 = 32, AVX-512 = 64)
  int64_t l1_bytes = 32 * 1024, l2_bytes = 1024 * 1024, llc_bytes = 32 * 1024 * 1024;
};

// A GPU arch's limits and rates, for "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a",
// "sm_100"... A Diag for an arch the table does not know.
Result<TargetInfo> gpu_target_info(const std::string& arch);

// The host CPU: model name and SIMD width from /proc/cpuinfo, cache sizes from
// sysconf, rates from a one-time estimate (fixed, conservative figures when
// unknown). The result is computed once per process.
const TargetInfo& host_target_info();

// Blocks of `threads` threads using `regs` registers each and `shared` bytes of
// shared memory that fit on one SM at once (0 when one block does not fit).
int blocks_per_sm(const TargetInfo& t, int threads, int regs, int64_t shared);

}  // namespace sf
