#include "autotune/cost_model.h"

#include <algorithm>
#include <cmath>

namespace sf {

namespace {

// DRAM latency the memory system must cover with requests in flight (Little's law):
// ~600 ns on A100/H100 class parts under load.
constexpr double kDramLatencyUs = 0.6;
// Warps per SM a SIMT FMA loop needs to keep the four schedulers issuing every cycle
// (two per scheduler hide the dependent-FMA latency of ~4 cycles with ILP).
constexpr double kWarpsForCompute = 8;

int threads_of(const TuneProblem& p, const KernelConfig& c, const BuildResult& b) {
  if (b.threads_per_block > 0) return b.threads_per_block;
  switch (p.kind) {
    case KernelKind::Pointwise:
    case KernelKind::Gather: return c.block;
    case KernelKind::Reduction: return c.threads_per_row * c.rows_per_block;
    case KernelKind::Matmul: return c.warps * 32;
  }
  return c.block;
}

int64_t shared_of(const BuildResult& b) {
  return (b.resources ? b.resources->shared_bytes : 0) + b.dynamic_shared_bytes;
}

// Blocks per SM from the real register count (32 when ptxas did not run).
int occupancy(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t, const BuildResult& b) {
  int regs = b.resources ? b.resources->registers : 32;
  return blocks_per_sm(t, threads_of(p, c, b), regs, shared_of(b));
}

int64_t grid_of(const TuneProblem& p, const KernelConfig& c, const BuildResult& b) {
  if (b.grid_blocks > 0) return b.grid_blocks;
  switch (p.kind) {
    case KernelKind::Pointwise:
    case KernelKind::Gather: {
      int64_t tile = int64_t{c.block} * std::max(c.vector, 1) * std::max(c.elems_per_thread, 1);
      int64_t g = (p.n + tile - 1) / tile;
      return c.grid_stride ? std::min<int64_t>(g, c.max_blocks) : g;
    }
    case KernelKind::Reduction: {
      int64_t g = (p.rows + c.rows_per_block - 1) / c.rows_per_block;
      return c.grid_stride ? std::min<int64_t>(g, c.max_blocks) : g;
    }
    case KernelKind::Matmul:
      return p.batch * ((p.m + c.block_m - 1) / c.block_m) * ((p.n + c.block_n - 1) / c.block_n) * c.split_k;
  }
  return 1;
}

double host_predict(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t) {
  // Vector width as a fraction of a SIMD register (LLVM's own choice fills one).
  double lanes = t.simd_bytes / static_cast<double>(p.elem_bytes);
  double f_vec = c.host_vector == 0 ? 1.0 : std::min(1.0, c.host_vector / lanes);
  // Interleaving hides FP latency (4 cycles, 2 ports: ~8 independent chains);
  // past that it only adds register pressure. 0 = LLVM's cost model, usually 2-4.
  double il = c.host_interleave == 0 ? 2 : c.host_interleave;
  double f_il = std::min(1.0, (il * std::max(f_vec * lanes, 1.0)) / (2 * lanes)) * (il > 4 ? 0.9 : 1.0);
  double compute = std::max<double>(p.flops, p.n) / (t.fp32_gflops * 1e3 * std::max(f_vec * f_il, 0.05));
  double mem = p.bytes / (t.dram_gbps * 1e3);
  if (p.kind == KernelKind::Matmul) {
    // One pass over K per host_tile_n columns: A is re-read N / tile times; B's
    // K x tile panel is reused across rows while it fits in L2.
    int tile = c.host_tile_n > 0 ? c.host_tile_n : 64;
    double a_reads = p.batch * double(p.m) * p.k * p.elem_bytes * std::ceil(double(p.n) / tile);
    double panel = double(p.k) * tile * p.elem_bytes;
    double b_reads = panel <= t.l2_bytes ? double(p.k) * p.n * p.elem_bytes * p.batch
                                         : p.batch * double(p.m) * p.k * p.n * p.elem_bytes;
    mem = (a_reads + b_reads) / (t.dram_gbps * 1e3);
    // Accumulators beyond 16 SIMD registers live in L1, not registers.
    double acc_regs = tile * 4.0 / t.simd_bytes;
    if (acc_regs > 16) compute *= 1.0 + 0.25 * std::log2(acc_regs / 16);
    // Short tiles pay the loop and load overhead of each pass over K.
    if (tile < lanes * 2) compute *= 1.5;
  }
  return std::max(compute, mem) + t.launch_us;
}

}  // namespace

std::optional<std::string> resource_reject(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t,
                                           const BuildResult& b) {
  if (t.kind == ConfigTarget::Host) return std::nullopt;
  if (occupancy(p, c, t, b) > 0) return std::nullopt;
  int regs = b.resources ? b.resources->registers : 0;
  return "no block fits on an SM: " + std::to_string(threads_of(p, c, b)) + " threads x " + std::to_string(regs) +
         " registers, " + std::to_string(shared_of(b)) + " bytes of shared memory";
}

double predict_us(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t, const BuildResult& b) {
  if (t.kind == ConfigTarget::Host) return host_predict(p, c, t);
  const int occ = std::max(occupancy(p, c, t, b), 1);
  const int threads = threads_of(p, c, b);
  const int64_t grid = std::max<int64_t>(grid_of(p, c, b), 1);
  // Blocks that actually share an SM, and the waves the grid takes.
  const int64_t resident = std::min<int64_t>(occ, (grid + t.sms - 1) / t.sms);
  const int64_t waves = (grid + int64_t{occ} * t.sms - 1) / (int64_t{occ} * t.sms);
  const double warps_per_sm = resident * std::ceil(threads / 32.0);
  const double sm_bw = t.dram_gbps * 1e3 / t.sms;  // bytes per us per SM
  const double sm_flops = t.fp32_gflops * 1e3 / t.sms;
  // SMs with work: a grid smaller than the SM count leaves the rest idle.
  const double busy_sms = std::min<double>(t.sms, static_cast<double>(grid));

  if (p.kind == KernelKind::Matmul) {
    const double tile_flops = 2.0 * c.block_m * c.block_n * double(p.k) / c.split_k;
    // Register tile per thread: FMAs per shared-memory load grow with its side.
    const double outs = double(c.block_m) * c.block_n / threads;
    const double f_smem = std::min(1.0, std::sqrt(outs) / 2 / 4);
    const double f_occ = std::min(1.0, warps_per_sm / kWarpsForCompute);
    // Without a second stage every K step waits for its global loads.
    const double f_pipe = c.stages >= 2 ? 1.0 : 0.7;
    const double per_block_rate = sm_flops * f_smem * f_occ * f_pipe / resident;
    double compute = waves * tile_flops / per_block_rate;
    // Global traffic: every tile reads its A and B panels; GROUP_M keeps about half in L2.
    const double l2 = c.group_m > 1 ? 0.5 : 0.75;
    double traffic = double(grid) * double(p.k) * (c.block_m + c.block_n) * p.elem_bytes * l2 +
                     double(p.batch) * p.m * p.n * p.elem_bytes;
    double mem = traffic / (sm_bw * busy_sms);
    return std::max(compute, mem) + t.launch_us;
  }

  // Memory-bound kinds: bandwidth as far as requests in flight cover the latency.
  int64_t per_thread_bytes = int64_t{p.elem_bytes};
  if (p.kind == KernelKind::Pointwise) per_thread_bytes *= int64_t{std::max(c.vector, 1)} * std::max(c.elems_per_thread, 1);
  int64_t inputs = std::max<int64_t>(static_cast<int64_t>(p.num_inputs), 1);
  double inflight = warps_per_sm * 32 * per_thread_bytes * inputs;
  double f_bw = std::min(1.0, inflight / (sm_bw * kDramLatencyUs));
  double mem = p.bytes / (sm_bw * busy_sms * f_bw);
  double extra = 0;
  if (p.kind == KernelKind::Reduction) {
    // Idle lanes when a row is shorter than its threads, and the tree reduction of
    // each row: log2(threads) shuffle steps, plus a barrier round through shared
    // memory when a row spans warps.
    double active = std::min(1.0, double(p.cols) / c.threads_per_row);
    mem /= std::max(active, 0.05);
    double steps = std::log2(std::max(c.threads_per_row, 1)) + (c.threads_per_row > 32 ? 4 : 0);
    double rows_per_sm = double(p.rows) / busy_sms;
    extra = rows_per_sm / (resident * c.rows_per_block) * steps * 0.02;  // ~20 ns a step
  }
  // Wave quantisation: the last wave's idle SMs.
  double q = grid > int64_t{occ} * t.sms ? double(waves * occ * t.sms) / grid : 1.0;
  return mem * q + extra + t.launch_us;
}

}  // namespace sf
