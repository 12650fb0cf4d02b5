// dropout inside generated kernels: the host kernels draw the reference's mask bit
// for bit (pointwise through views and vector loops, reduction prologues, matmul
// epilogues, a block at its origin), the Philox known answer comes out of a kernel,
// the NVPTX kernels assemble with ptxas (the 32x32 -> 64-bit products as PTX
// multiplies, no calls), and whole programs on every input placement and uneven
// shards give the global reference's result.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/kernels/host_program_check.h"

namespace sf {
namespace kernels_dropout_test {

using kernel_test::finish;

// Values in [-2, 2] that are never 0 (so a 0 in a result is a dropped element).
Tensor nonzero_tensor(const TensorType& t, uint64_t seed) {
  Tensor x(t.dtype, t.shape);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double m = 0.25 + 1.75 * static_cast<double>(rng() >> 11) * 0x1p-53;
    x.set(i, rng() & 1 ? m : -m);
  }
  return x;
}

std::vector<Tensor> inputs_of(const Graph& g, uint64_t seed) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.params().size(); ++i) in.push_back(nonzero_tensor(g.node(g.params()[i]).type, seed + i));
  return in;
}

Result<std::vector<Tensor>> run_host(KernelKind kind, const Graph& g, const std::vector<Tensor>& in,
                                     const KernelConfig& cfg = {}) {
  return kernel_test::run_emitted(emitter_for(kind).emit(KernelSpec{"dropout", kind, g}, cfg, llvmb::Target::host()), g, in);
}

// The host kernel's outputs against the reference's: the same elements dropped (a 0
// exactly where the reference has one), and the values bit for bit when `exact` (a
// scale that is a power of two, one rounding either way), else within the tolerance.
void expect_matches(KernelKind kind, const Graph& g, const std::vector<Tensor>& in, bool exact,
                    const KernelConfig& cfg = {}) {
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = run_host(kind, g, in, cfg);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const Tensor &w = (*want)[o], &h = (*got)[o];
    SCOPED_TRACE(g.name() + " output " + std::to_string(o) + " " + w.type().str());
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_EQ(h.get(i) == 0, w.get(i) == 0) << "the mask differs at " << i << ": got " << h.get(i) << ", want " << w.get(i);
    if (exact) {
      ASSERT_EQ(std::memcmp(h.data(), w.data(), static_cast<size_t>(w.nbytes())), 0) << "values differ";
    } else {
      Comparison c = compare(h, w, default_tolerance(w.dtype()));
      EXPECT_TRUE(c.ok()) << c.mismatches << " mismatch(es), first at " << c.first_mismatch;
    }
  }
}

// ---- pointwise ---------------------------------------------------------------------------

// Seed 0's first four elements are lanes 0..3 of Philox4x32-10 at counter 0, key 0:
// Random123's known answer 6627e8d5 e169c58d bc57ac4c 9b00dbd8, u = 0.399, 0.881,
// 0.736, 0.605; with p = 0.5 the first is dropped and the rest doubled.
TEST(DropoutPointwise, TheKnownAnswerComesOutOfAKernel) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    GraphBuilder b("kat");
    b.ret(dropout(b.param("x", dt, {4}), 0.5, 0));
    Graph g = finish(b);
    Tensor x(dt, {4});
    const double xv[] = {3, -5, 0.5, 7};
    for (int i = 0; i < 4; ++i) x.set(i, xv[i]);
    Result<std::vector<Tensor>> out = run_host(KernelKind::Pointwise, g, {x});
    ASSERT_TRUE(out.ok()) << out.error().str();
    const double want[] = {0, -10, 1, 14};
    for (int i = 0; i < 4; ++i) EXPECT_EQ((*out)[0].get(i), want[i]) << dtype_name(dt) << " " << i;
  }
}

TEST(DropoutPointwise, TheReferencesMaskInEveryDtypeThroughViewsAndVectorLoops) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    GraphBuilder b("views");
    Value x = b.param("x", dt, {3, 37, 7});
    b.ret(dropout(x, 0.5, 1));
    b.ret(dropout(x, 0.75, kMax));                      // a seed using both key words
    b.ret(dropout(transpose(x, 0, 2), 0.5, 2));          // the mask of the transposed index
    b.ret(transpose(dropout(x, 0.5, 2), 0, 2));          // a view of a dropped-out value
    b.ret(dropout(expand(b.param("row", dt, {1, 7}), {3, 37, 7}), 0.5, 3));  // of a broadcast
    b.ret(dropout(x, 0.0, 4));                          // the identity
    b.ret(dropout(x, 1.0, 5));                          // zeros
    // A block at its origin inside a larger tensor, as local_node writes it.
    b.ret(b.op(OpKind::Dropout, {x}, {},
               {{"p", 0.5}, {"seed", int64_t{6}}, {"origin", std::vector<int64_t>{1, 5, 0}},
                {"global_shape", std::vector<int64_t>{4, 50, 7}}}));
    Graph g = finish(b);
    std::vector<Tensor> in = inputs_of(g, 10);
    expect_matches(KernelKind::Pointwise, g, in, /*exact=*/true);
    if (dt != DType::F32) continue;  // vector loops: the index arithmetic is the same in every dtype
    for (auto [v, il] : {std::pair{4, 1}, std::pair{8, 2}, std::pair{1, 4}}) {
      KernelConfig cfg;
      cfg.host_vector = v;
      cfg.host_interleave = il;
      expect_matches(KernelKind::Pointwise, g, in, true, cfg);
    }
  }
  // A scale that is not a power of two: the mask bit for bit, values within rounding.
  GraphBuilder b("inexact");
  b.ret(dropout(b.param("x", DType::F32, {5, 41}), 0.1, 77) * 3.0);
  Graph g = finish(b);
  expect_matches(KernelKind::Pointwise, g, inputs_of(g, 11), /*exact=*/false);
}

// ---- reduction and matmul kernels ----------------------------------------------------------

TEST(DropoutReduction, InTheReductionsPrologueAndEpilogue) {
  GraphBuilder b("softmax_dropout");
  Value x = b.param("x", DType::F32, {6, 33});
  b.ret(dropout(softmax(x, -1), 0.5, 8));                                   // attention-probs dropout
  b.ret(kernel_test::reduce(OpKind::Sum, dropout(x, 0.25, 9), {1}, false));  // inside the sum
  Graph composite = finish(b);
  Graph g = decompose(composite);
  expect_matches(KernelKind::Reduction, g, inputs_of(g, 12), /*exact=*/false);
}

TEST(DropoutMatmul, InTheEpilogueAtTheOutputsCoordinates) {
  GraphBuilder b("mm_dropout");
  Value a = b.param("a", DType::F32, {2, 9, 5});
  Value w = b.param("w", DType::F32, {5, 11});
  b.ret(dropout(relu(matmul(a, w)) + 1.0, 0.5, 10));  // + 1: no zero before the mask
  Graph g = finish(b);
  expect_matches(KernelKind::Matmul, g, inputs_of(g, 13), /*exact=*/false);
}

// ---- NVPTX -----------------------------------------------------------------------------------

TEST(DropoutNvptx, KernelsOfEveryKindAssembleWithPtxMultipliesAndNoCalls) {
  GraphBuilder p("pw");
  p.ret(dropout(p.param("x", DType::BF16, {5, 37}), 0.1, 123456789012345));
  Graph pw = finish(p);
  GraphBuilder r("red");
  r.ret(dropout(softmax(r.param("x", DType::F32, {4, 33}), -1), 0.5, 1));
  Graph red = decompose(finish(r));
  GraphBuilder m("mm");
  m.ret(dropout(matmul(m.param("a", DType::BF16, {32, 16}), m.param("w", DType::BF16, {16, 32})), 0.2, 3));
  Graph mm = finish(m);
  const std::pair<KernelKind, const Graph*> kernels[] = {
      {KernelKind::Pointwise, &pw}, {KernelKind::Reduction, &red}, {KernelKind::Matmul, &mm}};
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const auto& [kind, g] : kernels) {
      SCOPED_TRACE(std::string(arch) + " " + g->name());
      Result<std::string> ptx = kernel_test::ptx_of(kind, *g, arch);
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      EXPECT_EQ(ptx->find("call"), std::string::npos) << "a call is left in the PTX";
      // Philox's 32 x 32 -> 64-bit products as 32-bit PTX multiplies: 20 high halves
      // (mul.hi.u32) per Philox call, and no emulated 64-bit multiply in a pointwise
      // kernel (its index arithmetic is 32-bit for this size).
      int mulhi = 0;
      for (size_t at = ptx->find("mul.hi.u32"); at != std::string::npos; at = ptx->find("mul.hi.u32", at + 1)) ++mulhi;
      EXPECT_GE(mulhi, 20) << *ptx;
      if (kind == KernelKind::Pointwise) {
        EXPECT_EQ(ptx->find("mul.lo.s64"), std::string::npos) << *ptx;
      }
      if (kernel_test::have_ptxas()) {
        EXPECT_EQ(kernel_test::ptxas_failure(*ptx, arch), "");
      }
    }
}

// ---- whole programs ---------------------------------------------------------------------------

// One dropout under every input placement (R, S(0), S(1), P) on 4 and 3 ranks
// (uneven and empty chunks): the gathered result is the global reference's, so every
// rank drew the global mask of its block.
TEST(DropoutPrograms, EveryInputPlacementDrawsTheGlobalMask) {
  uint64_t seed = 70;
  for (int ranks : {4, 3})
    for (const char* place : {"R", "S(0)", "S(1)", "P"}) {
      const std::string text = "mesh tp=" + std::to_string(ranks) + "\ngraph g(x: f32[5, 7] {tp: " + place +
                               "}, b: f32[7]) {\n  y = add(dropout(x, p=0.5, seed=21), b)\n  return y\n}\n";
      Result<Graph> g = parse_graph(text, "g.sf");
      ASSERT_TRUE(g.ok()) << g.error().str();
      kernel_test::check_on_host_kernels(*g, seed++, text);
    }
}

TEST(DropoutPrograms, ShardedBlocksOnATwoDimMeshAndATensorParallelMlp) {
  const char* texts[] = {
      // Rows and columns both sharded: each rank's block at its (row, column) origin.
      "mesh dp=2 tp=2\ngraph g(x: f32[7, 9] {dp: S(0), tp: S(1)}) {\n"
      "  y = dropout(x, p=0.25, seed=5)\n  return y {dp: S(0), tp: S(1)}\n}\n",
      // Megatron's MLP on 3 ranks: the hidden activations are column-sharded (16 on 3
      // ranks: 6, 6, 4), dropped out per rank, then the rowwise matmul.
      "mesh tp=3\ngraph g(x: f32[5, 8], w1: f32[16, 8] {tp: S(0)}, w2: f32[8, 16] {tp: S(1)}) {\n"
      "  h = dropout(relu(matmul(x, transpose(w1, 0, 1))), p=0.5, seed=99)\n"
      "  y = matmul(h, transpose(w2, 0, 1))\n  return y\n}\n",
  };
  uint64_t seed = 80;
  for (const char* text : texts) {
    Result<Graph> g = parse_graph(text, "g.sf");
    ASSERT_TRUE(g.ok()) << g.error().str();
    kernel_test::check_on_host_kernels(*g, seed++, text);
  }
}

}  // namespace kernels_dropout_test
}  // namespace sf
