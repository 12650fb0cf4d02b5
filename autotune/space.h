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
//  host:          host_vector x host_interleave (x host_tile_n for matmul)
// A persistent grid is SMs x the blocks that fit on an SM by threads alone.
std::vector<KernelConfig> config_space(const TuneProblem& p, const TargetInfo& t);

// Why `c` is not worth compiling for `p` on `t`, or nullopt when it is.
std::optional<std::string> rule_reject(const TuneProblem& p, const KernelConfig& c, const TargetInfo& t);

}  // namespace sf
