// The tensor-core matmul's default configs (suggest_matmul_config, matmul.h): the
// tile a product's shape, dtype and arch suggest, split-K where its tiles leave SMs
// idle, the warp-specialised persistent kernel, small tiles with a producer warpgroup
// for decode shapes, and the SIMT kernel's tile; each choice with the measurement
// behind it.
#include "codegen/kernels/matmul.h"

#include <algorithm>
#include <optional>

#include "codegen/kernels/element.h"
#include "codegen/kernels/matmul_group.h"

namespace sf {

using namespace matmul_detail;

namespace {

// Split-K for a default tensor-core tile whose output tiles leave more than half of a
// typical part's SMs idle (a decode-sized M, or a small output over a long K): the
// largest split of 2..16 that keeps the blocks within one wave of SMs, gives each
// block 8 K tiles or more (its pipeline full most of the time), and keeps the
// workspace's traffic (2 x split + 2 f32 accesses per output element, atomics among
// them) within the operands' bytes. 1 where none does (typical_sms: an estimate).
int default_split_k(const MatmulGroup& p, const KernelConfig& c, int sm) {
  const int64_t sms = typical_sms(sm);
  const int64_t batch = std::max<int64_t>(p.nbatch, 1);
  const int64_t tiles = batch * ceil_div(p.M, c.block_m) * ceil_div(p.N, c.block_n);
  const int64_t kt = ceil_div(p.K, c.block_k);
  const double operand_bytes = double(batch) * double(p.M + p.N) * double(p.K) * double(dtype_size(p.dtype));
  const double out_f32_bytes = double(batch) * double(p.M) * double(p.N) * 4.0;
  int best = 1;
  if (tiles * 2 > sms) return best;
  for (int s = 2; s <= 16; s *= 2)
    if (tiles * s <= sms && kt % s == 0 && kt / s >= 8 && (2.0 * s + 2.0) * out_f32_bytes <= operand_bytes) best = s;
  return best;
}

// The warp-specialised persistent kernel for a 16-bit 128 x 256 default tile with at
// least a wave of output tiles (typical_sms: an estimate), where TMA reads the
// operands: a producer warpgroup, one block per SM walking the tiles, the consumers
// taking 232 registers a thread (setmaxnreg) and storing their epilogue in chunks
// through shared memory of their own. On an H200 this measured 0.904 and 0.928 of
// cuBLAS GEMM alone for a bf16 GEMM + bias + GELU at 4096^3 and 16384x4096x4096,
// where the one-block-a-tile kernel measured 0.878 and 0.901 (bench_kernels, runs
// 10a and 10c). Smaller grids, TF32 and f16/bf16 tiles of other shapes keep the
// one-block-a-tile kernel, which no measurement has shown slower there.
std::optional<KernelConfig> default_persistent(const MatmulGroup& p, const KernelConfig& w, int sm) {
  const int64_t sms = typical_sms(sm);
  const int64_t tiles = std::max<int64_t>(p.nbatch, 1) * ceil_div(p.M, w.block_m) * ceil_div(p.N, w.block_n);
  if (p.dtype == DType::F32 || w.block_m != 128 || w.block_n != 256 || w.split_k != 1 || tiles < sms)
    return std::nullopt;
  KernelConfig c = w;
  c.warp_specialize = 1;
  c.persistent = static_cast<int>(sms);
  c.setmaxnreg = 232;
  MmaChoice ch = mma_choice(p, c, sm, true);
  if (ch.unsupported || !ch.wgmma || !ch.tma) return std::nullopt;
  return c;
}

// A decode step's product on sm_90a (16-bit, few rows: the 128 x 256 default tile
// leaves more than half the SMs idle) whose 64 x 64 tiles fill more than half of them:
// 64 x 64 x 64 tiles on 4 warps, 4 stages, a producer warpgroup bringing the operands
// by TMA, instead of splitting K over the large tile. On an H200 the bf16 GEMM + bias
// + GELU at 128 x 4096 x 4096 took 27.9, 28.8 and 28.5 us in that config against
// 49.7, 49.9 and 49.0 us with 128 x 256 split 4 ways (tune --measure, runs 9, 10 and
// 11: bench/results/tune-h200-run{9,10,11}/matmul_bf16_128x4096x4096). Other small
// shapes (fewer 64 x 64 tiles than that, TF32) keep split-K, which no measurement has
// compared there.
std::optional<KernelConfig> default_small_tiles(const MatmulGroup& p, const KernelConfig& w, int sm) {
  const int64_t sms = typical_sms(sm), batch = std::max<int64_t>(p.nbatch, 1);
  const int64_t large = batch * ceil_div(p.M, w.block_m) * ceil_div(p.N, w.block_n);
  const int64_t small = batch * ceil_div(p.M, 64) * ceil_div(p.N, 64);
  if (p.dtype == DType::F32 || large * 2 > sms || small * 2 <= sms) return std::nullopt;
  KernelConfig c = w;
  c.block_m = 64;
  c.block_n = 64;
  c.block_k = 64;
  c.warps = 4;
  c.stages = 4;
  c.split_k = 1;
  c.warp_specialize = 1;
  MmaChoice ch = mma_choice(p, c, sm, true);
  if (ch.unsupported || !ch.wgmma || !ch.tma) return std::nullopt;
  return c;
}

}  // namespace

int typical_sms(int sm) { return sm >= 90 ? 132 : sm == 89 ? 128 : sm == 86 ? 84 : 108; }

KernelConfig suggest_matmul_config(const KernelSpec& unfolded, const KernelConfig& base, const std::string& arch) {
  const KernelSpec spec = fold_batch_into_rows(unfolded);
  Result<MatmulGroup> plan = analyse_matmul(spec);
  std::optional<int> sm = kernels::sm_version(arch);
  if (!plan || !sm) return base;
  KernelConfig c = base;
  c.split_k = 1;
  c.warps = 4;
  c.stages = 3;
  // 128 x 128 x 32 (Triton's and CUTLASS's common sm_80 tile) where the matrix fills
  // it; a small matrix gets the smallest tile that covers it, down to 32 x 32.
  auto side = [](int64_t n) {
    int s = 32;
    while (s < 128 && s < n) s *= 2;
    return s;
  };
  const bool wg = has_wgmma(arch);
  if (wg) {
    // sm_90a: Triton's Hopper tile, 128 x 256 x 64 with 8 warps (two warpgroups of
    // 64 rows, each m64n256k16 wgmma), 4 stages; smaller matrices get 64 rows and
    // 4 warps, and as few 64-wide column panels as cover N.
    KernelConfig w = c;
    w.block_m = plan->M > 64 ? 128 : 64;
    w.warps = w.block_m / 16;
    w.block_n = 64;
    while (w.block_n < 256 && w.block_n < plan->N) w.block_n *= 2;
    w.block_k = plan->dtype == DType::F32 ? 32 : 64;  // 128-byte rows: 64 16-bit or 32 TF32 elements
    w.stages = 4;  // two tiles ahead while one wgmma group is in flight (192 KiB for 16-bit)
    if (mma_choice(*plan, w, *sm, true).wgmma) {
      if (std::optional<KernelConfig> d = default_small_tiles(*plan, w, *sm)) return *d;
      KernelConfig s = w;
      s.split_k = default_split_k(*plan, w, *sm);
      if (s.split_k > 1 && mma_choice(*plan, s, *sm, true).wgmma) return s;
      if (std::optional<KernelConfig> p = default_persistent(*plan, w, *sm)) return *p;
      return w;
    }
  }
  c.block_m = side(plan->M);
  c.block_n = side(plan->N);
  c.block_k = 32;
  // TF32 with an m- or n-contiguous operand loads its fragments one 32-bit shared load
  // per register (ldmatrix cannot transpose 32-bit elements): 8 warps halve each
  // thread's accumulators, and 4 would leave ptxas at 255 registers with spills.
  if (plan->dtype == DType::F32 && (plan->sak != 1 || plan->sbk != 1)) c.warps = 8;
  if (mma_unsupported(*plan, c, *sm, wg)) {
    c.block_k = 64;  // a k-contiguous side may need 64 elements
    if (mma_unsupported(*plan, c, *sm, wg)) {
      // The SIMT kernel (exact f32, or what the tensor cores cannot take): its 64 x 64
      // tile on 2 warps, an 8 x 8 register tile a thread (4 warps give 4 x 8). On an
      // H200 the exact f32 GEMM + bias + GELU took 4048 us at 4096^3 with 2 warps
      // (block_k 8) and 14540 at 16384 x 4096 x 4096 (block_k 16, group_m 1) against
      // 5754 and 22448 with the 4-warp default (tune --measure, runs 9 and 10 alike:
      // bench/results/tune-h200-run{9,10}/matmul_f32_*), 1.4x and 1.5x.
      KernelConfig simt = base;
      if (simt.block_m == 64 && simt.block_n == 64 && simt.warps == 4) simt.warps = 2;
      return simt;
    }
  }
  KernelConfig s = c;
  s.split_k = default_split_k(*plan, c, *sm);
  return s.split_k > 1 && !mma_unsupported(*plan, s, *sm, wg) ? s : c;
}

}  // namespace sf
