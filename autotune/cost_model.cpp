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
    case KernelKind::Matmul:
    case KernelKind::Attention: return c.warps * 32;
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
  // A persistent matmul's blocks each walk several tiles: the work is still one tile
  // per output tile (priced in waves of them; the overlap of one tile's epilogue with
  // the next one's loads is not modelled).
  if (b.grid_blocks > 0 && !(p.kind == KernelKind::Matmul && c.persistent > 0)) return b.grid_blocks;
  switch (p.kind) {
    case KernelKind::Pointwise:
    case KernelKind::Gather: {
      int64_t tile = int64_t{c.block} * std::max(c.vector, 1) * std::max(c.elems_per_thread, 1);
      int64_t g = (p.n + tile - 1) / tile;
      return c.grid_stride ? std::min<int64_t>(g, c.max_blocks) : g;
    }
    case KernelKind::Reduction: {
      int64_t g = (p.rows + c.rows_per_block - 1) / c.rows_per_block;
      return (c.grid_stride ? std::min<int64_t>(g, c.max_blocks) : g) * std::max(c.split_reduction, 1);
    }
    case KernelKind::Matmul:
      return p.batch * ((p.m + c.block_m - 1) / c.block_m) * ((p.n + c.block_n - 1) / c.block_n) * c.split_k;
    case KernelKind::Attention: return p.batch * ((p.m + c.block_m - 1) / c.block_m);
  }
  return 1;
}

// The host kernels' time is the innermost loop's: a vector body of host_vector x
// host_interleave elements per iteration and a scalar remainder (LLVM's epilogue),
// repeated once per row (reduction), per (row, K step, column tile) (matmul), or
// once (pointwise). Cycles per body: the vector ops over two FP ports, at least the
// 4-cycle FP add latency when each chain carries a sum (reductions), plus one for
// the loop. `0` knobs are what LLVM picks by itself: full SIMD width and
// interleave 2 where no reassociation is needed, and one scalar in-order chain for
// floating-point sums, which it may not reorder unasked.
double host_predict(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t) {
  constexpr double kGhz = 2.5, kAddLatency = 4, kPorts = 2;
  // f16/bf16 are computed in f32: lanes are those of the arithmetic, not of storage.
  // LLVM's x86 backend prefers 256-bit vectors even where AVX-512 exists (the
  // prefer-vector-width=256 default of Skylake-AVX512 and later), so wider vectors
  // are split into 256-bit operations.
  const int simd = std::min(t.simd_bytes, 32);
  const int lanes = std::max(1, simd / std::max(p.elem_bytes, 4));
  const bool carried = p.kind == KernelKind::Reduction;
  double trip = 0, outer = 1, ops = 1;
  switch (p.kind) {
    case KernelKind::Pointwise:
    case KernelKind::Gather:
      trip = static_cast<double>(p.n);
      ops = std::max(1.0, double(p.flops) / std::max<double>(p.n, 1));
      break;
    case KernelKind::Reduction:
      trip = static_cast<double>(p.cols);
      outer = static_cast<double>(p.rows);
      ops = std::max(1.0, double(p.flops) / std::max<double>(double(p.rows) * p.cols, 1));
      break;
    case KernelKind::Matmul: {
      int tile = c.host_tile_n > 0 ? c.host_tile_n : 64;
      trip = static_cast<double>(std::min<int64_t>(tile, p.n));
      outer = double(p.batch) * p.m * p.k * std::ceil(double(p.n) / tile);
      break;
    }
    case KernelKind::Attention:
      // The inner loops are a score's dot product over the head dim and an output
      // row's update over the key tile.
      trip = static_cast<double>(std::max<int64_t>(p.k, 1));
      outer = double(p.flops) / (2.0 * trip);
      ops = 2;
      break;
  }
  // What LLVM picks by itself: the full width, or the widest power of two the trip
  // count fills when it is shorter; interleave 2 where two bodies fit.
  int v, chains;
  if (carried) {
    v = c.host_vector == 0 ? 1 : c.host_vector;
    chains = c.host_vector == 0 ? 1 : (c.host_interleave == 0 ? 2 : c.host_interleave);
  } else {
    int fit = 1;
    while (fit * 2 <= std::min<double>(trip, lanes)) fit *= 2;
    v = c.host_vector == 0 ? fit : c.host_vector;
    chains = c.host_interleave == 0 ? static_cast<int>(std::clamp(std::floor(trip / v), 1.0, 2.0)) : c.host_interleave;
  }
  const double step = double(v) * chains;
  const double bodies = std::floor(trip / step), rem = trip - bodies * step;
  const double vec_ops = ops * chains * std::ceil(double(v) / lanes);
  const double body = std::max(vec_ops / kPorts, carried ? kAddLatency : 0.0) + 1;
  const double scalar = carried ? kAddLatency : ops / kPorts + 0.5;
  // A matmul tile that divides N gives the inner loop a constant trip count: no
  // runtime bound, no remainder check; otherwise each pass pays for both.
  const double pass = p.kind == KernelKind::Matmul && p.n % (c.host_tile_n > 0 ? c.host_tile_n : 64) != 0 ? 3 : 0;
  double compute_us = outer * (bodies * body + rem * scalar + pass) / (kGhz * 1e3);
  double mem_us = p.bytes / (t.dram_gbps * 1e3);
  if (p.kind == KernelKind::Matmul) {
    // Accumulators past 16 SIMD registers spill to L1 every K step.
    int tile = c.host_tile_n > 0 ? c.host_tile_n : 64;
    double acc_regs = tile * 4.0 / simd;
    if (acc_regs > 16) compute_us *= 1.0 + 0.25 * std::log2(acc_regs / 16);
    // The inner loop reads a vector of B's K x tile panel per FMA: from L1 when the
    // panel fits there, else from L2 at about half the rate.
    if (double(p.k) * tile * p.elem_bytes > t.l1_bytes) compute_us *= 1.5;
    // A is read once per column tile; B's K x tile panel stays in L2 across rows when it fits.
    double a_reads = double(p.batch) * p.m * p.k * p.elem_bytes * std::ceil(double(p.n) / tile);
    double panel = double(p.k) * tile * p.elem_bytes;
    double b_reads = panel <= t.l2_bytes ? double(p.batch) * p.k * p.n * p.elem_bytes
                                         : double(p.batch) * p.m * p.k * p.n * p.elem_bytes;
    mem_us = (a_reads + b_reads) / (t.dram_gbps * 1e3);
  }
  return std::max(compute_us, mem_us) + t.launch_us;
}

}  // namespace

std::optional<std::string> resource_reject(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t,
                                           const BuildResult& b) {
  if (t.kind == ConfigTarget::Host) return std::nullopt;
  // A register reallocation ptxas dropped (C7508: the registers at entry unknown)
  // leaves the kernel without it: the same code as the config without setmaxnreg.
  if (c.setmaxnreg > 0 && b.resources)
    for (const std::string& n : b.resources->notes)
      if (n.find("'setmaxnreg' ignored") != std::string::npos) return "ptxas: " + n;
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

  if (p.kind == KernelKind::Matmul && b.tensor_cores && t.tensor16_gflops > 0) {
    // The tensor-core kernel (mma.sync): its rate grows with the warp tile (mma per
    // ldmatrix) and needs a few warps per SM to cover ldmatrix and mma latency. On
    // sm_90, mma.sync reaches about two thirds of the dense peak, which wgmma
    // approaches; ours waits for each K tile's wgmma group before the next, so it
    // is charged 0.85 of the peak, and needs a warpgroup's m64 x block_n per
    // instruction to be wide (block_n 256 keeps the tensor pipe busiest). Estimates,
    // to rank configs, not measurements.
    // Split-K: grid z splits K, so a block multiplies K / split_k of it.
    const int split = std::max(c.split_k, 1);
    const double tile_flops = 2.0 * c.block_m * c.block_n * double(p.k) / split;
    const double warp_tile = double(c.block_m) * c.block_n / std::max(c.warps, 1);
    const double f_tile = b.wgmma ? std::min(1.0, std::sqrt(double(c.block_n) / 256))
                                  : std::min(1.0, std::sqrt(warp_tile) / 64);
    const double f_occ = std::min(1.0, warps_per_sm / 4);
    // Ping-pong hides each tile's epilogue behind the other warpgroup's K loop, which
    // the others spend with the tensor cores idle: charged 0.9 (an estimate).
    const double f_arch = b.wgmma ? (c.pingpong ? 0.9 : 0.85)
                                  : t.name.rfind("sm_9", 0) == 0 || t.name.rfind("sm_1", 0) == 0 ? 0.65 : 0.85;
    // The wgmma kernel keeps one group in flight (3 stages or more), so its copies run
    // stages - 2 tiles ahead: on an H200 the 4-stage 128 x 256 x 64 configs took 0.93
    // to 0.98 of the 3-stage ones' time at 4096^3 (bench/results/tune-h200-run7/), the
    // warp-specialised persistent one 0.93. Charged 0.93 at 3 stages, so that the
    // deeper pipeline ranks first (a ping-pong warpgroup, alone on the tensor cores
    // during its K loop, needs the copies furthest ahead).
    const double f_pipe = c.stages < 3 ? 0.8 : b.wgmma && c.stages == 3 ? 0.93 : 1.0;
    // TF32 (--allow-tf32) at its own rate, half the 16-bit one.
    const double peak = b.tf32 && t.tf32_gflops > 0 ? t.tf32_gflops : t.tensor16_gflops;
    const double per_block_rate = peak * 1e3 / t.sms * f_tile * f_occ * f_arch * f_pipe / resident;
    double compute = waves * tile_flops / per_block_rate;
    // Every block reads its A and B panels through L2 (about 4x DRAM's bandwidth on
    // the archs these kernels run on, an estimate); with a GROUP_M swizzle a wave's
    // blocks share panels, so DRAM sees each operand about twice, four times without.
    // A cluster of two (cluster_m / cluster_n) brings the pair's shared tile once: each
    // block reads half of it (B's with cluster_m, A's with cluster_n).
    const double a_rows = c.cluster_n > 1 ? c.block_m / 2.0 : c.block_m, b_rows = c.cluster_m > 1 ? c.block_n / 2.0 : c.block_n;
    const double l2_traffic = double(grid) * double(p.k) / split * (a_rows + b_rows) * p.elem_bytes;
    double dram = double(p.batch) * (double(p.m) * p.k + double(p.k) * p.n) * p.elem_bytes * (c.group_m > 1 ? 2 : 4) +
                  double(p.batch) * p.m * p.n * p.elem_bytes;
    // Split-K's f32 partial sums: every split adds its share (an atomic read and write
    // at L2) and the last block reads the sums back and zeroes them; charged as DRAM
    // traffic, an estimate (a bare TF32 matmul adds into its output the same way).
    if (split > 1) dram += double(p.batch) * p.m * p.n * 4.0 * (2.0 * split + 2.0);
    // The copies a pipeline keeps in flight hide the L2 and DRAM latency of the loads
    // as they hide it from the products, so f_pipe scales this side too (where the
    // operands' traffic binds, as for a 64-row ping-pong tile, it alone ranks stages).
    double mem = std::max(dram, l2_traffic / 4) / (sm_bw * busy_sms) / f_pipe;
    return std::max(compute, mem) + t.launch_us;
  }
  if (p.kind == KernelKind::Attention && b.tensor_cores && t.tensor16_gflops > 0) {
    // The tensor-core kernel (mma.sync): its products at half the 16-bit dense peak
    // (mma.sync, with the softmax between the two products), halved again where the
    // scores and output pass through shared memory (block_m not 16 or 32 rows a warp:
    // the register-resident form does not apply), with enough warps per SM to cover
    // the latencies; K and V read once per query tile through L2 (taken as 4x DRAM's
    // bandwidth, as for the matmul), DRAM seeing each tensor about once. With 32 rows
    // a warp each k and v fragment read from shared memory feeds two mma (128 for 48
    // ldmatrix a key tile at E = 128, against 64 for 40): taken as 10% faster, so
    // that those configs are measured. Each key tile also costs a barrier, the row
    // max's shuffles and the rescaling of every output accumulator whatever its
    // width: taken as the products of 8 more keys, so that 16-key tiles rank below
    // 32 and 64 (FlashAttention-2 takes 32 to 128). Estimates, to rank.
    // The wgmma form (sm_90a, 16 rows a warp): each product one instruction per
    // warpgroup and k step, its operand k and v read by the tensor cores from shared
    // memory without ldmatrix. On an H200 (run 11, the bench sdpa block) its tiles of
    // 32 keys or more took 0.61 to 0.93 of the 128 x 64 mma.sync tile's time, most
    // under 0.8: taken as 1.5x. Pipelined (wgmma = 2) measured 0.9 to 1.1 of plain at
    // the same tile: taken as 1.45x, so that plain ranks first. Estimates, to rank.
    const bool one_tile = c.block_m == 16 * c.warps, two_tiles = c.block_m == 32 * c.warps;
    const double form = c.wgmma && one_tile ? (c.wgmma == 2 ? 1.45 : 1.5) : two_tiles ? 1.1 : one_tile ? 1.0 : 0.5;
    const double bn = double(std::max<int64_t>(1, std::min<int64_t>(c.block_n, std::max<int64_t>(p.n, 1))));
    const double f_tile = bn / (bn + 8);
    const double f_occ = std::min(1.0, warps_per_sm / kWarpsForCompute);
    const double rate = t.tensor16_gflops * 1e3 * (busy_sms / t.sms) * 0.5 * form * f_tile * f_occ;
    double compute = double(p.flops) / rate;
    const double tiles = std::ceil(double(p.m) / std::max(c.block_m, 1));
    const double l2 = double(p.batch) * tiles * double(p.n) * double(p.k + p.cols) * p.elem_bytes;
    double mem = std::max(double(p.bytes), l2 / 4) / (sm_bw * busy_sms);
    return std::max(compute, mem) + t.launch_us;
  }
  if (p.kind == KernelKind::Attention) {
    // The SIMT attention kernel: every product reads both factors from shared memory
    // (a quarter of the FMA rate, an estimate), with enough warps to cover the
    // latency; K and V tiles are read from L2 once per query tile.
    const double f_occ = std::min(1.0, warps_per_sm / kWarpsForCompute);
    double compute = double(p.flops) / (sm_flops * busy_sms * 0.25 * f_occ);
    const double tiles = std::ceil(double(p.m) / std::max(c.block_m, 1));
    const double traffic = double(p.bytes) + double(p.batch) * tiles * double(p.n) * double(p.k + p.cols) * p.elem_bytes;
    double mem = traffic / (sm_bw * busy_sms);
    return std::max(compute, mem) + t.launch_us;
  }
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
    // Split-K reads each K slice once as well (grid counts the splits) and adds every
    // split's partial output atomically: a read and a write of the output per split.
    double traffic = double(grid) * double(p.k) / c.split_k * (c.block_m + c.block_n) * p.elem_bytes * l2 +
                     double(p.batch) * p.m * p.n * p.elem_bytes * (c.split_k > 1 ? 2 * c.split_k : 1);
    double mem = traffic / (sm_bw * busy_sms);
    return std::max(compute, mem) + t.launch_us;
  }

  // Memory-bound kinds: bandwidth as far as requests in flight cover the latency.
  int64_t per_thread_bytes = int64_t{p.elem_bytes};
  if (p.kind == KernelKind::Pointwise) per_thread_bytes *= int64_t{std::max(c.vector, 1)} * std::max(c.elems_per_thread, 1);
  // A reduction's fold loop: LLVM unrolls it by 4 to 8 (seen in the PTX) and a row
  // held in registers loads all its slots at once, so a thread has about 4 loads in
  // flight where its share of the row has that many elements.
  if (p.kind == KernelKind::Reduction) {
    const int64_t share = (p.cols / std::max(c.split_reduction, 1) + c.threads_per_row - 1) / std::max(c.threads_per_row, 1);
    per_thread_bytes *= std::clamp<int64_t>(share, 1, 4);
  }
  int64_t inputs = std::max<int64_t>(static_cast<int64_t>(p.num_inputs), 1);
  double inflight = warps_per_sm * 32 * per_thread_bytes * inputs;
  double f_bw = std::min(1.0, inflight / (sm_bw * kDramLatencyUs));
  double mem = p.bytes / (sm_bw * busy_sms * f_bw);
  double extra = 0;
  if (p.kind == KernelKind::Reduction) {
    // Idle lanes when a row is shorter than its threads, and the tree reduction of
    // each row: log2(threads) shuffle steps, plus a barrier round through shared
    // memory when a row spans warps.
    // A split reduction's blocks each take a share of a row.
    const int split = std::max(c.split_reduction, 1);
    // A multi-pass row is read once per pass; the bytes counted once are read again.
    if (b.row_reads > 1 && p.bytes > 0)
      mem *= (double(p.bytes) + (b.row_reads - 1) * double(p.rows) * double(p.cols) * p.elem_bytes) / double(p.bytes);
    double active = std::min(1.0, double(p.cols) / split / c.threads_per_row);
    mem /= std::max(active, 0.05);
    // An outer reduction: a warp's lanes take neighbouring rows (adjacent in memory)
    // when a block holds several rows (or a thread a row), else one row's elements a
    // row apart, each lane its own 32-byte sector. L2 moves whole sectors: the bytes
    // used of each are what counts.
    const bool lanes_on_rows = c.threads_per_row == 1 || c.rows_per_block > 1;
    if (p.outer) {
      const double run = lanes_on_rows ? double(std::min(c.rows_per_block, 32)) * p.elem_bytes : p.elem_bytes;
      mem /= std::min(1.0, run / 32.0);
    }
    // A row's partials meet in shared memory when its threads span warps (or, in an
    // outer reduction, whenever several threads hold a row's elements).
    const bool outer_form = p.outer && c.threads_per_row > 1 && c.rows_per_block > 1;
    const bool through_shared =
        outer_form ? c.threads_per_row * c.rows_per_block > 32 : c.threads_per_row > 32;
    double steps = std::log2(std::max(c.threads_per_row, 1)) + (through_shared ? 4 : 0);
    double rows_per_sm = double(p.rows) * split / busy_sms;
    extra = rows_per_sm / (resident * c.rows_per_block) * steps * 0.02;  // ~20 ns a step
    // Split rows meet in a workspace: each block stores its partials and counts itself
    // in (two fences and two barriers, ~8 steps), and a group's last block reads back
    // the `split` partials of each row, pipelined (~2 ns each): an estimate.
    if (split > 1) extra += 8 * 0.02 + split * 0.002;
  }
  if (p.kind == KernelKind::Pointwise) {
    // Issue slots the configs differ in: a load or store per operand and vector
    // (charged 4 slots, for the load/store pipe and its address arithmetic) and the
    // thread loop's index and bounds per vector x elems_per_thread elements (about 8
    // instructions), at 4 schedulers x ~1.7 GHz per SM, 32 lanes a warp instruction.
    // Added to the memory time (and quantised in waves with it): an estimate to rank. Fitted to the order tune
    // --measure found on an H200 (bench/results/tune-h200-run7/pointwise_*: bf16 bias +
    // GELU 85 us at vector 8, 102 at 4, 108-120 at 2, 153 at 1), which the memory
    // term alone ties once enough bytes are in flight.
    const double vec = std::max(c.vector, 1), ept = std::max(c.elems_per_thread, 1);
    const double slots_per_elem = 4.0 * double(inputs + 1) / vec + 8.0 / (vec * ept);
    mem += double(p.n) * slots_per_elem / (32.0 * 4 * 1.7e3 * busy_sms);
  }
  // Wave quantisation: the last wave's idle SMs.
  double q = grid > int64_t{occ} * t.sms ? double(waves * occ * t.sms) / grid : 1.0;
  return mem * q + extra + t.launch_us;
}

}  // namespace sf
