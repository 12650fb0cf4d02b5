#include "autotune/space.h"

#include <algorithm>

namespace sf {

namespace {

// Blocks of `threads` threads that fit on one SM by thread and block count alone;
// times the SM count this is a grid that keeps every SM full without a tail.
int persistent_grid(const TargetInfo& t, int threads) {
  int per_sm = std::max(1, std::min(t.max_blocks, t.max_threads / std::max(threads, 1)));
  return t.sms * per_sm;
}

std::vector<KernelConfig> gpu_pointwise(const TargetInfo& t) {
  std::vector<KernelConfig> out;
  for (int block : {128, 256, 512, 1024})
    for (int vector : {1, 2, 4, 8})
      for (int ept : {1, 2, 4})
        for (bool persistent : {false, true}) {
          KernelConfig c;
          c.block = block;
          c.vector = vector;
          c.elems_per_thread = ept;
          c.grid_stride = persistent;
          c.max_blocks = persistent ? persistent_grid(t, block) : KernelConfig{}.max_blocks;
          out.push_back(c);
        }
  return out;
}

std::vector<KernelConfig> gpu_reduction(const TuneProblem& p, const TargetInfo& t) {
  std::vector<KernelConfig> out;
  std::vector<std::pair<int, int>> shapes;  // (threads_per_row, rows_per_block)
  for (int tpr : {8, 16, 32, 64, 128, 256, 512, 1024})
    for (int rows : {1, 2, 4, 8, 16}) shapes.emplace_back(tpr, rows);
  // Outer reductions: blocks of 32 to 128 neighbouring rows (a warp's lanes on whole
  // 128-byte lines of f32 at each element index) with 1 to 32 threads a row.
  if (p.outer)
    for (int tpr : {1, 2, 4, 8, 16, 32})
      for (int rows : {32, 64, 128}) shapes.emplace_back(tpr, rows);
  for (auto [tpr, rows] : shapes) {
    int threads = tpr * rows;
    if (threads > 1024 || threads < 32) continue;  // whole warps, CUDA's block limit
    for (int split : {1, 8, 64})
      for (bool persistent : {false, true}) {
        KernelConfig c;
        c.threads_per_row = tpr;
        c.rows_per_block = rows;
        c.split_reduction = split;
        c.grid_stride = persistent;
        c.max_blocks = persistent ? persistent_grid(t, threads) : KernelConfig{}.max_blocks;
        out.push_back(c);
      }
  }
  return out;
}

// One tensor-core config of the space below; a persistent grid of the SMs times the
// blocks one SM's shared memory holds.
KernelConfig tensor_core_config(int bm, int bn, int bk, int warps, int stages, int ws, int sk, int pers, int pp,
                                int regs, int tma_store, int cluster, const TargetInfo& t, int operand_bytes) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.warps = warps;
  c.stages = stages;
  c.group_m = 8;
  c.warp_specialize = ws;
  c.split_k = sk;
  if (pers) {
    const int64_t shared = int64_t{stages} * (int64_t{bm} * bk + int64_t{bk} * bn) * operand_bytes + 16 * stages;
    const int64_t per_sm = t.shared_bytes / std::max<int64_t>(shared + t.reserved_shared_per_block, 1);
    c.persistent = t.sms * static_cast<int>(std::clamp<int64_t>(per_sm, 1, 4));
  }
  c.pingpong = pp;
  c.setmaxnreg = regs;
  c.tma_store = tma_store;
  c.cluster_m = cluster == 1 ? 2 : 1;
  c.cluster_n = cluster == 2 ? 2 : 1;
  return c;
}

// Tensor-core tiles (sm_80+, 16-bit or TF32 operands): Triton's and CUTLASS's common
// sm_80 configs, which on sm_90a include the wgmma ones (4 or 8 warps, 64-row
// warpgroups, block_k 64, or 32 for TF32). Their contiguous shared sides are 32 or 64
// wide, the swizzle's widths. Each also tries split-K (2 and 4: a bare TF32 matmul adds
// into its output, any other group sums in a workspace), which the rules keep only
// where the output tiles leave SMs idle.
//
// The warp-specialised sm_90a configs also come persistent (CUTLASS's and Triton's
// persistent Hopper GEMMs are warp-specialised: the producer loads the next tile
// while the consumers store this one): a grid of the SMs times the blocks one SM
// holds by shared memory. Those with two consumer warpgroups also come ping-pong
// (CUTLASS's other Hopper schedule: the warpgroups take whole tiles in turn), and
// those of them whose consumer threads hold 128 accumulators (the most that fit,
// where 168 registers a thread are tightest) also with setmaxnreg=232: the producer
// warpgroup keeps 40 registers a thread, the consumers take the rest, as CUTLASS's
// Hopper kernels do; those again also with TMA stores (tma_store=1: the staged chunks
// leave by cp.async.bulk.tensor, as CUTLASS's Hopper epilogues do; configs whose
// outputs TMA cannot store fail to build and are dropped), and (without TMA stores) in
// clusters of two along M and along N, the pair's shared tile multicast (CUTLASS's
// Hopper GEMMs default to clusters of two); the warp-specialised configs without a
// persistent grid also in clusters along M.
void add_tensor_core_matmul(std::vector<KernelConfig>& out, bool wgmma, bool split, const TargetInfo& t,
                            int operand_bytes) {
  for (int bm : {64, 128, 256})
    for (int bn : {64, 128, 256})
      for (int bk : {32, 64})
        for (int warps : {4, 8})
          for (int stages : {2, 3, 4, 5})
            // sm_90a: also with a producer warpgroup (the wgmma + TMA kernel; configs it
            // cannot take fail to build and are dropped).
            for (int ws = 0; ws <= (wgmma && stages >= 3 ? 1 : 0); ++ws)
              for (int sk = 1; sk <= (split ? 4 : 1); sk *= 2)
                for (int pers = 0; pers <= ws; ++pers)
                  // Persistent with two consumer warpgroups: also ping-pong, which
                  // gives each warpgroup whole tiles (so 64-row tiles fit 8 warps).
                  for (int pp = 0; pp <= (pers && warps == 8 && sk == 1 ? 1 : 0); ++pp) {
                    // Accumulators a consumer thread holds: its warpgroup's rows (the
                    // whole tile in ping-pong, half of it otherwise) x block_n / 128.
                    const int64_t acc = int64_t{pp ? bm : bm / 2} * bn / 128;
                    const bool realloc = pers && warps == 8 && acc == 128;
                    for (int regs : realloc ? std::vector<int>{0, 232} : std::vector<int>{0})
                      for (int store = 0; store <= (regs ? 1 : 0); ++store)
                        // Clusters (no split-K): beside each setmaxnreg=232 config along M and N;
                        // beside each warp-specialised one-block-a-tile one (the decode
                        // shape's class) along M, its blocks sharing B (the weight).
                        for (int cl = 0; cl <= (sk > 1 ? 0 : regs && !store ? 2 : ws && !pers ? 1 : 0); ++cl)
                          out.push_back(tensor_core_config(bm, bn, bk, warps, stages, ws, sk, pers, pp, regs, store, cl, t,
                                                           operand_bytes));
                  }
}

std::vector<KernelConfig> gpu_matmul(const TuneProblem& p, const TargetInfo& t) {
  std::vector<KernelConfig> out;
  if ((p.operand_bytes == 2 || p.tf32) && t.tensor16_gflops > 0) add_tensor_core_matmul(out, t.name == "sm_90a", true, t, p.operand_bytes);
  for (int bm : {32, 64, 128})
    for (int bn : {32, 64, 128})
      for (int bk : {8, 16, 32})
        for (int warps : {2, 4, 8})
          for (int stages : {1, 2, 3})
            for (int group_m : {1, 8})
              for (int split : {1, 2, 4}) {  // any group: docs/kernels.md, "Split-K"
                KernelConfig c;
                c.block_m = bm;
                c.block_n = bn;
                c.block_k = bk;
                c.warps = warps;
                c.stages = stages;
                c.group_m = group_m;
                c.split_k = split;
                out.push_back(c);
              }
  return out;
}

std::vector<KernelConfig> attention_tiles(const std::vector<int>& warps) {
  std::vector<KernelConfig> out;
  for (int bm : {16, 32, 64, 128})
    for (int bn : {16, 32, 64, 128})
      for (int w : warps) {
        KernelConfig c;
        c.block_m = bm;
        c.block_n = bn;
        c.warps = w;
        out.push_back(c);
      }
  return out;
}

std::vector<KernelConfig> host_space(KernelKind kind) {
  if (kind == KernelKind::Attention) return attention_tiles({KernelConfig{}.warps});
  std::vector<KernelConfig> out;
  std::vector<int> tiles = kind == KernelKind::Matmul ? std::vector<int>{16, 32, 64, 128, 256} : std::vector<int>{0};
  for (int tile : tiles)
    for (int v : {0, 1, 2, 4, 8, 16})
      for (int il : {0, 1, 2, 4, 8}) {
        KernelConfig c;
        c.host_tile_n = tile;
        c.host_vector = v;
        c.host_interleave = il;
        out.push_back(c);
      }
  return out;
}

int64_t ceil_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// An attention tile over twice the (power-of-two rounded) rows or keys is mostly
// padding; the tiles must fit the block's memory (`budget` bytes): the f32 tiles, or
// on a GPU with 16-bit tensor cores (`tensor_cores`) the 16-bit ones of the
// register-resident form where the config takes it (16-bit operands, 16 or 32 rows a
// warp, tiles and head dims multiples of 16). Without that, a 192-row or 128 x 128
// tile would be priced at f32 and never measured.
std::optional<std::string> attention_reject(const TuneProblem& p, const KernelConfig& c, int64_t budget,
                                            bool tensor_cores = false) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (c.block_m > 2 * ceil_pow2(p.m) && c.block_m > 16) return "block_m " + s(c.block_m) + " is over twice L = " + s(p.m);
  if (c.block_n > 2 * ceil_pow2(p.n) && c.block_n > 16) return "block_n " + s(c.block_n) + " is over twice S = " + s(p.n);
  const bool regs16 = tensor_cores && p.operand_bytes == 2 && c.warps > 0 &&
                      (c.block_m == 16 * c.warps || c.block_m == 32 * c.warps) && c.block_n % 16 == 0 &&
                      p.k % 16 == 0 && p.cols % 8 == 0;
  const int64_t bytes = regs16 ? attention_tile_bytes16(c.block_m, c.block_n, p.k, p.cols, c.wgmma, c.stages)
                               : attention_tile_bytes(c.block_m, c.block_n, p.k, p.cols);
  if (bytes > budget) return "its tiles take " + s(bytes) + " bytes, over the " + s(budget) + " a block may hold";
  return std::nullopt;
}

}  // namespace

std::vector<KernelConfig> config_space(const TuneProblem& p, const TargetInfo& t) {
  if (t.kind == ConfigTarget::Host) return host_space(p.kind);
  switch (p.kind) {
    case KernelKind::Pointwise: return gpu_pointwise(t);
    case KernelKind::Reduction: return gpu_reduction(p, t);
    case KernelKind::Matmul: return gpu_matmul(p, t);
    case KernelKind::Attention: {
      std::vector<KernelConfig> out = attention_tiles({2, 4, 8});
      // sm_90a: register-resident tiles of whole warpgroups (16 rows a warp: 1 to 4
      // warpgroups, 64 to 256 rows) over 16 to 128 keys multiplying by wgmma, plain
      // and pipelined, where the head dims are whole 64-column panels. On an H200 the
      // fastest were 256 x 64 (16 warps), 192 x 96 and 128 x 128 (run 11).
      if (t.name == "sm_90a" && p.operand_bytes == 2 && p.k % 64 == 0 && p.cols % 64 == 0)
        for (int warps : {4, 8, 12, 16})
          for (int bn : {16, 32, 64, 96, 128})
            for (int w : {1, 2}) {  // synchronous, pipelined
              KernelConfig c;
              c.block_m = 16 * warps;
              c.block_n = bn;
              c.warps = warps;
              c.wgmma = w;
              out.push_back(c);
            }
      return out;
    }
    case KernelKind::Gather: {
      std::vector<KernelConfig> out;
      for (int block : {128, 256, 512, 1024}) {
        KernelConfig c;
        c.block = block;
        out.push_back(c);
      }
      return out;
    }
  }
  return {};
}

std::optional<std::string> rule_reject(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (t.kind == ConfigTarget::Host) {
    // A vector wider than two SIMD registers only splits into more instructions.
    if (c.host_vector * p.elem_bytes > 2 * t.simd_bytes)
      return "host_vector " + s(c.host_vector) + " x " + s(p.elem_bytes) + " bytes exceeds two " + s(t.simd_bytes) +
             "-byte SIMD registers";
    if (p.kind == KernelKind::Attention) return attention_reject(p, c, 1 << 20);
    if (p.kind == KernelKind::Matmul && c.host_tile_n > 2 * ceil_pow2(std::max<int64_t>(p.n, 1)) && c.host_tile_n > 16)
      return "host_tile_n " + s(c.host_tile_n) + " is over twice N = " + s(p.n);
    return std::nullopt;
  }
  switch (p.kind) {
    case KernelKind::Pointwise: {
      // One thread moves vector x elem_bytes at a time; over 16 bytes is more than one
      // 128-bit transaction per load (PTX ISA: ld.global.v4.b32 is the widest).
      if (int64_t{c.vector} * p.elem_bytes > 16)
        return "vector " + s(c.vector) + " x " + s(p.elem_bytes) + " bytes exceeds one 16-byte load";
      int64_t tile = int64_t{c.block} * c.vector * c.elems_per_thread;
      // A block's tile larger than the whole problem leaves most threads idle.
      if (tile > 2 * ceil_pow2(std::max<int64_t>(p.n, 1)) && tile > 128)
        return "a block covers " + s(tile) + " elements, over twice the " + s(p.n) + " there are";
      if (c.grid_stride && p.n <= tile * int64_t{c.max_blocks})
        return "the persistent grid of " + s(c.max_blocks) + " blocks already covers the problem in one pass";
      return std::nullopt;
    }
    case KernelKind::Reduction: {
      // More threads per row than elements in it leaves threads idle.
      if (c.threads_per_row > 2 * ceil_pow2(std::max<int64_t>(p.cols, 1)) && c.threads_per_row > 32)
        return "threads_per_row " + s(c.threads_per_row) + " is over twice the row length " + s(p.cols);
      int64_t blocks = (p.rows + c.rows_per_block - 1) / c.rows_per_block;
      // An outer reduction needs up to 32 rows a block for its warps to read whole
      // lines, whatever that leaves of the SMs.
      if (c.rows_per_block > (p.outer ? 32 : 1) && blocks < t.sms && p.rows >= t.sms)
        return "rows_per_block " + s(c.rows_per_block) + " leaves " + s(blocks) + " blocks for " + s(t.sms) + " SMs";
      if (c.grid_stride && blocks <= c.max_blocks)
        return "the persistent grid of " + s(c.max_blocks) + " blocks already covers the rows in one pass";
      if (c.split_reduction > 1) {
        // Shares of a row meet in a workspace: one pass and outputs per row only, and
        // only worth it when the rows leave SMs idle.
        if (!p.splittable)
          return "split_reduction " + s(c.split_reduction) + " needs one pass over each row and outputs per row only";
        if (blocks >= t.sms) return "split_reduction " + s(c.split_reduction) + ": " + s(blocks) + " row blocks already fill " + s(t.sms) + " SMs";
        if (p.cols / c.split_reduction < c.threads_per_row)
          return "split_reduction " + s(c.split_reduction) + " leaves shares of " + s(p.cols / c.split_reduction) +
                 " elements, fewer than the " + s(c.threads_per_row) + " threads of a row";
      }
      return std::nullopt;
    }
    case KernelKind::Matmul: {
      // A tile over twice the (power-of-two rounded) problem extent is mostly padding.
      if (c.block_m > 2 * ceil_pow2(p.m) && c.block_m > 32) return "block_m " + s(c.block_m) + " is over twice M = " + s(p.m);
      if (c.block_n > 2 * ceil_pow2(p.n) && c.block_n > 32) return "block_n " + s(c.block_n) + " is over twice N = " + s(p.n);
      if (c.block_k > 2 * ceil_pow2(p.k) && c.block_k > 8) return "block_k " + s(c.block_k) + " is over twice K = " + s(p.k);
      // Each thread must own at least one output, and a warp's 32 threads a whole row
      // of the register tile: fewer outputs than threads cannot be laid out.
      int64_t threads = int64_t{c.warps} * 32;
      if (int64_t{c.block_m} * c.block_n < threads * 2)
        return s(c.block_m) + "x" + s(c.block_n) + " tile has fewer than 2 outputs per thread for " + s(threads) + " threads";
      if (int64_t{c.block_m} * c.block_n / threads > 128)
        return s(int64_t{c.block_m} * c.block_n / threads) + " outputs per thread need more than 255 registers";
      if (c.group_m > 1 && (p.m + c.block_m - 1) / c.block_m <= 1)
        return "group_m " + s(c.group_m) + " swizzles nothing with one row of tiles";
      if (c.split_k > 1) {
        // Split-K (a bare f32 matmul adds its partial sums into its output, any other
        // group sums them in a workspace): only worth it when the output tiles leave
        // SMs idle.
        int64_t tiles = p.batch * ((p.m + c.block_m - 1) / c.block_m) * ((p.n + c.block_n - 1) / c.block_n);
        if (tiles >= t.sms) return "split_k " + s(c.split_k) + ": " + s(tiles) + " output tiles already fill " + s(t.sms) + " SMs";
        int64_t kt = (p.k + c.block_k - 1) / c.block_k;
        if (kt % c.split_k != 0 || kt / c.split_k < 2)
          return "split_k " + s(c.split_k) + " does not split " + s(kt) + " K tiles into parts of 2 or more";
      }
      return std::nullopt;
    }
    case KernelKind::Gather: return std::nullopt;
    case KernelKind::Attention: return attention_reject(p, c, t.max_shared_per_block, t.tensor16_gflops > 0);
  }
  return std::nullopt;
}

}  // namespace sf
