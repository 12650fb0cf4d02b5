// One performance model (docs/performance-model.md): a device's peak rates in SI
// units and the roofline over them. The rates come from one table, the arch's row
// in autotune/target.cpp (datasheet figures), or from a system file's GPU
// (codegen/fusion/timeline.h), and every estimate in shardfuse prices work through
// them: the compile report, collective-matmul decomposition, `simulate` and the
// tuner's static ranking (autotune/cost_model.h, which also reads the table's
// occupancy limits). Collectives are priced by the alpha-beta model per link class
// below (CommRates): propagation's choice among sharding strategies, the
// decomposition's ring estimate and the timeline all call collective_us, with the
// links of a system file (autotune/system.h) when one is given.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "autotune/target.h"
#include "runtime/core/collective.h"
#include "runtime/core/device_mesh.h"
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

// --- collectives: alpha-beta per link class ------------------------------------------

enum class CollAlgorithm : uint8_t { Ring, Tree };

// One class of link between GPUs.
struct LinkSpec {
  double bandwidth_GB_s = 0;  // per GPU per direction, 1e9 bytes per second
  double alpha_us = 0;        // latency per algorithm step
  double sm_fraction = 0;     // share of a GPU's SMs a running collective takes: kernels go at (1 - this)
  // Share of a collective's speed lost while a member's compute stream runs a
  // kernel (HBM and SM contention). 0 in the shipped systems: not calibrated.
  double comm_slowdown = 0;
  CollAlgorithm algorithm = CollAlgorithm::Ring;
};

enum class LinkClass : uint8_t { NvLink, Ib };
std::string_view link_class_name(LinkClass c);  // "nvlink", "ib"

// Latency steps of `k` over n ranks: ring all_gather, reduce_scatter and all_to_all
// n-1, ring all_reduce 2(n-1); tree all_reduce 2 ceil(log2 n) (others stay ring).
double collective_steps(CollectiveKind k, int n, CollAlgorithm a);
// alpha * steps + bytes * bus_factor / bandwidth, in microseconds; 0 for n <= 1.
// `bytes` is nccl-tests' "size": all_gather's gathered output, reduce_scatter's
// input, all_reduce's buffer, all_to_all's send buffer.
double collective_us(CollectiveKind k, int n, double bytes, const LinkSpec& link);
// One point-to-point transfer (a step of a decomposed collective matmul's ring):
// alpha + bytes / bandwidth, in microseconds.
double shift_us(double bytes, const LinkSpec& link);

// The links between the GPUs a mesh runs on. Ranks fill nodes in order (rank r is
// on node r / gpus_per_node); a collective whose group stays inside one node runs
// over `intra` (NVLink), one that spans nodes over `inter`.
struct CommRates {
  std::string name;  // where the figures are from
  int gpus_per_node = 8;
  LinkSpec intra, inter;

  const LinkSpec& link(LinkClass c) const { return c == LinkClass::NvLink ? intra : inter; }
  // The class of link the groups of `mesh_dim` cross: NvLink when every group along
  // that dim sits inside one node.
  LinkClass link_class(const DeviceMesh& mesh, int mesh_dim) const;
  // collective_us over the group of `mesh_dim`, in seconds.
  double collective_s(CollectiveKind k, const DeviceMesh& mesh, int mesh_dim, double bytes) const;
};

// Without a system file: one 8-GPU node of NVLink 4 (examples/systems/
// h100x8_nvlink.json's links), InfiniBand between nodes as h100_2x8_ib.json has it.
// Estimates, not measurements.
const CommRates& default_comm_rates();

}  // namespace sf
