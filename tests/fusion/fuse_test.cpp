// Fusion decisions, checked by hand: which ops end up in one kernel, that
// collectives stay barriers, and that every rank fuses alike. (Numerical
// agreement of fused programs with the reference is in tests/dist/pipeline_test.cpp,
// which runs the fused pipeline by default.)
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/dist/explain.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "tests/result_util.h"

namespace sf {
namespace fusion_fuse_test {

Graph parse(const std::string& text) {
  Result<Graph> g = parse_graph(text, "t.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

Graph example(const std::string& name) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + name);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

std::vector<LocalProgram> programs(const Graph& g, bool fused = true) {
  DeviceMesh mesh(g.mesh());
  RankPipelineOptions o;
  o.fuse = fused;
  return ok_value(rank_programs(g, propagate(g, mesh), mesh, o));
}

std::vector<std::string> kinds(const LocalProgram& p) {
  std::vector<std::string> k;
  for (const LocalKernel& x : p.kernels) k.push_back(std::string(kernel_kind_name(x.kind)));
  return k;
}

TEST(Fuse, NormalisationsBecomeOneReductionKernel) {
  for (const char* op : {"softmax(x, dim=-1)", "layer_norm(x, w, b)", "rms_norm(x, w)"}) {
    Graph g = parse(std::string("graph g(x: f32[4, 16], w: f32[16], b: f32[16]) {\n  y = ") + op + "\n  return y\n}\n");
    LocalProgram p = programs(g)[0];
    ASSERT_EQ(p.kernels.size(), 1u) << op << "\n" << explain_kernels(p);
    EXPECT_EQ(p.kernels[0].kind, KernelKind::Reduction) << op;
    EXPECT_GE(p.kernels[0].ops.size(), 4u) << op;
    EXPECT_GT(p.kernels[0].bytes_saved, 0) << op;
  }
}

TEST(Fuse, MatmulTakesItsTransposedOperandAndEpilogue) {
  Graph g = parse(
      "graph g(x: f32[8, 16], w: f32[32, 16], b: f32[32], r: f32[8, 32]) {\n"
      "  y = add(relu(add(matmul(x, transpose(w, 0, 1)), b)), r)\n  return y\n}\n");
  LocalProgram p = programs(g)[0];
  ASSERT_EQ(p.kernels.size(), 1u) << explain_kernels(p);
  EXPECT_EQ(p.kernels[0].kind, KernelKind::Matmul);
  EXPECT_EQ(p.kernels[0].ops, (std::vector<std::string>{"transpose", "matmul", "add", "relu", "add"}));
  EXPECT_EQ(p.kernels[0].name, "k0_matmul_add_relu_add");
  // Reads x, w, b, r once and writes y once.
  EXPECT_EQ(p.kernels[0].bytes_read, (8 * 16 + 32 * 16 + 32 + 8 * 32) * 4);
  EXPECT_EQ(p.kernels[0].bytes_written, 8 * 32 * 4);
}

TEST(Fuse, PointwiseChainWithTwoOutputs) {
  Graph g = parse("graph g(x: f16[6, 5]) {\n  a = exp(x)\n  b = mul(a, 2.0)\n  return a, sigmoid(b)\n}\n");
  LocalProgram p = programs(g)[0];
  ASSERT_EQ(p.kernels.size(), 1u) << explain_kernels(p);
  EXPECT_EQ(p.kernels[0].kind, KernelKind::Pointwise);
  EXPECT_EQ(p.kernels[0].group.outputs().size(), 2u);  // a escapes, b does not
  EXPECT_EQ(p.kernels[0].group.params().size(), 1u);   // the literal is folded in
}

TEST(Fuse, CollectivesAreBarriers) {
  LocalProgram p = programs(example("tp_mlp.sf"))[0];
  EXPECT_EQ(kinds(p), (std::vector<std::string>{"matmul", "matmul", "pointwise"})) << explain_kernels(p);
  // The bias add after the all-reduce is its own kernel, fed by the wait.
  const LocalStep& last = p.steps.back();
  ASSERT_EQ(last.kind, LocalStep::Kind::Kernel);
  EXPECT_EQ(p.kernels[static_cast<size_t>(last.kernel)].ops, std::vector<std::string>{"add"});
  EXPECT_EQ(p.steps[p.steps.size() - 2].kind, LocalStep::Kind::Wait);
}

TEST(Fuse, FewerKernelsThanOpsOnEveryExample) {
  for (const char* e : {"tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf", "transformer_block.sf", "fsdp_tp_2d.sf",
                        "fsdp_mlp.sf"}) {
    LocalProgram fused = programs(example(e))[0], unfused = programs(example(e), false)[0];
    int ops = 0;
    for (const LocalKernel& k : fused.kernels) ops += static_cast<int>(k.ops.size());
    EXPECT_EQ(unfused.kernels.size(), static_cast<size_t>(ops)) << e;
    EXPECT_LT(fused.kernels.size(), unfused.kernels.size()) << e;
  }
  // Views after a matmul start a copy kernel (the matmul epilogue is elementwise only).
  EXPECT_EQ(programs(example("transformer_block.sf"))[0].kernels.size(), 15u);
}

TEST(Fuse, EveryRankFusesAlikeWithUnevenShards) {
  // 3 ranks: the batch-2 reduce-scatter leaves rank 2 an empty shard, which must
  // not change its kernels or its step order.
  Graph g = example("transformer_block.sf");
  Mesh m = g.mesh();
  m.dims[0].size = 3;
  Result<Graph> g3 = remesh(g, m);
  ASSERT_TRUE(g3.ok());
  std::vector<LocalProgram> ps = programs(*g3);
  for (const LocalProgram& p : ps) {
    ASSERT_EQ(p.steps.size(), ps[0].steps.size());
    for (size_t i = 0; i < p.steps.size(); ++i) EXPECT_EQ(p.steps[i].kind, ps[0].steps[i].kind) << "rank " << p.rank;
    ASSERT_EQ(p.kernels.size(), ps[0].kernels.size());
    for (size_t k = 0; k < p.kernels.size(); ++k) EXPECT_EQ(p.kernels[k].ops, ps[0].kernels[k].ops);
  }
}

}  // namespace fusion_fuse_test
}  // namespace sf

namespace sf {
namespace fusion_fuse_test {

TEST(Fuse, AGroupThatCannotBeEmittedIsSplitAndTheRestStaysFused) {
  Graph g = parse(
      "graph g(x: f32[8, 16], w: f32[16, 16]) {\n"
      "  h = relu(matmul(x, w))\n"
      "  y = mul(exp(add(x, 1.0)), 2.0)\n"
      "  return h, y\n}\n");
  DeviceMesh mesh(g.mesh());
  RankPipelineOptions opts;
  // A pretend emitter limit: no kernel with exp in it and more than one op.
  int asked = 0;
  opts.can_emit = [&](const LocalKernel& k) {
    ++asked;
    return std::find(k.ops.begin(), k.ops.end(), "exp") == k.ops.end();
  };
  LocalProgram p = ok_value(rank_programs(g, propagate(g, mesh), mesh, opts))[0];
  std::vector<std::vector<std::string>> ops;
  for (const LocalKernel& k : p.kernels) ops.push_back(k.ops);
  EXPECT_EQ(ops, (std::vector<std::vector<std::string>>{{"matmul", "relu"}, {"add"}, {"exp"}, {"mul"}}))
      << explain_kernels(p);
  EXPECT_EQ(asked, 2) << "each distinct multi-op kernel (matmul+relu, add+exp+mul) is checked once";
}

}  // namespace fusion_fuse_test
}  // namespace sf
