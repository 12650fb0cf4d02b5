// The sm_90a warpgroup kernel (wgmma.mma_async, codegen/kernels/matmul_mma.cpp) on the
// host, no GPU needed: every block's threads as OS threads, wgmma simulated from the
// PTX ISA's descriptor format, canonical shared-memory layouts and D fragment figure
// (mma_sim.h, ptx_isa_tables.h), cp.async or TMA with mbarriers under the memory
// model, results against the float64 reference evaluator. Also the PTX of its register
// reallocation (the rest of its PTX checks are in matmul_mma_test.cpp).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/kernels/mma_ptx.h"
#include "tests/kernels/matmul_sim.h"
#include "tests/sanitized.h"

namespace sf {
namespace kernels_matmul_wgmma_test {

using namespace mma_sim;
using kernel_test::assemble;
using kernel_test::have_ptxas;

// ---- the warpgroup (wgmma) kernel on the host -----------------------------------------------

// Every operand layout: A K-major (x) or M-major (transpose), B K-major (transpose(w))
// or N-major (w); both 16-bit dtypes; ragged M, N and K; one and two warpgroups; two
// m64 steps per warpgroup; block_n 64 .. 256 (one to four 64-wide panels of an
// N-major B, which the leading byte offset steps across).
TEST(MatmulWgmmaSim, EveryOperandLayoutMatchesTheReference) {
  for (DType dt : {DType::BF16, DType::F16}) {
    // The sanitizer build's sample (tests/sanitized.h): bf16 only; f16 takes the same
    // indices, and the batch and epilogue tests below run it there.
    if (test::kSanitized && dt == DType::F16) continue;
    for (bool a_t : {false, true})
      for (bool b_t : {false, true}) {
        Shape3 s{136, 200, 136, a_t, b_t, {}};
        check(mm_graph(s, dt, Epi::None), tc_config(64, 64, 64, 4, 2), name(s, dt, tc_config(64, 64, 64, 4, 2)) + " wgmma",
              true, 1, /*wgmma=*/true);
        // The 16-bit dtypes share every index: one of them on two warpgroups (the sanitizer
        // build: with each operand once K-major and once MN-major).
        if (dt == DType::BF16 && (!test::kSanitized || a_t != b_t))
          check(mm_graph(s, dt, Epi::None), tc_config(128, 128, 64, 8, 3),
                name(s, dt, tc_config(128, 128, 64, 8, 3)) + " wgmma", true, 1, true);
      }
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
      check(mm_graph(s, DType::BF16, Epi::None), tc_config(64, 64, 64, 4, 2),
            name(s, DType::BF16, tc_config(64, 64, 64, 4, 2)) + " wgmma tma", true, 1, true, true);
      if (a_t != b_t)  // two warpgroups, with each operand once K-major and once MN-major
        check(mm_graph(s, DType::BF16, Epi::None), tc_config(128, 128, 64, 8, 3),
              name(s, DType::BF16, tc_config(128, 128, 64, 8, 3)) + " wgmma tma", true, 1, true, true);
    }
  Shape3 batched{72, 64, 80, false, true, {3}};
  check(mm_graph(batched, DType::F16, Epi::BiasGelu), tc_config(64, 64, 64, 4, 3), "tma batch 3", true, 1, true, true);
  Shape3 lin{136, 100, 72, false, true, {}};
  check(mm_graph(lin, DType::F32, Epi::None), tc_config(64, 64, 32, 4, 3), "tma tf32", true, 1, true, true);
  Shape3 deep{128, 128, 520, false, false, {}};
  for (const KernelConfig& c : {tc_config(128, 128, 64, 8, 4), tc_config(64, 64, 64, 4, 2)}) {
    check(mm_graph(deep, DType::BF16, Epi::None), c, name(deep, DType::BF16, c) + " wgmma tma", true, 1, true, true);
    if (test::kSanitized) break;  // the sanitizer build's sample: the 4-stage pipeline
  }
}

// TMA over batch dims in any order (MmaTiling::map_batch): each operand's map has a
// dim for each batch dim it steps through, with that dim's stride, whatever its order
// against the matrix's (as the attention's maps over permuted heads), and none for a
// batch dim it is broadcast over. q k^T over permuted projections ([batch, seq, heads,
// 64] seen as [batch, heads, seq, 64]: 4-D maps, heads 128 bytes apart inside rows 384
// apart), also warp-specialised; a permuted A over 3 batches times a shared B that the
// batch cannot fold into rows (A is not dense across it: a 3-D map for A, a 2-D one for
// B). The maps' dims and strides are written out here; each kernel runs on the
// simulated sm_90a against the reference.
TEST(MatmulWgmmaSim, TmaStepsThroughBatchDimsInAnyOrder) {
  auto graph = [](const std::string& params, const std::string& body) {
    Result<Graph> g = parse_graph("graph g(" + params + ") {\n" + body + "\n}\n", "g.sf");
    if (!g.ok()) throw std::runtime_error(g.error().str());
    return std::move(g).value();
  };
  struct Case {
    const char* what;
    Graph g;
    std::array<int64_t, 5> adims, bdims;
    std::array<int64_t, 4> astrides, bstrides;  // bytes
    int arank, brank;
  };
  const std::vector<Case> cases = {
      {"q k^T over permuted heads",
       graph("q: bf16[2, 72, 3, 64], k: bf16[2, 80, 3, 64]",
             "  s = matmul(permute(q, dims=[0, 2, 1, 3]), transpose(permute(k, dims=[0, 2, 1, 3]), -2, -1))\n  return s"),
       {64, 72, 3, 2, 1}, {64, 80, 3, 2, 1}, {384, 128, 72 * 384, 0}, {384, 128, 80 * 384, 0}, 4, 4},
      {"a permuted batch times a shared weight",
       graph("x: bf16[72, 3, 64], w: bf16[64, 80]", "  y = matmul(permute(x, dims=[1, 0, 2]), w)\n  return y"),
       {64, 72, 3, 1, 1}, {80, 64, 1, 1, 1}, {384, 128, 0, 0}, {160, 0, 0, 0}, 3, 2},
  };
  for (const Case& c : cases) {
    KernelSpec spec = spec_of(c.g);
    spec.tma = true;
    Result<EmittedKernel> k = emitter_for(KernelKind::Matmul).emit(spec, tc_config(64, 64, 64, 4, 2), llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << c.what << ": " << k.error().str();
    ASSERT_EQ(k->launch.tensor_maps.size(), 2u) << c.what;
    const TensorMapSpec &a = k->launch.tensor_maps[0], &b = k->launch.tensor_maps[1];
    EXPECT_EQ(a.rank, c.arank) << c.what;
    EXPECT_EQ(b.rank, c.brank) << c.what;
    EXPECT_EQ(a.dims, c.adims) << c.what;
    EXPECT_EQ(b.dims, c.bdims) << c.what;
    EXPECT_EQ(a.strides, c.astrides) << c.what;
    EXPECT_EQ(b.strides, c.bstrides) << c.what;
    check(c.g, tc_config(64, 64, 64, 4, 2), std::string(c.what) + " tma", true, 1, true, true);
  }
  check(cases[0].g, tc_config(64, 64, 64, 4, 3, 8, /*ws=*/1), "q k^T over permuted heads, ws", true, 1, true, true);
}

// Warp specialisation (warp_specialize = 1): a producer warpgroup after the consumers
// issues every copy, the stages handed over by full and empty mbarriers with no
// barrier in the loop. Every operand layout, two consumer warpgroups, a batch, and the
// long pipeline with 2, 3 and 4 stages; the memory model fails a copy into a stage an
// unretired wgmma group reads (the producer must wait for the empty phase) and a read
// before the full phase was waited for.
TEST(MatmulWgmmaSim, WarpSpecialisedProducerAndConsumers) {
  for (bool a_t : {false, true})
    for (bool b_t : {false, true}) {
      if (test::kSanitized && a_t != b_t) continue;  // the sample there: both K-major, both MN-major
      Shape3 s{136, 200, 136, a_t, b_t, {}};
      KernelConfig c = tc_config(64, 64, 64, 4, 3, 8, /*ws=*/1);
      check(mm_graph(s, DType::BF16, Epi::None), c, name(s, DType::BF16, c) + " ws", true, 1, true, true);
    }
  Shape3 batched{72, 64, 80, false, true, {3}};
  check(mm_graph(batched, DType::F16, Epi::BiasGelu), tc_config(128, 64, 64, 8, 3, 8, 1), "ws batch 3", true, 1, true, true);
  Shape3 deep{128, 128, 520, false, false, {}};
  for (const KernelConfig& c :
       {tc_config(128, 128, 64, 8, 4, 8, 1), tc_config(64, 128, 64, 4, 3, 8, 1), tc_config(64, 64, 64, 4, 2, 8, 1)}) {
    check(mm_graph(deep, DType::BF16, Epi::None), c, name(deep, DType::BF16, c) + " ws", true, 1, true, true);
    if (test::kSanitized) break;  // the sanitizer build's sample: two consumer warpgroups, 4 stages
  }
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

// Outputs that are not 16-byte aligned: the direct stores, on the plain and the
// warp-specialised kernel (whose producer warpgroup still passes the epilogue).
TEST(MatmulWgmmaSim, MisalignedOutputsTakeTheDirectStores) {
  Shape3 s{72, 100, 128, false, true, {}};
  for (int ws : {0, 1}) {
    KernelConfig c = tc_config(64, 64, 64, 4, 3, 8, ws);
    check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " shifted ws " + std::to_string(ws), true, 1,
          true, true, 4);
  }
}

// The persistent warp-specialised kernel stages its epilogue in chunks of 64 columns
// through an area of each consumer warp's own (the producer is refilling the
// pipeline's shared memory meanwhile): 128-wide tiles take two chunks, the last
// column tile's second chunk is cut by N = 200, the last row tile by M = 136, and
// outputs shifted off 16-byte alignment store each chunk element by element. A chunk
// written at the wrong columns, rows or padding fails the comparison.
TEST(MatmulWgmmaSim, PersistentConsumersStageTheEpilogueInChunks) {
  Shape3 s{136, 200, 192, false, true, {}};
  for (size_t shift : {size_t{0}, size_t{4}}) {
    KernelConfig c = tc_config(64, 128, 64, 4, 3, 8, /*ws=*/1);
    c.persistent = 3;
    check(mm_graph(s, DType::BF16, Epi::BiasGelu), c,
          name(s, DType::BF16, c) + " chunks, outputs shifted " + std::to_string(shift), true, 1, true, true, shift);
  }
}

// A persistent kernel strides its work items by the launch's blocks (%nctaid.x), not
// by the count its config was compiled with: launched 1, 2, 5 (as compiled) or 13
// blocks wide (more than its 12 items), cooperative and ping-pong, it computes every
// item once. A runtime may then launch fewer blocks on a device that holds fewer.
TEST(MatmulWgmmaSim, PersistentKernelCoversItsItemsOnAnyGrid) {
  Shape3 s{136, 100, 320, false, true, {2}};  // 3 x 2 tiles of 64 x 64, batch 2: 12 items
  Graph g = mm_graph(s, DType::BF16, Epi::BiasGelu);
  std::vector<Tensor> in = make_inputs(g, 1);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  for (int pp : {0, 1}) {
    KernelConfig c = tc_config(64, 64, 64, pp ? 8 : 4, 3, 8, /*ws=*/1);
    c.persistent = 5;
    c.pingpong = pp;
    for (int64_t grid : {1, 2, 5, 13}) {
      if (test::kSanitized && grid != 2) continue;  // the sanitizer build's sample
      const std::string what = (pp ? "ping-pong" : "cooperative") + std::string(" on ") + std::to_string(grid) + " blocks";
      std::string hw_error;
      Result<std::vector<Tensor>> got = run_tc(g, in, c, &hw_error, false, nullptr, true, nullptr, true, nullptr, false, 0,
                                               nullptr, grid);
      ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
      EXPECT_EQ(hw_error, "") << what;
      Comparison cmp = compare((*got)[0], (*want)[0], default_tolerance(DType::BF16));
      EXPECT_TRUE(cmp.ok()) << what << ": " << cmp.mismatches << " mismatches";
    }
  }
}

// The persistent grid on the warpgroup kernel: TMA plain (every thread walks the items,
// mbarrier phases carried over: 5 K tiles a item over 3 stages) and warp-specialised
// (the producer runs ahead into the next item; the consumers release the last tile's
// stage too, or the producer would wait for it forever), cp.async, a batch, K = 0
// (the epilogue alone, item after item).
TEST(MatmulWgmmaSim, PersistentGridCarriesThePipelineAcrossTiles) {
  Shape3 s{136, 100, 320, false, true, {2}};
  for (int ws : {0, 1}) {
    KernelConfig c = tc_config(64, 64, 64, 4, 3, 8, ws);
    c.persistent = 3;
    check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " persistent tma ws " + std::to_string(ws),
          true, 1, true, true);
  }
  KernelConfig c = tc_config(64, 64, 64, 4, 4);
  c.persistent = 5;
  check(mm_graph(s, DType::F16, Epi::None), c, name(s, DType::F16, c) + " persistent cp.async", true, 1, true);
  Shape3 empty{136, 64, 0, false, true, {}};
  KernelConfig e = tc_config(64, 64, 64, 4, 3);
  e.persistent = 1;
  check(mm_graph(empty, DType::BF16, Epi::BiasGelu), e, "persistent K = 0", /*loads=*/false, 1, true);
}

// Ping-pong (pingpong = 1: warp-specialised, persistent, two consumer warpgroups):
// each consumer warpgroup multiplies whole tiles, the block's items taken in turn and
// their K loops ordered by named barriers. Blocks with an even and an odd number of
// items (5 K tiles an item over 3 stages, so the stages' phases wrap mid-item), blocks
// whose second warpgroup has no item at all, two m64 steps per warpgroup (128 rows
// each), and one block walking four items. The memory model fails a read before its copy's full
// phase was waited for, which a warpgroup running ahead of its turn would do (its
// parity wait two phases back passes at once); and a missing or extra arrival
// deadlocks, which the simulation reports.
TEST(MatmulWgmmaSim, PingPongConsumersTakeTilesInTurn) {
  Shape3 s{136, 100, 320, false, true, {2}};  // 3 x 2 tiles of 64 x 64, batch 2: 12 items
  // 5 blocks: 3, 3, 2, 2, 2 items (odd and even counts per warpgroup); 12: one item a
  // block, the second warpgroup idle. The deep case below has 4 items in one block.
  for (int grid : {5, 12}) {
    KernelConfig c = tc_config(64, 64, 64, 8, 3, 8, /*ws=*/1);
    c.persistent = grid;
    c.pingpong = 1;
    check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " pingpong grid " + std::to_string(grid),
          true, 1, true, true);
  }
  KernelConfig tall = tc_config(128, 64, 64, 8, 3, 8, 1);
  tall.persistent = 2;
  tall.pingpong = 1;
  check(mm_graph(s, DType::F16, Epi::Residual), tall, name(s, DType::F16, tall) + " pingpong 128 rows", true, 1, true, true);
  if (test::kSanitized) return;  // the sanitizer build's sample: grid 5 walks several items a block too
  Shape3 deep{128, 256, 320, false, false, {}};  // 4 items of 5 K tiles over 4 stages, one block
  KernelConfig d = tc_config(64, 128, 64, 8, 4, 8, 1);
  d.persistent = 1;
  d.pingpong = 1;
  check(mm_graph(deep, DType::BF16, Epi::None), d, name(deep, DType::BF16, d) + " pingpong deep", true, 1, true, true);
}

// The 128 x 256 persistent warp-specialised kernel's epilogue in PTX: 4 chunks of 64
// columns, each staged (the 16 pairs a thread holds in it, one 4-byte shared store
// each), met at its warp's barrier, written back with 4 128-bit stores a thread and met
// again; the areas (8 warps x 16 rows of 128 bytes, each padded by 16) past the
// pipeline and its mbarriers; no spill at the launch's 168 registers.
TEST(MatmulWgmmaNvptx, PersistentEpilogueStagesInChunks) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = tc_config(128, 256, 64, 8, 4, 8, /*ws=*/1);
  c.persistent = 132;
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  // (The whole text: LLVM lays the item loop's last block out before the K loop.)
  EXPECT_EQ(count(p.text, "st.shared.b32"), 64);
  EXPECT_EQ(count(p.text, "bar.sync %r"), 8) << "two warp barriers a chunk";
  EXPECT_EQ(count(p.text, "st.global.v4"), 16);
  EXPECT_EQ(count(p.text, "ld.shared.v4"), 16);
  const int64_t pipeline = 4 * (128 + 256) * 64 * 2 + 4 * 16;  // stages, then full and empty mbarriers
  EXPECT_EQ(p.launch.shared_bytes, (pipeline + 127) / 128 * 128 + 8 * 16 * (128 + 16));
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills());
  }
}

// "built", or why the wgmma + TMA kernel of a 128 x 128 x 128 bf16 matmul refuses `c`.
std::string refused(const KernelConfig& c) {
  KernelSpec spec = tf32_spec(mm_graph({128, 128, 128, false, true, {}}, DType::BF16, Epi::None));
  spec.tma = true;
  Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, c, /*wgmma=*/true);
  return k.ok() ? std::string("built") : k.error().message;
}

// What ping-pong needs, refused with the reason.
TEST(MatmulWgmmaSim, PingPongRefusesWhatItCannotRun) {
  KernelConfig c = tc_config(64, 128, 64, 8, 3, 8, 1);
  c.persistent = 4;
  c.pingpong = 1;
  EXPECT_EQ(refused(c), "built");
  KernelConfig no_ws = c;
  no_ws.warp_specialize = 0;
  EXPECT_NE(refused(no_ws).find("pingpong = 1 needs warp_specialize = 1"), std::string::npos) << refused(no_ws);
  KernelConfig no_pers = c;
  no_pers.persistent = 0;
  EXPECT_NE(refused(no_pers).find("pingpong = 1 needs a persistent grid"), std::string::npos) << refused(no_pers);
  KernelConfig one_wg = c;
  one_wg.warps = 4;
  EXPECT_NE(refused(one_wg).find("pingpong = 1 needs two consumer warpgroups"), std::string::npos) << refused(one_wg);
  KernelConfig wide = c;
  wide.block_m = 128;
  wide.block_n = 256;  // 2 x 128 accumulators a thread when one warpgroup holds the tile
  EXPECT_NE(refused(wide).find("256 accumulators"), std::string::npos) << refused(wide);
  KernelConfig two = c;
  two.pingpong = 2;
  EXPECT_NE(refused(two).find("pingpong = 2 is not 0 or 1"), std::string::npos) << refused(two);
}

// Register reallocation (setmaxnreg = the consumers' registers): the producer
// warpgroup gives up registers (setmaxnreg.dec) and both consumer warpgroups take
// them (.inc) before anything else, on the cooperative and the ping-pong schedule,
// and with split-K through the workspace; the epilogue takes 4 n8 tiles
// a batch (8 of them a fragment row here, N ragged). The simulation fails a warpgroup
// whose warps do not all execute the same setmaxnreg and counts that do not add up
// to the launch's 168 a thread (Block::check_registers).
TEST(MatmulWgmmaSim, RegisterReallocationSharesTheLaunchRegisters) {
  Shape3 s{136, 100, 320, false, true, {2}};
  KernelConfig c = tc_config(128, 64, 64, 8, 3, 8, /*ws=*/1);
  c.persistent = 3;
  c.setmaxnreg = 232;
  check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " setmaxnreg 232", true, 1, true, true);
  KernelConfig pp = tc_config(64, 64, 64, 8, 3, 8, 1);
  pp.persistent = 5;
  pp.pingpong = 1;
  pp.setmaxnreg = 240;
  check(mm_graph(s, DType::F16, Epi::Residual), pp, name(s, DType::F16, pp) + " pingpong setmaxnreg 240", true, 1, true, true);
  if (test::kSanitized) return;
  Shape3 s4{136, 100, 256, false, true, {2}};  // 4 K tiles, 2 a share
  KernelConfig sk = c;
  sk.split_k = 2;
  check(mm_graph(s4, DType::BF16, Epi::BiasGelu), sk, name(s4, DType::BF16, sk) + " setmaxnreg split-K", true, 1, true, true);
}

// What register reallocation needs, refused with the reason; and the simulation's
// check of it, on hand-made records.
TEST(MatmulWgmmaSim, RegisterReallocationRefusesWhatItCannotRun) {
  KernelConfig c = tc_config(128, 128, 64, 8, 3, 8, 1);
  c.persistent = 4;
  c.setmaxnreg = 232;
  EXPECT_EQ(refused(c), "built");
  KernelConfig no_ws = c;
  no_ws.warp_specialize = 0;
  EXPECT_NE(refused(no_ws).find("setmaxnreg = 232 needs warp_specialize = 1"), std::string::npos) << refused(no_ws);
  KernelConfig no_pers = c;
  no_pers.persistent = 0;
  EXPECT_NE(refused(no_pers).find("setmaxnreg = 232 needs a persistent grid"), std::string::npos) << refused(no_pers);
  KernelConfig one_wg = c;
  one_wg.warps = 4;
  one_wg.block_m = 64;
  EXPECT_NE(refused(one_wg).find("needs two consumer warpgroups"), std::string::npos) << refused(one_wg);
  for (int bad : {168, 236, 248, -8}) {
    KernelConfig b = c;
    b.setmaxnreg = bad;
    EXPECT_NE(refused(b).find("is not a multiple of 8 in 176..240"), std::string::npos) << bad << ": " << refused(b);
  }

  auto verdict = [](const std::function<void(Block&)>& record) {
    Block blk(384, 1024);
    record(blk);
    blk.check_registers();
    return blk.error;
  };
  auto wg = [](Block& b, int g, int count, int inc, int skip = -1) {
    for (int t = 128 * g; t < 128 * (g + 1); ++t)
      if (t != skip) b.setmaxnreg[t].emplace_back(count, inc);
  };
  EXPECT_EQ(verdict([&](Block& b) {
              wg(b, 0, 232, 1);
              wg(b, 1, 232, 1);
              wg(b, 2, 40, 0);
            }),
            "");
  EXPECT_NE(verdict([&](Block& b) {  // the producer's lead thread alone gives up registers
              wg(b, 0, 232, 1);
              wg(b, 1, 232, 1);
              b.setmaxnreg[256].emplace_back(40, 0);
            }).find("did not execute what thread"),
            std::string::npos);
  EXPECT_NE(verdict([&](Block& b) {  // one warp of the producer skips it
              wg(b, 0, 232, 1);
              wg(b, 1, 232, 1);
              wg(b, 2, 40, 0, /*skip=*/300);
            }).find("thread 300 of warpgroup 2"),
            std::string::npos);
  EXPECT_NE(verdict([&](Block& b) {  // 232 + 232 + 24 leaves 16 a thread unused
              wg(b, 0, 232, 1);
              wg(b, 1, 232, 1);
              wg(b, 2, 24, 0);
            }).find("488 registers a thread between them, not the 504"),
            std::string::npos);
  EXPECT_NE(verdict([&](Block& b) { wg(b, 0, 160, 1); }).find("setmaxnreg.inc 160 from the launch's 168"), std::string::npos);
}

// Register reallocation (setmaxnreg = 232) on the tuned 128 x 256 cooperative kernel
// and the 128 x 128 ping-pong one: .minnctapersm 1 beside .maxntid 384, so ptxas
// gives every thread the launch's 168 registers (without it ptxas drops setmaxnreg,
// C7508: RunPtxas.NotesSaySetmaxnregWasIgnored); the producer warpgroup's one
// setmaxnreg.dec to 40 before its copies, the consumers' one .inc to 232 before
// their products; no spills and no ptxas note. The consumers' epilogue then takes 4 n8
// tiles a batch: 16 bias loads ahead of the first store (8 at 168 registers), 64 in
// all. The config text and explain say so.
TEST(MatmulWgmmaNvptx, RegisterReallocation) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  for (auto [bm, bn, pp] : {std::tuple{128, 256, 0}, std::tuple{128, 128, 1}}) {
    if (test::kSanitized && pp) continue;  // the sanitizer build's sample: one kernel (ptxas is most of it)
    const std::string what = std::to_string(bm) + "x" + std::to_string(bn) + (pp ? " ping-pong" : "");
    KernelConfig c = tc_config(bm, bn, 64, 8, 4, 8, /*ws=*/1);
    c.persistent = 132;
    c.pingpong = pp;
    c.setmaxnreg = 232;
    Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
    EXPECT_EQ(p.launch.block[0], 384) << what;
    EXPECT_EQ(count(p.text, ".maxntid 384, 1, 1"), 1) << what;
    EXPECT_EQ(count(p.text, ".minnctapersm 1"), 1) << what;
    EXPECT_EQ(count(p.text, "setmaxnreg"), 2) << what;
    const size_t dec = p.text.find("setmaxnreg.dec.sync.aligned.u32 40;");
    const size_t inc = p.text.find("setmaxnreg.inc.sync.aligned.u32 232;");
    ASSERT_NE(dec, std::string::npos) << what;
    ASSERT_NE(inc, std::string::npos) << what;
    EXPECT_LT(dec, p.text.find("cp.async.bulk.tensor")) << what << ": the producer gives up registers before its copies";
    EXPECT_LT(inc, p.text.find("wgmma.mma_async")) << what << ": the consumers take them before their products";
    if (!pp) {
      const std::string tail = p.text.substr(p.text.find("wgmma.wait_group.sync.aligned 0;"));
      EXPECT_EQ(count(tail, "ld.global"), 64) << "one bias load per column a thread holds";
      EXPECT_EQ(count(tail.substr(0, tail.find("st.global")), "ld.global"), 16) << "two batches of 4 n8 tiles";
    }
    if (have_ptxas()) {
      Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
      ASSERT_TRUE(r.ok()) << r.error().str();
      EXPECT_FALSE((*r)[0].spills()) << what;
      EXPECT_EQ((*r)[0].registers, 168) << what;
      EXPECT_TRUE((*r)[0].notes.empty()) << what << ": " << (*r)[0].notes[0];
    }
  }
  KernelConfig c = tc_config(128, 256, 64, 8, 4, 8, 1);
  c.persistent = 132;
  Ptx plain = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  EXPECT_EQ(count(plain.text, "setmaxnreg"), 0);
  EXPECT_EQ(count(plain.text, ".minnctapersm"), 0);
  c.setmaxnreg = 232;
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=128 block_n=256 block_k=64 warps=8 stages=4 group_m=8 split_k=1 warp_specialize=1 persistent=132 "
            "setmaxnreg=232");
  Result<MatmulPath> path = tma_path(g, c);
  ASSERT_TRUE(path.ok());
  EXPECT_TRUE(path->tensor_cores);
  EXPECT_NE(path->why.find("registers reallocated: the consumer warpgroups take 232 a thread"), std::string::npos)
      << path->why;
  c.persistent = 0;
  path = tma_path(g, c);
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->tensor_cores);
  EXPECT_NE(path->why.find("setmaxnreg = 232 needs a persistent grid"), std::string::npos) << path->why;
}

// TF32 wgmma (m64nNk8): both operands K-major (x @ transpose(w)), 32-wide k panels.
TEST(MatmulWgmmaSim, Tf32KMajorMatchesTheReference) {
  Shape3 s{136, 100, 72, false, true, {}};
  for (const KernelConfig& c : {tc_config(64, 64, 32, 4, 2), tc_config(128, 128, 64, 8, 3)})
    check(mm_graph(s, DType::F32, Epi::None), c, name(s, DType::F32, c) + " tf32 wgmma", true, 1, true);
}

// Split-K on the warpgroup kernel (TF32, K-major operands): each z block's TMA copies
// start at its share of K, plain and warp-specialised, and the partial sums add up.
TEST(MatmulWgmmaSim, Tf32SplitKWithTma) {
  Shape3 s{72, 100, 256, false, true, {}};
  for (int ws : {0, 1}) {
    KernelConfig c = tc_config(64, 64, 32, 4, 3, 8, ws);
    c.split_k = 2;
    check(mm_graph(s, DType::F32, Epi::None), c, name(s, DType::F32, c) + " tf32 split_k 2 tma", true, 1, true, true);
  }
  KernelConfig c = tc_config(64, 64, 32, 4, 2);
  c.split_k = 4;
  check(mm_graph(s, DType::F32, Epi::None), c, name(s, DType::F32, c) + " tf32 split_k 4 cp.async", true, 1, true);
}

// Split-K of a 16-bit group on the warpgroup kernel, through the f32 workspace: TMA
// plain and warp-specialised (the producer warpgroup meets the arrival's barriers),
// warp-specialised on a persistent grid (the consumers alone meet, on named barrier
// 3, while the producer issues the next item's copies), and cp.async.
TEST(MatmulWgmmaSim, SixteenBitSplitKSumsInTheWorkspace) {
  Shape3 s{72, 100, 256, false, true, {}};
  for (int ws : {0, 1}) {
    KernelConfig c = tc_config(64, 64, 64, 4, 3, 8, ws);
    c.split_k = 2;
    check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " split_k 2 tma ws " + std::to_string(ws),
          true, 1, true, true);
  }
  KernelConfig p = tc_config(64, 64, 64, 4, 3, 8, 1);
  p.split_k = 2;
  p.persistent = 3;
  check(mm_graph(s, DType::F16, Epi::RawAndBiasRelu), p, name(s, DType::F16, p) + " split_k 2 persistent ws", true, 1,
        true, true);
  KernelConfig c = tc_config(64, 64, 64, 4, 2);
  c.split_k = 4;
  check(mm_graph(s, DType::BF16, Epi::Residual), c, name(s, DType::BF16, c) + " split_k 4 cp.async", true, 1, true);
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

}  // namespace kernels_matmul_wgmma_test
}  // namespace sf
