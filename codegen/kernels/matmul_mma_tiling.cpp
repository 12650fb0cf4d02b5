// The tensor-core matmul's tiling: which kernel (mma.sync, or wgmma fed by cp.async
// or TMA) a group and config get, and why not the others (matmul_mma_tiling.h).
#include "codegen/kernels/matmul_mma_tiling.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace sf::matmul_detail {

namespace {

// How an operand sits in global memory, for 16-byte copies: the dim with unit stride
// ("contiguous") and the other one's stride, which must keep every chunk (`per`
// elements: 8 of 16 bits, 4 of 32) 16-byte aligned.
struct OperandLayout {
  bool k_contiguous = false;  // A: [m][k] rows (else [k][m]); B: [n][k] rows (else [k][n])
  std::string why_not;        // non-empty: no layout 16-byte copies can read
};

// `outer` is M (A) or N (B): the stride pair is (outer stride, k stride).
OperandLayout operand_layout(const char* name, int64_t s_outer, int64_t s_k, int64_t outer, int64_t k,
                             const std::vector<int64_t>& bstrides, int64_t per) {
  OperandLayout l;
  auto aligned = [per](int64_t s, int64_t n) { return n == 1 || s % per == 0; };
  for (int64_t s : bstrides)
    if (s % per != 0) {
      l.why_not = std::string("operand ") + name + "'s batch stride " + num(s) + " is not a multiple of " + num(per) +
                  " elements (16-byte cp.async needs 16-byte aligned rows)";
      return l;
    }
  if ((s_k == 1 || k == 1) && aligned(s_outer, outer)) {
    l.k_contiguous = true;
    return l;
  }
  if ((s_outer == 1 || outer == 1) && aligned(s_k, k)) return l;
  l.why_not = std::string("operand ") + name + " (strides " + num(s_outer) + ", " + num(s_k) +
              ") has no unit-stride dim whose rows start 16-byte aligned (the other stride a multiple of " + num(per) +
              " elements)";
  return l;
}

// Why the warpgroup kernel cannot take tiling `t` (filled up to the shared tiles),
// or nullopt. The shared tiles are mma_layout.h's 128-byte-row panels, which are
// wgmma's 128-byte swizzle atoms when each tile starts 1024-byte aligned.
// `pingpong`: every warpgroup takes whole tiles (KernelConfig::pingpong) instead of
// a share of each tile's rows.
std::optional<std::string> wgmma_unfit(const MmaTiling& t, bool pingpong) {
  if (t.threads % 128 != 0) return num(t.threads / 32) + " warps are not whole warpgroups of 4";
  const int wgs = pingpong ? 1 : t.threads / 128;
  if (t.bm % (64 * wgs) != 0)
    return pingpong ? "block_m = " + num(t.bm) + " is not a multiple of 64 (one warpgroup's wgmma rows)"
                    : "block_m = " + num(t.bm) + " does not give each of " + num(wgs) + " warpgroups a multiple of 64 rows";
  if (t.a.row_bytes() != 128 || t.b.row_bytes() != 128)
    return "the shared tiles' contiguous sides must be multiples of " + num(128 / t.a.eb) +
           " elements (128-byte swizzle atoms): " +
           (t.a.row_bytes() != 128 ? (t.a_kc ? "block_k" : "block_m") : (t.b_kc ? "block_k" : "block_n")) + " is " +
           num(64 / t.a.eb);
  if (t.a.eb == 4 && (!t.a_kc || !t.b_kc))
    return "TF32 wgmma reads both operands K-major, and " + std::string(!t.a_kc ? "A is m" : "B is n") + "-contiguous";
  if ((t.bm / wgs / 64) * t.bn / 2 > 128)
    return "each thread would hold " + num((t.bm / wgs / 64) * t.bn / 2) + " accumulators; at most 128 fit in registers";
  return std::nullopt;
}

// The batch dims an operand's tensor map steps through (those above 1 it is not
// broadcast over), innermost first.
std::vector<int> map_batch_dims(const MatmulGroup& p, const std::vector<int64_t>& bstride) {
  std::vector<int> dims;
  for (size_t e = p.batch.size(); e-- > 0;)
    if (p.batch[e] > 1 && bstride[e] != 0) dims.push_back(static_cast<int>(e));
  return dims;
}

// Why TMA cannot read `p`'s operands (a tensor map of rank 2, plus one dim for each
// batch dim the operand steps through, at most 5), or nullopt.
std::optional<std::string> tma_unfit(const MatmulGroup& p) {
  for (const auto* s : {&p.a_bstride, &p.b_bstride})
    if (const size_t n = map_batch_dims(p, *s).size(); n > static_cast<size_t>(kMaxTensorMapRank - 2))
      return "an operand steps through " + num(int64_t(n)) + " batch dims, more than a tensor map's " +
             num(kMaxTensorMapRank - 2);
  const int64_t lim = int64_t{1} << 31;  // TMA coordinates are 32-bit
  if (std::max({p.M, p.N, p.K, p.nbatch}) >= lim) return "an extent is 2^31 or more";
  return std::nullopt;
}

// The two tensor maps of tiling `t` (A's, B's): the unit-stride dim first (k for a
// K-major operand, m or n otherwise), then the other, then the batch dims the operand
// steps through (map_batch_dims; their strides in any order, as the attention's maps
// over permuted heads); each box one 128-byte-wide panel of the stage's tile. Extents
// of 1 get a 16-byte stride, which no index ever steps. nullopt (with `why`) when a
// stride is not a multiple of 16 bytes or a matrix's rows overlap. `batch` gets each
// map's batch dims (MmaTiling::map_batch).
std::optional<std::vector<TensorMapSpec>> tma_maps(const MatmulGroup& p, const MmaTiling& t, std::string* why,
                                                   std::vector<std::vector<int>>& batch) {
  const int64_t eb = t.a.eb, panel = 128 / eb;
  std::vector<TensorMapSpec> maps;
  batch.clear();
  for (int which = 0; which < 2; ++which) {
    const bool kc = which == 0 ? t.a_kc : t.b_kc;
    const int64_t outer = which == 0 ? p.M : p.N, s_outer = which == 0 ? p.sam : p.sbn, s_k = which == 0 ? p.sak : p.sbk;
    const std::vector<int64_t>& bstride = which == 0 ? p.a_bstride : p.b_bstride;
    const std::vector<int> bdims = map_batch_dims(p, bstride);
    TensorMapSpec m;
    m.input = which == 0 ? p.a.param : p.b.param;
    m.dtype = p.dtype;
    m.rank = 2 + static_cast<int>(bdims.size());
    m.dims = {kc ? p.K : outer, kc ? outer : p.K, 1, 1, 1};
    const int64_t s1 = (kc ? s_outer : s_k) * eb;
    m.strides = {m.dims[1] == 1 ? 16 : s1, 0, 0, 0};
    for (size_t i = 0; i < bdims.size(); ++i) {
      m.dims[i + 2] = p.batch[static_cast<size_t>(bdims[i])];
      m.strides[i + 1] = bstride[static_cast<size_t>(bdims[i])] * eb;
    }
    m.box = {static_cast<int>(panel), kc ? (which == 0 ? t.bm : t.bn) : t.bk, 1, 1, 1};
    for (int d = 0; d + 1 < m.rank; ++d)
      if (m.strides[static_cast<size_t>(d)] % 16 != 0 || m.strides[static_cast<size_t>(d)] <= 0) {
        *why = std::string("operand ") + (which == 0 ? "A" : "B") + "'s stride of " + num(m.strides[static_cast<size_t>(d)]) +
               " bytes is not a positive multiple of 16";
        return std::nullopt;
      }
    if (m.dims[1] > 1 && m.strides[0] < m.dims[0] * eb) {
      *why = std::string("operand ") + (which == 0 ? "A" : "B") + "'s rows overlap";
      return std::nullopt;
    }
    maps.push_back(m);
    batch.push_back(bdims);
  }
  return maps;
}

}  // namespace

Result<MmaTiling> mma_tiling(const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch) {
  auto no = [](std::string s) -> Result<MmaTiling> { return diag(std::move(s)); };
  if (sm < 80) return no("sm_" + num(sm) + " has no mma.sync for 16-bit or TF32 operands (sm_80 and later have)");
  const bool tf32 = p.dtype == DType::F32 && p.allow_tf32;
  if (p.dtype == DType::F32 && !tf32)
    return no("f32 operands stay on exact FMA (TF32 tensor cores only with --allow-tf32)");
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && !tf32)
    return no(std::string(dtype_name(p.dtype)) + " operands stay on exact FMA (tensor cores take f16, bf16 and, with --allow-tf32, f32)");
  const int eb = tf32 ? 4 : 2;
  // Split-K: a bare TF32 matmul adds into its output, any other group sums in a
  // workspace (MmaTiling::split_ws).
  if (std::optional<std::string> why = split_k_unfit(p, c)) return no(*why);
  OperandLayout la = operand_layout("A", p.sam, p.sak, p.M, p.K, p.a_bstride, 16 / eb);
  if (!la.why_not.empty()) return no(la.why_not);
  OperandLayout lb = operand_layout("B", p.sbn, p.sbk, p.N, p.K, p.b_bstride, 16 / eb);
  if (!lb.why_not.empty()) return no(lb.why_not);
  if (!pow2(c.block_m) || c.block_m < 16 || c.block_m > 256)
    return no("block_m = " + num(c.block_m) + " is not a power of two in 16..256");
  if (!pow2(c.block_n) || c.block_n < 16 || c.block_n > 256)
    return no("block_n = " + num(c.block_n) + " is not a power of two in 16..256");
  if (!pow2(c.block_k) || c.block_k < 16 || c.block_k > 128)
    return no("block_k = " + num(c.block_k) + " is not a power of two in 16..128 (mma.m16n8k16 steps k by 16)");
  if (!pow2(c.warps) || c.warps > 16) return no("warps = " + num(c.warps) + " is not a power of two in 1..16");
  if (c.stages < 2 || c.stages > 8) return no("stages = " + num(c.stages) + " is outside 2..8 (a cp.async pipeline)");
  if (c.group_m < 1) return no("group_m = " + num(c.group_m) + " must be positive");
  if (c.pingpong < 0 || c.pingpong > 1) return no("pingpong = " + num(c.pingpong) + " is not 0 or 1");
  MmaTiling t;
  t.bm = c.block_m;
  t.bn = c.block_n;
  t.bk = c.block_k;
  t.threads = c.warps * 32;
  t.stages = c.stages;
  t.group_m = c.group_m;
  t.a_kc = la.k_contiguous;
  t.b_kc = lb.k_contiguous;
  // Shared tiles in the global layout, so each 16-byte chunk is copied unchanged.
  auto tile = [&](bool kc, int outer) -> std::optional<SmemTile> {
    SmemTile s;
    s.eb = eb;
    s.rows = kc ? outer : t.bk;
    s.cols = kc ? t.bk : outer;
    if (s.cols % (64 / eb) != 0) return std::nullopt;
    s.panel = s.cols % (128 / eb) == 0 ? 128 / eb : 64 / eb;
    return s;
  };
  std::optional<SmemTile> ta = tile(t.a_kc, t.bm), tb = tile(t.b_kc, t.bn);
  const std::string widths = num(64 / eb) + " or a multiple of " + num(128 / eb);
  if (!ta)
    return no("A's shared tile would have rows of " + num(t.a_kc ? t.bk : t.bm) + " elements; the swizzle needs " + widths +
              " (" + (t.a_kc ? "block_k" : "block_m") + ")");
  if (!tb)
    return no("B's shared tile would have rows of " + num(t.b_kc ? t.bk : t.bn) + " elements; the swizzle needs " + widths +
              " (" + (t.b_kc ? "block_k" : "block_n") + ")");
  t.a = *ta;
  t.b = *tb;
  // mma.sync: the warps as a grid whose warp tiles are multiples of 16 x 16 (one
  // ldmatrix.x4 of A and of B), as square as possible: the A and B fragments a warp
  // loads per k step grow with its tile's sides, its mma count with their product.
  std::string sync_unfit;
  for (int wn = 1; wn <= c.warps; wn *= 2) {
    int wm = c.warps / wn;
    if (t.bm % (16 * wm) != 0 || t.bn % (16 * wn) != 0) continue;
    int xm = t.bm / wm, xn = t.bn / wn;
    if (t.wm == 0 || xm + xn < t.warp_m + t.warp_n || (xm + xn == t.warp_m + t.warp_n && xn > t.warp_n)) {
      t.wm = wm;
      t.wn = wn;
      t.warp_m = xm;
      t.warp_n = xn;
    }
  }
  if (t.wm == 0) {
    sync_unfit = num(c.warps) + " warps cannot split a " + num(t.bm) + "x" + num(t.bn) +
                 " tile into warp tiles of whole 16x16 blocks";
  } else {
    t.mi = t.warp_m / 16;
    t.ni = t.warp_n / 8;
    if (t.mi * t.ni * 4 > 128)
      sync_unfit = "each thread would hold " + num(t.mi * t.ni * 4) + " accumulators (a " + num(t.warp_m) + "x" +
                   num(t.warp_n) + " warp tile); at most 128 fit in registers";
  }
  if (wgmma_arch) {
    std::optional<std::string> unfit = wgmma_unfit(t, c.pingpong == 1);
    if (!unfit) {
      t.wgmma = true;
      t.wgs = t.threads / 128;
      t.wg_m = c.pingpong == 1 ? t.bm : t.bm / t.wgs;
      t.mi = t.wg_m / 64;
      t.ni = t.bn / 8;
      t.m_step = 64;
      t.wm = t.wgs;  // the warp grid of the mma.sync kernel does not apply
      t.wn = 1;
      t.warp_m = t.wg_m;
      t.warp_n = t.bn;
    } else {
      t.not_wgmma = *unfit;
    }
  }
  if (!t.wgmma && !sync_unfit.empty()) return no(sync_unfit);
  t.stage_bytes = t.a.bytes() + t.b.bytes();
  t.shared_bytes = t.stage_bytes * t.stages;
  if (c.warp_specialize < 0 || c.warp_specialize > 1)
    return no("warp_specialize = " + num(c.warp_specialize) + " is not 0 or 1");
  if (t.wgmma && p.tma) {
    std::string why;
    std::optional<std::vector<TensorMapSpec>> maps;
    if (std::optional<std::string> unfit = tma_unfit(p)) why = *unfit;
    else maps = tma_maps(p, t, &why, t.map_batch);
    if (!maps) {
      t.not_tma = why;
    } else {
      t.tma = true;
      t.maps = std::move(*maps);
      t.mbar_off = t.shared_bytes;
      t.ws = c.warp_specialize == 1;
      t.shared_bytes += (t.ws ? 16 : 8) * t.stages;
    }
  }
  if (c.warp_specialize == 1 && !t.ws)
    return no("warp_specialize = 1 needs the sm_90a wgmma kernel fed by TMA (" +
              (!t.wgmma ? "not wgmma: " + t.not_wgmma : "not TMA: " + (t.not_tma.empty() ? "--no-tma" : t.not_tma)) + ")");
  if (c.pingpong == 1) {
    // Two consumer warpgroups taking the block's work items in turn, ordered by named
    // barriers; the producer's pipeline and the persistent walk carry the items.
    std::string why;
    if (!t.ws) why = "warp_specialize = 1 (a producer warpgroup feeding both consumers)";
    else if (c.persistent == 0) why = "a persistent grid (persistent > 0: each block walks tiles, taken in turn)";
    else if (t.wgs != 2) why = "two consumer warpgroups (warps = 8), not " + num(t.wgs);
    else if (t.split > 1 || c.split_k > 1) why = "split_k = 1";
    if (!why.empty()) return no("pingpong = 1 needs " + why);
    t.pingpong = true;
  }
  if (c.setmaxnreg != 0) {
    // One producer and two consumer warpgroups share the launch's registers:
    // producer + 2 x consumer = 3 x 168, each a multiple of 8 and at least 24.
    const int v = c.setmaxnreg, launch = MmaTiling::kLaunchRegs;
    std::string why;
    if (!t.ws) why = "warp_specialize = 1 (a producer warpgroup that gives up registers)";
    else if (c.persistent == 0) why = "a persistent grid (persistent > 0: the producer never joins the epilogue)";
    else if (t.wgs != 2) why = "two consumer warpgroups (warps = 8), not " + num(t.wgs);
    if (!why.empty()) return no("setmaxnreg = " + num(v) + " needs " + why);
    if (v % 8 != 0 || v <= launch || 3 * launch - 2 * v < 24)
      return no("setmaxnreg = " + num(v) + " is not a multiple of 8 in " + num(launch + 8) + ".." +
                num((3 * launch - 24) / 2) + " (the consumers' registers a thread, above the launch's " + num(launch) +
                ", leaving the producer at least 24)");
    t.consumer_regs = v;
    t.producer_regs = 3 * launch - 2 * v;
  }
  if (c.tma_store < 0 || c.tma_store > 1) return no("tma_store = " + num(c.tma_store) + " is not 0 or 1");
  if (c.tma_store == 1) {
    // The outputs' chunks leave through TMA from the consumers' own staging areas,
    // which only the persistent warp-specialised kernel has (mma_chunk_area decides
    // the rest from the outputs).
    std::string why;
    if (!t.ws) why = "warp_specialize = 1 (the sm_90a wgmma kernel fed by TMA, with a producer warpgroup)";
    else if (c.persistent == 0) why = "a persistent grid (persistent > 0: its epilogue is staged in chunks)";
    if (!why.empty()) return no("tma_store = 1 needs " + why);
    t.want_tma_store = true;
  }
  t.split_ws = c.split_k > 1 && split_k_uses_workspace(p);
  if (t.split_ws) {
    // The last block's flag, past everything else (a persistent producer may be
    // refilling the pipeline's stages while the consumers read it).
    t.flag_off = (t.shared_bytes + 15) / 16 * 16;
    t.shared_bytes = t.flag_off + 16;
  }
  if (t.shared_bytes > max_shared_bytes(sm))
    return no("the tiles need " + num(t.shared_bytes) + " bytes of shared memory (" + num(t.stages) + " stages), more than sm_" +
              num(sm) + "'s " + num(max_shared_bytes(sm)) + " per block");
  t.split = c.split_k;
  t.kt = ceil_div(p.K, t.bk) / t.split;  // split_k_unfit checked that the split divides the K tiles
  t.tiles = std::max<int64_t>(ceil_div(p.M, t.bm) * ceil_div(p.N, t.bn), 1);
  t.items = t.tiles * std::max<int64_t>(p.nbatch, 1);
  if (c.persistent < 0 || c.persistent > 65535)
    return no("persistent = " + num(c.persistent) + " is outside 0..65535 blocks");
  t.persistent = c.persistent;
  if ((c.cluster_m != 1 && c.cluster_m != 2) || (c.cluster_n != 1 && c.cluster_n != 2) || c.cluster_m * c.cluster_n > 2)
    return no("cluster_m = " + num(c.cluster_m) + ", cluster_n = " + num(c.cluster_n) +
              ": each is 1 or 2, and at most one of them 2 (clusters of two blocks)");
  if (c.cluster_m * c.cluster_n == 2) {
    // Two blocks sharing one operand's tile by TMA multicast, their pipelines tied by
    // each other's mbarriers: the producer warpgroup's copies (a block a pair of
    // tiles, or a persistent walk over the pairs).
    std::string why;
    if (!t.ws) why = "warp_specialize = 1 (the sm_90a wgmma kernel fed by TMA, with a producer warpgroup)";
    else if (t.split > 1) why = "split_k = 1";
    if (!why.empty()) return no("cluster_" + std::string(c.cluster_m == 2 ? "m" : "n") + " = 2 needs " + why);
    t.cluster = 2;
    t.cluster_shares_b = c.cluster_m == 2;
    // The shared operand's map brings half the rows of each box (at least 8: the
    // halves start on a 1024-byte swizzle pattern, a whole one each).
    TensorMapSpec& shared = t.maps[t.cluster_shares_b ? 1 : 0];
    if (shared.box[1] % (8 * t.cluster) != 0)
      return no("the shared operand's boxes have " + num(shared.box[1]) + " rows, not two halves of whole 8-row swizzle patterns");
    shared.box[1] /= t.cluster;
    const int64_t wm = t.cluster_shares_b ? int64_t{t.bm} * t.cluster : t.bm;
    const int64_t wn = t.cluster_shares_b ? t.bn : int64_t{t.bn} * t.cluster;
    t.tiles = std::max<int64_t>(ceil_div(p.M, wm) * ceil_div(p.N, wn), 1);
    t.items = t.tiles * std::max<int64_t>(p.nbatch, 1);
  }
  return t;
}

// Whether every index the kernel forms fits i32: the operands' spans over tiles padded
// past M, N and K, and every tensor's size.
bool mma_fits_i32(const Graph& g, const MatmulGroup& p, const MmaTiling& t) {
  const int64_t lim = int64_t{1} << 30;
  int64_t mp = ceil_div(p.M, t.bm) * t.bm + t.bm, np = ceil_div(p.N, t.bn) * t.bn + t.bn, kp = (t.kt * t.split + 1) * t.bk;
  auto span = [&](const std::vector<int64_t>& bs, int64_t r, int64_t sr, int64_t c, int64_t sc) {
    int64_t s = r * std::max<int64_t>(sr, 1) + c * std::max<int64_t>(sc, 1) + 1;
    for (size_t e = 0; e < bs.size(); ++e) s += (p.batch[e] - 1) * bs[e];
    return s;
  };
  int64_t worst = std::max({span(p.a_bstride, mp, p.sam, kp, p.sak), span(p.b_bstride, kp, p.sbk, np, p.sbn),
                            p.nbatch * mp * np, t.shared_bytes + t.threads});
  for (const Node& n : g.nodes()) worst = std::max(worst, numel(n.type.shape));
  return worst < lim;
}

MmaChoice mma_choice(const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch) {
  MmaChoice r;
  Result<MmaTiling> t = mma_tiling(p, c, sm, wgmma_arch);
  if (!t) {
    std::string m = t.error().message;
    const std::string prefix = "matmul: ";
    r.unsupported = m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
    return r;
  }
  r.wgmma = t->wgmma;
  r.not_wgmma = t->not_wgmma;
  r.tma = t->tma;
  r.not_tma = t->not_tma;
  return r;
}

std::optional<std::string> mma_unsupported(const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch) {
  return mma_choice(p, c, sm, wgmma_arch).unsupported;
}

}  // namespace sf::matmul_detail
