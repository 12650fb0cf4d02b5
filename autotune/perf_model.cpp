// One performance model: autotune/perf_model.h.
#include "autotune/perf_model.h"

#include <algorithm>
#include <cmath>

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

std::string_view link_class_name(LinkClass c) {
  switch (c) {
    case LinkClass::NvLink: return "nvlink";
    case LinkClass::Ib: return "ib";
  }
  return "?";
}

double collective_steps(CollectiveKind k, int n, CollAlgorithm a) {
  if (n <= 1) return 0;
  switch (k) {
    case CollectiveKind::AllReduce:
      // A tree reduces up and broadcasts down: 2 ceil(log2 n) hops; a ring does a
      // reduce-scatter then an all-gather, n-1 steps each.
      return a == CollAlgorithm::Tree ? 2.0 * std::ceil(std::log2(static_cast<double>(n))) : 2.0 * (n - 1);
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll: return n - 1.0;
  }
  return 0;
}

double collective_us(CollectiveKind k, int n, double bytes, const LinkSpec& link) {
  if (n <= 1) return 0;
  // GB/s = 1e9 B/s = 1e3 B/us.
  return link.alpha_us * collective_steps(k, n, link.algorithm) + bytes * bus_factor(k, n) / (link.bandwidth_GB_s * 1e3);
}

double shift_us(double bytes, const LinkSpec& link) { return link.alpha_us + bytes / (link.bandwidth_GB_s * 1e3); }

LinkClass CommRates::link_class(const DeviceMesh& mesh, int mesh_dim) const {
  if (gpus_per_node < 1) return LinkClass::Ib;
  for (const std::vector<int>& g : mesh.groups(mesh_dim))
    for (int r : g)
      if (r / gpus_per_node != g.front() / gpus_per_node) return LinkClass::Ib;
  return LinkClass::NvLink;
}

double CommRates::collective_s(CollectiveKind k, const DeviceMesh& mesh, int mesh_dim, double bytes) const {
  const int n = static_cast<int>(mesh.size(mesh_dim));
  return collective_us(k, n, bytes, link(link_class(mesh, mesh_dim))) * 1e-6;
}

const CommRates& default_comm_rates() {
  static const CommRates r = [] {
    CommRates c;
    c.name = "8-GPU NVLink 4 node, InfiniBand between nodes (estimates)";
    c.gpus_per_node = 8;
    c.intra = LinkSpec{450, 1.0, 0.15, 0, CollAlgorithm::Ring};
    c.inter = LinkSpec{50, 4.0, 0.08, 0, CollAlgorithm::Ring};
    return c;
  }();
  return r;
}

}  // namespace sf
