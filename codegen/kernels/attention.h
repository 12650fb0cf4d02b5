// The fused attention emitter (KernelKind::Attention): the group fusion made of one
// attention (codegen/ir/attention_match.h: matmul(q, kt) -> elementwise chain ->
// softmax -> matmul with v), with the views and pointwise ops that produce q, kt and v
// (RoPE, head splits, GQA's kv-head repeat) as its prologue and the views after it
// (the head merge) as its store. FlashAttention's algorithm: the scores and the
// probabilities are never written to memory.
//
// One block per (batch, tile of block_m query rows); the keys in tiles of block_n
// (with GQA, one block per (batch, kv head's group of G query heads, block_m / G rows
// of each), so a k or v tile serves the whole group):
//   q tile [block_m, E] evaluated once (its prologue computed once per element);
//   for each key tile that some row of the block can see (a causal chain's keys
//   beyond the block's last row + diagonal are skipped):
//     k tile [block_n, E] and v tile [block_n, Ev] evaluated (their prologue);
//     scores = q k^T, through the chain (scale, masks) element by element;
//     online softmax per row: m' = max(m, max_j s), p = exp(s - m'),
//       l = l * exp(m - m') + sum_j p, acc = acc * exp(m - m') + p v;
//   out = acc / l, stored through the output views.
// All in f32 (f16/bf16 operands widened as loaded); the result rounded once at the
// store. A row whose every key is masked gives 0 / 0 = NaN, as softmax of a row of
// -inf does in the reference.
//
// The tiles live in shared memory on NVPTX (block = warps x 32 threads, each phase a
// loop over the tile's elements a block apart, with a barrier after it) and on the
// stack on the host (the same phases as plain loops, one block after another): the
// same algorithm, so the host run checks the GPU kernel's tiling and index math.
// On NVPTX, f16/bf16 attention with 16-aligned tiles and head dims takes the tensor
// cores on sm_80 and later: q k^T and p v as warp tiles of mma.sync.m16n8k16 (f32
// accumulation), their fragments read from the f32 tiles and rounded to the operand
// dtype (p to q's dtype, as FlashAttention's second product does), each fragment's
// positions from mma_layout.h; the softmax, the chain and the loads stay per element.
// Other attention (f32, odd tiles or head dims) multiplies in FMA (SIMT).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "codegen/ir/attention_match.h"
#include "codegen/kernels/emitter.h"

namespace sf {

namespace kernels {
struct IndexMap;
}

struct AttentionKernelInfo {
  AttentionMatch match;  // ValueIds of the group graph
  int64_t batches = 1;   // the product of the batch dims
  // Where element (batch..., row, col) of the attention's result is stored in the
  // kernel's one output: its element strides (dense, or through the output views).
  std::vector<int64_t> out_strides;
  // GQA: the query heads (the last batch dim) come in groups of this many that read
  // one kv head (k and v reach the kernel through the decomposition's repeat: slice,
  // reshape, expand, reshape, slice, the groups aligned with the heads); a block then
  // takes the rows of a whole group, so each k and v tile is read once per group.
  // 1: every head its own blocks.
  int64_t heads_per_kv = 1;
};

// The group's attention and output layout, or a Diag saying why the group is not one.
Result<AttentionKernelInfo> attention_info(const Graph& group);

// How TMA reads the heads of k or v (the wgmma form's KernelSpec::tma): a tensor map
// over the param with dims (cols, rows, then up to three dims of heads), innermost
// first, and the map coordinates of each head. The operand is [heads..., rows, cols]
// in C order, read from a param of `param_numel` elements through `map` (its views'
// index map, element.h): plain heads, GQA's repeated heads, or heads of a permuted
// projection ([batch, seq, heads, cols] seen as [batch, heads, seq, cols], as
// FlashAttention-3 reads q, k and v by TMA), or a slice of heads (k of a fused qkv
// projection). Every row's columns must be adjacent, rows and heads evenly spaced by
// multiples of 16 bytes, and the first head a whole number of head strides into the
// param; a Diag says which does not hold.
struct KvTmaLayout {
  int rank = 3;
  std::array<int64_t, kMaxTensorMapRank> dims{1, 1, 1, 1, 1};  // elements: cols, rows, then the head dims
  std::array<int64_t, kMaxTensorMapRank - 1> strides{};         // bytes between indices of dims 1, 2, ...
  // Map dim 2 + i's coordinate of head h (the operand's flat index over its leading
  // dims) is start + (h / div) % radix; the dim's extent is start + radix (a slice's
  // heads sit `start` heads into the param's).
  struct HeadDim {
    int64_t div = 1, radix = 1, start = 0;
    bool operator==(const HeadDim&) const = default;
  };
  std::vector<HeadDim> head_dims;
};
Result<KvTmaLayout> kv_tma_layout(const kernels::IndexMap& map, int64_t heads, int64_t rows, int64_t cols,
                                  int64_t param_numel, int64_t elem_bytes);

// The bytes of shared memory (NVPTX) or stack (host) a block may hold.
int64_t attention_tile_budget(const llvmb::Target& target);

Result<EmittedKernel> emit_attention(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target);

// Why the tensor-core kernel cannot compute `group` with `config` (q, k, v not one of
// f16/bf16, tiles or head dims not multiples of 16 (Ev: 8)), or nullopt.
std::optional<std::string> attention_mma_unfit(const Graph& group, const KernelConfig& config);
// Whether emit_attention for NVPTX `arch` takes the tensor cores (sm_80+ and fit).
bool attention_uses_tensor_cores(const KernelSpec& spec, const KernelConfig& config, const std::string& arch);
// Why the wgmma form (config.wgmma) cannot compute `group` with `config` on NVPTX
// `arch` (not sm_90a, no tensor cores, not 16 rows a warp, warps not whole
// warpgroups, head dims not multiples of 64), or nullopt.
std::optional<std::string> attention_wgmma_unfit(const Graph& group, const KernelConfig& config, const std::string& arch);
// Whether the block's tiles under `config` fit the shared memory a block may hold on
// NVPTX `arch` (the check emit_attention makes, without emitting).
bool attention_tiles_fit(const Graph& group, const KernelConfig& config, const std::string& arch);

// A block's tile as emitted: the query heads it takes (GQA group, or 1), rows of each,
// its rows bm = group x rows_per_head and keys bn per step, both cut to the rows and
// keys there are; and whether the tensor-core kernel takes its register-resident form
// (FlashAttention-2's: each warp keeps 16 rows' scores, probabilities and output in
// mma fragments; when bm = 16 x warps), else scores and output pass through shared
// memory between the phases.
struct AttentionBlockShape {
  int64_t group = 1, rows_per_head = 1, bm = 1, bn = 1;
  // The register-resident tensor-core form, where the (cut) tile is 16 or 32 rows a
  // warp: `mtiles` 16-row mma tiles a warp (1 or 2; 0 in the other forms). Two share
  // every k and v fragment a warp reads (FlashAttention-2's 32 rows a warp), which
  // halves the shared-memory reads per product.
  bool registers = false;
  int mtiles = 0;
};
AttentionBlockShape attention_block_shape(const AttentionKernelInfo& info, const KernelConfig& config, bool tensor_cores);

// The order an NVPTX attention kernel's blocks take (KernelConfig::group_heads). With
// a causal mask and more than one query tile, the tiles of later rows see more keys
// and cost more: the blocks then take the tiles longest first (FlashAttention-3's
// longest-processing-time-first order, so that no long tile starts last and leaves
// the other SMs idle), `width` kv-head groups side by side at each tile; a section of
// that many groups runs through all its tiles before the next starts, so its k and v
// stay in L2. width = config.group_heads, or at 0 as many groups as keep their k and
// v within kAttentionL2Bytes. width 0: the grid's plain order (group by group, tiles
// ascending), without a causal mask or with one query tile.
inline constexpr int64_t kAttentionL2Bytes = int64_t{16} << 20;
struct AttentionBlockOrder {
  int64_t width = 0;
  int64_t groups = 0;       // kv-head groups (batch x kv heads): the blocks of one query tile
  int64_t query_tiles = 0;  // query tiles of each group
  int64_t kv_bytes_per_group = 0;
};
AttentionBlockOrder attention_block_order(const Graph& group, const AttentionKernelInfo& info, const KernelConfig& config,
                                          const AttentionBlockShape& shape);
// How report.txt and explain say it: "blocks: query tiles longest first, 16 kv-head
// groups of 64 at a time (k and v 16.0 MiB)"; "" for the plain order.
std::string attention_order_str(const AttentionBlockOrder& order);

// The tensor-core kernel built for the host with each GPU thread one call and its
// mma.sync and barriers calls to MmaSimHooks (matmul.h; the tests simulate them from
// the PTX ISA): entry(args, blockIdx.x, 0, threadIdx.x, shared memory, hooks, 0), one
// block per call sequence of launch.block threads. A Diag where attention_mma_unfit.
Result<EmittedKernel> emit_attention_block_on_host(const KernelSpec& spec, const KernelConfig& config);

// The attention emitter behind the Emitter interface (emitter_for(KernelKind::Attention)).
const Emitter& attention_emitter();

}  // namespace sf
