// The simulated hardware's thread-block cluster instructions (mma_sim.h's Block and
// Cluster): the TMA copy multicast into every block of a mask, the arrive on another
// block's mbarrier, and the cluster barrier (MmaSimHooks::tma_load_multicast,
// mbar_arrive_cluster, cluster_barrier), as the PTX ISA describes them.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "tests/kernels/mma_sim.h"

namespace sf::mma_sim {

// ---- thread-block clusters ----

// The block of rank `rank` in `blk`'s cluster, still running (under the cluster's
// mu), or nullptr after failing the run with `what`.
inline Block* cluster_peer_locked(Block& blk, int32_t rank, const char* what) {
  if (!blk.cluster || rank < 0 || static_cast<size_t>(rank) >= blk.cluster->blocks.size()) {
    blk.fail(std::string(what) + " names CTA rank " + std::to_string(rank) + ", outside the block's cluster");
    return nullptr;
  }
  if (blk.cluster->live[static_cast<size_t>(rank)] == 0) {
    blk.fail(std::string(what) + " reaches the block of rank " + std::to_string(rank) +
             " of the cluster, which has exited (its shared memory is gone)");
    return nullptr;
  }
  return blk.cluster->blocks[static_cast<size_t>(rank)];
}

// Another block reaching `d`'s mbarrier at `at` (under d.mu): it must have been
// initialised before a cluster barrier that has completed since (else the access may
// come before the initialisation, which the kernel's fence.mbarrier_init only
// publishes through that barrier).
inline void unpublished_init_locked(Block& d, int64_t at, const char* what) {
  auto it = d.mbars.find(at);
  if (it != d.mbars.end() && it->second.init_barriers >= d.cluster->barriers.load())
    d.fail_locked(std::string(what) + " from another block of the cluster reaches an mbarrier of block " +
                  std::to_string(d.rank) + " that no cluster barrier has published since its initialisation");
}

// cp.async.bulk.tensor ... .multicast::cluster: the box into every block of `mask`, at
// the same offset of each one's shared memory, completing on the mbarrier at the same
// offset of each.
inline void sim_tma_load_multicast(void* ctx, int32_t, const void* map, void* dst, int32_t c0, int32_t c1, int32_t c2,
                                   int32_t c3, int32_t c4, void* mbar, int32_t mask) {
  Block& blk = *static_cast<Block*>(ctx);
  if (!blk.cluster) return blk.fail("a multicast TMA copy in a block outside any cluster");
  const int n = static_cast<int>(blk.cluster->blocks.size());
  if (mask <= 0 || mask >= (1 << n)) return blk.fail("a multicast TMA copy's CTA mask " + std::to_string(mask) + " is not within the cluster");
  const int64_t at = static_cast<uint8_t*>(dst) - blk.smem, bar = static_cast<uint8_t*>(mbar) - blk.smem;
  std::lock_guard<std::mutex> lock(blk.cluster->mu);
  ++blk.cluster->multicasts;
  for (int r = 0; r < n; ++r) {
    if (!(mask & (1 << r))) continue;
    Block* d = cluster_peer_locked(blk, r, "a multicast TMA copy");
    if (!d) return;
    std::lock_guard<std::mutex> dlock(d->mu);
    if (d != &blk) unpublished_init_locked(*d, bar, "a multicast TMA copy");
    tma_box_locked(*d, *static_cast<const SimTensorMap*>(map), at, c0, c1, c2, c3, c4, bar);  // a refusal is d's error
  }
}

// mapa + mbarrier.arrive.release.cluster.shared::cluster: an arrival on the mbarrier
// at `mbar`'s offset in the block of rank `rank`.
inline void sim_mbar_arrive_cluster(void* ctx, int32_t, void* mbar, int32_t rank) {
  Block& blk = *static_cast<Block*>(ctx);
  const int64_t at = static_cast<uint8_t*>(mbar) - blk.smem;
  if (!blk.cluster) return blk.fail("an mbarrier arrive on a cluster rank in a block outside any cluster");
  std::lock_guard<std::mutex> lock(blk.cluster->mu);
  Block* d = cluster_peer_locked(blk, rank, "an mbarrier arrive");
  if (!d) return;
  std::lock_guard<std::mutex> dlock(d->mu);
  if (d != &blk) unpublished_init_locked(*d, at, "an mbarrier arrive");
  auto it = d->mbars.find(at);
  if (it == d->mbars.end()) return d->fail_locked("arrive from another block of the cluster on an mbarrier never initialised");
  if (--it->second.pending < 0) return d->fail_locked("more arrivals on an mbarrier phase than its count");
  complete_if_done(it->second);
}

// barrier.cluster.arrive + wait: every thread of every block of the cluster.
inline void sim_cluster_barrier(void* ctx, int32_t) {
  Block& blk = *static_cast<Block*>(ctx);
  if (!blk.cluster) return blk.fail("barrier.cluster in a block outside any cluster");
  blk.cluster->bar.arrive_and_wait();
}

}  // namespace sf::mma_sim
