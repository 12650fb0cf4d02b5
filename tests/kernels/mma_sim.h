// A simulated thread block for the tensor-core matmul kernels built for the host
// (emit_matmul_mma_block_on_host): OS threads as GPU threads, and the warp- and
// warpgroup-collective instructions, cp.async, TMA and mbarriers simulated from the
// PTX ISA (ptx_isa_tables.h), not from the emitter's own index maps, under a memory
// model that fails reads of data not yet waited for and copies into shared memory a
// wgmma may still read. The matmul tests' graphs, configs and run-and-compare on it:
// matmul_sim.h; the fused attention's: attention_sim.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "codegen/kernels/matmul.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/ptx_isa_tables.h"

namespace sf::mma_sim {

using kernels::RowCol;

constexpr int kLanes = 32;

// ---- the simulated warps -----------------------------------------------------------------

// A 32-bit register as the tensor cores read TF32: the sign, exponent and top 10
// mantissa bits of the f32 (the low 13 bits are ignored).
inline float from_tf32(uint32_t bits) { return std::bit_cast<float>(bits & 0xFFFFE000u); }

inline float from_16(uint32_t h, bool f16) {
  h &= 0xFFFFu;
  if (f16) return static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
  return std::bit_cast<float>(h << 16);
}

// One warp's rendezvous: every lane deposits its operands, all 32 meet, each computes
// its own result from everybody's, all 32 meet again before the slots are reused.
struct Warp {
  kernel_test::SleepBarrier<> bar{kLanes};
  std::array<const uint8_t*, kLanes> row{};
  std::array<int, kLanes> trans{};
  std::array<std::array<uint32_t, 4>, kLanes> a{};
  std::array<std::array<uint32_t, 2>, kLanes> b{};
  std::array<std::array<float, 4>, kLanes> c{};
  std::array<float, kLanes> shfl{};  // shfl.bfly's posted values
};

// One warpgroup's rendezvous for wgmma: every thread deposits its descriptors and
// mode, all 128 meet (and must agree), each computes its own fragment of D.
struct WarpGroup {
  kernel_test::SleepBarrier<> bar{4 * kLanes};
  std::array<uint64_t, 4 * kLanes> da{}, db{};
  std::array<int32_t, 4 * kLanes> mode{};
  int calls = 0;  // wgmma instructions thread 0 of the group issued
  std::array<float, 64 * 16> am{};   // the operands as thread 0 read them: A [m][k]
  std::array<float, 256 * 16> bm{};  // B [n][k]
  std::array<std::array<uint32_t, 4>, 4 * kLanes> ra{};  // A from registers: each thread's four
};

// Shared-memory byte ranges [lo, hi) whose cp.async data may not be read yet, or which
// an in-flight wgmma may still read.
struct Range {
  int64_t lo = 0, hi = 0;
  bool overlaps(int64_t a, int64_t b) const { return a < hi && lo < b; }
};

struct Block;
struct Cluster;
// bar.sync's completion: the data every thread waited for (cp.async.wait_group) before
// the barrier becomes readable by all.
struct Publish {
  Block* blk;
  void operator()() noexcept;
};

struct Block {
  explicit Block(int threads, size_t smem_bytes)
      : bar(threads, Publish{this}),
        bar_threads(static_cast<size_t>(threads)),
        cp_groups(static_cast<size_t>(threads), std::vector<std::vector<Range>>(1)),
        landed(static_cast<size_t>(threads)),
        smem_bytes(smem_bytes),
        storage(smem_bytes + 1024),
        bulk(static_cast<size_t>(threads), std::vector<std::vector<BulkStore>>(1)),
        fences(static_cast<size_t>(threads), 0),
        store_rounds(static_cast<size_t>(threads / kLanes), 0) {
    for (int w = 0; w < threads / kLanes; ++w) warps.push_back(std::make_unique<Warp>());
    for (int w = 0; w < threads / (4 * kLanes); ++w) {
      groups.push_back(std::make_unique<WarpGroup>());
      wgmma_groups.emplace_back(1);
    }
    auto p = reinterpret_cast<uintptr_t>(storage.data());
    smem = storage.data() + ((1024 - p % 1024) % 1024);
  }
  kernel_test::SleepBarrier<Publish> bar;
  size_t bar_threads;
  // The memory model (under mu): per thread, its cp.async groups (the last one open)
  // and the ranges its waits completed but no barrier has published yet; per
  // warpgroup, the operand ranges of its wgmma groups not yet waited for (the last
  // open), and how many of its threads reached the current commit or wait.
  std::vector<std::vector<std::vector<Range>>> cp_groups;
  std::vector<std::vector<Range>> landed;
  std::vector<std::vector<std::vector<Range>>> wgmma_groups;
  std::vector<int> wg_commits = std::vector<int>(4, 0);
  // wgmma.wait_group instances: each thread's count of the waits it has made, and per
  // warpgroup how many threads have made their n-th (warps may be one wait apart: a
  // warp past `wait_group 1` may reach the next `wait_group 0` before another warp
  // has reached the first).
  std::map<int32_t, int64_t> wait_seq;
  std::vector<std::map<int64_t, int>> wg_waits = std::vector<std::map<int64_t, int>>(4);
  // TMA: each mbarrier (by its shared-memory offset) and the copies still to be
  // waited for: a copy completes phase `use` of its mbarrier, and a reader must have
  // seen that phase complete (observed[thread][mbarrier] > use).
  struct MBar {
    int count = 0, pending = 0;
    int64_t tx = 0;
    int completions = 0;
    int64_t init_barriers = 0;  // clusters: the cluster barriers completed when it was initialised
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
  // TMA stores (under mu): per thread, its bulk async-groups, the committed ones not
  // yet complete and the open one last, each a list of stores. A store is carried out
  // only when a wait completes its group, reading shared memory then: a kernel that
  // writes an area again before its store has read it stores the new values, and one
  // that never waits stores nothing (and fails check_bulk). Per thread, the proxy
  // fences it made; per warp, its bulk groups committed with stores in them.
  struct BulkStore {
    const SimTensorMap* map = nullptr;
    int64_t src = 0;  // shared-memory offset of the box
    std::array<int32_t, 5> c{};
  };
  std::vector<std::vector<std::vector<BulkStore>>> bulk;
  std::vector<int64_t> fences;
  std::vector<int64_t> store_rounds;
  int tma_stores = 0;      // boxes stored
  int tma_store_bytes = 0;  // bytes written to global memory by them
  // After the block ran: every thread's bulk groups completed (the stores of one that
  // was never waited for would land after the block's shared memory is gone).
  void check_bulk() {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t t = 0; t < bulk.size(); ++t)
      if (bulk[t].size() > 1 || !bulk[t].back().empty())
        return fail_locked("thread " + std::to_string(t) + " exited with TMA stores it never waited for (cp.async.bulk.wait_group)");
  }
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<std::unique_ptr<WarpGroup>> groups;
  bool ignore_wgmma_trans = false;  // a broken wgmma that reads every operand K-major
  // A warpgroup held back at each of its wgmma (`lag_group`, -1: none), so that the
  // others run ahead of it as far as the kernel's synchronisation lets them: a kernel
  // that counts on the warpgroups keeping in step shows it.
  int lag_group = -1;
  std::chrono::microseconds lag{0};
  std::mutex mu;
  // Named barriers 1..15 (bar.sync / bar.arrive id, count), under mu: the threads
  // arrived at the current instance (how many, which), its count, and instances
  // completed.
  struct Named {
    int arrived = 0, count = 0;
    int64_t done = 0;
    std::vector<int32_t> who;
  };
  std::map<int32_t, Named> named;
  std::condition_variable named_cv;
  std::string error;  // the first thing the simulated hardware refused
  // Thread-block clusters: the block's cluster (nullptr: none) and its rank there.
  Cluster* cluster = nullptr;
  int rank = 0;
  bool ignore_trans = false;  // a broken ldmatrix, to show the tests would notice
  // setmaxnreg, under mu: each thread's (count, inc) in the order it executed them.
  std::map<int32_t, std::vector<std::pair<int32_t, int32_t>>> setmaxnreg;

  // After the block ran: the register reallocation as the PTX ISA requires it. Every
  // warp of a warpgroup executes the same setmaxnreg (here: one at most, as a second
  // one needs the warpgroup synchronised in between); a .dec lowers and an .inc raises
  // the registers of the launch (65536 / threads in whole 8s, at most 255), each count
  // a multiple of 8 in 24..256; and the warpgroups' counts add up to the launch's
  // pool exactly (an .inc the pool cannot cover waits forever; CUTLASS's
  // configurations match the pool exactly too).
  void check_registers() {
    std::lock_guard<std::mutex> lock(mu);
    if (setmaxnreg.empty()) return;
    const int threads = static_cast<int>(bar_threads), wgs = threads / (4 * kLanes);
    const int launch = std::min(65536 / threads / 8 * 8, 255);
    if (threads % (4 * kLanes) != 0)
      return fail_locked("setmaxnreg in a block of " + std::to_string(threads) + " threads, not whole warpgroups");
    int64_t total = 0;
    for (int g = 0; g < wgs; ++g) {
      const int first = g * 4 * kLanes;
      auto seq = [&](int t) {
        auto it = setmaxnreg.find(t);
        return it == setmaxnreg.end() ? std::vector<std::pair<int32_t, int32_t>>{} : it->second;
      };
      const std::vector<std::pair<int32_t, int32_t>> want = seq(first);
      for (int t = first + 1; t < first + 4 * kLanes; ++t)
        if (seq(t) != want)
          return fail_locked("setmaxnreg: thread " + std::to_string(t) + " of warpgroup " + std::to_string(g) +
                             " did not execute what thread " + std::to_string(first) + " did (every warp of a warpgroup must)");
      if (want.size() > 1) return fail_locked("setmaxnreg executed twice by warpgroup " + std::to_string(g));
      int regs = launch;
      if (!want.empty()) {
        const auto [count, inc] = want[0];
        if (count % 8 != 0 || count < 24 || count > 256)
          return fail_locked("setmaxnreg count " + std::to_string(count) + " is not a multiple of 8 in 24..256");
        if (inc ? count <= launch : count >= launch)
          return fail_locked("setmaxnreg." + std::string(inc ? "inc " : "dec ") + std::to_string(count) + " from the launch's " +
                             std::to_string(launch) + " registers");
        regs = count;
      }
      total += regs;
    }
    if (total != int64_t{launch} * wgs)
      fail_locked("setmaxnreg: the warpgroups end with " + std::to_string(total) + " registers a thread between them, not the " +
                  std::to_string(int64_t{launch} * wgs) + " of the launch");
  }
  int wavefronts = 0;         // the most any ldmatrix phase (8 row addresses) took

  void saw_wavefronts(int w) {
    std::lock_guard<std::mutex> lock(mu);
    wavefronts = std::max(wavefronts, w);
  }

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    fail_locked(what);
  }
  // Threads spinning on an mbarrier phase, since when (a phase that never comes is a
  // deadlock: the wait gives up and fails the run instead of hanging the test).
  std::map<int32_t, std::chrono::steady_clock::time_point> spinning;

  void fail_locked(const std::string& what) {
    if (error.empty()) error = what;
    named_cv.notify_all();  // a bar.sync waiting on a named barrier ends too
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

inline void Publish::operator()() noexcept {
  for (auto& l : blk->landed) l.clear();
}

// A thread-block cluster: its blocks by rank, run at once (their threads side by
// side), a barrier of all their threads (barrier.cluster), and per block the threads
// still running. A block whose threads have all returned is gone, its shared memory
// with it: a copy multicast into it, or an arrive on one of its mbarriers, fails the
// run (the kernel let a block leave while the others still needed it).
// The barrier's completions are counted: a block may reach another's mbarrier only
// after a cluster barrier completed since that block initialised it.
struct Cluster {
  struct Count {
    std::atomic<int64_t>* n;
    void operator()() noexcept { ++*n; }
  };
  Cluster(std::vector<Block*> b, int threads)
      : blocks(std::move(b)), bar(threads * static_cast<int>(blocks.size()), Count{&barriers}), live(blocks.size(), threads) {}
  std::vector<Block*> blocks;
  std::atomic<int64_t> barriers{0};  // cluster barriers completed
  kernel_test::SleepBarrier<Count> bar;
  std::mutex mu;  // taken before any block's
  std::vector<int> live;
  int multicasts = 0;  // multicast copies issued (under mu)
  void thread_returned(int rank) {
    std::lock_guard<std::mutex> lock(mu);
    --live[static_cast<size_t>(rank)];
  }
};

inline void sim_barrier(void* ctx) { static_cast<Block*>(ctx)->bar.arrive_and_wait(); }

// bar.sync / bar.arrive id, count: an instance completes when `count` threads have
// arrived or synced on it; a syncing thread waits for its instance. A wait that never
// completes fails the run after 20 s (deadlock) instead of hanging the test.
// An instance's completion publishes its threads' waited-for cp.async data among
// them (bar.sync and bar.arrive order the memory accesses of every thread that takes
// part), as bar.sync 0 does the block's.
inline void sim_named_barrier(void* ctx, int32_t thread, int32_t id, int32_t count, int32_t sync) {
  Block& blk = *static_cast<Block*>(ctx);
  std::unique_lock<std::mutex> lock(blk.mu);
  if (id < 1 || id > 15) return blk.fail_locked("named barrier " + std::to_string(id) + " outside 1..15");
  if (count <= 0 || count % kLanes != 0 || count > static_cast<int32_t>(blk.bar_threads))
    return blk.fail_locked("named barrier count " + std::to_string(count) + " is not whole warps of the block");
  Block::Named& n = blk.named[id];
  if (n.arrived == 0) n.count = count;
  else if (n.count != count) return blk.fail_locked("threads disagree on named barrier " + std::to_string(id) + "'s count");
  const int64_t mine = n.done;
  n.who.push_back(thread);
  if (++n.arrived == n.count) {
    n.arrived = 0;
    ++n.done;
    for (int32_t t : n.who)
      if (t >= 0 && static_cast<size_t>(t) < blk.landed.size()) blk.landed[static_cast<size_t>(t)].clear();
    n.who.clear();
    blk.named_cv.notify_all();
    return;
  }
  if (!sync) return;
  const bool ok = blk.named_cv.wait_for(lock, std::chrono::seconds(20), [&] { return n.done > mine || !blk.error.empty(); });
  if (!ok) blk.fail_locked("a bar.sync on named barrier " + std::to_string(id) + " has not completed in 20 s (deadlock)");
}

// shfl.sync.bfly: every lane of the warp posts its value, then reads its partner's.
inline float sim_shfl_bfly(void* ctx, int32_t thread, float v, int32_t lane_mask) {
  Block& blk = *static_cast<Block*>(ctx);
  Warp& w = *blk.warps[static_cast<size_t>(thread / kLanes)];
  const int lane = thread % kLanes;
  if (lane_mask < 0 || lane_mask >= kLanes) {
    blk.fail("shfl.bfly lane mask " + std::to_string(lane_mask) + " outside the warp");
    lane_mask = 0;
  }
  w.shfl[static_cast<size_t>(lane)] = v;
  w.bar.arrive_and_wait();
  const float r = w.shfl[static_cast<size_t>(lane ^ lane_mask)];
  w.bar.arrive_and_wait();  // every lane has read before a later shuffle overwrites
  return r;
}

inline void sim_ldmatrix(void* ctx, int32_t thread, const void* row, int32_t trans, uint32_t* out) {
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

inline void sim_mma(void* ctx, int32_t thread, int32_t kind, const uint32_t* a, const uint32_t* b, float* cd) {
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

// What every wgmma checks and how it multiplies: the threads of the warpgroup agree on
// the descriptors and the mode; a descriptor uses the 128-byte swizzle with base
// offset 0 on a 1024-byte pattern boundary and every address lies inside the block's
// shared memory. Thread 0 of the group reads the shared-memory operands through their
// descriptors into the group's A (64 x k; unless `a_regs`: the threads' registers
// placed by the ISA's A figure) and B (k x n), checks and records the byte ranges
// they span; then every thread computes its own D elements, placed by the ISA's
// fragment figure.
inline void wgmma_on(Block& blk, int32_t thread, const uint32_t* a_regs, uint64_t desc_a, uint64_t desc_b, int32_t mode,
                     float* d) {
  WarpGroup& wg = *blk.groups[static_cast<size_t>(thread / (4 * kLanes))];
  const int t = thread % (4 * kLanes);
  wg.da[static_cast<size_t>(t)] = desc_a;
  wg.db[static_cast<size_t>(t)] = desc_b;
  wg.mode[static_cast<size_t>(t)] = mode;
  if (a_regs) std::copy(a_regs, a_regs + 4, wg.ra[static_cast<size_t>(t)].begin());
  if (t == 0) ++wg.calls;
  if (t == 0 && thread / (4 * kLanes) == blk.lag_group) std::this_thread::sleep_for(blk.lag);
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
  if (a_regs && (tf32 || (mode & 2) != 0)) blk.fail("wgmma: A from registers is 16-bit and has no imm-trans-a");
  kernels::isa::WgmmaDesc a = kernels::isa::decode_wgmma_desc(desc_a), b = kernels::isa::decode_wgmma_desc(desc_b);
  for (const kernels::isa::WgmmaDesc* x : {&a, &b}) {
    if (a_regs && x == &a) continue;
    if (x->swizzle != 1 || x->base_offset != 0 || ((x->start >> 7) & 7) != 0)
      blk.fail("wgmma: a descriptor is not a 128-byte swizzle starting on a 1024-byte pattern boundary");
  }
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
    if (a_regs) {
      for (int u = 0; u < 4 * kLanes; ++u)
        for (int e = 0; e < 8; ++e) {
          RowCol q = kernels::isa::isa_wgmma_a(u, e);
          const uint32_t reg = wg.ra[static_cast<size_t>(u)][static_cast<size_t>(e / 2)];
          wg.am[static_cast<size_t>(q.row * 16 + q.col)] = from_16(e % 2 ? reg >> 16 : reg & 0xFFFFu, f16);
        }
    } else {
      for (int64_t r = 0; r < 64; ++r)
        for (int64_t kk = 0; kk < kk_n; ++kk) wg.am[static_cast<size_t>(r * 16 + kk)] = elem(a, ta, r, kk, alo, ahi);
    }
    for (int64_t c = 0; c < n; ++c)
      for (int64_t kk = 0; kk < kk_n; ++kk) wg.bm[static_cast<size_t>(c * 16 + kk)] = elem(b, tb, c, kk, blo, bhi);
    std::lock_guard<std::mutex> lock(blk.mu);
    if (!a_regs) blk.check_read_locked(alo, ahi, "wgmma");
    blk.check_read_locked(blo, bhi, "wgmma");
    for (const Block::TmaWrite& w : blk.tma_writes)
      if (((!a_regs && w.r.overlaps(alo, ahi)) || w.r.overlaps(blo, bhi)) && blk.observed[{thread, w.mbar}] <= w.use)
        blk.fail_locked("wgmma reads what a TMA copy writes before its mbarrier phase was waited for");
    auto& open = blk.wgmma_groups[static_cast<size_t>(thread / (4 * kLanes))].back();
    if (!a_regs) open.push_back({alo, ahi});
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

// wgmma.mma_async m64nNk16 with A and B from shared memory.
inline void sim_wgmma(void* ctx, int32_t thread, uint64_t desc_a, uint64_t desc_b, int32_t mode, float* d) {
  wgmma_on(*static_cast<Block*>(ctx), thread, nullptr, desc_a, desc_b, mode, d);
}

// wgmma.mma_async m64nNk16 with A from registers (the fused attention's q and p).
inline void sim_wgmma_ra(void* ctx, int32_t thread, const uint32_t* a, uint64_t desc_b, int32_t mode, float* d) {
  wgmma_on(*static_cast<Block*>(ctx), thread, a, 0, desc_b, mode, d);
}

// cp.async: copies at once (zero-filling past `bytes`), but its range may not be read
// until the thread waited for its group and a barrier published it; and it must not
// overwrite what an in-flight wgmma group may still read.
inline void sim_cp_async(void* ctx, int32_t thread, void* dst, const void* src, int32_t bytes) {
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

inline void sim_cp_commit(void* ctx, int32_t thread) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  blk.cp_groups[static_cast<size_t>(thread)].emplace_back();
}

inline void sim_cp_wait(void* ctx, int32_t thread, int32_t pending) {
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
inline void sim_wgmma_commit(void* ctx, int32_t thread) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  const size_t g = static_cast<size_t>(thread / (4 * kLanes));
  if (++blk.wg_commits[g] < 4 * kLanes) return;
  blk.wg_commits[g] = 0;
  blk.wgmma_groups[g].emplace_back();
}

// wgmma.wait_group is .sync.aligned: a warp's lanes leave it together (the warp
// rendezvous below), and the warpgroup's groups retire once all its 128 threads have
// made that wait (their n-th).
inline void sim_wgmma_wait(void* ctx, int32_t thread, int32_t pending) {
  Block& blk = *static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> lock(blk.mu);
    const size_t g = static_cast<size_t>(thread / (4 * kLanes));
    const int64_t n = blk.wait_seq[thread]++;
    if (++blk.wg_waits[g][n] == 4 * kLanes) {
      blk.wg_waits[g].erase(n);
      auto& gs = blk.wgmma_groups[g];
      const int64_t committed = static_cast<int64_t>(gs.size()) - 1;
      const int64_t done = std::max<int64_t>(0, committed - pending);
      gs.erase(gs.begin(), gs.begin() + done);
    }
  }
  blk.warps[static_cast<size_t>(thread / kLanes)]->bar.arrive_and_wait();
}

// mbarrier phase bookkeeping: a phase completes when its arrivals and transaction
// bytes are all in; it then counts as completion number `completions`.
inline void complete_if_done(Block::MBar& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.completions;
    m.pending = m.count;
  }
}

inline void sim_mbar_init(void* ctx, int32_t, void* mbar, int32_t count) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  const int64_t at = static_cast<uint8_t*>(mbar) - blk.smem;
  if (at < 0 || at + 8 > static_cast<int64_t>(blk.smem_bytes) || at % 8 != 0) return blk.fail_locked("mbarrier outside shared memory");
  blk.mbars[at] = Block::MBar{count, count, 0, 0, blk.cluster ? blk.cluster->barriers.load() : 0};
}

inline void sim_mbar_expect_tx(void* ctx, int32_t, void* mbar, int32_t bytes) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  auto it = blk.mbars.find(static_cast<uint8_t*>(mbar) - blk.smem);
  if (it == blk.mbars.end()) return blk.fail_locked("arrive.expect_tx on an mbarrier never initialised");
  it->second.tx += bytes;
  if (--it->second.pending < 0) return blk.fail_locked("more arrivals on an mbarrier phase than its count");
  complete_if_done(it->second);
}

inline void sim_setmaxnreg(void* ctx, int32_t thread, int32_t count, int32_t inc) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  blk.setmaxnreg[thread].emplace_back(count, inc);
}

inline void sim_mbar_arrive(void* ctx, int32_t, void* mbar) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  auto it = blk.mbars.find(static_cast<uint8_t*>(mbar) - blk.smem);
  if (it == blk.mbars.end()) return blk.fail_locked("arrive on an mbarrier never initialised");
  if (--it->second.pending < 0) return blk.fail_locked("more arrivals on an mbarrier phase than its count");
  complete_if_done(it->second);
}

inline int32_t sim_mbar_try_wait_locked(Block& blk, int32_t thread, void* mbar, int32_t parity);

// A spinning thread gives the others its core (the simulation runs hundreds of threads
// on a few).
inline int32_t sim_mbar_try_wait(void* ctx, int32_t thread, void* mbar, int32_t parity) {
  Block& blk = *static_cast<Block*>(ctx);
  int32_t done;
  {
    std::lock_guard<std::mutex> lock(blk.mu);
    done = sim_mbar_try_wait_locked(blk, thread, mbar, parity);
  }
  if (!done) std::this_thread::yield();
  return done;
}

inline int32_t sim_mbar_try_wait_locked(Block& blk, int32_t thread, void* mbar, int32_t parity) {
  // Once the simulated hardware has refused something, waits end, so the kernel runs
  // to its end and the test reports the refusal instead of hanging.
  if (!blk.error.empty()) return 1;
  const int64_t at = static_cast<uint8_t*>(mbar) - blk.smem;
  auto it = blk.mbars.find(at);
  if (it == blk.mbars.end()) {
    blk.fail_locked("try_wait on an mbarrier never initialised");
    return 1;
  }
  // The phase of parity `parity` has completed when the one in progress has the other.
  if ((it->second.completions & 1) == (parity & 1)) {
    const auto now = std::chrono::steady_clock::now();
    auto [since, fresh] = blk.spinning.try_emplace(thread, now);
    if (!fresh && now - since->second > std::chrono::seconds(20)) {
      blk.fail_locked("an mbarrier wait has not completed in 20 s: the phase it waits for never comes (deadlock)");
      return 1;
    }
    return 0;
  }
  blk.spinning.erase(thread);
  int& seen = blk.observed[{thread, at}];
  seen = std::max(seen, it->second.completions);
  return 1;
}

// TMA's 128-byte swizzle of a shared-memory offset: its 16-byte unit (bits 4-6) XOR
// address bits 7-9 (the box's row within the 1024-byte pattern); `off` relative to the
// 1024-byte-aligned shared memory.
inline int64_t swizzle_128b(int64_t off) { return off ^ (((off >> 7) & 7) << 4); }

// The byte offset of a box's dims past the first two (one coordinate each, `c[d - 2]`
// for dim d) through the map's strides; `in` false when one is outside the tensor.
inline int64_t outer_offset(const TensorMapSpec& m, const int32_t* c, bool& in) {
  int64_t off = 0;
  in = true;
  for (int d = 2; d < m.rank; ++d) {
    const int64_t g = c[d - 2];
    in = in && g >= 0 && g < m.dims[static_cast<size_t>(d)];
    off += g * m.strides[static_cast<size_t>(d - 1)];
  }
  return off;
}

// cp.async.bulk.tensor with a 128-byte swizzle: box row r of 128 bytes lands at
// dst + 128 r with its 16-byte units permuted by address bits 7-9, elements outside
// the tensor read as zero; the box's bytes complete on the mbarrier.
// One box into block `blk`'s shared memory at offset `at`, completing on its mbarrier
// at offset `bar` (under blk.mu).
inline void tma_box_locked(Block& blk, const SimTensorMap& m, int64_t at, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           int32_t c4, int64_t bar) {
  const int64_t eb = dtype_size(m.spec.dtype);
  const int64_t rows = m.spec.box[1];
  ++blk.tma_copies;
  if (m.spec.box[0] * eb != 128 || at % 1024 != 0 || at < 0 || at + rows * 128 > static_cast<int64_t>(blk.smem_bytes))
    return blk.fail_locked("TMA: a 128-byte-swizzled box must be 128 bytes wide and land 1024-byte aligned in shared memory");
  const Range r{at, at + rows * 128};
  for (const auto& gs : blk.wgmma_groups)
    for (const auto& grp : gs)
      for (const Range& x : grp)
        if (x.overlaps(r.lo, r.hi)) blk.fail_locked("TMA overwrites shared memory that an in-flight wgmma may still read");
  // The dims past the first two: one coordinate each (their boxes are 1 wide), in
  // bounds or the whole box reads zeros; their bytes from the map's strides.
  const int32_t outer[3] = {c2, c3, c4};
  for (int d = 2; d < m.spec.rank; ++d)
    if (m.spec.box[static_cast<size_t>(d)] != 1) return blk.fail_locked("TMA: a box wider than 1 in a dim past the second");
  bool outer_in = true;
  const int64_t outer_off = outer_offset(m.spec, outer, outer_in);
  for (int d = m.spec.rank; d < 5; ++d)
    if (outer[d - 2] != 0) return blk.fail_locked("TMA: a coordinate past the map's rank is not 0");
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < m.spec.box[0]; ++i) {
      const int64_t g0 = c0 + i, g1 = c1 + row;
      const bool in = outer_in && g0 >= 0 && g0 < m.spec.dims[0] && g1 >= 0 && g1 < m.spec.dims[1];
      int64_t off = at + row * 128 + i * eb;
      if (!blk.tma_ignores_swizzle) off = swizzle_128b(off);
      if (in)
        std::memcpy(blk.smem + off,
                    static_cast<const uint8_t*>(m.base) + g0 * eb + g1 * m.spec.strides[0] + outer_off,
                    static_cast<size_t>(eb));
      else
        std::memset(blk.smem + off, 0, static_cast<size_t>(eb));
    }
  auto it = blk.mbars.find(bar);
  if (it == blk.mbars.end()) return blk.fail_locked("TMA completes on an mbarrier never initialised");
  // Overwriting an earlier copy's bytes before anyone waited for that copy's phase:
  // the producer ran ahead of the consumers (it must wait for the stage to be released).
  for (const Block::TmaWrite& w : blk.tma_writes)
    if (w.r.overlaps(r.lo, r.hi)) {
      int seen = 0;
      for (const auto& [key, n] : blk.observed)
        if (key.second == w.mbar) seen = std::max(seen, n);
      if (seen <= w.use) blk.fail_locked("TMA overwrites a copy no thread has waited for yet");
    }
  std::erase_if(blk.tma_writes, [&](const Block::TmaWrite& w) { return w.r.overlaps(r.lo, r.hi); });
  blk.tma_writes.push_back({r, bar, it->second.completions});
  it->second.tx -= rows * 128;
  complete_if_done(it->second);
}

inline void sim_tma_load(void* ctx, int32_t, const void* map, void* dst, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                         int32_t c4, void* mbar) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  tma_box_locked(blk, *static_cast<const SimTensorMap*>(map), static_cast<uint8_t*>(dst) - blk.smem, c0, c1, c2, c3, c4,
                 static_cast<uint8_t*>(mbar) - blk.smem);
}

// ---- TMA stores ----

// One box of a TMA store, carried out (under mu): box row r, element i of the 128-byte
// swizzled box at shared offset `src` (16-byte unit u of a row at u ^ address bits 7-9)
// to the map's element (c0 + i, c1 + r, c2, ...) where that is inside the tensor; the
// elements outside are not written.
inline void carry_out_locked(Block& blk, const Block::BulkStore& st) {
  const SimTensorMap& m = *st.map;
  const int64_t eb = dtype_size(m.spec.dtype);
  bool outer_in = true;
  const int64_t outer_off = outer_offset(m.spec, st.c.data() + 2, outer_in);
  if (!outer_in) return;
  for (int64_t row = 0; row < m.spec.box[1]; ++row)
    for (int64_t i = 0; i < m.spec.box[0]; ++i) {
      const int64_t g0 = st.c[0] + i, g1 = st.c[1] + row;
      if (g0 < 0 || g0 >= m.spec.dims[0] || g1 < 0 || g1 >= m.spec.dims[1]) continue;
      const int64_t off = swizzle_128b(st.src + row * 128 + i * eb);
      const int64_t at = g0 * eb + g1 * m.spec.strides[0] + outer_off;
      if (m.bytes && (at < 0 || at + eb > static_cast<int64_t>(m.bytes)))
        return blk.fail_locked("a TMA store writes byte " + std::to_string(at) + " of an output of " + std::to_string(m.bytes));
      std::memcpy(static_cast<uint8_t*>(const_cast<void*>(m.base)) + at, blk.smem + off, static_cast<size_t>(eb));
      blk.tma_store_bytes += static_cast<int>(eb);
    }
}

// cp.async.bulk.tensor shared -> global: checked now (the box's shape, its place in
// shared memory, every lane of the warp fenced since its last store), carried out when
// a wait completes its group.
inline void sim_tma_store(void* ctx, int32_t thread, const void* map, const void* src, int32_t c0, int32_t c1, int32_t c2,
                          int32_t c3, int32_t c4) {
  Block& blk = *static_cast<Block*>(ctx);
  const auto& m = *static_cast<const SimTensorMap*>(map);
  const int64_t eb = dtype_size(m.spec.dtype);
  const int64_t at = static_cast<const uint8_t*>(src) - blk.smem;
  std::lock_guard<std::mutex> lock(blk.mu);
  ++blk.tma_stores;
  if (m.spec.output < 0) return blk.fail_locked("a TMA store through an input's tensor map");
  if (m.spec.box[0] * eb != 128 || at % 1024 != 0 || at < 0 || at + m.spec.box[1] * 128 > static_cast<int64_t>(blk.smem_bytes))
    return blk.fail_locked("TMA store: a 128-byte-swizzled box must be 128 bytes wide and start 1024-byte aligned in shared memory");
  for (int d = 2; d < 5; ++d)
    if (d < m.spec.rank ? m.spec.box[static_cast<size_t>(d)] != 1 : (d == 2 ? c2 : d == 3 ? c3 : c4) != 0)
      return blk.fail_locked("TMA store: a box wider than 1, or a coordinate past the map's rank not 0, in a dim past the second");
  // fence.proxy.async by every lane of the warp before its store reads what they wrote
  // (the fence, then the warp's barrier, then the store).
  const size_t w = static_cast<size_t>(thread / kLanes);
  for (size_t l = w * kLanes; l < (w + 1) * kLanes; ++l)
    if (blk.fences[l] <= blk.store_rounds[w])
      return blk.fail_locked("a TMA store reads shared memory lane " + std::to_string(l % kLanes) + " of warp " +
                             std::to_string(w) + " wrote without fence.proxy.async since the warp's last store");
  blk.bulk[static_cast<size_t>(thread)].back().push_back({&m, at, {c0, c1, c2, c3, c4}});
}

inline void sim_bulk_commit(void* ctx, int32_t thread) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  auto& groups = blk.bulk[static_cast<size_t>(thread)];
  if (!groups.back().empty()) ++blk.store_rounds[static_cast<size_t>(thread / kLanes)];
  groups.emplace_back();
}

// cp.async.bulk.wait_group[.read] `pending`: the thread's oldest committed groups carried
// out until at most `pending` remain. (.read only promises the sources were read; the
// simulation completes the writes too, which nothing in the kernel can tell apart.)
inline void sim_bulk_wait(void* ctx, int32_t thread, int32_t pending, int32_t) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  auto& groups = blk.bulk[static_cast<size_t>(thread)];
  while (static_cast<int64_t>(groups.size()) - 1 > pending) {
    for (const Block::BulkStore& st : groups.front()) carry_out_locked(blk, st);
    groups.erase(groups.begin());
  }
}

inline void sim_proxy_fence(void* ctx, int32_t thread) {
  Block& blk = *static_cast<Block*>(ctx);
  std::lock_guard<std::mutex> lock(blk.mu);
  ++blk.fences[static_cast<size_t>(thread)];
}

}  // namespace sf::mma_sim
