// Fusion of slice and concat, checked by hand: they are views that move a pointwise
// group to their result's index space, a concat pulls its operands' groups in, RoPE is
// one kernel, and nothing that escapes is computed in another space. (The fused
// programs' numbers are checked in tests/kernels/views_test.cpp and
// generated_programs_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/result_util.h"
#include "codegen/dist/explain.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/parser.h"

namespace sf {
namespace fusion_fuse_views_test {

std::vector<LocalProgram> programs(const std::string& text) {
  Result<Graph> g = parse_graph(text, "t.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  DeviceMesh mesh(g->mesh());
  return ok_value(rank_programs(*g, propagate(*g, mesh), mesh));
}

std::vector<std::string> kernel_ops(const LocalProgram& p) {
  std::vector<std::string> v;
  for (const LocalKernel& k : p.kernels) {
    std::string s = std::string(kernel_kind_name(k.kind)) + ":";
    for (const std::string& op : k.ops) s += " " + op;
    v.push_back(s);
  }
  return v;
}

using Ops = std::vector<std::string>;

TEST(FuseViews, RopeIsOneKernelWhicheverWayItIsWritten) {
  for (const char* y : {"add(mul(concat(neg(x2), x1, dim=-1), c), mul(x, s))",
                        "add(mul(x, s), mul(concat(neg(x2), x1, dim=-1), c))"}) {
    LocalProgram p = programs(std::string("graph g(x: f32[2, 3, 8], c: f32[3, 8], s: f32[3, 8]) {\n") +
                              "  x1 = slice(x, dim=-1, end=4)\n  x2 = slice(x, dim=-1, start=4)\n  y = " + y +
                              "\n  return y\n}\n")[0];
    ASSERT_EQ(p.kernels.size(), 1u) << y << "\n" << explain_kernels(p);
    EXPECT_EQ(p.kernels[0].kind, KernelKind::Pointwise);
    EXPECT_EQ(p.kernels[0].group.params().size(), 3u);  // x, c, s: no intermediate in memory
    EXPECT_EQ(p.kernels[0].bytes_written, 2 * 3 * 8 * 4);
  }
}

// x computed by another group (its head split after a projection, as in a LLaMA
// block): the product x * cos forms in x's group, and rotate_half(x) * sin in the
// slices' group, which reads x. The add joins the second (joining the first alone
// would be a cycle), and the first merges in: one kernel, reading the projection.
TEST(FuseViews, RopeOfAComputedValueIsOneKernel) {
  LocalProgram p = programs(
      "graph g(a: f32[2, 3, 16], w: f32[16, 16], c: f32[3, 8], s: f32[3, 8]) {\n"
      "  x = permute(reshape(matmul(a, w), shape=[2, 3, 2, 8]), dims=[0, 2, 1, 3])\n"
      "  r = concat(neg(slice(x, dim=-1, start=4)), slice(x, dim=-1, end=4), dim=-1)\n"
      "  return add(mul(x, c), mul(r, s))\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"matmul: matmul", "pointwise: reshape permute slice neg slice concat mul mul add"}))
      << explain_kernels(p);
}

TEST(FuseViews, AValueUsedElsewhereIsNotComputedInAnotherSpace) {
  // y escapes, so the slice reads it from memory rather than computing exp on 4 of 8.
  LocalProgram p = programs("graph g(x: f32[4, 8]) {\n  y = exp(x)\n  return y, slice(y, dim=1, end=4)\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"pointwise: exp", "pointwise: slice"})) << explain_kernels(p);
  // Used only by the slice, exp is computed for the 4 columns kept.
  p = programs("graph g(x: f32[4, 8]) {\n  y = exp(x)\n  return slice(y, dim=1, end=4)\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"pointwise: exp slice"})) << explain_kernels(p);
  // A concat operand that escapes stays in its own kernel; the one that does not joins.
  p = programs("graph g(x: f32[4, 8]) {\n  a = exp(x)\n  b = neg(x)\n  return concat(a, b, dim=0), a\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"pointwise: exp", "pointwise: neg concat"})) << explain_kernels(p);
}

TEST(FuseViews, MatmulsAndReductionsTakeThemOnlyInAPrologue) {
  // A matmul reads params through transposes and permutes only: the slice is a kernel.
  LocalProgram p = programs(
      "graph g(x: f32[4, 8], w: f32[16, 8]) {\n  y = matmul(x, transpose(slice(w, dim=0, end=6), 0, 1))\n"
      "  return y\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"pointwise: slice transpose", "matmul: matmul"})) << explain_kernels(p);
  // Nor does a view go into the matmul's epilogue.
  p = programs("graph g(x: f32[4, 8], w: f32[8, 6]) {\n  y = relu(slice(matmul(x, w), dim=1, end=3))\n  return y\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"matmul: matmul", "pointwise: slice relu"})) << explain_kernels(p);
  // A reduction's prologue takes both; its epilogue takes neither.
  p = programs(
      "graph g(x: f32[4, 8], y: f32[4, 2]) {\n  s = sum(concat(exp(slice(x, dim=1, step=2)), y, dim=1), dims=[1])\n"
      "  return s\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"reduction: slice exp concat sum"})) << explain_kernels(p);
  p = programs("graph g(x: f32[4, 8]) {\n  m = max(x, dims=[1], keepdim=true)\n  return slice(sub(x, m), dim=0, end=2)\n}\n")[0];
  EXPECT_EQ(kernel_ops(p), (Ops{"reduction: max sub", "pointwise: slice"})) << explain_kernels(p);
}

// Attention's head views (codegen/ir/view_strides.h): splitting the projection's last
// dim into heads and moving heads before the sequence is a strided view of the
// projection's output, so the scores' matmul reads it in place and no kernel copies it.
// Merging heads back ([b, h, s, d] -> [b, s, h * d]) is no strided view (h and d are
// not one after the other in memory): that copy stays, and the next matmul reads it.
TEST(FuseViews, AMatmulReadsHeadSplitsInPlaceButNotAHeadMerge) {
  // Kernels are listed in the order their groups formed (the scores' group forms at q's
  // views, before k's projection), so the lists are compared sorted.
  auto sorted_ops = [](const LocalProgram& p) {
    Ops v = kernel_ops(p);
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::string heads =
      "graph g(x: f32[2, 8, 16], wq: f32[16, 16], wk: f32[16, 16], wv: f32[16, 16], wo: f32[16, 16]) {\n"
      "  q = permute(reshape(matmul(x, transpose(wq, 0, 1)), shape=[2, 8, 4, 4]), dims=[0, 2, 1, 3])\n"
      "  k = permute(reshape(matmul(x, transpose(wk, 0, 1)), shape=[2, 8, 4, 4]), dims=[0, 2, 1, 3])\n"
      "  s = matmul(q, transpose(k, -2, -1))\n";
  LocalProgram p = programs(heads + "  return s\n}\n")[0];
  EXPECT_EQ(sorted_ops(p), (Ops{"matmul: reshape permute reshape permute transpose matmul", "matmul: transpose matmul",
                                "matmul: transpose matmul"}))
      << explain_kernels(p);
  // The context's matmul reads v's head split in place; merging the heads back before
  // the output projection is a copy.
  p = programs(heads + "  v = permute(reshape(matmul(x, transpose(wv, 0, 1)), shape=[2, 8, 4, 4]), dims=[0, 2, 1, 3])\n"
                       "  o = reshape(permute(matmul(s, v), dims=[0, 2, 1, 3]), shape=[2, 8, 16])\n"
                       "  return matmul(o, wo)\n}\n")[0];
  EXPECT_EQ(sorted_ops(p), (Ops{"matmul: matmul", "matmul: reshape permute matmul",
                                "matmul: reshape permute reshape permute transpose matmul", "matmul: transpose matmul",
                                "matmul: transpose matmul", "matmul: transpose matmul", "pointwise: permute reshape"}))
      << explain_kernels(p);
  // A split that something else reads too is written once, and the matmul reads that.
  p = programs("graph g(x: f32[2, 8], w: f32[4, 4]) {\n  r = reshape(x, shape=[2, 2, 4])\n"
               "  return matmul(r, w), neg(r)\n}\n")[0];
  const Ops ops = kernel_ops(p);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "matmul: matmul"), 1) << explain_kernels(p);
}

TEST(FuseViews, EveryRankFusesAlikeWithAnEmptyShard) {
  // 4 heads on 3 ranks: 2, 2 and 0.
  std::vector<LocalProgram> ps = programs(
      "mesh tp=3\ngraph g(x: f32[2, 4, 3, 8] {tp: S(1)}, c: f32[3, 8], s: f32[3, 8]) {\n"
      "  r = concat(neg(slice(x, dim=-1, start=4)), slice(x, dim=-1, end=4), dim=-1)\n"
      "  return add(mul(x, c), mul(r, s)) {tp: S(1)}\n}\n");
  ASSERT_EQ(ps.size(), 3u);
  for (const LocalProgram& p : ps) {
    ASSERT_EQ(p.kernels.size(), 1u) << "rank " << p.rank << "\n" << explain_kernels(p);
    EXPECT_EQ(kernel_ops(p), kernel_ops(ps[0]));
  }
  EXPECT_EQ(numel(ps[2].kernels[0].group.node(ps[2].kernels[0].group.outputs()[0].value).type.shape), 0);
}

}  // namespace fusion_fuse_views_test
}  // namespace sf
