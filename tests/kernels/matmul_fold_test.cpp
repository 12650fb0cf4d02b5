// Folding a matmul's batch into its rows (fold_batch_into_rows, matmul_group.h): which
// groups fold and to what shapes, which do not, and that a folded kernel computes the
// batched product: simulated through the warp-specialised wgmma + TMA kernel, which a
// batched A times a shared B could not take unfolded.
#include <gtest/gtest.h>

#include "codegen/ir/builder.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/matmul_group.h"
#include "tests/kernels/matmul_sim.h"

namespace sf {
namespace kernels_matmul_fold_test {

using namespace mma_sim;
using matmul_detail::fold_batch_into_rows;

// x [batch..., m, k] @ transpose(w [n, k]) + bias [n], then + r [batch..., m, n]
// (or, with `row_bias`, + r [m, n]: the same rows in every batch).
Graph linear(const Shape& batch, int64_t m, int64_t n, int64_t k, bool row_bias = false, bool batched_w = false) {
  GraphBuilder b("lin");
  Shape xs = batch, ws = batched_w ? batch : Shape{}, rs = row_bias ? Shape{} : batch;
  xs.insert(xs.end(), {m, k});
  ws.insert(ws.end(), {n, k});
  rs.insert(rs.end(), {m, n});
  const int64_t r = static_cast<int64_t>(ws.size());
  Value x = b.param("x", DType::BF16, xs), w = b.param("w", DType::BF16, ws), bias = b.param("bias", DType::BF16, {n}),
        res = b.param("r", DType::BF16, rs);
  b.ret(gelu(matmul(x, transpose(w, r - 2, r - 1)) + bias) + res);
  return decompose(finish(b));  // gelu into its elementwise ops, as the fusion pass has it
}

Shape param_shape(const Graph& g, size_t i) { return g.node(g.params()[i]).type.shape; }

TEST(MatmulFold, ABatchedInputTimesASharedWeightBecomesOneProduct) {
  std::optional<Graph> f = fold_batch_into_rows(linear({2, 3}, 40, 72, 64));
  ASSERT_TRUE(f);
  ASSERT_EQ(f->params().size(), 4u);  // the kernel's arguments, in order
  EXPECT_EQ(param_shape(*f, 0), (Shape{240, 64}));
  EXPECT_EQ(param_shape(*f, 1), (Shape{72, 64})) << "B keeps its shape";
  EXPECT_EQ(param_shape(*f, 2), (Shape{72}));
  EXPECT_EQ(param_shape(*f, 3), (Shape{240, 72}));
  ASSERT_EQ(f->outputs().size(), 1u);
  EXPECT_EQ(f->node(f->outputs()[0].value).type.shape, (Shape{240, 72}));
  // The emitter sees one 240-row product with a 2-D A.
  Result<matmul_detail::MatmulGroup> p = matmul_detail::analyse_matmul(fold_batch_into_rows(spec_of(linear({2, 3}, 40, 72, 64))));
  ASSERT_TRUE(p) << p.error().str();
  EXPECT_EQ(p->M, 240);
  EXPECT_EQ(p->nbatch, 1);
}

TEST(MatmulFold, WhatWouldChangeTheElementsStaysBatched) {
  EXPECT_FALSE(fold_batch_into_rows(linear({3}, 40, 72, 64, /*row_bias=*/true))) << "r's rows repeat in every batch";
  EXPECT_FALSE(fold_batch_into_rows(linear({3}, 40, 72, 64, false, /*batched_w=*/true))) << "a weight per batch";
  EXPECT_FALSE(fold_batch_into_rows(linear({}, 40, 72, 64))) << "no batch";
  EXPECT_FALSE(fold_batch_into_rows(linear({1}, 40, 72, 64))) << "a batch of one";
  // A read through a view (here attention's heads back into rows) is not dense
  // across the batch.
  GraphBuilder b("permuted");
  Value x = b.param("x", DType::BF16, {40, 3, 64}), w = b.param("w", DType::BF16, {72, 64});
  b.ret(matmul(permute(x, {1, 0, 2}), transpose(w, 0, 1)));
  EXPECT_FALSE(fold_batch_into_rows(finish(b)));
  // B's param also read by the epilogue.
  GraphBuilder c("shared");
  Value y = c.param("x", DType::BF16, {3, 64, 64}), v = c.param("w", DType::BF16, {64, 64});
  c.ret(matmul(y, v) + v);
  EXPECT_FALSE(fold_batch_into_rows(finish(c)));
}

// The folded kernel's numbers: x [3, 40, 64] through the warp-specialised TMA kernel
// (64 x 64 tiles: 2 row tiles over the 120 folded rows, one of them cut at 120),
// bias + GELU + a residual, against the reference of the batched graph.
TEST(MatmulFold, TheFoldedKernelComputesTheBatchedProductThroughTma) {
  KernelConfig c = tc_config(64, 64, 64, 4, 3, 8, /*ws=*/1);
  check(linear({3}, 40, 72, 64), c, "folded ws", true, 1, /*wgmma=*/true, /*tma=*/true);
  c.persistent = 3;
  check(linear({3}, 40, 72, 64), c, "folded ws persistent", true, 2, true, true);
  // Unfolded (a residual whose rows repeat over the batch) the same config takes TMA
  // too since 2026-11-28 (before, it was refused: B's batch stride is 0): A through a
  // 3-D map, B, shared, through a 2-D one.
  KernelSpec batched = spec_of(linear({3}, 40, 72, 64, /*row_bias=*/true)), s = spec_of(linear({3}, 40, 72, 64));
  batched.tma = s.tma = true;
  Result<MatmulPath> row_bias = matmul_path(batched, c, "sm_90a");
  ASSERT_TRUE(row_bias) << row_bias.error().str();
  EXPECT_TRUE(row_bias->tensor_cores) << row_bias->why;
  EXPECT_NE(row_bias->why.find("filled by TMA"), std::string::npos) << row_bias->why;
  Result<EmittedKernel> k = emitter_for(KernelKind::Matmul).emit(batched, c, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k) << k.error().str();
  ASSERT_EQ(k->launch.tensor_maps.size(), 2u);
  EXPECT_EQ(k->launch.tensor_maps[0].rank, 3);
  EXPECT_EQ(k->launch.tensor_maps[1].rank, 2);
  check(linear({3}, 40, 72, 64, /*row_bias=*/true), c, "unfolded ws, B shared", true, 1, true, true);
  Result<MatmulPath> folded = matmul_path(s, c, "sm_90a");
  ASSERT_TRUE(folded) << folded.error().str();
  EXPECT_NE(folded->why.find("filled by TMA"), std::string::npos) << folded->why;
  EXPECT_EQ(folded->why.rfind("batch [3] folded into 120 rows (B is shared), wgmma.mma_async", 0), 0u) << folded->why;
  EXPECT_EQ(row_bias->why.find("folded"), std::string::npos) << row_bias->why;
}

}  // namespace kernels_matmul_fold_test
}  // namespace sf
