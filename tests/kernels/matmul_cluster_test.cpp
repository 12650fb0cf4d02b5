// Thread-block clusters with TMA multicast (KernelConfig::cluster_m / cluster_n,
// docs/kernels.md "Clusters"): two blocks of the persistent warp-specialised wgmma
// kernel take pairs of output tiles, each bringing half of the operand tile they
// share into both blocks' shared memory. On the host, no GPU needed: both blocks of
// each cluster run at once under mma_sim.h's simulation, whose multicast lands in
// every block of the mask and completes on each one's mbarrier, whose remote arrive
// fails on a block that has exited, against the float64 reference; the simulation's
// own checks driven by hand; the PTX and ptxas; what the knobs refuse.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/kernels/matmul_sim.h"
#include "tests/kernels/mma_ptx.h"
#include "tests/sanitized.h"

namespace sf {
namespace kernels_matmul_cluster_test {

using namespace mma_sim;
using kernel_test::assemble;
using kernel_test::have_ptxas;

KernelConfig cluster_config(int bm, int bn, int warps, int stages, int persistent, int cm, int cn) {
  KernelConfig c = tc_config(bm, bn, 64, warps, stages, 8, /*ws=*/1);
  c.persistent = persistent;
  c.cluster_m = cm;
  c.cluster_n = cn;
  return c;
}

// The shared operand's map brings half a box's rows: B's (K-major: bn rows) with
// cluster_m = 2, A's (m-contiguous: bk rows) with cluster_n = 2; the other map is
// unchanged; the launch is whole clusters, the work items pairs of tiles.
TEST(MatmulCluster, TheSharedOperandsBoxIsHalfAsTall) {
  Graph g = mm_graph({136, 200, 192, false, true, {}}, DType::BF16, Epi::None);
  KernelSpec spec = tf32_spec(g);
  spec.tma = true;
  Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, cluster_config(64, 64, 4, 3, 5, 2, 1), true);
  ASSERT_TRUE(k.ok()) << k.error().str();
  ASSERT_EQ(k->launch.tensor_maps.size(), 2u);
  EXPECT_EQ(k->launch.tensor_maps[0].box[1], 64);  // A: bm rows of 64 k
  EXPECT_EQ(k->launch.tensor_maps[1].box[1], 32);  // B: half of bn = 64
  EXPECT_EQ(k->launch.cluster, 2);
  // ceil(136 / 128) pairs along M x ceil(200 / 64) tiles along N = 8 items; 5 blocks
  // asked for make 2 clusters.
  EXPECT_EQ(k->launch.grid[0], 4);
  Graph ga = mm_graph({136, 200, 192, true, false, {}}, DType::BF16, Epi::None);
  KernelSpec sa = tf32_spec(ga);
  sa.tma = true;
  Result<EmittedKernel> kn = emit_matmul_mma_block_on_host(sa, cluster_config(64, 64, 4, 3, 64, 1, 2), true);
  ASSERT_TRUE(kn.ok()) << kn.error().str();
  EXPECT_EQ(kn->launch.tensor_maps[0].box[1], 32);  // A, m-contiguous: half of bk = 64 rows of k
  EXPECT_EQ(kn->launch.tensor_maps[1].box[1], 64);  // B, n-contiguous: bk rows
  // ceil(136 / 64) tiles along M x ceil(200 / 128) pairs along N = 6 items, so 6 of
  // the 32 clusters asked for.
  EXPECT_EQ(kn->launch.grid[0], 12);
  // Without a persistent walk: a block a tile, two a pair, the batch in grid y.
  Graph gb = mm_graph({136, 200, 192, false, true, {3}}, DType::BF16, Epi::None);
  KernelSpec sb = tf32_spec(gb);
  sb.tma = true;
  Result<EmittedKernel> kb = emit_matmul_mma_block_on_host(sb, cluster_config(64, 64, 4, 3, 0, 2, 1), true);
  ASSERT_TRUE(kb.ok()) << kb.error().str();
  EXPECT_EQ(kb->launch.grid[0], 16);  // 8 pairs
  EXPECT_EQ(kb->launch.grid[1], 3);
  EXPECT_EQ(kb->launch.cluster, 2);
  EXPECT_FALSE(kb->launch.persistent);
}

// The products against the reference, both directions: a pair whose second tile lies
// wholly past M (its block still brings its half of B and stores nothing), ragged N,
// a batch, transposed operands (the shared tile's halves split k rows instead of m or
// n rows), f16 and TF32, two outputs stored by TMA, ping-pong, several items a
// cluster, one item in all. A half at the wrong rows, a multicast that misses a
// block, a stage released on one block only (the other's producer overwrites it while
// it is read), a block leaving before the other's last arrivals, all fail here.
TEST(MatmulCluster, ProductsMatchTheReference) {
  check(mm_graph({136, 200, 192, false, true, {}}, DType::BF16, Epi::BiasGelu), cluster_config(64, 64, 4, 3, 2, 2, 1),
        "cluster_m ragged", true, 1, true, true);
  check(mm_graph({72, 136, 128, true, false, {2}}, DType::F16, Epi::Residual), cluster_config(64, 64, 4, 3, 4, 1, 2),
        "cluster_n A^T batch", true, 2, true, true);
  KernelConfig st = cluster_config(64, 64, 4, 3, 2, 2, 1);
  st.tma_store = 1;
  check(mm_graph({128, 128, 128, false, false, {}}, DType::BF16, Epi::RawAndBiasRelu), st, "cluster_m tma stores", true, 3,
        true, true);
  KernelConfig t32 = cluster_config(64, 64, 4, 3, 2, 1, 2);
  t32.block_k = 32;
  check(mm_graph({80, 200, 96, false, true, {}}, DType::F32, Epi::None), t32, "cluster_n tf32", true, 4, true, true);
  // Without a persistent walk: blocks 2i and 2i + 1 take pair i (sm_90a's decode-shape
  // default class, 64 x 64 x 64 with a producer warpgroup and 4 stages).
  check(mm_graph({136, 200, 320, false, true, {}}, DType::BF16, Epi::BiasGelu), cluster_config(64, 64, 4, 4, 0, 2, 1),
        "cluster_m, a block a pair", true, 9, true, true);
  if (test::kSanitized) return;
  check(mm_graph({72, 200, 128, true, false, {2}}, DType::F16, Epi::RawAndBiasRelu), cluster_config(64, 64, 4, 2, 0, 1, 2),
        "cluster_n, a block a pair, batch, two outputs", true, 10, true, true);
  for (int lag = 0; lag < 2; ++lag)
    check(mm_graph({128, 128, 256, false, true, {}}, DType::BF16, Epi::None), cluster_config(64, 64, 4, 3, 0, 2, 1),
          "cluster_m, a block a pair, block " + std::to_string(lag) + " lagging", true, 11, true, true, 0, lag);  // the sanitizer build's sample; the rest in the optimized build
  KernelConfig pp = cluster_config(64, 64, 8, 3, 4, 2, 1);
  pp.pingpong = 1;
  check(mm_graph({200, 136, 192, false, true, {2}}, DType::BF16, Epi::BiasGelu), pp, "cluster_m ping-pong", true, 5, true,
        true);
  check(mm_graph({64, 64, 128, false, true, {}}, DType::BF16, Epi::None), cluster_config(64, 64, 4, 2, 8, 1, 2),
        "one item, its second tile wholly past N", true, 6, true, true);
  // One block of each cluster held back at every wgmma: the other runs ahead as far as
  // the mbarriers let it, finishes first, and must not leave before the lagging
  // block's last arrivals on its mbarriers are in.
  for (int lag = 0; lag < 2; ++lag)
    check(mm_graph({256, 128, 256, false, true, {}}, DType::BF16, Epi::BiasGelu), cluster_config(64, 64, 4, 3, 2, 2, 1),
          "cluster_m, block " + std::to_string(lag) + " lagging", true, 7, true, true, 0, lag);
  // The default class of kernel: 128 x 256, setmaxnreg, clusters along M.
  KernelConfig big = cluster_config(128, 256, 8, 4, 2, 2, 1);
  big.setmaxnreg = 232;
  check(mm_graph({384, 256, 128, false, true, {}}, DType::BF16, Epi::BiasGelu), big, "128x256 cluster_m", true, 8, true,
        true);
}

// The simulation's cluster instructions, driven by hand: a multicast lands in every
// block of its mask and completes on each one's mbarrier; a mask past the cluster, a
// block that has exited, an arrive on an mbarrier the peer never initialised, or one
// initialised with no cluster barrier since, fail.
TEST(MatmulCluster, TheSimulationHoldsTheKernelToTheProtocol) {
  TensorMapSpec spec;
  spec.input = 0;
  spec.dtype = DType::BF16;
  spec.rank = 2;
  spec.dims = {64, 8, 1, 1, 1};
  spec.strides = {128, 0, 0, 0};
  spec.box = {64, 8, 1, 1, 1};
  std::vector<uint16_t> in(64 * 8);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  SimTensorMap map{spec, in.data()};
  auto pair = [](std::vector<std::unique_ptr<Block>>& b) {
    for (int r = 0; r < 2; ++r) {
      b.push_back(std::make_unique<Block>(32, 4096));
      b.back()->rank = r;
    }
    auto c = std::make_unique<Cluster>(std::vector<Block*>{b[0].get(), b[1].get()}, 32);
    for (auto& x : b) x->cluster = c.get();
    return c;
  };
  {  // both blocks get the box, 128-byte swizzled, and both phases complete
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    for (auto& x : b) {
      sim_mbar_init(x.get(), 0, x->smem + 2048, 1);
      sim_mbar_expect_tx(x.get(), 0, x->smem + 2048, 1024);
    }
    ++c->barriers;  // the cluster barrier after the initialisation
    sim_tma_load_multicast(b[0].get(), 0, &map, b[0]->smem + 1024, 0, 0, 0, 0, 0, b[0]->smem + 2048, 3);
    for (auto& x : b) {
      EXPECT_EQ(x->error, "");
      EXPECT_EQ(sim_mbar_try_wait(x.get(), 0, x->smem + 2048, 0), 1) << "block " << x->rank;
      uint16_t v = 0;  // element 9 of row 3: 16-byte unit 1 of the row moves to 1 ^ 3
      std::memcpy(&v, x->smem + 1024 + 3 * 128 + ((1 ^ 3) * 16) + 2, 2);
      EXPECT_EQ(v, 3 * 64 + 9) << "block " << x->rank;
    }
    EXPECT_EQ(c->multicasts, 1);
  }
  {  // only block 1 in the mask: block 0's shared memory untouched
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    for (auto& x : b) sim_mbar_init(x.get(), 0, x->smem + 2048, 1);
    ++c->barriers;
    std::memset(b[0]->smem + 1024, 0, 1024);
    sim_tma_load_multicast(b[0].get(), 0, &map, b[0]->smem + 1024, 0, 0, 0, 0, 0, b[0]->smem + 2048, 2);
    uint16_t v = 0;
    std::memcpy(&v, b[0]->smem + 1024 + 3 * 128 + 2 * 16, 2);
    EXPECT_EQ(v, 0);
    std::memcpy(&v, b[1]->smem + 1024 + 3 * 128 + 2 * 16, 2);
    EXPECT_EQ(v, 3 * 64 + 8);  // unit 2 of row 3 holds elements 8.. (unit 2 ^ 3)
  }
  {  // a mask naming a rank the cluster does not have
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    sim_tma_load_multicast(b[0].get(), 0, &map, b[0]->smem + 1024, 0, 0, 0, 0, 0, b[0]->smem + 2048, 4);
    EXPECT_NE(b[0]->error.find("CTA mask 4 is not within the cluster"), std::string::npos) << b[0]->error;
  }
  {  // an arrive on the other block's mbarrier: counted there, not here
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    for (auto& x : b) sim_mbar_init(x.get(), 0, x->smem + 2048, 1);
    ++c->barriers;
    sim_mbar_arrive_cluster(b[0].get(), 0, b[0]->smem + 2048, 1);
    EXPECT_EQ(sim_mbar_try_wait(b[1].get(), 0, b[1]->smem + 2048, 0), 1);
    EXPECT_EQ(sim_mbar_try_wait(b[0].get(), 0, b[0]->smem + 2048, 0), 0);
    EXPECT_EQ(b[0]->error + b[1]->error, "");
  }
  {  // the other block has exited: its shared memory is gone
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    for (auto& x : b) sim_mbar_init(x.get(), 0, x->smem + 2048, 1);
    ++c->barriers;
    for (int t = 0; t < 32; ++t) c->thread_returned(1);
    sim_mbar_arrive_cluster(b[0].get(), 0, b[0]->smem + 2048, 1);
    EXPECT_NE(b[0]->error.find("which has exited"), std::string::npos) << b[0]->error;
  }
  {  // the other block never initialised the mbarrier
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    sim_mbar_init(b[0].get(), 0, b[0]->smem + 2048, 1);
    ++c->barriers;
    sim_mbar_arrive_cluster(b[0].get(), 0, b[0]->smem + 2048, 1);
    EXPECT_NE(b[1]->error.find("never initialised"), std::string::npos) << b[1]->error;
  }
  {  // initialised, but no cluster barrier since: the arrive may come before the init
    std::vector<std::unique_ptr<Block>> b;
    auto c = pair(b);
    for (auto& x : b) sim_mbar_init(x.get(), 0, x->smem + 2048, 1);
    sim_tma_load_multicast(b[0].get(), 0, &map, b[0]->smem + 1024, 0, 0, 0, 0, 0, b[0]->smem + 2048, 3);
    EXPECT_EQ(b[0]->error, "");  // its own mbarrier: ordered by its own thread
    EXPECT_NE(b[1]->error.find("that no cluster barrier has published since its initialisation"), std::string::npos)
        << b[1]->error;
  }
}

// The 128 x 256 default-class kernel with cluster_m = 2, in PTX: the cluster shape in
// the entry's header; each stage's A box by a plain TMA copy and B's half box by a
// multicast one (as many of each); the consumers' releases through mapa onto each
// block's mbarrier; one cluster barrier after the mbarriers' initialisation; ptxas
// takes it with the launch's 168 registers and no spills.
TEST(MatmulCluster, PtxMulticastsTheSharedTile) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = cluster_config(128, 256, 8, 4, 132, 2, 1);
  c.setmaxnreg = 232;
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  EXPECT_EQ(count(p.text, ".reqnctapercluster 2, 1, 1"), 1);
  const int multicast = count(p.text, "mbarrier::complete_tx::bytes.multicast::cluster [");
  EXPECT_GE(multicast, 1);
  EXPECT_EQ(count(p.text, "mbarrier::complete_tx::bytes ["), multicast);  // A's copies, one per B multicast
  EXPECT_GE(count(p.text, "mapa.shared::cluster.u32"), 1);
  EXPECT_EQ(count(p.text, "mapa.shared::cluster.u32"), count(p.text, "mbarrier.arrive.release.cluster.shared::cluster.b64"));
  EXPECT_EQ(count(p.text, "mbarrier.arrive.shared::cta.b64"), 0);  // no release on the block's own mbarrier alone
  EXPECT_EQ(count(p.text, "barrier.cluster.arrive.release.aligned"), 1);
  EXPECT_EQ(count(p.text, "barrier.cluster.wait.acquire.aligned"), 1);
  EXPECT_EQ(p.launch.cluster, 2);
  EXPECT_EQ(p.launch.grid[0], 132);
  EXPECT_EQ(p.launch.tensor_maps[1].box[1], 128);
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills()) << (*r)[0].spill_store_bytes << " bytes spilled";
    EXPECT_EQ((*r)[0].registers, 168);
  }
  // A block a pair of tiles (the decode shape's default class, no persistent walk):
  // the same instructions, a grid of whole clusters, ptxas without spills.
  Graph d = mm_graph({128, 4096, 4096, false, true, {}}, DType::BF16, Epi::None);
  Ptx pd = emit_ptx(d, cluster_config(64, 64, 4, 4, 0, 2, 1), "sm_90a", false, true);
  EXPECT_EQ(count(pd.text, ".reqnctapercluster 2, 1, 1"), 1);
  EXPECT_GE(count(pd.text, ".multicast::cluster ["), 1);
  EXPECT_EQ(count(pd.text, "barrier.cluster.wait.acquire.aligned"), 1);
  EXPECT_EQ(pd.launch.grid[0], 2 * 64);  // 64 pairs of tiles, two blocks each
  EXPECT_EQ(pd.launch.cluster, 2);
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(pd.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills()) << (*r)[0].spill_store_bytes << " bytes spilled";
  }
  // Without clusters, none of it.
  c.cluster_m = 1;
  Ptx q = emit_ptx(g, c, "sm_90a", false, true);
  EXPECT_EQ(count(q.text, "cluster_"), 0);
  EXPECT_EQ(count(q.text, ".reqnctapercluster"), 0);
  EXPECT_EQ(count(q.text, "multicast"), 0);
  EXPECT_EQ(count(q.text, "mapa"), 0);
  EXPECT_EQ(q.launch.cluster, 1);
}

// explain's account: which tiles pair up and what they share.
TEST(MatmulCluster, ExplainSaysWhatTheBlocksShare) {
  KernelSpec spec = spec_of(mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu));
  spec.tma = true;
  KernelConfig c = cluster_config(128, 256, 8, 4, 132, 2, 1);
  Result<MatmulPath> p = matmul_path(spec, c, "sm_90a");
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_NE(p->why.find("clusters of 2 blocks on tiles adjacent in M, sharing B's tile: each block brings half of it by TMA "
                        "multicast into both"),
            std::string::npos)
      << p->why;
  c.cluster_m = 1;
  c.cluster_n = 2;
  Result<MatmulPath> q = matmul_path(spec, c, "sm_90a");
  ASSERT_TRUE(q.ok());
  EXPECT_NE(q->why.find("adjacent in N, sharing A's tile"), std::string::npos) << q->why;
}

// What the knobs need, refused with the reason.
TEST(MatmulCluster, RefusesWhatItCannotRun) {
  auto refused = [](const KernelConfig& c, bool tma = true) {
    KernelSpec spec = tf32_spec(mm_graph({128, 128, 256, false, true, {}}, DType::BF16, Epi::None));
    spec.tma = tma;
    Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, c, /*wgmma=*/true);
    return k.ok() ? std::string("built") : k.error().message;
  };
  EXPECT_EQ(refused(cluster_config(64, 64, 4, 3, 2, 2, 1)), "built");
  KernelConfig both = cluster_config(64, 64, 4, 3, 2, 2, 2);
  EXPECT_NE(refused(both).find("at most one of them 2"), std::string::npos) << refused(both);
  KernelConfig four = cluster_config(64, 64, 4, 3, 2, 4, 1);
  EXPECT_NE(refused(four).find("cluster_m = 4, cluster_n = 1: each is 1 or 2"), std::string::npos) << refused(four);
  EXPECT_EQ(refused(cluster_config(64, 64, 4, 3, 0, 2, 1)), "built");  // a block a pair of tiles
  KernelConfig split = cluster_config(64, 64, 4, 3, 2, 1, 2);
  split.split_k = 2;
  EXPECT_NE(refused(split).find("cluster_n = 2 needs split_k = 1"), std::string::npos) << refused(split);
  KernelConfig no_ws = cluster_config(64, 64, 4, 3, 2, 2, 1);
  no_ws.warp_specialize = 0;
  EXPECT_NE(refused(no_ws).find("cluster_m = 2 needs warp_specialize = 1"), std::string::npos) << refused(no_ws);
  // --no-tma: no producer warpgroup, so no cluster either.
  KernelConfig plain = cluster_config(64, 64, 4, 3, 2, 2, 1);
  plain.warp_specialize = 0;
  EXPECT_NE(refused(plain, /*tma=*/false).find("cluster_m = 2 needs warp_specialize = 1"), std::string::npos);
}

}  // namespace kernels_matmul_cluster_test
}  // namespace sf
