// The configs the tuner considers for one kernel, per kind and target, and the
// rules that drop a config before anything is compiled (a tile far larger than
// the problem, a vector wider than one memory transaction, ...). Spaces are
// ordered, deterministic lists: the same problem gives the same list, so the
// cache's per-config entries line up across runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "autotune/config.h"
#include "autotune/problem.h"
#include "autotune/target.h"

namespace sf {

// Every config of the space for (problem, target), before pruning.
//  GPU pointwise: block x vector x elems_per_thread x {one-shot grid, persistent grid}
//  GPU reduction: threads_per_row x rows_per_block x {one-shot, persistent}
//  GPU matmul:    block_m x block_n x block_k x warps x stages x group_m x split_k,
//                 preceded for 16-bit operands on archs with tensor cores by the
//                 tensor-core tiles (64..256 x 64..256 x 32/64, 4/8 warps, 2-5 stages)
//  GPU attention: block_m (query rows) x block_n (keys per tile) x warps
//  host:          host_vector x host_interleave (x host_tile_n for matmul);
//                 attention: block_m x block_n
// A persistent grid is SMs x the blocks that fit on an SM by threads alone.
std::vector<KernelConfig> config_space(const TuneProblem& p, const TargetInfo& t);

// The f32 tiles a fused attention block holds (shared memory on a GPU, the stack on
// the host): q [bm, e], k [bn, e], v [bn, ev], the scores [bm, bn], the output
// accumulator [bm, ev] and three per-row values (max, sum, rescale).
inline int64_t attention_tile_bytes(int64_t bm, int64_t bn, int64_t e, int64_t ev) {
  return 4 * (bm * e + bn * e + bn * ev + bm * bn + bm * ev + 3 * bm);
}

// The shared memory of the tensor-core attention's register-resident form (16-bit
// operands; block_m 16 or 32 rows a warp), as its emitter lays it out: q [bm, e] and
// kv_buffers of k [bn, e] and v [bn, ev] as 16-bit values. On mma.sync each row is
// padded to an odd number of 16-byte chunks and there are two buffers; with `wgmma`
// (1 or 2) each head dim is whole 64-column panels of 128-byte rows, `stages` buffers
// (wgmma = 1; three pipelined), and TMA's full and empty mbarriers (16 bytes a buffer).
inline int64_t attention_tile_bytes16(int64_t bm, int64_t bn, int64_t e, int64_t ev, int wgmma, int stages = 2) {
  if (wgmma) {
    const int64_t buffers = wgmma == 2 ? 3 : stages;
    auto panels = [](int64_t n) { return (n + 63) / 64; };
    return panels(e) * bm * 128 + buffers * (panels(e) + panels(ev)) * bn * 128 + 16 * buffers;
  }
  auto padded = [](int64_t n) { return n + ((n / 8) % 2 == 0 ? 8 : 16); };
  return 2 * (bm * padded(e) + 2 * bn * (padded(e) + padded(ev)));
}

// Why `c` is not worth compiling for `p` on `t`, or nullopt when it is.
std::optional<std::string> rule_reject(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t);

}  // namespace sf
