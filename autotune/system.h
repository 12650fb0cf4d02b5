// The system file (docs/overlap.md): the GPUs and links of a machine shardfuse
// estimates for, turned into the one performance model's rates
// (autotune/perf_model.h): device_rates for the GPU, comm_rates for the links.
// `simulate` needs one; compile, explain, run and tune take one with --system.
#pragma once

#include <string>
#include <vector>

#include "autotune/perf_model.h"
#include "runtime/core/diag.h"

namespace sf {

struct GpuSpec {
  std::string name;         // for people: "H100 SXM5 80GB"
  std::string arch;         // "sm_90a": which tuning-cache entries apply
  std::string device_name;  // what CUDA calls it ("NVIDIA H100 80GB HBM3"): matches cache targets
  double fp32_tflops = 0;   // peak SIMT fp32: elementwise work, f32 matmuls
  double bf16_tflops = 0;   // peak dense f16/bf16 tensor-core rate: f16/bf16 matmuls (0: price them at fp32)
  double hbm_GB_s = 0;      // HBM bandwidth, 1e9 bytes per second
  double launch_us = 0;     // per-kernel launch overhead the roofline adds
};

// The system file's GPU as the one performance model's rates (autotune/perf_model.h):
// its fp32, f16/bf16 and HBM figures and launch cost; TF32 from the arch's table row
// scaled as the file's 16-bit rate is to the table's (half the 16-bit rate when the
// table lacks the arch). A 16-bit rate of 0 prices 16-bit matmuls at fp32.
DeviceRates device_rates(const GpuSpec& gpu);

struct SystemSpec {
  std::string name;
  std::vector<std::string> notes;
  GpuSpec gpu;
  int nodes = 1, gpus_per_node = 1;
  LinkSpec nvlink;  // between GPUs of one node
  LinkSpec ib;      // between nodes
  bool has_ib = false;
  int max_world() const { return nodes * gpus_per_node; }
};

// The system file (docs/overlap.md): JSON with "format": "shardfuse-system",
// "version": 1. Errors name the file, the line and column where they can, and the
// field ("gpu.hbm_GB_s: expected a number > 0").
Result<SystemSpec> parse_system(const std::string& text, const std::string& file);
Result<SystemSpec> load_system(const std::string& path);

// The system's links as CommRates: NVLink inside a node, InfiniBand between nodes
// (NVLink again when the system has one node).
CommRates comm_rates(const SystemSpec& sys);

}  // namespace sf
