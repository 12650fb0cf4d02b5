// The tensor-core matmul's tiling (internal to codegen/kernels): which kernel a
// config gets (mma.sync, or sm_90a's wgmma, fed by cp.async or TMA), its shared
// tiles, warp layout, pipeline depth and tensor maps, decided once from the group and
// the config. matmul_mma.cpp emits the kernel from it; matmul_mma_tiling.cpp decides.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernels/matmul_group.h"

namespace sf::matmul_detail {

inline std::string num(int64_t v) { return std::to_string(v); }

inline int log2i(int64_t v) {
  int r = 0;
  while ((int64_t{1} << r) < v) ++r;
  return r;
}

// A tile in shared memory: `rows` rows of `cols` elements of `eb` bytes (2, or 4 for
// TF32), the cols contiguous, kept as panels of `panel` columns (64 or 128 bytes),
// each a block of rows of 64 or 128 bytes with mma_layout.h's XOR swizzle of 16-byte
// chunks.
struct SmemTile {
  int rows = 0, cols = 0, panel = 0, eb = 2;
  int64_t bytes() const { return int64_t{rows} * cols * eb; }
  int row_bytes() const { return panel * eb; }
  int per_chunk() const { return 16 / eb; }
};

struct MmaTiling {
  int bm = 0, bn = 0, bk = 0, threads = 0, stages = 0, group_m = 0;
  int wm = 0, wn = 0;            // the warps as a wm x wn grid over the block tile
  int warp_m = 0, warp_n = 0;    // each warp's tile
  int mi = 0, ni = 0;            // m16 (wgmma: m64) row steps and n8 column tiles per warp
  int m_step = 16;               // rows between consecutive mi (64 for wgmma)
  // sm_90a: warpgroup MMA (wgmma.mma_async, one m64 x bn x k16 per mi and k step,
  // both operands read from shared memory through descriptors). `wgs` warpgroups
  // split the block's rows, `wg_m` each; `not_wgmma` says why a config on sm_90a
  // stays on mma.sync.
  bool wgmma = false;
  int wgs = 0, wg_m = 0;
  std::string not_wgmma;
  // wgmma with TMA (KernelSpec::tma): one thread copies each stage's panels with
  // cp.async.bulk.tensor through two tensor maps, completing on the stage's mbarrier
  // (8 bytes each at `mbar_off`); `not_tma` says why a wgmma kernel stays on cp.async.
  bool tma = false;
  std::string not_tma;
  int64_t mbar_off = 0;  // the stages' "full" mbarriers (TMA done); ws: then their "empty" ones
  // Warp specialisation (KernelConfig::warp_specialize, wgmma + TMA only): one more
  // warpgroup, after the `threads` consumers, whose first thread issues every copy.
  bool ws = false;
  int launch_threads() const { return threads + (ws ? 128 : 0); }
  std::vector<TensorMapSpec> maps;  // A's, then B's (then, TMA stores, the outputs')
  // Per map: the output's batch dims (MatmulGroup::batch) its dims 2, 3, ... step
  // through, innermost first; a batch dim the operand is broadcast over has none.
  std::vector<std::vector<int>> map_batch;
  bool a_kc = false, b_kc = false;  // operand_layout's k_contiguous of A and B
  SmemTile a, b;
  int64_t stage_bytes = 0, shared_bytes = 0;
  int64_t kt = 0;  // K tiles one block walks (all of them unless split-K)
  // Split-K (KernelConfig::split_k): grid z splits the K tiles into `split` shares of
  // kt each. A bare TF32 matmul: every block adds its partial sums into the output,
  // which the launch zeroes (LaunchShape::zero_outputs).
  int split = 1;
  // Split-K of any other group (a 16-bit matmul, an epilogue, a second output): each
  // block adds its partial sums into an f32 workspace (LaunchShape::workspace_bytes,
  // zeroed by the launch) and counts itself in on the tile's u32 counter after it;
  // the block that arrives last reads the whole sums back and runs the group's
  // epilogue on them. `flag_off`: the shared word that tells its threads.
  bool split_ws = false;
  int64_t flag_off = 0;
  // A persistent grid (KernelConfig::persistent): `persistent` blocks (at most one per
  // work item) each take work items w = blockIdx.x, + grid, ... of the `items` = output
  // tiles x batch; the pipeline's stages and mbarrier phases run on across items.
  int persistent = 0;
  int64_t tiles = 0, items = 0;  // output tiles per matrix, and times the batch
  // Ping-pong (KernelConfig::pingpong; warp-specialised, persistent, two consumer
  // warpgroups): each consumer warpgroup multiplies whole items (wg_m = bm), the
  // block's items j taken by warpgroup j % 2; warpgroup c starts an item's K loop only
  // after the other finished the previous item's (named barrier 1 + c, arrived by the
  // other), so their K loops take the tensor cores in turn and each one's epilogue runs
  // during the other's K loop.
  bool pingpong = false;
  // Register reallocation (KernelConfig::setmaxnreg; persistent, warp-specialised, two
  // consumer warpgroups): the block's 384 threads start with kLaunchRegs each, then
  // the producer warpgroup drops to `producer_regs` (setmaxnreg.dec) and the consumer
  // warpgroups rise to `consumer_regs` (setmaxnreg.inc), the two adding up to the
  // launch's registers exactly; 0: no reallocation.
  static constexpr int kLaunchRegs = 168;  // 65536 / 384, rounded down to whole 8s
  int consumer_regs = 0, producer_regs = 0;
  // n8 column tiles per fragment row of one of the epilogue's batches (MmaEpilogue),
  // two batches live at once besides the accumulators: 2 (8 values a thread a batch)
  // at 168 registers a thread, where 4 spilled 80 bytes in the 128 x 256 kernel; 4
  // once the consumers have 232 or more, where they do not spill.
  int epilogue_batch_columns() const { return consumer_regs >= 232 ? 4 : 2; }
  // The persistent warp-specialised kernel's staging areas (matmul_mma_epilogue.h,
  // "staged in chunks"): each consumer warp's, `chunk_cols` columns of its fragment
  // rows for every output, past everything else at `chunk_off`; -1: none (its
  // epilogue stores directly).
  int64_t chunk_off = -1;
  int chunk_cols = 0;
  // TMA stores (KernelConfig::tma_store; the areas above): each warp's chunk of each
  // output is laid out as TMA's boxes of 16 rows of 128 bytes with the 128-byte
  // swizzle (1024-byte aligned), and its first lane stores them with
  // cp.async.bulk.tensor through one tensor map an output (`maps`, after A's and B's),
  // alternating between `store_bufs` such areas (2 where they fit, else 1).
  // `want_tma_store`: the config asks for it (mma_chunk_area decides).
  bool want_tma_store = false, tma_store = false;
  int store_bufs = 0;
  // Thread-block clusters (KernelConfig::cluster_m / cluster_n; the warp-specialised
  // kernel): `cluster` (2) blocks, consecutive in the grid, take the
  // work items together, each item a pair of output tiles adjacent in M
  // (`cluster_shares_b`: they share B's tile) or in N (sharing A's); without a
  // persistent walk, blocks 2i and 2i + 1 take pair i. Each block brings
  // its own operand's tile as before and half the rows of every box of the shared one
  // (that map's box is half as tall), multicast into both blocks' shared memory and
  // completing on both blocks' full mbarriers; every consumer warp releases a stage on
  // both blocks' empty mbarriers (the stage is written by both producers). `tiles` and
  // `items` then count the pairs. 1: no cluster.
  int cluster = 1;
  bool cluster_shares_b = false;
  // The rows of the shared operand's boxes each block brings (cluster > 1).
  int half_rows() const {
    const bool kc = cluster_shares_b ? b_kc : a_kc;
    return (kc ? (cluster_shares_b ? bn : bm) : bk) / cluster;
  }
  int64_t grid_x() const {
    if (!persistent) return tiles * cluster;
    return cluster * std::min<int64_t>(std::max(persistent / cluster, 1), items);
  }
};

// The tiling of `p` under `c` on sm_`sm` (`wgmma_arch`: sm_90a), or a Diag saying why
// no tensor-core kernel fits (matmul.h lists the conditions).
Result<MmaTiling> mma_tiling(const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch);

// Whether every index the kernel forms fits i32: the operands' spans over tiles padded
// past M, N and K, and every tensor's size.
bool mma_fits_i32(const Graph& g, const MatmulGroup& p, const MmaTiling& t);

}  // namespace sf::matmul_detail
