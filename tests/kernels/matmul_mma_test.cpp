// The tensor-core matmul kernel (codegen/kernels/matmul_mma.cpp), no GPU needed:
//   - the kernel itself, built for the host (emit_matmul_mma_block_on_host), runs every
//     block with one OS thread per GPU thread; its ldmatrix and mma calls go to a warp
//     simulation written here from the PTX ISA's figures (ptx_isa_tables.h), not from
//     mma_layout.h, and its results must match the float64 reference evaluator. A wrong
//     ldmatrix address, swizzle, fragment order, copy or epilogue index fails here;
//   - ldmatrix addresses must be 16-byte rows inside the block's shared memory, all 32
//     lanes must reach every warp-collective call together, and shared memory starts as
//     NaN, so a read before a write shows up;
//   - the NVPTX kernel: mma.sync, ldmatrix and cp.async.cg in the PTX for sm_80 and
//     sm_90a, no FMA left in a bare bf16 matmul, ptxas accepts it without spills;
//   - matmul_path says which kernel a matmul gets and why.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/ptx_isa_tables.h"

#include <algorithm>
#include <array>
#include <barrier>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/matmul.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_matmul_mma_test {

using kernel_test::arg_array;
using kernel_test::assemble;
using kernel_test::finish;
using kernel_test::have_ptxas;
using kernel_test::jit;
using kernel_test::output_tensors;
using kernels::RowCol;

constexpr int kLanes = 32;

// ---- the simulated warps -----------------------------------------------------------------

// A 32-bit register as the tensor cores read TF32: the sign, exponent and top 10
// mantissa bits of the f32 (the low 13 bits are ignored).
float from_tf32(uint32_t bits) { return std::bit_cast<float>(bits & 0xFFFFE000u); }

float from_16(uint32_t h, bool f16) {
  h &= 0xFFFFu;
  if (f16) return static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
  return std::bit_cast<float>(h << 16);
}

// One warp's rendezvous: every lane deposits its operands, all 32 meet, each computes
// its own result from everybody's, all 32 meet again before the slots are reused.
struct Warp {
  std::barrier<> bar{kLanes};
  std::array<const uint8_t*, kLanes> row{};
  std::array<int, kLanes> trans{};
  std::array<std::array<uint32_t, 4>, kLanes> a{};
  std::array<std::array<uint32_t, 2>, kLanes> b{};
  std::array<std::array<float, 4>, kLanes> c{};
};

// One warpgroup's rendezvous for wgmma: every thread deposits its descriptors and
// mode, all 128 meet (and must agree), each computes its own fragment of D.
struct WarpGroup {
  std::barrier<> bar{4 * kLanes};
  std::array<uint64_t, 4 * kLanes> da{}, db{};
  std::array<int32_t, 4 * kLanes> mode{};
  int calls = 0;  // wgmma instructions thread 0 of the group issued
  std::array<float, 64 * 16> am{};   // the operands as thread 0 read them: A [m][k]
  std::array<float, 256 * 16> bm{};  // B [n][k]
};

// Shared-memory byte ranges [lo, hi) whose cp.async data may not be read yet, or which
// an in-flight wgmma may still read.
struct Range {
  int64_t lo = 0, hi = 0;
  bool overlaps(int64_t a, int64_t b) const { return a < hi && lo < b; }
};

struct Block;
// bar.sync's completion: the data every thread waited for (cp.async.wait_group) before
// the barrier becomes readable by all.
struct Publish {
  Block* blk;
  void operator()() noexcept;
};

struct Block {
  explicit Block(int threads, size_t smem_bytes)
      : bar(threads, Publish{this}), smem_bytes(smem_bytes), storage(smem_bytes + 1024),
        cp_groups(static_cast<size_t>(threads), std::vector<std::vector<Range>>(1)),
        landed(static_cast<size_t>(threads)) {
    for (int w = 0; w < threads / kLanes; ++w) warps.push_back(std::make_unique<Warp>());
    for (int w = 0; w < threads / (4 * kLanes); ++w) {
      groups.push_back(std::make_unique<WarpGroup>());
      wgmma_groups.emplace_back(1);
    }
    auto p = reinterpret_cast<uintptr_t>(storage.data());
    smem = storage.data() + ((1024 - p % 1024) % 1024);
  }
  std::barrier<Publish> bar;
  // The memory model (under mu): per thread, its cp.async groups (the last one open)
  // and the ranges its waits completed but no barrier has published yet; per
  // warpgroup, the operand ranges of its wgmma groups not yet waited for (the last
  // open), and how many of its threads reached the current commit or wait.
  std::vector<std::vector<std::vector<Range>>> cp_groups;
  std::vector<std::vector<Range>> landed;
  std::vector<std::vector<std::vector<Range>>> wgmma_groups;
  std::vector<int> wg_commits = std::vector<int>(4, 0), wg_waits = std::vector<int>(4, 0);
  // TMA: each mbarrier (by its shared-memory offset) and the copies still to be
  // waited for: a copy completes phase `use` of its mbarrier, and a reader must have
  // seen that phase complete (observed[thread][mbarrier] > use).
  struct MBar {
    int count = 0, pending = 0;
    int64_t tx = 0;
    int completions = 0;
  };
  std::map<int64_t, MBar> mbars;
  struct TmaWrite {
    Range r;
    int64_t mbar = 0;
    int use = 0;
  };
  std::vector<TmaWrite> tma_writes;
  std::map<std::pair<int, int64_t>, int> observed;
  bool tma_ignores_swizzle = false;  // broken TMA hardware, to show the tests notice
  int tma_copies = 0;
  size_t smem_bytes;
  std::vector<uint8_t> storage;
  uint8_t* smem = nullptr;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<std::unique_ptr<WarpGroup>> groups;
  bool ignore_wgmma_trans = false;  // a broken wgmma that reads every operand K-major
  std::mutex mu;
  std::string error;  // the first thing the simulated hardware refused
  bool ignore_trans = false;  // a broken ldmatrix, to show the tests would notice
  int wavefronts = 0;         // the most any ldmatrix phase (8 row addresses) took

  void saw_wavefronts(int w) {
    std::lock_guard<std::mutex> lock(mu);
    wavefronts = std::max(wavefronts, w);
  }

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    fail_locked(what);
  }
  void fail_locked(const std::string& what) {
    if (error.empty()) error = what;
  }

  // Reading [lo, hi) of shared memory: no cp.async data in it may be unwaited or
  // unpublished. Under mu.
  void check_read_locked(int64_t lo, int64_t hi, const char* who) {
    for (size_t t = 0; t < cp_groups.size(); ++t) {
      for (const auto& g : cp_groups[t])
        for (const Range& r : g)
          if (r.overlaps(lo, hi))
            return fail_locked(std::string(who) + " reads shared memory a cp.async of thread " + std::to_string(t) +
                               " has not been waited for");
      for (const Range& r : landed[t])
        if (r.overlaps(lo, hi))
          return fail_locked(std::string(who) + " reads shared memory thread " + std::to_string(t) +
                             " waited for but no barrier has published");
    }
  }
};

void Publish::operator()() noexcept {
  for (auto& l : blk->landed) l.clear();
}

void sim_barrier(void* ctx) { static_cast<Block*>(ctx)->bar.arrive_and_wait(); }

void sim_ldmatrix(void* ctx, int32_t thread, const void* row, int32_t trans, uint32_t* out) {
  Block& blk = *static_cast<Block*>(ctx);
  Warp& w = *blk.warps[static_cast<size_t>(thread / kLanes)];
  const int lane = thread % kLanes;
  w.row[static_cast<size_t>(lane)] = static_cast<const uint8_t*>(row);
  w.trans[static_cast<size_t>(lane)] = trans;
  w.bar.arrive_and_wait();
  for (int l = 0; l < kLanes; ++l) {
    const uint8_t* r = w.row[static_cast<size_t>(l)];
    if (w.trans[static_cast<size_t>(l)] != trans) blk.fail("ldmatrix: lanes disagree on .trans");
    if (r < blk.smem || r + 16 > blk.smem + blk.smem_bytes || (r - blk.smem) % 16 != 0) {
      blk.fail("ldmatrix: lane " + std::to_string(l) + " of thread " + std::to_string(thread) +
               "'s warp points outside shared memory or off a 16-byte row");
      for (int j = 0; j < 4; ++j) out[j] = 0xFFFFFFFFu;
      w.bar.arrive_and_wait();
      return;
    }
  }
  if (lane == 0) {
    std::lock_guard<std::mutex> lock(blk.mu);
    for (int l = 0; l < kLanes; ++l) {
      int64_t at = w.row[static_cast<size_t>(l)] - blk.smem;
      blk.check_read_locked(at, at + 16, "ldmatrix");
    }
  }
  // Lane 0 prices each matrix's 8 row reads in the 32-bank model of mma_layout_test:
  // as many wavefronts as the most distinct 4-byte words one bank must deliver.
  if (lane == 0)
    for (int j = 0; j < 4; ++j) {
      std::array<std::vector<int64_t>, 32> words;
      for (int r = 0; r < 8; ++r)
        for (int64_t wd = 0; wd < 4; ++wd) {
          int64_t word = (w.row[static_cast<size_t>(8 * j + r)] - blk.smem) / 4 + wd;
          auto& b = words[static_cast<size_t>(word % 32)];
          if (std::find(b.begin(), b.end(), word) == b.end()) b.push_back(word);
        }
      size_t most = 0;
      for (const auto& b : words) most = std::max(most, b.size());
      blk.saw_wavefronts(static_cast<int>(most));
    }
  // Register j of this lane: matrix j, whose row i lane 8j + i points at; which element
  // lands where is the ISA's figure (isa_ld), with or without .trans.
  for (int j = 0; j < 4; ++j) {
    uint32_t reg = 0;
    for (int half = 0; half < 2; ++half) {
      RowCol p = kernels::isa::isa_ld(lane, half, trans != 0 && !blk.ignore_trans);
      const uint8_t* src = w.row[static_cast<size_t>(8 * j + p.row)] + 2 * p.col;
      uint32_t h = static_cast<uint32_t>(src[0]) | (static_cast<uint32_t>(src[1]) << 8);
      reg |= h << (16 * half);
    }
    out[j] = reg;
  }
  w.bar.arrive_and_wait();
}

void sim_mma(void* ctx, int32_t thread, int32_t kind, const uint32_t* a, const uint32_t* b, float* cd) {
  Block& blk = *static_cast<Block*>(ctx);
  Warp& w = *blk.warps[static_cast<size_t>(thread / kLanes)];
  const int lane = thread % kLanes;
  std::memcpy(w.a[static_cast<size_t>(lane)].data(), a, 16);
  std::memcpy(w.b[static_cast<size_t>(lane)].data(), b, 8);
  std::memcpy(w.c[static_cast<size_t>(lane)].data(), cd, 16);
  w.bar.arrive_and_wait();
  // A (16 x K), B (K x 8) and C (16 x 8) gathered from every lane by the ISA figures:
  // K = 16 for 16-bit operands (two per register), 8 for TF32 (one per register).
  const bool tf32 = kind == 2, f16 = kind == 1;
  const int kk_n = tf32 ? 8 : 16;
  float am[16][16], bm[16][8], cm[16][8];
  for (int l = 0; l < kLanes; ++l) {
    const auto& ra = w.a[static_cast<size_t>(l)];
    const auto& rb = w.b[static_cast<size_t>(l)];
    if (tf32) {
      for (int i = 0; i < 4; ++i) {
        RowCol p = kernels::isa::isa_a32(l, i);
        am[p.row][p.col] = from_tf32(ra[static_cast<size_t>(i)]);
      }
      for (int i = 0; i < 2; ++i) {
        RowCol p = kernels::isa::isa_b32(l, i);
        bm[p.row][p.col] = from_tf32(rb[static_cast<size_t>(i)]);
      }
    } else {
      for (int i = 0; i < 8; ++i) {
        RowCol p = kernels::isa::isa_a(l, i);
        am[p.row][p.col] = from_16(ra[static_cast<size_t>(i / 2)] >> (16 * (i % 2)), f16);
      }
      for (int i = 0; i < 4; ++i) {
        RowCol p = kernels::isa::isa_b(l, i);
        bm[p.row][p.col] = from_16(rb[static_cast<size_t>(i / 2)] >> (16 * (i % 2)), f16);
      }
    }
    for (int i = 0; i < 4; ++i) {
      RowCol q = kernels::isa::isa_c(l, i);
      cm[q.row][q.col] = w.c[static_cast<size_t>(l)][static_cast<size_t>(i)];
    }
  }
  for (int i = 0; i < 4; ++i) {
    RowCol q = kernels::isa::isa_c(lane, i);
    double s = cm[q.row][q.col];
    for (int kk = 0; kk < kk_n; ++kk) s += static_cast<double>(am[q.row][kk]) * bm[kk][q.col];
    cd[i] = static_cast<float>(s);
  }
  w.bar.arrive_and_wait();
}

// wgmma.mma_async m64nNk16 with A and B from shared memory: the descriptors decoded
// and the operands read by the ISA's canonical layouts (ptx_isa_tables.h), D by its
// fragment figure. The descriptors must agree across the warpgroup, use the 128-byte
// swizzle with base offset 0 on a 1024-byte pattern boundary, and every address must
// lie inside the block's shared memory.
void sim_wgmma(void* ctx, int32_t thread, uint64_t desc_a, uint64_t desc_b, int32_t mode, float* d) {
  Block& blk = *static_cast<Block*>(ctx);
  WarpGroup& wg = *blk.groups[static_cast<size_t>(thread / (4 * kLanes))];
  const int t = thread % (4 * kLanes);
  wg.da[static_cast<size_t>(t)] = desc_a;
  wg.db[static_cast<size_t>(t)] = desc_b;
  wg.mode[static_cast<size_t>(t)] = mode;
  if (t == 0) ++wg.calls;
  wg.bar.arrive_and_wait();
  for (int u = 0; u < 4 * kLanes; ++u)
    if (wg.da[static_cast<size_t>(u)] != desc_a || wg.db[static_cast<size_t>(u)] != desc_b ||
        wg.mode[static_cast<size_t>(u)] != mode)
      blk.fail("wgmma: the threads of a warpgroup disagree on the descriptors or the shape");
  const bool f16 = (mode & 1) != 0, tf32 = (mode & 8) != 0;
  const bool ta = (mode & 2) != 0 && !blk.ignore_wgmma_trans, tb = (mode & 4) != 0 && !blk.ignore_wgmma_trans;
  const int n = mode >> 8;
  const int64_t eb = tf32 ? 4 : 2, kk_n = tf32 ? 8 : 16;
  if (tf32 && (ta || tb)) blk.fail("wgmma: TF32 has no transposed (MN-major) operands");
  kernels::isa::WgmmaDesc a = kernels::isa::decode_wgmma_desc(desc_a), b = kernels::isa::decode_wgmma_desc(desc_b);
  for (const kernels::isa::WgmmaDesc* x : {&a, &b})
    if (x->swizzle != 1 || x->base_offset != 0 || ((x->start >> 7) & 7) != 0)
      blk.fail("wgmma: a descriptor is not a 128-byte swizzle starting on a 1024-byte pattern boundary");
  // Thread 0 of the group reads both operands through the descriptors into the group's
  // A (64 x k) and B (k x n), checks and records the byte ranges they span; then every
  // thread computes its own D elements.
  if (t == 0) {
    auto elem = [&](const kernels::isa::WgmmaDesc& x, bool mn_major, int64_t mn, int64_t k, int64_t& lo,
                    int64_t& hi) -> float {
      int64_t at = kernels::isa::wgmma_operand_addr(x, mn_major, mn, k, eb);
      if (at < 0 || at + eb > static_cast<int64_t>(blk.smem_bytes)) {
        blk.fail("wgmma: an operand element lies outside shared memory");
        return 0.0f;
      }
      lo = std::min(lo, at);
      hi = std::max(hi, at + eb);
      uint32_t h = 0;
      std::memcpy(&h, blk.smem + at, static_cast<size_t>(eb));
      return tf32 ? from_tf32(h) : from_16(h, f16);
    };
    const int64_t big = std::numeric_limits<int64_t>::max();
    int64_t alo = big, ahi = -big, blo = big, bhi = -big;
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t kk = 0; kk < kk_n; ++kk) wg.am[static_cast<size_t>(r * 16 + kk)] = elem(a, ta, r, kk, alo, ahi);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t kk = 0; kk < kk_n; ++kk) wg.bm[static_cast<size_t>(c * 16 + kk)] = elem(b, tb, c, kk, blo, bhi);
    std::lock_guard<std::mutex> lock(blk.mu);
    blk.check_read_locked(alo, ahi, "wgmma");
    blk.check_read_locked(blo, bhi, "wgmma");
    for (const Block::TmaWrite& w : blk.tma_writes)
      if ((w.r.overlaps(alo, ahi) || w.r.overlaps(blo, bhi)) && blk.observed[{thread, w.mbar}] <= w.use)
        blk.fail_locked("wgmma reads what a TMA copy writes before its mbarrier phase was waited for");
    auto& open = blk.wgmma_groups[static_cast<size_t>(thread / (4 * kLanes))].back();
    open.push_back({alo, ahi});
    open.push_back({blo, bhi});
  }
  wg.bar.arrive_and_wait();
  for (int i = 0; i < n / 2; ++i) {
    RowCol q = kernels::isa::isa_wgmma_d(t, i);
    double s = d[i];
    for (int kk = 0; kk < kk_n; ++kk)
      s += static_cast<double>(wg.am[static_cast<size_t>(q.row * 16 + kk)]) *
           static_cast<double>(wg.bm[static_cast<size_t>(q.col * 16 + kk)]);
    d[i] = static_cast<float>(s);
  }
  wg.bar.arrive_and_wait();
}

// cp.async: copies at once (zero-filling past `bytes`), but its range may not be read
// until the thread waited for its group and a barrier published it; and it must not
// overwrite what an in-flight wgmma group may still read.
void sim_cp_async(void* ctx, int32_t thread, void* dst, const void* src, int32_t bytes) {
  Block& blk = *static_cast<Block*>(ctx);
  auto* d = static_cast<uint8_t*>(dst);
  const int64_t at = d - blk.smem;
  if (at < 0 || at + 16 > static_cast<int64_t>(blk.smem_bytes) || at % 16 != 0 || bytes < 0 || bytes > 16) {
    blk.fail("cp.async: a 16-byte copy outside shared memory or off a 16-byte boundary");
    return;
  }
  std::lock_guard<std::mutex> lock(blk.mu);
  for (size_t g = 0; g < blk.wgmma_groups.size(); ++g)
    for (const auto& grp : blk.wgmma_groups[g])
      for (const Range& r : grp)
        if (r.overlaps(at, at + 16))
          blk.fail_locked("cp.async overwrites shared memory that an in-flight wgmma of warpgroup " + std::to_string(g) +
                          " may still read");
  std::memset(d, 0, 16);
  if (bytes > 0) std::memcpy(d, src, static_cast<size_t>(bytes));
  blk.cp_groups[static_cast<size_t>(thread)].back().push_back({at, at + 16});
}

void sim_cp_commit(void* ctx, int32_t thread) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  blk.cp_groups[static_cast<size_t>(thread)].emplace_back();
}

void sim_cp_wait(void* ctx, int32_t thread, int32_t pending) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  auto& gs = blk.cp_groups[static_cast<size_t>(thread)];
  // Committed groups are all but the open last one; all but the newest `pending` complete.
  const int64_t committed = static_cast<int64_t>(gs.size()) - 1;
  const int64_t done = std::max<int64_t>(0, committed - pending);
  for (int64_t i = 0; i < done; ++i)
    for (const Range& r : gs[static_cast<size_t>(i)]) blk.landed[static_cast<size_t>(thread)].push_back(r);
  gs.erase(gs.begin(), gs.begin() + done);
}

// wgmma.commit_group / wait_group: the warpgroup's 128 threads each call; the last
// to arrive acts for the group.
void sim_wgmma_commit(void* ctx, int32_t thread) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  const size_t g = static_cast<size_t>(thread / (4 * kLanes));
  if (++blk.wg_commits[g] < 4 * kLanes) return;
  blk.wg_commits[g] = 0;
  blk.wgmma_groups[g].emplace_back();
}

void sim_wgmma_wait(void* ctx, int32_t thread, int32_t pending) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  const size_t g = static_cast<size_t>(thread / (4 * kLanes));
  if (++blk.wg_waits[g] < 4 * kLanes) return;
  blk.wg_waits[g] = 0;
  auto& gs = blk.wgmma_groups[g];
  const int64_t committed = static_cast<int64_t>(gs.size()) - 1;
  const int64_t done = std::max<int64_t>(0, committed - pending);
  gs.erase(gs.begin(), gs.begin() + done);
}

// mbarrier phase bookkeeping: a phase completes when its arrivals and transaction
// bytes are all in; it then counts as completion number `completions`.
void complete_if_done(Block::MBar& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.completions;
    m.pending = m.count;
  }
}

void sim_mbar_init(void* ctx, int32_t, void* mbar, int32_t count) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  const int64_t at = static_cast<uint8_t*>(mbar) - blk.smem;
  if (at < 0 || at + 8 > static_cast<int64_t>(blk.smem_bytes) || at % 8 != 0) return blk.fail_locked("mbarrier outside shared memory");
  blk.mbars[at] = Block::MBar{count, count, 0, 0};
}

void sim_mbar_expect_tx(void* ctx, int32_t, void* mbar, int32_t bytes) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  auto it = blk.mbars.find(static_cast<uint8_t*>(mbar) - blk.smem);
  if (it == blk.mbars.end()) return blk.fail_locked("arrive.expect_tx on an mbarrier never initialised");
  it->second.tx += bytes;
  --it->second.pending;
  complete_if_done(it->second);
}

int32_t sim_mbar_try_wait(void* ctx, int32_t thread, void* mbar, int32_t parity) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  const int64_t at = static_cast<uint8_t*>(mbar) - blk.smem;
  auto it = blk.mbars.find(at);
  if (it == blk.mbars.end()) {
    blk.fail_locked("try_wait on an mbarrier never initialised");
    return 1;
  }
  // The phase of parity `parity` has completed when the one in progress has the other.
  if ((it->second.completions & 1) == (parity & 1)) {
    if (blk.error.empty() && it->second.pending == it->second.count && it->second.tx == 0 &&
        it->second.completions == 0 && parity == 1)
      blk.fail_locked("try_wait on a phase that can never complete");
    return 0;
  }
  int& seen = blk.observed[{thread, at}];
  seen = std::max(seen, it->second.completions);
  return 1;
}

// cp.async.bulk.tensor with a 128-byte swizzle: box row r of 128 bytes lands at
// dst + 128 r with its 16-byte units permuted by address bits 7-9, elements outside
// the tensor read as zero; the box's bytes complete on the mbarrier.
void sim_tma_load(void* ctx, int32_t, const void* map, void* dst, int32_t c0, int32_t c1, int32_t c2, void* mbar) {
  Block& blk = *static_cast<Block*>(ctx);
  const auto& m = *static_cast<const SimTensorMap*>(map);
  const int64_t eb = dtype_size(m.spec.dtype);
  const int64_t at = static_cast<uint8_t*>(dst) - blk.smem;
  const int64_t rows = m.spec.box[1];
  std::lock_guard<std::mutex> lock(blk.mu);
  ++blk.tma_copies;
  if (m.spec.box[0] * eb != 128 || at % 1024 != 0 || at < 0 || at + rows * 128 > static_cast<int64_t>(blk.smem_bytes))
    return blk.fail_locked("TMA: a 128-byte-swizzled box must be 128 bytes wide and land 1024-byte aligned in shared memory");
  const Range r{at, at + rows * 128};
  for (const auto& gs : blk.wgmma_groups)
    for (const auto& grp : gs)
      for (const Range& x : grp)
        if (x.overlaps(r.lo, r.hi)) blk.fail_locked("TMA overwrites shared memory that an in-flight wgmma may still read");
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < m.spec.box[0]; ++i) {
      const int64_t g0 = c0 + i, g1 = c1 + row, g2 = m.spec.rank == 3 ? c2 : 0;
      const bool in = g0 >= 0 && g0 < m.spec.dims[0] && g1 >= 0 && g1 < m.spec.dims[1] && g2 >= 0 &&
                      (m.spec.rank < 3 || g2 < m.spec.dims[2]);
      int64_t off = at + row * 128 + i * eb;
      if (!blk.tma_ignores_swizzle) off ^= ((off >> 7) & 7) << 4;
      if (in)
        std::memcpy(blk.smem + off,
                    static_cast<const uint8_t*>(m.base) + g0 * eb + g1 * m.spec.strides[0] + g2 * m.spec.strides[1],
                    static_cast<size_t>(eb));
      else
        std::memset(blk.smem + off, 0, static_cast<size_t>(eb));
    }
  const int64_t bar = static_cast<uint8_t*>(mbar) - blk.smem;
  auto it = blk.mbars.find(bar);
  if (it == blk.mbars.end()) return blk.fail_locked("TMA completes on an mbarrier never initialised");
  std::erase_if(blk.tma_writes, [&](const Block::TmaWrite& w) { return w.r.overlaps(r.lo, r.hi); });
  blk.tma_writes.push_back({r, bar, it->second.completions});
  it->second.tx -= rows * 128;
  complete_if_done(it->second);
}

// ---- graphs and running ------------------------------------------------------------------

// Uniform [-1, 1), deterministic per seed.
std::vector<Tensor> make_inputs(const Graph& g, uint64_t seed) {
  std::vector<Tensor> in;
  for (size_t p = 0; p < g.params().size(); ++p) {
    const TensorType& t = g.node(g.params()[p]).type;
    Tensor x(t.dtype, t.shape);
    std::mt19937_64 rng(seed + 7919 * p);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, -1.0 + 2.0 * static_cast<double>(rng() >> 11) * 0x1p-53);
    in.push_back(std::move(x));
  }
  return in;
}

struct Shape3 {
  int64_t m, n, k;
  bool a_t = false;  // A is transpose(a) with a [K, M]: m contiguous
  bool b_t = false;  // B is transpose(w) with w [N, K]: k contiguous
  Shape batch;       // batch dims of both operands
};

enum class Epi { None, BiasGelu, Residual, RawAndBiasRelu };

Graph mm_graph(const Shape3& s, DType dt, Epi e) {
  GraphBuilder b("mm");
  Shape sa = s.batch, sb = s.batch;
  const int64_t r = static_cast<int64_t>(s.batch.size()) + 2;
  Value a, w;
  if (s.a_t) {
    sa.insert(sa.end(), {s.k, s.m});
    a = transpose(b.param("in0", dt, sa), r - 2, r - 1);
  } else {
    sa.insert(sa.end(), {s.m, s.k});
    a = b.param("in0", dt, sa);
  }
  if (s.b_t) {
    sb.insert(sb.end(), {s.n, s.k});
    w = transpose(b.param("in1", dt, sb), r - 2, r - 1);
  } else {
    sb.insert(sb.end(), {s.k, s.n});
    w = b.param("in1", dt, sb);
  }
  Value h = matmul(a, w);
  switch (e) {
    case Epi::None: b.ret(h); break;
    case Epi::BiasGelu: b.ret(gelu(h + b.param("in2", dt, {s.n}))); break;
    case Epi::Residual: b.ret(h + b.param("in2", dt, h.type().shape)); break;
    case Epi::RawAndBiasRelu:
      b.ret(h);
      b.ret(relu(h + b.param("in2", dt, {s.n})));
      break;
  }
  return decompose(finish(b));
}

KernelSpec spec_of(const Graph& g, std::string entry = "mm_tc") { return KernelSpec{std::move(entry), KernelKind::Matmul, g}; }

// --allow-tf32's spec: an f32 matmul may take the tensor cores in TF32.
KernelSpec tf32_spec(const Graph& g) {
  KernelSpec s = spec_of(g);
  s.allow_tf32 = true;
  return s;
}

KernelConfig tc_config(int bm, int bn, int bk, int warps, int stages, int group_m = 8) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.warps = warps;
  c.stages = stages;
  c.group_m = group_m;
  return c;
}

// Every block of the launch, its threads as OS threads sharing NaN-filled shared
// memory, a barrier and the simulated warps.
Result<std::vector<Tensor>> run_tc(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                   std::string* hw_error, bool ignore_trans = false, int* wavefronts = nullptr,
                                   bool wgmma = false, int* wgmma_calls = nullptr, bool tma = false,
                                   int* tma_copies = nullptr, bool tma_no_swizzle = false) {
  KernelSpec spec = tf32_spec(g);
  spec.tma = tma;
  Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, cfg, wgmma);
  if (!k) return k.error();
  LaunchShape launch = k->launch;
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  using Entry = void (*)(void**, int32_t, int32_t, int32_t, void*, const MmaSimHooks*);
  auto entry = reinterpret_cast<Entry>(*fn);
  std::vector<Tensor> out = output_tensors(g);
  for (Tensor& t : out)
    if (t.nbytes()) std::memset(t.data(), 0x7f, t.nbytes());
  std::vector<void*> args = arg_array(inputs, out);
  std::vector<SimTensorMap> maps;
  for (const TensorMapSpec& t : launch.tensor_maps) maps.push_back({t, inputs[static_cast<size_t>(t.input)].data()});
  for (SimTensorMap& m : maps) args.push_back(&m);
  const int threads = launch.block[0];
  kernel_test::BlockThreads block(threads);
  for (int64_t by = 0; by < launch.grid[1]; ++by)
    for (int64_t bx = 0; bx < launch.grid[0]; ++bx) {
      Block blk(threads, static_cast<size_t>(launch.shared_bytes));
      blk.ignore_trans = ignore_trans;
      blk.ignore_wgmma_trans = ignore_trans;
      blk.tma_ignores_swizzle = tma_no_swizzle;
      std::memset(blk.smem, 0xFF, blk.smem_bytes);  // NaN in both bf16 and f16
      MmaSimHooks hooks;
      hooks.ctx = &blk;
      hooks.barrier = &sim_barrier;
      hooks.ldmatrix_x4 = &sim_ldmatrix;
      hooks.mma = &sim_mma;
      hooks.wgmma = &sim_wgmma;
      hooks.cp_async = &sim_cp_async;
      hooks.cp_commit = &sim_cp_commit;
      hooks.cp_wait = &sim_cp_wait;
      hooks.wgmma_commit = &sim_wgmma_commit;
      hooks.wgmma_wait = &sim_wgmma_wait;
      hooks.tma_load = &sim_tma_load;
      hooks.mbar_init = &sim_mbar_init;
      hooks.mbar_expect_tx = &sim_mbar_expect_tx;
      hooks.mbar_try_wait = &sim_mbar_try_wait;
      block.run([&](int t) { entry(args.data(), static_cast<int32_t>(bx), static_cast<int32_t>(by), t, blk.smem, &hooks); });
      if (!blk.error.empty() && hw_error->empty()) *hw_error = blk.error;
      if (wavefronts) *wavefronts = std::max(*wavefronts, blk.wavefronts);
      if (wgmma_calls)
        for (const auto& wg : blk.groups) *wgmma_calls += wg->calls;
      if (tma_copies) *tma_copies += blk.tma_copies;
    }
  return out;
}

// `loads`: the kernel reads shared memory at all (K > 0).
// For an f32 graph (TF32 kernels) the reference gets the inputs as the tensor cores
// read them, cut to TF32, so the kernel must match it to f32's tolerance: a kernel
// that skipped TF32 or cut wrongly fails.
void check(const Graph& g, const KernelConfig& cfg, const std::string& what, bool loads = true, uint64_t seed = 1,
           bool wgmma = false, bool tma = false) {
  std::vector<Tensor> in = make_inputs(g, seed);
  std::vector<Tensor> ref_in = in;
  for (Tensor& t : ref_in)
    if (t.dtype() == DType::F32)
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, from_tf32(std::bit_cast<uint32_t>(static_cast<float>(t.get(i)))));
  Result<std::vector<Tensor>> want = evaluate(g, ref_in);
  ASSERT_TRUE(want.ok()) << what << ": " << want.error().str();
  std::string hw_error;
  int wavefronts = 0, wgmma_calls = 0, tma_copies = 0;
  Result<std::vector<Tensor>> got = run_tc(g, in, cfg, &hw_error, false, &wavefronts, wgmma, &wgmma_calls, tma, &tma_copies);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  EXPECT_EQ(hw_error, "") << what;
  EXPECT_EQ(tma_copies > 0, tma && loads) << what << ": " << tma_copies << " TMA copies";
  if (wgmma) {
    EXPECT_EQ(wavefronts, 0) << what << ": the wgmma kernel used ldmatrix";
    EXPECT_EQ(wgmma_calls > 0, loads) << what << ": " << wgmma_calls << " wgmma instructions";
  } else if (g.node(g.params()[0]).type.dtype == DType::F32) {
    // TF32 with both operands m-/n-contiguous loads no fragment by ldmatrix.
    EXPECT_LE(wavefronts, 1) << what << ": an ldmatrix phase hit a bank more than once";
    EXPECT_EQ(wgmma_calls, 0) << what;
  } else {
    // The swizzle as emitted: every ldmatrix phase of the kernel is one wavefront.
    EXPECT_EQ(wavefronts, loads ? 1 : 0) << what << ": an ldmatrix phase hit a bank more than once";
    EXPECT_EQ(wgmma_calls, 0) << what;
  }
  ASSERT_EQ(got->size(), want->size()) << what;
  for (size_t o = 0; o < want->size(); ++o) {
    Comparison c = compare((*got)[o], (*want)[o], default_tolerance((*want)[o].dtype()));
    EXPECT_TRUE(c.ok()) << what << ": output " << o << ": " << c.mismatches << " mismatches, first at flat index "
                        << c.first_mismatch << " (got " << (*got)[o].get(std::max<int64_t>(c.first_mismatch, 0)) << ", want "
                        << (*want)[o].get(std::max<int64_t>(c.first_mismatch, 0)) << "), max abs err " << c.max_abs_err;
  }
}

std::string name(const Shape3& s, DType dt, const KernelConfig& c) {
  return std::string(dtype_name(dt)) + " M" + std::to_string(s.m) + " N" + std::to_string(s.n) + " K" + std::to_string(s.k) +
         (s.a_t ? " A^T" : "") + (s.b_t ? " B^T" : "") + " tile " + std::to_string(c.block_m) + "x" +
         std::to_string(c.block_n) + "x" + std::to_string(c.block_k) + " warps " + std::to_string(c.warps) + " stages " +
         std::to_string(c.stages);
}

// ---- the kernel on the host ------------------------------------------------------------------

// Every operand layout the kernel stages (A m- or k-contiguous, B n- or k-contiguous),
// both 16-bit dtypes, ragged M, N and K (partial tiles, a partial last K tile), and
// tiles whose contiguous sides are 32 (64-byte rows) and 64 (128-byte rows) wide.
TEST(MatmulMmaSim, EveryOperandLayoutMatchesTheReference) {
  for (DType dt : {DType::BF16, DType::F16})
    for (bool a_t : {false, true})
      for (bool b_t : {false, true}) {
        Shape3 s{40, 48, 88, a_t, b_t, {}};
        for (const KernelConfig& c : {tc_config(32, 32, 32, 2, 2), tc_config(64, 32, 64, 4, 3)})
          check(mm_graph(s, dt, Epi::None), c, name(s, dt, c));
      }
}

// More warps than one per 16 rows, 128-wide panels split in two, four stages, a
// GROUP_M swizzle over several block rows.
TEST(MatmulMmaSim, WiderTilesAndDeeperPipelines) {
  Shape3 s{96, 136, 160, false, false, {}};
  for (const KernelConfig& c : {tc_config(64, 128, 32, 4, 4, 2), tc_config(32, 64, 32, 1, 2, 1), tc_config(128, 64, 32, 8, 3)})
    check(mm_graph(s, DType::BF16, Epi::None), c, name(s, DType::BF16, c));
}

// The epilogue on the accumulator fragments: bias + GELU, a residual read at the
// element's own (row, col), and two outputs (the raw result and a bias + ReLU).
TEST(MatmulMmaSim, EpiloguesOnTheFragments) {
  Shape3 s{48, 72, 64, false, true, {}};
  KernelConfig c = tc_config(32, 64, 32, 4, 2);
  for (Epi e : {Epi::BiasGelu, Epi::Residual, Epi::RawAndBiasRelu})
    check(mm_graph(s, DType::BF16, e), c, name(s, DType::BF16, c) + " epilogue " + std::to_string(static_cast<int>(e)));
}

// Batched: the batch is grid y, each operand offset by its batch stride.
TEST(MatmulMmaSim, BatchedMatmul) {
  Shape3 s{32, 40, 48, false, true, {3}};
  KernelConfig c = tc_config(32, 32, 32, 2, 2);
  check(mm_graph(s, DType::F16, Epi::None), c, name(s, DType::F16, c) + " batch 3");
}

// The epilogue stores the two adjacent columns of a fragment row as one access where N
// is even (every shape above); with N odd it stores one element at a time.
TEST(MatmulMmaSim, OddNStoresOneElementAtATime) {
  Shape3 s{40, 45, 64, false, true, {}};
  KernelConfig c = tc_config(32, 32, 32, 2, 2);
  for (Epi e : {Epi::None, Epi::BiasGelu})
    check(mm_graph(s, DType::BF16, e), c, name(s, DType::BF16, c) + " epilogue " + std::to_string(static_cast<int>(e)));
}

// K = 0: nothing to accumulate, the epilogue of 0.
TEST(MatmulMmaSim, EmptyContraction) {
  Shape3 s{16, 32, 0, false, false, {}};
  check(mm_graph(s, DType::BF16, Epi::BiasGelu), tc_config(32, 32, 32, 2, 2), "K = 0", /*loads=*/false);
}

// The simulation is not blind: the same kernel on simulated hardware whose ldmatrix
// ignores .trans (x @ w reads B n-contiguous, through .trans) must give wrong results.
TEST(MatmulMmaSim, HardwareThatIgnoresTransGivesWrongResults) {
  Shape3 s{32, 32, 32, false, false, {}};
  Graph g = mm_graph(s, DType::BF16, Epi::None);
  std::vector<Tensor> in = make_inputs(g, 1);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok());
  std::string hw_error;
  Result<std::vector<Tensor>> got = run_tc(g, in, tc_config(32, 32, 32, 2, 2), &hw_error, /*ignore_trans=*/true);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_FALSE(compare((*got)[0], (*want)[0], default_tolerance(DType::BF16)).ok());
}

// TF32 (--allow-tf32): f32 operands in 32-bit shared tiles (32-wide panels of 128-byte
// rows, 16-wide of 64), mma.m16n8k8 per 32 bytes of k. k-contiguous operands come by
// ldmatrix (the same bytes as 16-bit ones), m- and n-contiguous ones one element per
// register. Matched against the reference on TF32-cut inputs (check above).
TEST(MatmulMmaSim, Tf32EveryOperandLayoutMatchesTheReference) {
  for (bool a_t : {false, true})
    for (bool b_t : {false, true}) {
      Shape3 s{40, 48, 84, a_t, b_t, {}};
      for (const KernelConfig& c : {tc_config(32, 32, 16, 2, 2), tc_config(64, 32, 32, 4, 3)})
        check(mm_graph(s, DType::F32, Epi::None), c, name(s, DType::F32, c) + " tf32");
    }
  Shape3 b{32, 40, 48, false, true, {2}};
  check(mm_graph(b, DType::F32, Epi::None), tc_config(32, 32, 32, 2, 2), "tf32 batch 2");
}

// The check is not blind to TF32: the same kernel's results against the exact f32
// reference (uncut inputs) miss f32's tolerance and keep f16's, TF32's mantissa.
TEST(MatmulMmaSim, Tf32RoundsLikeTf32) {
  Shape3 s{32, 32, 256, false, true, {}};
  Graph g = mm_graph(s, DType::F32, Epi::None);
  std::vector<Tensor> in = make_inputs(g, 3);
  Result<std::vector<Tensor>> exact = evaluate(g, in);
  ASSERT_TRUE(exact.ok());
  std::string hw_error;
  Result<std::vector<Tensor>> got = run_tc(g, in, tc_config(32, 32, 32, 2, 2), &hw_error);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(hw_error, "");
  EXPECT_FALSE(compare((*got)[0], (*exact)[0], default_tolerance(DType::F32)).ok());
  EXPECT_TRUE(compare((*got)[0], (*exact)[0], default_tolerance(DType::F16)).ok());
}

// ---- the warpgroup (wgmma) kernel on the host -----------------------------------------------

// Every operand layout: A K-major (x) or M-major (transpose), B K-major (transpose(w))
// or N-major (w); both 16-bit dtypes; ragged M, N and K; one and two warpgroups; two
// m64 steps per warpgroup; block_n 64 .. 256 (one to four 64-wide panels of an
// N-major B, which the leading byte offset steps across).
TEST(MatmulWgmmaSim, EveryOperandLayoutMatchesTheReference) {
  for (DType dt : {DType::BF16, DType::F16})
    for (bool a_t : {false, true})
      for (bool b_t : {false, true}) {
        Shape3 s{136, 200, 136, a_t, b_t, {}};
        check(mm_graph(s, dt, Epi::None), tc_config(64, 64, 64, 4, 2), name(s, dt, tc_config(64, 64, 64, 4, 2)) + " wgmma",
              true, 1, /*wgmma=*/true);
        if (dt == DType::BF16)  // the 16-bit dtypes share every index: one of them on two warpgroups
          check(mm_graph(s, dt, Epi::None), tc_config(128, 128, 64, 8, 3),
                name(s, dt, tc_config(128, 128, 64, 8, 3)) + " wgmma", true, 1, true);
      }
  Shape3 s{72, 200, 80, false, false, {}};
  for (const KernelConfig& c : {tc_config(128, 64, 64, 4, 3), tc_config(64, 256, 64, 4, 2)})
    check(mm_graph(s, DType::BF16, Epi::None), c, name(s, DType::BF16, c) + " wgmma", true, 1, true);
}

// The pipeline over many K tiles: with 3 or more stages one wgmma group stays in flight
// while the copies run one tile fewer ahead; the simulated memory model fails a copy
// into a stage an unretired wgmma group reads, and a read of data not yet waited for
// and published by a barrier.
TEST(MatmulWgmmaSim, PipelineOverManyKTiles) {
  Shape3 s{128, 128, 520, false, false, {}};
  for (const KernelConfig& c : {tc_config(128, 128, 64, 8, 3), tc_config(64, 128, 64, 4, 4), tc_config(64, 64, 64, 4, 2)})
    check(mm_graph(s, DType::BF16, Epi::None), c, name(s, DType::BF16, c) + " wgmma", true, 1, true);
}

// TMA (KernelSpec::tma): thread 0 copies each stage's 128-byte-wide panels with
// cp.async.bulk.tensor through the two tensor maps the launch lists, completing on the
// stage's mbarrier, which every thread waits for. Every operand layout, one and two
// warpgroups, ragged edges (zero-filled by the copy), a 3-D map for a batch, TF32, and
// a pipeline over many K tiles; the memory model fails a wgmma that reads a copy's
// bytes before its mbarrier phase was waited for, or a copy into an in-flight stage.
TEST(MatmulWgmmaSim, TmaEveryOperandLayoutMatchesTheReference) {
  for (bool a_t : {false, true})
    for (bool b_t : {false, true}) {
      Shape3 s{136, 200, 136, a_t, b_t, {}};
      for (const KernelConfig& c : {tc_config(64, 64, 64, 4, 2), tc_config(128, 128, 64, 8, 3)})
        check(mm_graph(s, DType::BF16, Epi::None), c, name(s, DType::BF16, c) + " wgmma tma", true, 1, true, true);
    }
  Shape3 batched{72, 64, 80, false, true, {3}};
  check(mm_graph(batched, DType::F16, Epi::BiasGelu), tc_config(64, 64, 64, 4, 3), "tma batch 3", true, 1, true, true);
  Shape3 lin{136, 100, 72, false, true, {}};
  check(mm_graph(lin, DType::F32, Epi::None), tc_config(64, 64, 32, 4, 3), "tma tf32", true, 1, true, true);
  Shape3 deep{128, 128, 520, false, false, {}};
  for (const KernelConfig& c : {tc_config(128, 128, 64, 8, 4), tc_config(64, 64, 64, 4, 2)})
    check(mm_graph(deep, DType::BF16, Epi::None), c, name(deep, DType::BF16, c) + " wgmma tma", true, 1, true, true);
}

// Not blind: TMA hardware that skips the 128-byte swizzle puts the panels where
// wgmma's descriptors do not read them.
TEST(MatmulWgmmaSim, TmaWithoutTheSwizzleGivesWrongResults) {
  Shape3 s{64, 64, 64, false, true, {}};
  Graph g = mm_graph(s, DType::BF16, Epi::None);
  std::vector<Tensor> in = make_inputs(g, 1);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok());
  std::string hw_error;
  int copies = 0;
  Result<std::vector<Tensor>> got = run_tc(g, in, tc_config(64, 64, 64, 4, 2), &hw_error, false, nullptr, true, nullptr,
                                           /*tma=*/true, &copies, /*tma_no_swizzle=*/true);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_GT(copies, 0);
  EXPECT_FALSE(compare((*got)[0], (*want)[0], default_tolerance(DType::BF16)).ok());
}

// With both operands MN-major no tile row runs along k, so block_k may be 16 or 32:
// each k step is then a whole panel's 16 rows.
TEST(MatmulWgmmaSim, MnMajorOperandsTakeShortKTiles) {
  Shape3 s{64, 96, 72, true, false, {}};
  for (const KernelConfig& c : {tc_config(64, 64, 16, 4, 3), tc_config(64, 128, 32, 4, 2)})
    check(mm_graph(s, DType::BF16, Epi::None), c, name(s, DType::BF16, c) + " wgmma", true, 1, true);
}

// The epilogue on the warpgroup's fragments, a batch, an odd N and K = 0.
TEST(MatmulWgmmaSim, EpiloguesBatchesAndEdges) {
  KernelConfig c = tc_config(64, 64, 64, 4, 2);
  Shape3 s{48, 72, 64, false, true, {}};
  for (Epi e : {Epi::BiasGelu, Epi::Residual, Epi::RawAndBiasRelu})
    check(mm_graph(s, DType::BF16, e), c, name(s, DType::BF16, c) + " wgmma epilogue " + std::to_string(static_cast<int>(e)),
          true, 1, true);
  Shape3 batched{32, 40, 48, false, true, {3}};
  check(mm_graph(batched, DType::F16, Epi::None), c, name(batched, DType::F16, c) + " wgmma batch 3", true, 1, true);
  Shape3 odd{40, 45, 64, false, true, {}};
  check(mm_graph(odd, DType::BF16, Epi::BiasGelu), c, name(odd, DType::BF16, c) + " wgmma odd N", true, 1, true);
  Shape3 empty{16, 32, 0, false, true, {}};
  check(mm_graph(empty, DType::BF16, Epi::BiasGelu), c, "wgmma K = 0", /*loads=*/false, 1, true);
}

// TF32 wgmma (m64nNk8): both operands K-major (x @ transpose(w)), 32-wide k panels.
TEST(MatmulWgmmaSim, Tf32KMajorMatchesTheReference) {
  Shape3 s{136, 100, 72, false, true, {}};
  for (const KernelConfig& c : {tc_config(64, 64, 32, 4, 2), tc_config(128, 128, 64, 8, 3)})
    check(mm_graph(s, DType::F32, Epi::None), c, name(s, DType::F32, c) + " tf32 wgmma", true, 1, true);
}

// Not blind: hardware that reads every operand K-major (ignores imm-trans) gives wrong
// results for x @ w, whose B is N-major.
TEST(MatmulWgmmaSim, HardwareThatIgnoresTransGivesWrongResults) {
  Shape3 s{64, 64, 64, false, false, {}};
  Graph g = mm_graph(s, DType::BF16, Epi::None);
  std::vector<Tensor> in = make_inputs(g, 1);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok());
  std::string hw_error;
  Result<std::vector<Tensor>> got =
      run_tc(g, in, tc_config(64, 64, 64, 4, 2), &hw_error, /*ignore_trans=*/true, nullptr, /*wgmma=*/true);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_FALSE(compare((*got)[0], (*want)[0], default_tolerance(DType::BF16)).ok());
}

// ---- NVPTX ------------------------------------------------------------------------------------

struct Ptx {
  std::string text;
  LaunchShape launch;
};

Ptx emit_ptx(const Graph& g, const KernelConfig& c, const std::string& arch, bool allow_tf32 = false, bool tma = false) {
  Ptx out;
  llvmb::Target t = llvmb::Target::nvptx(arch);
  KernelSpec spec = allow_tf32 ? tf32_spec(g) : spec_of(g);
  spec.tma = tma;
  Result<EmittedKernel> k = emit_matmul(spec, c, t);
  EXPECT_TRUE(k.ok()) << (k.ok() ? "" : k.error().str());
  if (!k) return out;
  out.launch = k->launch;
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  EXPECT_TRUE(ptx.ok()) << (ptx.ok() ? "" : ptx.error().str());
  if (ptx) out.text = *ptx;
  return out;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(MatmulMmaNvptx, HotLoopUsesMmaLdmatrixAndCpAsync) {
  Shape3 s{4096, 4096, 4096, false, false, {}};
  for (DType dt : {DType::BF16, DType::F16})
    for (const char* arch : {"sm_80", "sm_90"}) {  // sm_90 without "a" has no wgmma
      Graph g = mm_graph(s, dt, Epi::None);
      KernelConfig c = suggest_matmul_config(spec_of(g), KernelConfig{}, arch);
      Ptx p = emit_ptx(g, c, arch);
      const std::string ty = dt == DType::BF16 ? "bf16" : "f16";
      EXPECT_GT(count(p.text, "mma.sync.aligned.m16n8k16.row.col.f32." + ty + "." + ty + ".f32"), 0) << arch << " " << ty;
      EXPECT_GT(count(p.text, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"), 0) << arch;
      EXPECT_GT(count(p.text, "cp.async.cg.shared.global"), 0) << arch;
      EXPECT_EQ(count(p.text, "fma.rn.f32"), 0) << arch << ": an FMA loop is left";
      EXPECT_EQ(count(p.text, "ld.global.u16"), 0) << arch << ": operands are read 2 bytes at a time";
      // 128 x 128 x 32 with 4 warps of 64 x 64: 4 x 8 mma per k step of 16, two steps.
      EXPECT_EQ(count(p.text, "mma.sync.aligned"), 4 * 8 * 2) << arch;
      EXPECT_EQ(p.launch.block[0], 128);
      EXPECT_EQ(p.launch.shared_bytes, 3 * (128 * 32 + 32 * 128) * 2);
    }
}

// sm_90a: the suggested 128 x 256 x 64 config with 8 warps and 4 stages is two
// warpgroups, each one m64n256k16 wgmma per k step of 16: 4 per K tile, fenced and
// committed once per tile, the previous tile's group waited for (one in flight); the
// copies are fenced into the async proxy before the barrier.
TEST(MatmulMmaNvptx, Sm90aHotLoopUsesWgmma) {
  for (bool b_t : {false, true})
    for (DType dt : {DType::BF16, DType::F16}) {
      Graph g = mm_graph({4096, 4096, 4096, false, b_t, {}}, dt, Epi::None);
      KernelConfig c = suggest_matmul_config(spec_of(g), KernelConfig{}, "sm_90a");
      EXPECT_EQ(c, tc_config(128, 256, 64, 8, 4));
      Ptx p = emit_ptx(g, c, "sm_90a");
      const std::string ty = dt == DType::BF16 ? "bf16" : "f16";
      EXPECT_EQ(count(p.text, "wgmma.mma_async.sync.aligned.m64n256k16.f32." + ty + "." + ty), 4) << ty;
      // imm-trans-b: 1 for w [K, N] (N-major), 0 for transpose(w) (K-major); A is K-major.
      EXPECT_EQ(count(p.text, std::string("p, 1, 1, 0, ") + (b_t ? "0;" : "1;")), 4) << ty << " b_t " << b_t;
      EXPECT_EQ(count(p.text, "wgmma.fence.sync.aligned"), 1);
      EXPECT_EQ(count(p.text, "wgmma.commit_group.sync.aligned"), 1);
      // One group left in flight across K tiles, all retired before the epilogue.
      EXPECT_EQ(count(p.text, "wgmma.wait_group.sync.aligned 1"), 1);
      EXPECT_EQ(count(p.text, "wgmma.wait_group.sync.aligned 0"), 1);
      EXPECT_EQ(count(p.text, "fence.proxy.async.shared::cta"), 1);
      EXPECT_GT(count(p.text, "cp.async.cg.shared.global"), 0);
      EXPECT_EQ(count(p.text, "mma.sync"), 0);
      EXPECT_EQ(count(p.text, "ldmatrix"), 0);
      EXPECT_EQ(count(p.text, "fma.rn.f32"), 0) << "an FMA loop is left";
      EXPECT_NE(p.text.find(".align 1024 .b8 sf_smem[]"), std::string::npos) << "the swizzle atoms need 1024-byte alignment";
      EXPECT_EQ(p.launch.block[0], 256);
      EXPECT_EQ(p.launch.shared_bytes, 4 * (128 * 64 + 64 * 256) * 2);
      if (have_ptxas()) {  // with the bench's bias + GELU epilogue on 128 accumulators a thread
        Ptx epi = emit_ptx(mm_graph({4096, 4096, 4096, false, b_t, {}}, dt, Epi::BiasGelu), c, "sm_90a");
        Result<std::vector<KernelResources>> r = assemble(epi.text, "sm_90a");
        ASSERT_TRUE(r.ok()) << r.error().str();
        EXPECT_FALSE((*r)[0].spills()) << ty;
      }
    }
}

// --allow-tf32: an f32 GEMM multiplies on the tensor cores in TF32; without it, FMA.
TEST(MatmulMmaNvptx, Tf32OnlyWhenAllowed) {
  Graph lin = mm_graph({4096, 4096, 4096, false, true, {}}, DType::F32, Epi::None);  // x @ transpose(w)
  Graph xw = mm_graph({4096, 4096, 4096, false, false, {}}, DType::F32, Epi::None);  // x @ w
  KernelConfig c80 = suggest_matmul_config(tf32_spec(lin), KernelConfig{}, "sm_80");
  EXPECT_EQ(c80, tc_config(128, 128, 32, 4, 3));
  Ptx p80 = emit_ptx(lin, c80, "sm_80", true);
  EXPECT_GT(count(p80.text, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"), 0);
  EXPECT_GT(count(p80.text, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"), 0);
  EXPECT_EQ(count(p80.text, "fma.rn.f32"), 0);
  // sm_90a, both operands K-major: wgmma m64n256k8 over 32-element (128-byte) k panels.
  KernelConfig c90 = suggest_matmul_config(tf32_spec(lin), KernelConfig{}, "sm_90a");
  EXPECT_EQ(c90, tc_config(128, 256, 32, 8, 4));
  Ptx p90 = emit_ptx(lin, c90, "sm_90a", true);
  EXPECT_EQ(count(p90.text, "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32"), 4);
  // x @ w: B is n-contiguous, which TF32 wgmma cannot read; mma.sync with B one
  // element per register.
  KernelConfig cxw = suggest_matmul_config(tf32_spec(xw), KernelConfig{}, "sm_90a");
  Ptx pxw = emit_ptx(xw, cxw, "sm_90a", true);
  EXPECT_GT(count(pxw.text, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"), 0);
  EXPECT_EQ(count(pxw.text, "wgmma"), 0);
  EXPECT_EQ(count(pxw.text, "ldmatrix.sync.aligned.m8n8.x4.trans"), 0) << "32-bit elements cannot be transposed by ldmatrix";
  // Not allowed: the SIMT FMA kernel.
  Ptx exact = emit_ptx(lin, c80, "sm_80", false);
  EXPECT_EQ(count(exact.text, "mma"), 0);
  EXPECT_GT(count(exact.text, "fma.rn.f32"), 0);
  if (have_ptxas())
    for (const Ptx* p : {&p80, &p90, &pxw}) {
      Result<std::vector<KernelResources>> r = assemble(p->text, p == &p80 ? "sm_80" : "sm_90a");
      ASSERT_TRUE(r.ok()) << r.error().str();
      EXPECT_FALSE((*r)[0].spills());
    }
}

// TMA on sm_90a: thread 0 arms each stage's mbarrier and issues one 2-D bulk tensor
// copy per 128-byte-wide panel (x: one 64 x 128 box of A; w [K, N]: four 64 x 64
// boxes of B) per K tile, every thread waits on the mbarrier; no cp.async, no proxy
// fence. The
// launch lists the two tensor maps (A K-major, B N-major), which a batch makes 3-D.
TEST(MatmulMmaNvptx, Sm90aTmaCopiesThroughTensorMaps) {
  Graph g = mm_graph({4096, 4096, 4096, false, false, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = suggest_matmul_config(spec_of(g), KernelConfig{}, "sm_90a");
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  // Tiles 0 and 1 before the loop (4 stages, one wgmma group in flight), one in it.
  EXPECT_EQ(count(p.text, "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"), 3 * (1 + 4));
  EXPECT_EQ(count(p.text, "mbarrier.init.shared::cta.b64"), 4);  // one per stage
  EXPECT_EQ(count(p.text, "mbarrier.arrive.expect_tx.shared::cta.b64"), 3);
  EXPECT_EQ(count(p.text, "mbarrier.try_wait.parity.shared::cta.b64"), 1);
  EXPECT_EQ(count(p.text, "fence.mbarrier_init.release.cluster"), 1);
  EXPECT_EQ(count(p.text, "cp.async.cg"), 0);
  EXPECT_EQ(count(p.text, "fence.proxy.async"), 0);
  EXPECT_EQ(count(p.text, "wgmma.mma_async"), 4);
  EXPECT_EQ(p.launch.shared_bytes, 4 * (128 * 64 + 64 * 256) * 2 + 4 * 8);
  ASSERT_EQ(p.launch.tensor_maps.size(), 2u);
  const TensorMapSpec& a = p.launch.tensor_maps[0];
  const TensorMapSpec& b = p.launch.tensor_maps[1];
  EXPECT_EQ(a.input, 0);
  EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(a.dims[0], 4096);
  EXPECT_EQ(a.strides[0], 4096 * 2);
  EXPECT_EQ(a.box[0], 64);
  EXPECT_EQ(a.box[1], 128);  // block_m rows of one 64-wide k panel
  EXPECT_EQ(b.input, 1);
  EXPECT_EQ(b.box[0], 64);
  EXPECT_EQ(b.box[1], 64);  // block_k rows of one 64-wide n panel
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills());
  }
  Graph bat = mm_graph({256, 256, 256, false, true, {4}}, DType::BF16, Epi::None);
  Ptx pb = emit_ptx(bat, tc_config(128, 128, 64, 8, 4), "sm_90a", false, true);
  EXPECT_GT(count(pb.text, "cp.async.bulk.tensor.3d"), 0);
  ASSERT_EQ(pb.launch.tensor_maps.size(), 2u);
  EXPECT_EQ(pb.launch.tensor_maps[0].rank, 3);
  EXPECT_EQ(pb.launch.tensor_maps[0].strides[1], 256 * 256 * 2);
  // Without KernelSpec::tma: cp.async, no tensor maps.
  Ptx plain = emit_ptx(g, c, "sm_90a");
  EXPECT_TRUE(plain.launch.tensor_maps.empty());
  EXPECT_EQ(count(plain.text, "cp.async.bulk"), 0);
}

TEST(MatmulMmaNvptx, TransposedOperandsUseLdmatrixTrans) {
  // x @ w (w [K, N]: n contiguous) needs .trans for B; transpose(a) @ transpose(w)
  // needs it for A and not for B.
  Graph g1 = mm_graph({256, 256, 256, false, false, {}}, DType::BF16, Epi::None);
  Ptx p1 = emit_ptx(g1, tc_config(128, 128, 32, 4, 3), "sm_80");
  EXPECT_GT(count(p1.text, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"), 0);
  Graph g2 = mm_graph({256, 256, 256, false, true, {}}, DType::BF16, Epi::None);
  Ptx p2 = emit_ptx(g2, tc_config(128, 128, 32, 4, 3), "sm_80");
  EXPECT_EQ(count(p2.text, ".trans"), 0) << "x @ transpose(w) reads both operands k-contiguous";
}

TEST(MatmulMmaNvptx, PtxasAcceptsEveryTestedConfigWithoutSpills) {
  if (!have_ptxas()) GTEST_SKIP() << "no ptxas";
  Shape3 s{1024, 1024, 1024, false, true, {}};
  for (DType dt : {DType::BF16, DType::F16})
    for (const char* arch : {"sm_80", "sm_90a"})
      for (const KernelConfig& c : {tc_config(128, 128, 32, 4, 3), tc_config(64, 64, 64, 4, 4), tc_config(128, 256, 32, 8, 3),
                                    tc_config(32, 32, 32, 2, 2)}) {
        Graph g = mm_graph(s, dt, Epi::BiasGelu);
        Ptx p = emit_ptx(g, c, arch);
        Result<std::vector<KernelResources>> r = assemble(p.text, arch);
        ASSERT_TRUE(r.ok()) << name(s, dt, c) << " " << arch << ": " << r.error().str();
        ASSERT_FALSE(r->empty());
        EXPECT_EQ((*r)[0].spill_store_bytes + (*r)[0].spill_load_bytes, 0) << name(s, dt, c) << " " << arch;
      }
}

// --check under --allow-tf32: an f32 value computed by an f32 matmul gets f16's
// tolerance (TF32's mantissa), and values no matmul feeds keep f32's.
TEST(MatmulMmaPath, CheckToleranceAllowsForTf32) {
  GraphBuilder b("t");
  Value x = b.param("x", DType::F32, {4, 8});
  Value w = b.param("w", DType::F32, {8, 4});
  Value y = relu(matmul(x, w));
  b.ret(y);
  b.ret(x + x);
  Graph g = finish(b);
  EXPECT_EQ(check_tolerance(g, g.outputs()[0].value).rtol, default_tolerance(DType::F32).rtol);
  EXPECT_EQ(check_tolerance(g, g.outputs()[0].value, true).rtol, default_tolerance(DType::F16).rtol);
  EXPECT_EQ(check_tolerance(g, g.outputs()[1].value, true).rtol, default_tolerance(DType::F32).rtol);
}

// ---- which kernel ------------------------------------------------------------------------------

TEST(MatmulMmaPath, SaysWhichKernelAndWhy) {
  Graph bf = mm_graph({256, 256, 256, false, false, {}}, DType::BF16, Epi::None);
  KernelConfig tc = tc_config(128, 128, 32, 4, 3);
  Result<MatmulPath> p = matmul_path(spec_of(bf), tc, "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->tensor_cores) << p->why;
  EXPECT_NE(p->why.find("mma.sync"), std::string::npos) << p->why;

  // block_k 32 leaves A's k-major rows 64 bytes wide: no 128-byte swizzle atoms, so
  // sm_90a keeps mma.sync and says why; a 64-wide block_k takes wgmma.
  EXPECT_FALSE(p->wgmma);
  EXPECT_NE(p->why.find("not wgmma"), std::string::npos) << p->why;
  EXPECT_NE(p->why.find("block_k"), std::string::npos) << p->why;
  p = matmul_path(spec_of(bf), tc_config(128, 128, 64, 4, 3), "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->wgmma) << p->why;
  EXPECT_NE(p->why.find("wgmma.mma_async m64n128k16"), std::string::npos) << p->why;
  // The same config on sm_90 (no "a") and sm_80: mma.sync.
  for (const char* arch : {"sm_90", "sm_80"}) {
    p = matmul_path(spec_of(bf), tc_config(128, 128, 64, 4, 3), arch);
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(p->tensor_cores && !p->wgmma) << arch << ": " << p->why;
  }
  // 2 warps are not a warpgroup.
  p = matmul_path(spec_of(bf), tc_config(64, 64, 64, 2, 3), "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->wgmma);
  EXPECT_NE(p->why.find("warpgroups"), std::string::npos) << p->why;

  p = matmul_path(spec_of(bf), tc, "sm_75");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->tensor_cores);
  EXPECT_NE(p->why.find("sm_75"), std::string::npos) << p->why;

  Graph f32 = mm_graph({256, 256, 256, false, false, {}}, DType::F32, Epi::None);
  p = matmul_path(spec_of(f32), tc, "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->tensor_cores);
  EXPECT_NE(p->why.find("--allow-tf32"), std::string::npos) << p->why;
  // Allowed: TF32 on mma.sync, not wgmma, since B (x @ w) is n-contiguous.
  p = matmul_path(tf32_spec(f32), tc_config(128, 128, 32, 8, 3), "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->tensor_cores && !p->wgmma) << p->why;
  EXPECT_NE(p->why.find("TF32 wgmma reads both operands K-major"), std::string::npos) << p->why;

  // block_k 16: A's k-contiguous shared rows would be 32 bytes, which the swizzle
  // does not cover.
  p = matmul_path(spec_of(bf), tc_config(64, 64, 16, 4, 2), "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->tensor_cores);
  EXPECT_NE(p->why.find("block_k"), std::string::npos) << p->why;

  // K = 20: A's rows (stride 20 elements) do not start 16-byte aligned.
  Graph odd = mm_graph({64, 64, 20, false, false, {}}, DType::BF16, Epi::None);
  p = matmul_path(spec_of(odd), tc, "sm_90a");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->tensor_cores);
  EXPECT_NE(p->why.find("operand A"), std::string::npos) << p->why;
  // ... and it still compiles, on the SIMT kernel.
  EXPECT_TRUE(emit_matmul(spec_of(odd), tc, llvmb::Target::nvptx("sm_90a")).ok());
}

TEST(MatmulMmaPath, SuggestedConfigTakesTensorCoresWhereTheyApply) {
  Graph bf = mm_graph({4096, 4096, 4096, false, false, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = suggest_matmul_config(spec_of(bf), KernelConfig{}, "sm_80");
  EXPECT_EQ(c.block_m, 128);
  EXPECT_EQ(c.block_n, 128);
  EXPECT_TRUE(matmul_path(spec_of(bf), c, "sm_80")->tensor_cores);
  // Small matrices get small tiles.
  Graph small = mm_graph({16, 40, 64, false, false, {}}, DType::BF16, Epi::None);
  KernelConfig cs = suggest_matmul_config(spec_of(small), KernelConfig{}, "sm_80");
  EXPECT_EQ(cs.block_m, 32);
  EXPECT_EQ(cs.block_n, 64);
  // f32 and sm_75 keep the base config.
  Graph f32 = mm_graph({256, 256, 256, false, false, {}}, DType::F32, Epi::None);
  EXPECT_EQ(suggest_matmul_config(spec_of(f32), KernelConfig{}, "sm_80"), KernelConfig{});
  EXPECT_EQ(suggest_matmul_config(spec_of(bf), KernelConfig{}, "sm_75"), KernelConfig{});
}

}  // namespace kernels_matmul_mma_test
}  // namespace sf
