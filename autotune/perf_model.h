// One performance model (docs/performance-model.md): a device's peak rates in SI
// units and the roofline over them. The rates come from one table, the arch's row
// in autotune/target.cpp (datasheet figures), or from a system file's GPU
// (codegen/fusion/timeline.h), and every estimate in shardfuse prices work through
// them: the compile report, collective-matmul decomposition, `simulate` and the
// tuner's static ranking (autotune/cost_model.h, which also reads the table's
// occupancy limits). Collectives are priced by the alpha-beta model of one link
// class (CostModel, codegen/dist/redistribute.h), from the system file when given.
#pragma once

#include <string>

#include "autotune/target.h"
#include "runtime/core/dtype.h"

namespace sf {

struct DeviceRates {
  std::string name;            // "NVIDIA H100 (SXM)": where the figures are from
  double hbm_bytes_s = 0;      // memory bandwidth
  double fp32_flops_s = 0;     // FP32 SIMT (an FMA is 2 flops)
  double tensor16_flops_s = 0; // dense f16/bf16 tensor cores, f32 accumulation; 0: none used
  double tf32_flops_s = 0;     // dense TF32 tensor cores; 0: none used
  double launch_s = 0;         // fixed cost of one kernel launch

  // The rate a matmul whose operands are `operands` runs at on the path shardfuse's
  // kernels take there: f16/bf16 on the tensor cores where the device has them, f32 in
  // TF32 under `allow_tf32` where it has TF32, else FP32 SIMT.
  double matmul_flops_s(DType operands, bool allow_tf32) const;
  // max(flops / flops_rate, bytes / hbm_bytes_s) in seconds, without the launch; a
  // rate of 0 prices that side at 0.
  double roofline_s(double flops, double flops_rate, double bytes) const;
};

// The rates of a TargetInfo row (gpu_target_info, host_target_info).
DeviceRates device_rates(const TargetInfo& t);
// The rates of a GPU arch's row ("sm_90a"), or a Diag for an arch the table lacks.
Result<DeviceRates> arch_rates(const std::string& arch);
// sm_90a's (an H100): what an estimate uses when nothing names a device.
const DeviceRates& default_device_rates();

}  // namespace sf
