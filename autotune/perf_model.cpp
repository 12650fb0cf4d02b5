// One performance model: autotune/perf_model.h.
#include "autotune/perf_model.h"

#include <algorithm>

namespace sf {

double DeviceRates::matmul_flops_s(DType operands, bool allow_tf32) const {
  if ((operands == DType::BF16 || operands == DType::F16) && tensor16_flops_s > 0) return tensor16_flops_s;
  if (operands == DType::F32 && allow_tf32 && tf32_flops_s > 0) return tf32_flops_s;
  return fp32_flops_s;
}

double DeviceRates::roofline_s(double flops, double flops_rate, double bytes) const {
  const double compute = flops_rate > 0 ? flops / flops_rate : 0;
  const double memory = hbm_bytes_s > 0 ? bytes / hbm_bytes_s : 0;
  return std::max(compute, memory);
}

DeviceRates device_rates(const TargetInfo& t) {
  DeviceRates r;
  r.name = t.model;
  r.hbm_bytes_s = t.dram_gbps * 1e9;
  r.fp32_flops_s = t.fp32_gflops * 1e9;
  r.tensor16_flops_s = t.tensor16_gflops * 1e9;
  r.tf32_flops_s = t.tf32_gflops * 1e9;
  r.launch_s = t.launch_us * 1e-6;
  return r;
}

Result<DeviceRates> arch_rates(const std::string& arch) {
  Result<TargetInfo> t = gpu_target_info(arch);
  if (!t) return t.error();
  return device_rates(*t);
}

const DeviceRates& default_device_rates() {
  static const DeviceRates r = [] {
    Result<DeviceRates> x = arch_rates("sm_90a");
    return x ? *x : DeviceRates{};
  }();
  return r;
}

}  // namespace sf
