// The tensor-core matmul kernel (codegen/kernels/matmul_mma.cpp), no GPU needed:
//   - the mma.sync kernel, built for the host (emit_matmul_mma_block_on_host), runs every
//     block with one OS thread per GPU thread; its ldmatrix and mma calls go to a warp
//     simulation written from the PTX ISA's figures (mma_sim.h, ptx_isa_tables.h), not
//     from mma_layout.h, and its results must match the float64 reference evaluator. A
//     wrong ldmatrix address, swizzle, fragment order, copy or epilogue index fails here;
//   - ldmatrix addresses must be 16-byte rows inside the block's shared memory, all 32
//     lanes must reach every warp-collective call together, shared memory starts as
//     NaN, and the memory model fails a read of copied data before its wait and barrier;
//   - the NVPTX kernels: mma.sync, ldmatrix and cp.async.cg for sm_80 and sm_90, wgmma
//     (with cp.async or TMA) for sm_90a, TF32 under --allow-tf32, no FMA left in a bare
//     16-bit matmul, ptxas accepts them without spills;
//   - matmul_path says which kernel a matmul gets and why.
// The warpgroup kernel's simulations are in matmul_wgmma_test.cpp.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/kernels/mma_ptx.h"
#include "tests/kernels/matmul_sim.h"
#include "tests/sanitized.h"

namespace sf {
namespace kernels_matmul_mma_test {

using namespace mma_sim;
using kernel_test::assemble;
using kernel_test::have_ptxas;

// ---- the kernel on the host ------------------------------------------------------------------

// Every operand layout the kernel stages (A m- or k-contiguous, B n- or k-contiguous),
// both 16-bit dtypes, ragged M, N and K (partial tiles, a partial last K tile), and
// tiles whose contiguous sides are 32 (64-byte rows) and 64 (128-byte rows) wide.
TEST(MatmulMmaSim, EveryOperandLayoutMatchesTheReference) {
  for (int d = 0; d < 2; ++d)
    for (int a_t = 0; a_t < 2; ++a_t)
      for (int b_t = 0; b_t < 2; ++b_t) {
        const DType dt = d ? DType::F16 : DType::BF16;
        Shape3 s{40, 48, 88, a_t != 0, b_t != 0, {}};
        const KernelConfig configs[] = {tc_config(32, 32, 32, 2, 2), tc_config(64, 32, 64, 4, 3)};
        // The sanitizer build's sample: each layout with each dtype and each config once.
        for (int k = 0; k < 2; ++k)
          if (test::in_sample(static_cast<size_t>(d + a_t + b_t + k)))
            check(mm_graph(s, dt, Epi::None), configs[k], name(s, dt, configs[k]));
      }
}

// More warps than one per 16 rows, 128-wide panels split in two, four stages, a
// GROUP_M swizzle over several block rows.
TEST(MatmulMmaSim, WiderTilesAndDeeperPipelines) {
  Shape3 s{96, 136, 160, false, false, {}};
  const KernelConfig configs[] = {tc_config(64, 128, 32, 4, 4, 2), tc_config(32, 64, 32, 1, 2, 1),
                                  tc_config(128, 64, 32, 8, 3)};
  for (size_t k = 0; k < 3; ++k)
    if (test::in_sample(k, 3))  // the sanitizer build runs the first (tests/sanitized.h)
      check(mm_graph(s, DType::BF16, Epi::None), configs[k], name(s, DType::BF16, configs[k]));
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

// The epilogue stages each warp's outputs in shared memory and stores them 16 bytes at
// a time where every output pointer is 16-byte aligned (all tests above); outputs that
// start 4 or 2 bytes past such a boundary take the direct stores (pairs, or single
// elements), the same numbers.
TEST(MatmulMmaSim, MisalignedOutputsTakeTheDirectStores) {
  Shape3 s{48, 72, 64, false, true, {}};
  KernelConfig c = tc_config(32, 64, 32, 4, 2);
  for (size_t shift : {4, 2})
    for (Epi e : {Epi::None, Epi::RawAndBiasRelu})
      check(mm_graph(s, DType::BF16, e), c, name(s, DType::BF16, c) + " outputs shifted " + std::to_string(shift), true, 1,
            false, false, shift);
}

// A persistent grid (persistent = blocks): each block walks output tiles and batches a
// grid apart, the cp.async pipeline's stages running on from item to item, with the
// staged epilogue between. 3 blocks for 12 items (3 x 2 tiles x 2 batches), 5 K tiles
// per item over 3 stages (items start mid-cycle). (A grid larger than the work is one
// block per item: Sm90aPersistentKernel checks its launch.)
TEST(MatmulMmaSim, PersistentGridWalksEveryTile) {
  Shape3 s{72, 100, 160, false, true, {2}};
  KernelConfig c = tc_config(32, 64, 32, 4, 3);
  c.persistent = 3;
  check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " persistent 3");
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
      check(mm_graph(s, DType::F32, Epi::None), tc_config(32, 32, 16, 2, 2),
            name(s, DType::F32, tc_config(32, 32, 16, 2, 2)) + " tf32");
      if (a_t == b_t)  // both by ldmatrix, or both one element per register, on a deeper tile
        check(mm_graph(s, DType::F32, Epi::None), tc_config(64, 32, 32, 4, 3),
              name(s, DType::F32, tc_config(64, 32, 32, 4, 3)) + " tf32");
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

// Split-K on the tensor cores (a bare TF32 matmul): grid z splits the K tiles, and each
// block adds its partial sums into the zeroed output with f32 atomics. Ragged M and N,
// both B layouts, 2 and 4 splits. A block that summed the wrong share of K (the first
// one for every z), or stored instead of adding, misses the reference.
TEST(MatmulMmaSim, Tf32SplitKAddsEveryShare) {
  for (bool b_t : {false, true}) {
    Shape3 s{40, 48, 128, false, b_t, {}};
    for (int split : {2, 4}) {
      // The sanitizer build's sample: each layout and each split once.
      if (!test::in_sample(static_cast<size_t>(b_t) + static_cast<size_t>(split / 2))) continue;
      KernelConfig c = tc_config(32, 32, 16, 2, 2);
      c.split_k = split;
      check(mm_graph(s, DType::F32, Epi::None), c, name(s, DType::F32, c) + " tf32 split_k " + std::to_string(split));
    }
  }
  Shape3 b{32, 40, 64, false, true, {2}};
  KernelConfig c = tc_config(32, 32, 16, 2, 3);
  c.split_k = 2;
  check(mm_graph(b, DType::F32, Epi::None), c, "tf32 split_k 2 batch 2");
}

// Split-K of a 16-bit matmul with its epilogue: every block adds its partial sums into the f32 workspace and counts itself in,
// and the tile's last block to arrive (a different z from tile to tile: run_tc
// rotates the order) reads the sums back and runs the epilogue, staged or direct.
// A block that stored its own partial, an epilogue run by the wrong block, or one
// run twice (two outputs: the raw product too) misses the reference.
TEST(MatmulMmaSim, SixteenBitSplitKSumsInAWorkspaceAndTheLastBlockRunsTheEpilogue) {
  struct Case {
    Shape3 s;
    DType dt;
    Epi e;
    KernelConfig c;
    int split;
  };
  const Case cases[] = {
      {{40, 48, 128, false, true, {}}, DType::BF16, Epi::BiasGelu, tc_config(32, 32, 32, 2, 2), 2},
      {{40, 48, 128, false, false, {}}, DType::F16, Epi::RawAndBiasRelu, tc_config(32, 32, 32, 2, 2), 4},
      {{48, 72, 256, false, true, {}}, DType::BF16, Epi::Residual, tc_config(32, 64, 32, 4, 2), 4},  // staged stores
      {{40, 45, 128, true, true, {}}, DType::BF16, Epi::None, tc_config(32, 32, 32, 2, 2), 2},      // odd N: direct
      {{32, 40, 64, false, true, {2}}, DType::F16, Epi::BiasGelu, tc_config(32, 32, 32, 2, 3), 2},  // a batch
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    if (!test::in_sample(i, 3)) continue;
    const Case& k = cases[i];
    KernelConfig c = k.c;
    c.split_k = k.split;
    check(mm_graph(k.s, k.dt, k.e), c,
          name(k.s, k.dt, c) + " split_k " + std::to_string(k.split) + " epilogue " + std::to_string(static_cast<int>(k.e)));
  }
}

// A persistent grid with split-K in the workspace: each block walks its items (3
// blocks for 6 tiles, 2 each, per split), every item's last block runs that item's
// epilogue.
TEST(MatmulMmaSim, SplitKOnAPersistentGrid) {
  Shape3 s{72, 100, 128, false, true, {}};
  KernelConfig c = tc_config(32, 64, 32, 4, 3);
  c.persistent = 3;
  c.split_k = 2;
  check(mm_graph(s, DType::BF16, Epi::BiasGelu), c, name(s, DType::BF16, c) + " persistent 3 split_k 2");
}

// ---- NVPTX ------------------------------------------------------------------------------------

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

// Split-K TF32 on sm_80 and on sm_90a's wgmma + TMA kernel: grid z = split_k, a
// zeroed output, tensor-core multiplies, and the partial sums added by f32 atomics
// (red.global.add.f32), no plain store of the result.
TEST(MatmulMmaNvptx, Tf32SplitKAddsPartialSums) {
  Graph lin = mm_graph({256, 512, 4096, false, true, {}}, DType::F32, Epi::None);
  struct Case {
    const char* arch;
    KernelConfig c;
    const char* mma;
  };
  KernelConfig c80 = tc_config(128, 128, 32, 4, 3);
  c80.split_k = 4;
  KernelConfig c90 = tc_config(128, 128, 64, 8, 3);
  c90.split_k = 4;
  for (const Case& k : {Case{"sm_80", c80, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"},
                        Case{"sm_90a", c90, "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"}}) {
    Ptx p = emit_ptx(lin, k.c, k.arch, /*allow_tf32=*/true, /*tma=*/true);
    EXPECT_EQ(p.launch.grid[2], 4) << k.arch;
    EXPECT_TRUE(p.launch.zero_outputs) << k.arch;
    EXPECT_GT(count(p.text, k.mma), 0) << k.arch;
    EXPECT_GT(count(p.text, "%ctaid.z"), 0) << k.arch;
    EXPECT_GT(count(p.text, "red.global.add.f32") + count(p.text, "atom.global.add.f32"), 0) << k.arch;
    EXPECT_EQ(count(p.text, "st.global.f32"), 0) << k.arch;
    EXPECT_EQ(count(p.text, "fma.rn.f32"), 0) << k.arch;
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

// Warp specialisation on sm_90a: 8 consumer warps and a producer warpgroup (384
// threads); full and empty mbarriers per stage (8 inits for 4 stages); no bar.sync
// in the K loop; consumers release a stage with
// mbarrier.arrive; the copies are issued by the producer's loop alone. The config
// text says warp_specialize=1 (and leaves it out at 0, as older caches wrote it).
TEST(MatmulMmaNvptx, Sm90aWarpSpecialisedKernel) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = tc_config(128, 256, 64, 8, 4, 8, /*ws=*/1);
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  EXPECT_EQ(p.launch.block[0], 384);
  EXPECT_EQ(p.launch.shared_bytes, 4 * (128 * 64 + 64 * 256) * 2 + 4 * 16);
  EXPECT_EQ(count(p.text, "mbarrier.init.shared::cta.b64"), 8);
  // One bar.sync after the mbarriers' initialisation, two around the staged epilogue
  // (the producer's threads meet them too), none in the K loop.
  EXPECT_EQ(count(p.text, "bar.sync"), 3);
  EXPECT_EQ(count(p.text, "mbarrier.arrive.shared::cta.b64"), 1);
  // The producer's loop (LLVM may lay its body out twice): one panel of x and one of
  // transpose(w) per armed stage.
  const int armed = count(p.text, "mbarrier.arrive.expect_tx.shared::cta.b64");
  EXPECT_GE(armed, 1);
  EXPECT_EQ(count(p.text, "cp.async.bulk.tensor.2d"), 2 * armed);
  EXPECT_EQ(count(p.text, "wgmma.mma_async"), 4);
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=128 block_n=256 block_k=64 warps=8 stages=4 group_m=8 split_k=1 warp_specialize=1");
  c.warp_specialize = 0;
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=128 block_n=256 block_k=64 warps=8 stages=4 group_m=8 split_k=1");
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills());
  }
  // Without TMA there is no producer to hand the copies to.
  Result<MatmulPath> path = matmul_path(spec_of(g), tc_config(128, 256, 64, 8, 4, 8, 1), "sm_90a");
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->wgmma) << path->why;
  EXPECT_NE(path->why.find("warp_specialize = 1 needs the sm_90a wgmma kernel fed by TMA"), std::string::npos) << path->why;
  path = tma_path(g, tc_config(128, 256, 64, 8, 4, 8, 1));
  ASSERT_TRUE(path.ok());
  EXPECT_NE(path->why.find("warp-specialised"), std::string::npos) << path->why;
}

// The staged epilogue in PTX: fragment pairs into shared memory (st.shared.b32 for
// bf16), read back 16 bytes a lane (ld.shared.v4) and stored 128 bits at a time
// (st.global.v4), on sm_80's and sm_90a's default kernels for the bench GEMM + bias +
// GELU. N = 4099 (rows that are not whole 16-byte chunks) keeps the direct stores
// only.
TEST(MatmulMmaNvptx, EpilogueStoresThroughSharedMemory) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    Ptx p = emit_ptx(g, suggest_matmul_config(spec_of(g), KernelConfig{}, arch), arch, false, /*tma=*/true);
    EXPECT_GT(count(p.text, "st.shared.b32"), 0) << arch;
    EXPECT_GT(count(p.text, "ld.shared.v4.u32"), 0) << arch;
    EXPECT_GT(count(p.text, "st.global.v4.u32"), 0) << arch;
    EXPECT_GT(count(p.text, "st.global.b32"), 0) << arch << ": the direct pair stores, for misaligned outputs";
  }
  Graph odd = mm_graph({256, 4099, 256, false, true, {}}, DType::BF16, Epi::BiasGelu);
  Ptx p = emit_ptx(odd, tc_config(128, 128, 32, 4, 3), "sm_80");
  EXPECT_EQ(count(p.text, "st.global.v4"), 0);
  EXPECT_GT(count(p.text, "st.global.b16"), 0);
}

// The persistent warp-specialised sm_90a kernel (persistent = 132, an H100's SMs): a
// grid of 132 blocks for 512 tiles, the batch folded into the items; the producer's
// copies loop over items and K tiles; no block-wide bar.sync but the one after the
// mbarriers' initialisation, the epilogue staged in chunks of 64 columns through each
// warp's own area (the producer refills the pipeline's shared memory meanwhile), its
// lanes meeting on the warp's named barrier twice a chunk; no spills. The config text says persistent=132 (and leaves it out at 0),
// explain says so, and more than 65535 blocks are refused.
TEST(MatmulMmaNvptx, Sm90aPersistentKernel) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = tc_config(128, 256, 64, 8, 4, 8, /*ws=*/1);
  c.persistent = 132;
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  EXPECT_EQ(p.launch.grid[0], 132);
  EXPECT_EQ(p.launch.grid[1], 1);
  EXPECT_EQ(p.launch.block[0], 384);
  EXPECT_EQ(count(p.text, "bar.sync \t0;"), 1);
  EXPECT_EQ(count(p.text, "bar.sync %r"), 8);
  EXPECT_EQ(count(p.text, "st.global.v4"), 16);
  EXPECT_GT(count(p.text, "cp.async.bulk.tensor.2d"), 0);
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=128 block_n=256 block_k=64 warps=8 stages=4 group_m=8 split_k=1 warp_specialize=1 persistent=132");
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_FALSE((*r)[0].spills());
  }
  Result<MatmulPath> path = tma_path(g, c);
  ASSERT_TRUE(path.ok());
  EXPECT_NE(path->why.find("persistent: 132 blocks"), std::string::npos) << path->why;
  EXPECT_NE(path->why.find("epilogue staged through each consumer warp's own shared memory 64 columns at a time"),
            std::string::npos)
      << path->why;
  // Without warp specialisation every thread walks the items, staging each epilogue.
  c.warp_specialize = 0;
  Ptx q = emit_ptx(g, c, "sm_90a", false, true);
  EXPECT_EQ(q.launch.grid[0], 132);
  EXPECT_GT(count(q.text, "st.global.v4"), 0);
  // A small batched matmul: fewer items than blocks, one block each.
  Graph small = mm_graph({128, 256, 256, false, true, {3}}, DType::BF16, Epi::None);
  EXPECT_EQ(emit_ptx(small, c, "sm_90a", false, true).launch.grid[0], 3);
  c.persistent = 70000;
  path = tma_path(g, c);
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->tensor_cores);
  EXPECT_NE(path->why.find("persistent = 70000"), std::string::npos) << path->why;
}

// The epilogue's pairs in batches at clamped coordinates (matmul_mma_epilogue.cpp,
// batched_pairs), seen in the persistent warp-specialised kernel's bias + GELU: a
// thread holds 64 columns of its 128 x 256 tile (32 n8 tiles, two columns each, in
// two fragment rows) and loads each column's bias once (the two rows' pairs share the
// load: 128 loads before), and the second batch's loads (2 n8 tiles x 2 columns) come
// before the first batch's stores, which they could not pass. N = 4100 does not fill
// whole 16-byte chunks, so the kernel stores directly; at N = 4096 it stages in chunks,
// the first batch's shared stores after the second batch's loads likewise. No spills
// at the 384-thread block's 168 registers. The default kernel's staged path and its
// direct fallback each load a column once too: 128 in all (256 before).
TEST(MatmulMmaNvptx, DirectEpilogueLoadsEachBiasOnceAheadOfTheStores) {
  KernelConfig c = tc_config(128, 256, 64, 8, 4, 8, /*ws=*/1);
  c.persistent = 132;
  for (int64_t n : {4100, 4096}) {
    Graph g = mm_graph({4096, n, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
    Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
    const size_t epi = p.text.find("wgmma.wait_group.sync.aligned 0;");
    ASSERT_NE(epi, std::string::npos);
    const std::string tail = p.text.substr(epi);
    EXPECT_EQ(count(p.text, "ld.global"), 64) << n << ": one bias load per column a thread holds";
    EXPECT_EQ(count(tail, "ld.global"), 64) << n;
    EXPECT_EQ(count(p.text, "st.shared"), n == 4096 ? 64 : 0) << n;
    const size_t first_store = tail.find(n == 4096 ? "st.shared" : "st.global");
    ASSERT_NE(first_store, std::string::npos);
    EXPECT_EQ(count(tail.substr(0, first_store), "ld.global"), 8) << n << ": two batches' loads before the first store";
    if (have_ptxas()) {
      Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
      ASSERT_TRUE(r.ok()) << r.error().str();
      EXPECT_FALSE((*r)[0].spills()) << n;
    }
    if (n == 4100) {
      Result<MatmulPath> path = tma_path(g, c);
      ASSERT_TRUE(path.ok());
      EXPECT_NE(path->why.find("epilogue stored directly: N = 4100 does not fill whole 16-byte chunks"), std::string::npos)
          << path->why;
    }
  }
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  Ptx staged = emit_ptx(g, tc_config(128, 256, 64, 8, 4), "sm_90a", false, /*tma=*/true);
  EXPECT_GT(count(staged.text, "st.global.v4"), 0);
  EXPECT_EQ(count(staged.text, "ld.global"), 128);
}

// Ping-pong (pingpong = 1) on the persistent warp-specialised kernel: the same 384
// threads, the two consumer warpgroups taking turns by named barriers (a bar.sync and
// a bar.arrive of 256 threads besides the one bar.sync after the mbarriers'
// initialisation; the epilogue's chunks meet on each warp's barrier of 32, twice for
// each of a warpgroup's 256 or 128 columns' 64-column chunks); each warpgroup's whole
// tile (64 x 256, or 128 x 128 in two m64 steps) is 128 accumulators a thread with no
// spills. The config text and explain say
// pingpong.
TEST(MatmulMmaNvptx, Sm90aPingPongKernel) {
  Graph g = mm_graph({4096, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  for (auto [bm, bn] : {std::pair{64, 256}, std::pair{128, 128}}) {
    if (test::kSanitized && bm == 128) continue;  // the sanitizer build's sample: one tile (ptxas is most of it)
    KernelConfig c = tc_config(bm, bn, 64, 8, 4, 8, /*ws=*/1);
    c.persistent = 132;
    c.pingpong = 1;
    Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
    EXPECT_EQ(p.launch.grid[0], 132);
    EXPECT_EQ(p.launch.block[0], 384);
    EXPECT_EQ(count(p.text, "bar.sync \t0;"), 1) << bm << "x" << bn;
    EXPECT_EQ(count(p.text, "bar.arrive"), 1) << bm << "x" << bn;
    // Each named barrier's thread count: the turn's (barrier 1 or 2) 256, the chunks' 32.
    std::map<std::string, int> counts;
    for (const char* op : {"bar.sync %r", "bar.arrive %r"})
      for (size_t at = p.text.find(op); at != std::string::npos; at = p.text.find(op, at + 1))
        ++counts[std::string(op).substr(0, 8) + p.text.substr(p.text.find(',', at), 5)];
    EXPECT_EQ(counts["bar.sync, 256"], 1) << bm << "x" << bn;
    EXPECT_EQ(counts["bar.arri, 256"], 1) << bm << "x" << bn;
    EXPECT_EQ(counts["bar.sync, 32;"], 2 * bn / 64) << bm << "x" << bn << ": two warp barriers a 64-column chunk";
    EXPECT_EQ(count(p.text, "wgmma.mma_async.sync.aligned.m64n" + std::to_string(bn) + "k16"), 4 * (bm / 64))
        << bm << "x" << bn << ": one wgmma per k step and m64 step of the warpgroup's whole tile";
    if (have_ptxas()) {
      Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
      ASSERT_TRUE(r.ok()) << r.error().str();
      EXPECT_FALSE((*r)[0].spills()) << bm << "x" << bn;
    }
  }
  KernelConfig c = tc_config(64, 256, 64, 8, 4, 8, 1);
  c.persistent = 132;
  c.pingpong = 1;
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=64 block_n=256 block_k=64 warps=8 stages=4 group_m=8 split_k=1 warp_specialize=1 persistent=132 "
            "pingpong=1");
  Result<MatmulPath> path = tma_path(g, c);
  ASSERT_TRUE(path.ok());
  EXPECT_TRUE(path->tensor_cores);
  EXPECT_NE(path->why.find("ping-pong"), std::string::npos) << path->why;
  c.persistent = 0;
  path = tma_path(g, c);
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->tensor_cores);
  EXPECT_NE(path->why.find("pingpong = 1 needs a persistent grid"), std::string::npos) << path->why;
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
  const KernelConfig configs[] = {tc_config(128, 128, 32, 4, 3), tc_config(64, 64, 64, 4, 4), tc_config(128, 256, 32, 8, 3),
                                  tc_config(32, 32, 32, 2, 2)};
  // The sanitizer build's sample (tests/sanitized.h): each config once, each dtype and
  // arch twice; ptxas, which takes most of the time, is not what ASan checks.
  for (size_t d = 0; d < 2; ++d)
    for (size_t a = 0; a < 2; ++a)
      for (size_t k = 0; k < 4; ++k) {
        if (test::kSanitized && (k % 2 != d || k / 2 != a)) continue;
        const DType dt = d ? DType::F16 : DType::BF16;
        const char* arch = a ? "sm_90a" : "sm_80";
        const KernelConfig& c = configs[k];
        Graph g = mm_graph(s, dt, Epi::BiasGelu);
        Ptx p = emit_ptx(g, c, arch);
        Result<std::vector<KernelResources>> r = assemble(p.text, arch);
        ASSERT_TRUE(r.ok()) << name(s, dt, c) << " " << arch << ": " << r.error().str();
        ASSERT_FALSE(r->empty());
        EXPECT_EQ((*r)[0].spill_store_bytes + (*r)[0].spill_load_bytes, 0) << name(s, dt, c) << " " << arch;
      }
}

// Split-K of a bf16 matmul + bias + GELU on sm_80 (mma.sync) and sm_90a (wgmma + TMA,
// warp-specialised): grid z = split_k, no zeroed outputs but a zeroed workspace of the
// f32 sums and a counter per tile, the partials added by f32 atomics, membar.gl before
// the count (a u32 atomic add), the sums read back by volatile loads, the bf16 outputs
// stored by the one block that runs the epilogue; ptxas takes it without spills.
TEST(MatmulMmaNvptx, SixteenBitSplitKSumsInAWorkspace) {
  Shape3 s{256, 512, 8192, false, true, {}};
  Graph g = mm_graph(s, DType::BF16, Epi::BiasGelu);
  KernelConfig c80 = tc_config(128, 128, 32, 4, 3);
  c80.split_k = 4;
  KernelConfig c90 = tc_config(128, 128, 64, 8, 4, 8, /*ws=*/1);
  c90.split_k = 4;
  struct Case {
    const char* arch;
    KernelConfig c;
    const char* mma;
  };
  for (const Case& k : {Case{"sm_80", c80, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"},
                        Case{"sm_90a", c90, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"}}) {
    Ptx p = emit_ptx(g, k.c, k.arch, false, /*tma=*/true);
    EXPECT_EQ(p.launch.grid[2], 4) << k.arch;
    EXPECT_FALSE(p.launch.zero_outputs) << k.arch;
    EXPECT_EQ(p.launch.workspace_bytes, 4 * (256 * 512 + 2 * 4)) << k.arch;
    EXPECT_GT(count(p.text, k.mma), 0) << k.arch;
    EXPECT_GT(count(p.text, "red.global.add.f32") + count(p.text, "atom.global.add.f32") + count(p.text, "red.add.f32") +
                  count(p.text, "atom.add.f32"),
              0)
        << k.arch;
    EXPECT_GT(count(p.text, "membar.gl"), 0) << k.arch;
    EXPECT_GT(count(p.text, "atom.global.add.u32") + count(p.text, "atom.add.u32"), 0) << k.arch;
    EXPECT_GT(count(p.text, "ld.volatile"), 0) << k.arch;
    EXPECT_GT(count(p.text, "st.global.v4") + count(p.text, "st.global.b32") + count(p.text, "st.global.u32"), 0) << k.arch;
    if (!have_ptxas()) continue;
    Result<std::vector<KernelResources>> r = assemble(p.text, k.arch);
    ASSERT_TRUE(r.ok()) << k.arch << ": " << r.error().str();
    ASSERT_FALSE(r->empty());
    EXPECT_EQ((*r)[0].spill_store_bytes + (*r)[0].spill_load_bytes, 0) << k.arch;
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

  // Split-K: a bare TF32 matmul keeps the tensor cores adding into its zeroed output;
  // an epilogue or a 16-bit matmul keeps them too, summing in the workspace, as the
  // SIMT kernel (exact f32) does.
  KernelConfig split = tc_config(128, 128, 32, 8, 3);
  split.split_k = 4;
  p = matmul_path(tf32_spec(f32), split, "sm_80");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->tensor_cores) << p->why;
  EXPECT_NE(p->why.find("split-K 4: partial sums added into the zeroed output"), std::string::npos) << p->why;
  Graph f32_epi = mm_graph({256, 256, 256, false, false, {}}, DType::F32, Epi::BiasGelu);
  p = matmul_path(tf32_spec(f32_epi), split, "sm_80");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->tensor_cores) << p->why;
  EXPECT_NE(p->why.find("f32 workspace, the last block of each tile runs the epilogue"), std::string::npos) << p->why;
  p = matmul_path(spec_of(bf), split, "sm_80");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->tensor_cores) << p->why;
  EXPECT_NE(p->why.find("f32 workspace"), std::string::npos) << p->why;
  Result<EmittedKernel> simt = emit_matmul(spec_of(f32_epi), split, llvmb::Target::nvptx("sm_80"));
  ASSERT_TRUE(simt.ok()) << simt.error().str();
  EXPECT_GT(simt->launch.workspace_bytes, 0);
  p = matmul_path(spec_of(f32_epi), split, "sm_80");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->tensor_cores);
  EXPECT_NE(p->why.find("split-K 4: partial sums added into an f32 workspace"), std::string::npos) << p->why;

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
  // f32 and sm_75 keep the base's SIMT tile, 64 x 64 on 2 warps (8 x 8 a thread),
  // not its 4.
  Graph f32 = mm_graph({256, 256, 256, false, false, {}}, DType::F32, Epi::None);
  KernelConfig simt;
  simt.warps = 2;
  EXPECT_EQ(suggest_matmul_config(spec_of(f32), KernelConfig{}, "sm_80"), simt);
  EXPECT_EQ(suggest_matmul_config(spec_of(bf), KernelConfig{}, "sm_75"), simt);
  KernelConfig other;
  other.block_m = 32;
  EXPECT_EQ(suggest_matmul_config(spec_of(f32), other, "sm_80"), other) << "another base tile is kept whole";
}

// Split-K by default where the default tile leaves more than half the SMs idle: the
// largest split of 2..16 that keeps one wave (132 SMs on sm_90a, 108 on sm_80), 8 K
// tiles a block, and the workspace's (2 x split + 2) x 4 bytes per output element
// within the operands' bytes. A 256 x 256 output over K = 8192 (operands 8 MiB, the
// f32 output 256 KiB): split 8 on sm_90a's 2 wgmma tiles and on sm_80's 4 tiles (16
// would move 34 x 256 KiB, more than the operands). A decode step (M = 64, N = K = 4096): 16 tiles of 64 x
// 256, 64 K tiles, split 8; at M = 128, 4 (the workspace's 2 MiB per split against
// 33 MiB of operands), except on sm_90a with TMA, where its 128 tiles of 64 x 64 fill
// the SMs: those, unsplit, a producer warpgroup bringing the operands
// (default_small_tiles; 64 rows' 64 such tiles do not). None where the tiles fill the
// SMs (4096^3) or the K tiles are few (K = 512).
TEST(MatmulMmaPath, SuggestedConfigSplitsKWhereTheTilesLeaveSmsIdle) {
  auto split = [](Shape3 s, const char* arch) {
    return suggest_matmul_config(spec_of(mm_graph(s, DType::BF16, Epi::BiasGelu)), KernelConfig{}, arch).split_k;
  };
  EXPECT_EQ(split({256, 256, 8192, false, true, {}}, "sm_90a"), 8);
  EXPECT_EQ(split({256, 256, 8192, false, true, {}}, "sm_80"), 8);
  EXPECT_EQ(split({64, 4096, 4096, false, true, {}}, "sm_90a"), 8);
  EXPECT_EQ(split({128, 4096, 4096, false, true, {}}, "sm_90a"), 4) << "cp.async: no producer warpgroup";
  KernelSpec with_tma = spec_of(mm_graph({128, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu));
  with_tma.tma = true;
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, suggest_matmul_config(with_tma, KernelConfig{}, "sm_90a")),
            "block_m=64 block_n=64 block_k=64 warps=4 stages=4 group_m=8 split_k=1 warp_specialize=1");
  with_tma.group = mm_graph({64, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  EXPECT_EQ(suggest_matmul_config(with_tma, KernelConfig{}, "sm_90a").split_k, 8);
  EXPECT_EQ(split({4096, 4096, 4096, false, true, {}}, "sm_90a"), 1);
  EXPECT_EQ(split({256, 256, 512, false, true, {}}, "sm_90a"), 1);
  // The suggested split builds: the workspace path, no spills.
  Graph g = mm_graph({64, 4096, 4096, false, true, {}}, DType::BF16, Epi::BiasGelu);
  KernelConfig c = suggest_matmul_config(spec_of(g), KernelConfig{}, "sm_90a");
  Ptx p = emit_ptx(g, c, "sm_90a", false, /*tma=*/true);
  EXPECT_GT(p.launch.workspace_bytes, 0);
  EXPECT_EQ(p.launch.grid[2], 8);
  if (!have_ptxas()) return;
  Result<std::vector<KernelResources>> r = assemble(p.text, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ((*r)[0].spill_store_bytes + (*r)[0].spill_load_bytes, 0);
}

}  // namespace kernels_matmul_mma_test
}  // namespace sf
