// TMA stores (KernelConfig::tma_store, docs/kernels.md "TMA stores"): the persistent
// warp-specialised wgmma kernel's staged chunks leave shared memory by
// cp.async.bulk.tensor through a tensor map of each output. On the host, no GPU
// needed: the kernel under mma_sim.h's simulation, whose TMA store is carried out only
// when a wait completes its bulk group (so an area written again before its store read
// it, or a store never waited for, shows), against the float64 reference; the
// simulation's own checks driven by hand; the PTX and ptxas; what the knob refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "tests/kernels/matmul_sim.h"
#include "tests/kernels/mma_ptx.h"
#include "tests/sanitized.h"

namespace sf {
namespace kernels_matmul_tma_store_test {

using namespace mma_sim;
using kernel_test::assemble;
using kernel_test::have_ptxas;

KernelConfig store_config(int bm, int bn, int warps, int stages, int persistent) {
  KernelConfig c = tc_config(bm, bn, 64, warps, stages, 8, /*ws=*/1);
  c.persistent = persistent;
  c.tma_store = 1;
  return c;
}

// A bf16 product whose epilogue returns it in f32 and, rounded, in bf16 (two maps of
// different element sizes: an f32 chunk of 64 columns is two boxes a row of boxes).
Graph two_widths(const Shape3& s) {
  GraphBuilder b("mm");
  Value a = b.param("in0", DType::BF16, {s.m, s.k});
  Value w = b.param("in1", DType::BF16, {s.n, s.k});
  Value h = matmul(a, transpose(w, 0, 1));
  b.ret(cast(h, DType::F32));
  b.ret(relu(h + b.param("in2", DType::BF16, {s.n})));
  return decompose(finish(b));
}

// The maps the kernel's launch lists after A's and B's, one an output, written out by
// hand: [N, M] innermost first (then the batch), rows N elements apart, a box of 128
// bytes by 16 rows.
TEST(MatmulTmaStore, EachOutputHasATensorMapAfterTheOperands) {
  Shape3 s{136, 200, 192, false, true, {3}};
  KernelSpec spec = tf32_spec(mm_graph(s, DType::BF16, Epi::RawAndBiasRelu));
  spec.tma = true;
  Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, store_config(64, 128, 4, 3, 3), /*wgmma=*/true);
  ASSERT_TRUE(k.ok()) << k.error().str();
  const std::vector<TensorMapSpec>& maps = k->launch.tensor_maps;
  ASSERT_EQ(maps.size(), 4u);
  EXPECT_EQ(maps[0].output, -1);
  EXPECT_EQ(maps[1].output, -1);
  for (int o = 0; o < 2; ++o) {
    const TensorMapSpec& m = maps[static_cast<size_t>(2 + o)];
    EXPECT_EQ(m.output, o);
    EXPECT_EQ(m.dtype, DType::BF16);
    EXPECT_EQ(m.rank, 3);
    EXPECT_EQ(m.dims[0], 200);
    EXPECT_EQ(m.dims[1], 136);
    EXPECT_EQ(m.dims[2], 3);
    EXPECT_EQ(m.strides[0], 400);            // a row: 200 bf16
    EXPECT_EQ(m.strides[1], 136 * 200 * 2);  // a batch
    EXPECT_EQ(m.box[0], 64);                 // 128 bytes
    EXPECT_EQ(m.box[1], 16);                 // a warp's fragment rows of one m64 step
    EXPECT_EQ(m.box[2], 1);
  }
}

// The stored outputs against the reference: ragged M and N (the last tiles' boxes
// clipped by TMA, the boxes wholly outside skipped), a batch (the maps' third
// coordinate), two outputs, an f32 output beside a bf16 one, TF32 (f32 boxes, two a
// chunk row), two m64 steps a warp, split-K in the workspace, ping-pong, and 256-wide
// tiles, whose 4 chunks take the two areas in turn, items walked by one block (each
// item's first chunk waits for the last item's stores; 9 ragged ones in the optimized
// build).
// A box at the wrong coordinates, a wrong swizzle, an area written again before its
// store read it, or a store never waited for fails. (K = 0 has no TMA, so no producer
// warpgroup and no TMA stores.)
TEST(MatmulTmaStore, StoredOutputsMatchTheReference) {
  Shape3 ragged{136, 200, 192, false, true, {}};
  check(mm_graph(ragged, DType::BF16, Epi::BiasGelu), store_config(64, 128, 4, 3, 3), "tma store ragged", true, 1, true, true);
  Shape3 batched{72, 128, 128, false, false, {2}};
  check(mm_graph(batched, DType::F16, Epi::RawAndBiasRelu), store_config(64, 64, 4, 3, 2), "tma store batch, two outputs",
        true, 1, true, true);
  {
    // The f32 output is the product unrounded (fused precision keeps the accumulator,
    // docs/kernels.md "Dtypes"), which the reference computes from the same bf16
    // values widened to f32; the bf16 output against the graph's own reference.
    Graph g = two_widths({72, 192, 128, false, true, {}});
    std::vector<Tensor> in = make_inputs(g, 3);
    GraphBuilder b("mm32");
    Value a = cast(b.param("in0", DType::BF16, {72, 128}), DType::F32);
    Value w = cast(b.param("in1", DType::BF16, {192, 128}), DType::F32);
    b.ret(matmul(a, transpose(w, 0, 1)));
    Result<std::vector<Tensor>> want32 = evaluate(decompose(finish(b)), {in[0], in[1]});
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want32.ok() && want.ok());
    std::string hw_error;
    int stores = 0;
    Result<std::vector<Tensor>> got = run_tc(g, in, store_config(64, 128, 4, 3, 2), &hw_error, false, nullptr, true, nullptr,
                                             true, nullptr, false, 0, nullptr, 0, &stores);
    ASSERT_TRUE(got.ok()) << got.error().str();
    EXPECT_EQ(hw_error, "");
    EXPECT_GT(stores, 0);
    Comparison c32 = compare((*got)[0], (*want32)[0], default_tolerance(DType::F32));
    EXPECT_TRUE(c32.ok()) << "f32 output: " << c32.mismatches << " mismatches, max abs err " << c32.max_abs_err;
    Comparison c16 = compare((*got)[1], (*want)[1], default_tolerance(DType::BF16));
    EXPECT_TRUE(c16.ok()) << "bf16 output: " << c16.mismatches << " mismatches, max abs err " << c16.max_abs_err;
  }
  // (A bare product: the reference reads every f32 input cut to TF32, a bias too.)
  Shape3 tf32{80, 96, 64, false, true, {}};
  KernelConfig t32 = store_config(64, 64, 4, 3, 2);
  t32.block_k = 32;
  check(mm_graph(tf32, DType::F32, Epi::None), t32, "tma store tf32", true, 1, true, true);
  KernelConfig tall = store_config(128, 64, 4, 3, 2);  // one warpgroup, two m64 steps a warp
  check(mm_graph({200, 128, 128, false, true, {}}, DType::BF16, Epi::Residual), tall, "tma store two m steps", true, 1, true,
        true);
  KernelConfig sk = store_config(64, 64, 4, 3, 3);  // split-K 2: the last block of a tile stores it
  sk.split_k = 2;
  check(mm_graph({72, 128, 256, false, true, {}}, DType::BF16, Epi::BiasGelu), sk, "tma store split-K", true, 1, true, true);
  KernelConfig pp = store_config(64, 64, 8, 3, 5);
  pp.pingpong = 1;
  check(mm_graph({136, 136, 320, false, true, {2}}, DType::BF16, Epi::BiasGelu), pp, "tma store ping-pong", true, 1, true, true);
  // 256-wide tiles: 4 chunks through the 2 areas (chunks 2 and 3 wait for 0's and 1's
  // stores to have read them), 2 items in one block.
  KernelConfig wide = store_config(64, 256, 4, 3, 1);
  check(mm_graph({128, 256, 128, false, true, {}}, DType::BF16, Epi::BiasGelu), wide, "tma store wide tiles", true, 1, true,
        true);
  if (test::kSanitized) return;  // the sanitizer build's sample; the rest in the optimized build
  check(mm_graph({130, 600, 128, false, true, {}}, DType::BF16, Epi::BiasGelu), wide, "tma store wide ragged tiles, 9 items",
        true, 1, true, true);
}

// The simulation's TMA store, driven by hand: the checks that catch an emitter which
// forgets the fence, writes an area before its store has read it, or never waits.
TEST(MatmulTmaStore, TheSimulationHoldsTheKernelToTheProtocol) {
  TensorMapSpec spec;
  spec.output = 0;
  spec.dtype = DType::BF16;
  spec.rank = 2;
  spec.dims = {64, 16, 1, 1, 1};
  spec.strides = {128, 0, 0, 0};
  spec.box = {64, 16, 1, 1, 1};
  std::vector<uint16_t> out(64 * 16, 0);
  SimTensorMap map{spec, out.data(), out.size() * 2};
  auto staged = [](Block& blk, uint16_t v) {
    for (int r = 0; r < 16; ++r)
      for (int i = 0; i < 64; ++i) {
        int64_t off = r * 128 + i * 2;
        off ^= ((off >> 7) & 7) << 4;
        std::memcpy(blk.smem + off, &v, 2);
      }
  };
  auto fence_all = [](Block& blk) {
    for (int t = 0; t < 32; ++t) sim_proxy_fence(&blk, t);
  };
  {  // the protocol kept: fenced, stored, committed, waited; the box lands swizzled back
    Block blk(32, 4096);
    staged(blk, 0x3f80);
    fence_all(blk);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 0, 0, 0, 0);
    sim_bulk_commit(&blk, 0);
    EXPECT_EQ(out[5 * 64 + 17], 0) << "carried out before any wait";
    sim_bulk_wait(&blk, 0, 0, 1);
    blk.check_bulk();
    EXPECT_EQ(blk.error, "");
    EXPECT_EQ(out[5 * 64 + 17], 0x3f80);
    EXPECT_EQ(blk.tma_store_bytes, 64 * 16 * 2);
  }
  {  // lane 7 did not fence
    Block blk(32, 4096);
    for (int t = 0; t < 32; ++t)
      if (t != 7) sim_proxy_fence(&blk, t);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 0, 0, 0, 0);
    EXPECT_NE(blk.error.find("lane 7 of warp 0 wrote without fence.proxy.async"), std::string::npos) << blk.error;
  }
  {  // the fences of the first store do not cover the second
    Block blk(32, 4096);
    fence_all(blk);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 0, 0, 0, 0);
    sim_bulk_commit(&blk, 0);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 0, 0, 0, 0);
    EXPECT_NE(blk.error.find("without fence.proxy.async since the warp's last store"), std::string::npos) << blk.error;
  }
  {  // the area written again before the wait: the store carries the new values
    Block blk(32, 4096);
    std::fill(out.begin(), out.end(), 0);
    staged(blk, 0x3f80);
    fence_all(blk);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 0, 0, 0, 0);
    sim_bulk_commit(&blk, 0);
    staged(blk, 0x4000);
    sim_bulk_wait(&blk, 0, 0, 1);
    EXPECT_EQ(out[0], 0x4000);
  }
  {  // never waited for
    Block blk(32, 4096);
    fence_all(blk);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 0, 0, 0, 0);
    sim_bulk_commit(&blk, 0);
    blk.check_bulk();
    EXPECT_NE(blk.error.find("exited with TMA stores it never waited for"), std::string::npos) << blk.error;
  }
  {  // clipped at the tensor's edge: a box at row 8 writes rows 8..15 only
    Block blk(32, 4096);
    std::fill(out.begin(), out.end(), 0);
    staged(blk, 0x3f80);
    fence_all(blk);
    sim_tma_store(&blk, 0, &map, blk.smem, 0, 8, 0, 0, 0);
    sim_bulk_commit(&blk, 0);
    sim_bulk_wait(&blk, 0, 0, 0);
    EXPECT_EQ(blk.error, "");
    EXPECT_EQ(out[7 * 64], 0);
    EXPECT_EQ(out[8 * 64], 0x3f80);
    EXPECT_EQ(blk.tma_store_bytes, 64 * 8 * 2);
  }
  {  // a map whose rows reach past the buffer
    Block blk(32, 4096);
    SimTensorMap wide = map;
    wide.spec.strides[0] = 256;
    fence_all(blk);
    sim_tma_store(&blk, 0, &wide, blk.smem, 0, 0, 0, 0, 0);
    sim_bulk_commit(&blk, 0);
    sim_bulk_wait(&blk, 0, 0, 0);
    EXPECT_NE(blk.error.find("a TMA store writes byte"), std::string::npos) << blk.error;
  }
}

// The 128 x 256 default-class kernel (persistent, warp-specialised, setmaxnreg=232)
// with TMA stores, in PTX: per thread 4 chunks of 64 columns, each staged (16 pair
// stores into the swizzled boxes), fenced, met at the warp's barrier and stored by the
// first lane with one 2-D bulk tensor store a box (one box a warp and chunk), one
// commit a chunk; the first lane waits (.read) before chunks 0, 2 and 3 (chunk 1 takes
// the other area, which chunk 0's wait already drained) and drains its
// groups before the kernel returns; no lane stores an output itself; two areas of
// 8 warps x 16 rows x 128 bytes past the pipeline, 1024-byte aligned; no spills.
TEST(MatmulTmaStore, PtxStoresEachChunkWithOneBulkCopyABox) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = store_config(128, 256, 8, 4, 132);
  c.setmaxnreg = 232;
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  EXPECT_EQ(count(p.text, "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"), 4);
  EXPECT_EQ(count(p.text, "cp.async.bulk.commit_group"), 4);
  EXPECT_EQ(count(p.text, "cp.async.bulk.wait_group.read 0;"), 1);
  EXPECT_EQ(count(p.text, "cp.async.bulk.wait_group.read 1;"), 2);
  EXPECT_EQ(count(p.text, "cp.async.bulk.wait_group 0;"), 1);
  EXPECT_EQ(count(p.text, "fence.proxy.async.shared::cta"), 4);
  EXPECT_EQ(count(p.text, "st.shared.b32"), 64);
  EXPECT_EQ(count(p.text, "st.global"), 0);
  EXPECT_EQ(count(p.text, "ld.shared.v4"), 0);
  const int64_t pipeline = 4 * (128 + 256) * 64 * 2 + 4 * 16;
  EXPECT_EQ(p.launch.shared_bytes, (pipeline + 1023) / 1024 * 1024 + 2 * 8 * 16 * 128);
  ASSERT_EQ(p.launch.tensor_maps.size(), 3u);
  EXPECT_EQ(p.launch.tensor_maps[2].output, 0);
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills()) << (*r)[0].spill_store_bytes << " bytes spilled";
    EXPECT_EQ((*r)[0].registers, 168);
  }
}

// explain's account of the kernel (matmul_path): the chunks stored by TMA, through how
// many areas; the 128 x 256 tile with f32 outputs (TF32) has room for one.
TEST(MatmulTmaStore, ExplainSaysTheChunksLeaveByTma) {
  KernelSpec spec = spec_of(mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu));
  spec.tma = true;
  KernelConfig c = store_config(128, 256, 8, 4, 132);
  c.setmaxnreg = 232;
  Result<MatmulPath> p = matmul_path(spec, c, "sm_90a");
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_NE(p->why.find("64 columns at a time (2 areas), stored by TMA (cp.async.bulk.tensor, a tensor map an output)"),
            std::string::npos)
      << p->why;
  KernelSpec t32 = tf32_spec(mm_graph({4096, 4096, 4096, false, true, {}}, DType::F32, Epi::None));
  t32.tma = true;
  KernelConfig ct = c;
  ct.block_k = 32;
  Result<MatmulPath> q = matmul_path(t32, ct, "sm_90a");
  ASSERT_TRUE(q.ok()) << q.error().str();
  EXPECT_NE(q->why.find("(1 area), stored by TMA"), std::string::npos) << q->why;
  // Asked for where the outputs do not allow it (compile refuses the config): said why.
  KernelSpec odd = spec_of(mm_graph({4096, 100, 4096, false, true, {}}, DType::BF16, Epi::None));
  odd.tma = true;
  Result<MatmulPath> r = matmul_path(odd, c, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_NE(r->why.find("no TMA stores, which the config asks for: N = 100 does not fill whole 16-byte chunks"),
            std::string::npos)
      << r->why;
  c.tma_store = 0;
  Result<MatmulPath> plain = matmul_path(spec, c, "sm_90a");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->why.find("stored by TMA"), std::string::npos) << plain->why;
}

// What tma_store = 1 needs, refused with the reason.
TEST(MatmulTmaStore, RefusesWhatItCannotRun) {
  auto refused = [](const Graph& g, const KernelConfig& c, bool tma = true) {
    KernelSpec spec = tf32_spec(g);
    spec.tma = tma;
    Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, c, /*wgmma=*/true);
    return k.ok() ? std::string("built") : k.error().message;
  };
  Graph g = mm_graph({128, 128, 128, false, true, {}}, DType::BF16, Epi::None);
  EXPECT_EQ(refused(g, store_config(64, 64, 4, 3, 2)), "built");
  KernelConfig no_ws = store_config(64, 64, 4, 3, 2);
  no_ws.warp_specialize = 0;
  EXPECT_NE(refused(g, no_ws).find("tma_store = 1 needs warp_specialize = 1"), std::string::npos) << refused(g, no_ws);
  KernelConfig no_pers = store_config(64, 64, 4, 3, 0);
  EXPECT_NE(refused(g, no_pers).find("tma_store = 1 needs a persistent grid"), std::string::npos) << refused(g, no_pers);
  KernelConfig bad = store_config(64, 64, 4, 3, 2);
  bad.tma_store = 2;
  EXPECT_NE(refused(g, bad).find("tma_store = 2 is not 0 or 1"), std::string::npos) << refused(g, bad);
  // 32 columns: a warp's chunk of 64 bytes, not a TMA box's 128.
  KernelConfig narrow = store_config(64, 32, 4, 3, 2);
  EXPECT_NE(refused(g, narrow).find("not whole 128-byte rows"), std::string::npos) << refused(g, narrow);
  // N = 100 bf16: rows 200 bytes apart, no whole 16-byte chunks (the staged paths' rule).
  Graph odd = mm_graph({128, 100, 128, false, true, {}}, DType::BF16, Epi::None);
  EXPECT_NE(refused(odd, store_config(64, 64, 4, 3, 2)).find("does not fill whole 16-byte chunks"), std::string::npos)
      << refused(odd, store_config(64, 64, 4, 3, 2));
  // --no-tma: no producer warpgroup to begin with.
  EXPECT_NE(refused(g, store_config(64, 64, 4, 3, 2), /*tma=*/false).find("warp_specialize = 1 needs"), std::string::npos);
}

}  // namespace kernels_matmul_tma_store_test
}  // namespace sf
