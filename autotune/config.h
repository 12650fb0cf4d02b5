// A kernel's tuning knobs and the kinds of kernels they belong to. No LLVM here:
// the autotuner (autotune/) and the runtime read configs from the cache and from
// plan.json where no compiler is present (DESIGN.md).
#pragma once

#include "runtime/core/kernel_kind.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/core/diag.h"

namespace sf {

// How a kernel rounds the f16/bf16 values it computes (docs/kernels.md, "Precision").
//   Fused (the default, as Inductor): values inside the kernel stay in f32 and are
//     rounded to their dtype once, where they are stored, and at explicit casts:
//     closer to the exact result, and no rounding between ops.
//   Eager: every node's result is rounded to its dtype, as eager PyTorch and the
//     reference evaluator do: a kernel then gives what the unfused graph gives, bit
//     for bit where the math functions agree.
// f32-only kernels are the same in both. `--check` allows for the difference
// (check_tolerance, codegen/reference/compare.h).
enum class Precision { Fused, Eager };
inline const char* precision_name(Precision p) { return p == Precision::Eager ? "eager" : "fused"; }


// KernelKind, kernel_kind_name, parse_kernel_kind: runtime/core/kernel_kind.h.

// Tuning knobs; every field has a sane default and an emitter reads the ones that
// concern its kind and target. The autotuner searches over them.
struct KernelConfig {
  // --- NVPTX ---
  // pointwise and reduction
  int block = 256;          // threads per block
  int vector = 4;           // elements per vector load/store where alignment allows
  int elems_per_thread = 1; // vectors per thread, a block apart (warp accesses stay coalesced)
  bool grid_stride = true;  // loop over the index space with a capped grid, or one shot
  int max_blocks = 4096;    // cap on the grid when grid_stride (a persistent grid is SMs x occupancy)
  // reduction
  int rows_per_block = 1;
  int threads_per_row = 256;
  int split_reduction = 1;  // blocks (grid y) sharing each row's elements; partial results added atomically
  // matmul
  int block_m = 64, block_n = 64, block_k = 16;
  int warps = 4;
  int stages = 2;    // matmul: the K loop's shared-memory stages; attention (wgmma=1): k/v buffers
  int group_m = 8;   // GROUP_M swizzle of block indices for L2 reuse
  int split_k = 1;
  // sm_90a wgmma + TMA: one extra warpgroup of producers issues the copies while the
  // `warps` consumer warps multiply, the stages handed over by mbarriers (0: every
  // thread takes part in both, meeting at a barrier per K tile).
  int warp_specialize = 0;
  // Tensor-core matmul: a persistent grid of this many blocks (Triton's NUM_SMS), each
  // walking output tiles (and batches) a grid apart; 0: one block per tile.
  int persistent = 0;
  // Warp-specialised persistent wgmma kernel with two consumer warpgroups: 1 gives each
  // warpgroup whole output tiles of its own, taken in turn (CUTLASS's ping-pong
  // schedule), so one warpgroup's epilogue runs while the other multiplies; 0: both
  // share every tile (CUTLASS's cooperative schedule). Fused attention with wgmma=2
  // on 8 or 16 warps: 1 has the warpgroups of each pair issue their products in
  // turns, one's softmax under the other's products (FlashAttention-3's ping-pong).
  int pingpong = 0;
  // Warp-specialised persistent wgmma kernel with two consumer warpgroups (384
  // threads, 168 registers each at launch): the consumer warpgroups' registers a
  // thread after setmaxnreg.inc (176..240, a multiple of 8), the producer warpgroup
  // giving up the difference with setmaxnreg.dec (232: the producer keeps 40, as
  // CUTLASS's Hopper kernels do); 0: no reallocation.
  int setmaxnreg = 0;
  // Warp-specialised persistent wgmma kernel fed by TMA, its epilogue staged in chunks:
  // 1 stores each consumer warp's staged chunk of every output with TMA
  // (cp.async.bulk.tensor shared to global, one instruction a 16-row box, issued by the
  // warp's first lane through a tensor map of the output), the warp going on to the
  // next chunk while the copy reads the last (CUTLASS's TMA epilogue); 0: the warp's
  // lanes store the chunk 128 bits at a time.
  int tma_store = 0;
  // Warp-specialised wgmma kernel fed by TMA (persistent or not): thread-block clusters of two
  // (CUTLASS's ClusterShape, Triton's num_ctas = 2). cluster_m = 2 pairs the blocks of
  // two output tiles stacked in M, which share B's tile: each block brings half of it
  // by TMA multicast into both blocks' shared memory, so L2 delivers each B panel
  // once for the pair; cluster_n = 2 pairs tiles side by side in N, sharing A's tile.
  // 1 and 1: no cluster. At most one of them is 2.
  int cluster_m = 1, cluster_n = 1;
  // Fused attention on sm_90a: 1 multiplies q k^T and p v with wgmma.mma_async, each
  // warpgroup's 64 query rows at a time, k and v read from shared memory through
  // matrix descriptors; 0: mma.sync, each warp's 16 rows (docs/kernels.md,
  // "Attention"). The matmul picks wgmma by itself.
  int wgmma = 0;
  // Fused causal attention on NVPTX: the blocks take the query tiles longest first
  // (the tiles whose rows see the most keys), this many kv-head groups (GQA groups, or
  // heads) at a time, so that a section's k and v stay in L2 while its tiles run
  // (FlashAttention-3's longest-processing-time-first order). 0: as many as keep a
  // section's k and v within 16 MiB. Attention without a causal mask keeps the grid's
  // plain order (every tile costs the same). docs/kernels.md, "Attention".
  int group_heads = 0;
  // --- host (the kernel runs as loops in one CPU thread) ---
  int host_vector = 0;      // llvm.loop.vectorize.width of the innermost loop; 0 = LLVM's choice
  int host_interleave = 0;  // llvm.loop.interleave.count of the innermost loop; 0 = LLVM's choice
  int host_tile_n = 0;      // matmul: output columns accumulated per pass over K; 0 = the emitter's default

  bool operator==(const KernelConfig&) const = default;
};

// Whether a config is for the host (CPU) or an NVPTX target; it decides which
// fields matter.
enum class ConfigTarget : uint8_t { Host, Gpu };

// The fields that decide the generated code for (kind, target), in a fixed order
// ("block_m", "block_n", ... for a GPU matmul).
std::vector<const char*> config_fields(KernelKind kind, ConfigTarget target);

// The fields that matter for (kind, target), as "name=value" pairs joined by
// spaces in a fixed order, e.g. "block=256 vector=4 elems_per_thread=1
// grid_stride=1 max_blocks=4096". Two configs with the same text build the same
// kernel; the text is what the tuning cache stores a config under.
std::string config_str(KernelKind kind, ConfigTarget target, const KernelConfig& c);

// The same fields as a JSON object ({"block": 256, ...}).
nlohmann::json config_to_json(KernelKind kind, ConfigTarget target, const KernelConfig& c);

// Reads the fields present in `j` over `base`; a Diag naming an unknown field or a
// value that is not an integer (bools for grid_stride).
Result<KernelConfig> config_from_json(const nlohmann::json& j, KernelConfig base = {});

// Parses config_str's text back ("a=1 b=2"); a Diag naming the offending token.
Result<KernelConfig> parse_config_str(std::string_view text, KernelConfig base = {});

// Extern candidates (docs/autotuning.md): a library GEMM (cuBLASLt, cuBLAS) measured
// beside the generated configs of a matmul, as Inductor's max-autotune measures its
// extern kernels. It is stored and chosen under the config text "extern=<library>"
// ("extern=cublaslt"), which no KernelConfig can have (parse_config_str rejects it),
// so a cached extern winner never passes for a config.
std::string extern_config_str(std::string_view library);
// The library of an extern config text, nullopt for a KernelConfig's text.
std::optional<std::string> extern_library_of(std::string_view config_text);

}  // namespace sf
