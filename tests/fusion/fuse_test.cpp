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

// A pre-norm block's residual after the output projection: the epilogue adds it and
// writes it in bf16; rms_norm's cast to f32 (and its square) go to the reduction's
// prologue, which widens in registers. Taken by the epilogue, the cast would be
// written as f32 for the reduction to read back. A widening cast that no reduction
// reads stays in the epilogue.
TEST(Fuse, AMatmulEpilogueDoesNotWidenWhatAReductionReads) {
  LocalProgram p = programs(parse(
      "graph g(x: bf16[8, 16], w: bf16[16, 16], r: bf16[8, 16], nw: bf16[16]) {\n"
      "  h = add(r, matmul(x, transpose(w, 0, 1)))\n"
      "  return h, rms_norm(h, nw)\n}\n"))[0];
  const LocalKernel* mm = nullptr;
  const LocalKernel* red = nullptr;
  for (const LocalKernel& k : p.kernels) {
    if (k.kind == KernelKind::Matmul) mm = &k;
    if (k.kind == KernelKind::Reduction) red = &k;
  }
  ASSERT_TRUE(mm && red) << explain_kernels(p);
  EXPECT_EQ(mm->ops, (std::vector<std::string>{"transpose", "matmul", "add"})) << explain_kernels(p);
  EXPECT_EQ(mm->bytes_written, 8 * 16 * 2) << "h alone, in bf16\n" << explain_kernels(p);
  EXPECT_EQ(red->ops.front(), "cast") << explain_kernels(p);
  EXPECT_EQ(red->bytes_read, 8 * 16 * 2 + 16 * 4) << "h in bf16, and the weight as its cast kernel wrote it\n"
                                                   << explain_kernels(p);

  p = programs(parse("graph g(x: bf16[8, 16], w: bf16[16, 16]) {\n"
                     "  return exp(cast(matmul(x, w), dtype=f32))\n}\n"))[0];
  ASSERT_EQ(p.kernels.size(), 1u) << explain_kernels(p);
  EXPECT_EQ(p.kernels[0].ops, (std::vector<std::string>{"matmul", "cast", "exp"})) << explain_kernels(p);
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
                        "fsdp_mlp.sf", "causal_attention.sf"}) {
    LocalProgram fused = programs(example(e))[0], unfused = programs(example(e), false)[0];
    int ops = 0;
    for (const LocalKernel& k : fused.kernels) ops += static_cast<int>(k.ops.size());
    EXPECT_EQ(unfused.kernels.size(), static_cast<size_t>(ops)) << e;
    EXPECT_LT(fused.kernels.size(), unfused.kernels.size()) << e;
  }
  // 15 kernels before, 4 of them copies; 11 once the matmuls read the head splits in
  // place; 9 with the attention one kernel (scores, softmax, product with v, and the
  // head splits and merge around it). None copies.
  const LocalProgram block = programs(example("transformer_block.sf"))[0];
  EXPECT_EQ(block.kernels.size(), 9u) << explain_kernels(block);
  int attention = 0;
  for (const LocalKernel& k : block.kernels) {
    EXPECT_TRUE(k.kind != KernelKind::Pointwise || k.flops > 0) << k.name << " only copies";
    attention += k.kind == KernelKind::Attention;
  }
  EXPECT_EQ(attention, 1) << explain_kernels(block);
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

// ---- generated values ------------------------------------------------------------------------
//
// Values made from generators (arange, full) and literals through elementwise ops,
// views and tril/triu: fusion recomputes them inside the kernels that read them (no
// kernel of their own, no buffer), materialises them only where they leave the
// kernels or an op reads its operand from memory, and propagation places them as their
// users want them, so that no rank slices a replicated mask.

bool has_op(const LocalKernel& k, OpKind op) {
  return std::any_of(k.group.nodes().begin(), k.group.nodes().end(), [&](const Node& n) { return n.op == op; });
}

int count_steps(const LocalProgram& p, LocalStep::Kind kind) {
  return static_cast<int>(std::count_if(p.steps.begin(), p.steps.end(), [&](const LocalStep& s) { return s.kind == kind; }));
}

TEST(FuseGenerators, ACausalMaskIsRecomputedInTheKernelsThatReadIt) {
  for (const char* mask : {"add(s, triu(full([8, 8], -1e9), diagonal=1))",
                           "where(ge(reshape(arange(8), shape=[8, 1]), arange(8)), s, -1e9)",
                           "where(eq(tril(full([8, 8], 1.0)), 0.0), -1e9, s)"}) {
    Graph g = parse(std::string("graph g(q: f32[2, 4, 8, 4], k: f32[2, 4, 4, 8]) {\n  s = mul(matmul(q, k), 0.5)\n") +
                    "  m = " + mask + "\n  p = softmax(m, dim=-1)\n  return p\n}\n");
    LocalProgram p = programs(g)[0];
    // The matmul with the mask in its epilogue, and the softmax: no mask kernel, no copy.
    ASSERT_EQ(p.kernels.size(), 2u) << mask << "\n" << explain_kernels(p);
    EXPECT_EQ(p.kernels[0].kind, KernelKind::Matmul) << mask;
    EXPECT_TRUE(has_op(p.kernels[0], OpKind::Arange) || has_op(p.kernels[0], OpKind::Full)) << mask;
    EXPECT_EQ(p.kernels[0].group.params().size(), 2u) << "the mask is no input: " << mask;
    EXPECT_EQ(p.kernels[1].kind, KernelKind::Reduction) << mask;
    // Its ops are listed (explain), and its steps belong to the kernel (a kernel that
    // cannot be emitted is split with them).
    EXPECT_GE(p.kernels[0].steps.size(), 4u) << mask;
  }
}

TEST(FuseGenerators, AMaskReadByTwoKernelsIsComputedInBoth) {
  Graph g = parse(
      "graph g(q: f32[2, 4, 8, 4], k: f32[2, 4, 4, 8], r: f32[8, 8]) {\n"
      "  m = triu(full([8, 8], -1e9), diagonal=1)\n"
      "  a = softmax(add(mul(matmul(q, k), 0.5), m), dim=-1)\n"
      "  b = mul(r, m)\n"
      "  return a, b\n}\n");
  LocalProgram p = programs(g)[0];
  int with_mask = 0;
  for (const LocalKernel& k : p.kernels) {
    with_mask += has_op(k, OpKind::Triu);
    if (has_op(k, OpKind::Triu)) {
      EXPECT_FALSE(k.group.params().empty()) << k.name;
    }
  }
  EXPECT_GE(with_mask, 2) << explain_kernels(p);
}

TEST(FuseGenerators, AGeneratedValueThatLeavesTheKernelsIsWrittenOnce) {
  // Returned: a kernel writes it (and the add reads the written value).
  Graph ret = parse("graph g(x: f32[4, 6]) {\n  m = tril(full([4, 6], 2.0))\n  y = add(x, m)\n  return y, m\n}\n");
  LocalProgram p = programs(ret)[0];
  int writers = 0;
  for (const LocalKernel& k : p.kernels)
    for (const Output& o : k.group.outputs()) writers += k.group.node(o.value).op == OpKind::Tril;
  EXPECT_EQ(writers, 1) << explain_kernels(p);

  // A matmul reads its operands from memory: a generated operand is materialised, and
  // the matmul kernel reads it as a param (through a view, in place).
  Graph mm = parse("graph g(x: f32[4, 6]) {\n  y = matmul(x, transpose(full([5, 6], 0.5), 0, 1))\n  return y\n}\n");
  LocalProgram q = programs(mm)[0];
  ASSERT_EQ(q.kernels.size(), 2u) << explain_kernels(q);
  EXPECT_EQ(q.kernels[0].kind, KernelKind::Pointwise);
  EXPECT_TRUE(q.kernels[0].group.params().empty());
  EXPECT_EQ(q.kernels[1].kind, KernelKind::Matmul);
  EXPECT_FALSE(has_op(q.kernels[1], OpKind::Full));
}

TEST(FuseGenerators, ALongGeneratedChainIsWrittenOnceNotCompiledIntoEveryReader) {
  std::string text = "graph g(x: f32[8], y: f32[4, 8], z: f32[3, 8]) {\n  a0 = cast(arange(8), f32)\n";
  for (int i = 1; i <= 200; ++i) text += "  a" + std::to_string(i) + " = add(a" + std::to_string(i - 1) + ", 1.0)\n";
  text += "  return add(x, a200), mul(y, a200), sub(z, a200)\n}\n";
  LocalProgram p = programs(parse(text))[0];
  size_t most = 0;
  for (const LocalKernel& k : p.kernels) most = std::max(most, k.ops.size());
  EXPECT_LE(most, 2u * 64) << explain_kernels(p);  // within max_ops plus what one kernel recomputes
  EXPECT_GE(p.kernels.size(), 4u);                 // the chain is written, in kernels of its own
}

// A generated value whose chain calls a transcendental, read with more dims than it
// has by a step that is not itself recomputed (a RoPE's cos table read by q), is
// written once by a kernel of its own: recomputed, the 16 sines would run at every one
// of the reader's 512 elements. Read at its own rank it is still recomputed, and a
// cheap chain (a causal mask) broadcast the same way too.
TEST(FuseGenerators, ACostlyTableBroadcastIntoALargerReaderIsWrittenOnce) {
  LocalProgram p = programs(parse("graph g(x: f32[4, 8, 16]) {\n  t = sin(mul(cast(arange(16), f32), 0.5))\n"
                                  "  y = mul(x, t)\n  return y\n}\n"))[0];
  ASSERT_EQ(p.kernels.size(), 2u) << explain_kernels(p);
  EXPECT_TRUE(has_op(p.kernels[0], OpKind::Sin));
  EXPECT_TRUE(p.kernels[0].group.params().empty()) << "computed from its index";
  EXPECT_FALSE(has_op(p.kernels[1], OpKind::Sin));
  EXPECT_EQ(p.kernels[1].group.params().size(), 2u) << "x and the table";
  LocalProgram same = programs(parse("graph g(x: f32[16]) {\n  t = sin(mul(cast(arange(16), f32), 0.5))\n"
                                     "  y = mul(x, t)\n  return y\n}\n"))[0];
  ASSERT_EQ(same.kernels.size(), 1u) << explain_kernels(same);
  EXPECT_TRUE(has_op(same.kernels[0], OpKind::Sin));
  LocalProgram cheap = programs(parse("graph g(x: f32[4, 8, 16]) {\n  t = mul(cast(arange(16), f32), 0.5)\n"
                                      "  y = mul(x, t)\n  return y\n}\n"))[0];
  ASSERT_EQ(cheap.kernels.size(), 1u) << explain_kernels(cheap);
}

TEST(FuseGenerators, WithoutFusionAGeneratorIsAKernelOfItsOwn) {
  Graph g = parse("graph g(x: f32[4, 6]) {\n  y = add(x, arange(6, dtype=f32))\n  return y\n}\n");
  LocalProgram p = programs(g, /*fused=*/false)[0];
  ASSERT_EQ(p.kernels.size(), 2u) << explain_kernels(p);
  EXPECT_TRUE(p.kernels[0].group.params().empty());
  EXPECT_EQ(programs(g)[0].kernels.size(), 1u);
}

TEST(FuseGenerators, PropagationBuildsEachRanksChunkInsteadOfSlicingAReplicatedValue) {
  // x is sharded by rows; the generated operand is wanted as S(0) too, and is built so
  // (arange's chunk and full's local shape), not built whole and sliced.
  Graph g = parse("mesh tp=4\ngraph g(x: f32[6, 5] {tp: S(0)}) {\n"
                  "  y = add(x, triu(full([6, 5], 3.0), diagonal=1))\n"
                  "  z = add(x, reshape(cast(arange(6), f32), shape=[6, 1]))\n"
                  "  return y {tp: S(0)}, z {tp: S(0)}\n}\n");
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(g, mesh);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (op_info(n.op).category == OpCategory::Generator || n.op == OpKind::Triu) {
      EXPECT_EQ(plan.nodes[i].output.str(g.mesh()), "{tp: S(0)}") << op_name(n.op);
    }
  }
  std::vector<LocalProgram> ps = ok_value(rank_programs(g, plan, mesh));
  for (const LocalProgram& p : ps) {
    EXPECT_EQ(count_steps(p, LocalStep::Kind::Slice), 0) << "rank " << p.rank;
    EXPECT_EQ(p.kernels.size(), 2u) << explain_kernels(p);
  }
  // Rank 1 holds rows 2 and 3: its triu's diagonal is 1 + 2 and its arange starts at 2.
  for (const LocalKernel& k : ps[1].kernels)
    for (const Node& n : k.group.nodes()) {
      if (n.op == OpKind::Triu) {
        EXPECT_EQ(n.attrs.get_int("diagonal"), 3);
      }
      if (n.op == OpKind::Arange) {
        EXPECT_EQ(n.attrs.get_int("start"), 2);
      }
      if (n.op == OpKind::Full) {
        EXPECT_EQ(n.attrs.get_ints("shape"), (std::vector<int64_t>{2, 5}));
      }
    }
}

TEST(FuseGenerators, UsersThatWantDifferentPlacementsKeepItReplicated) {
  Graph g = parse("mesh tp=2\ngraph g(x: f32[4, 6] {tp: S(0)}, w: f32[4, 6] {tp: S(1)}) {\n"
                  "  m = full([4, 6], 1.0)\n  return add(x, m) {tp: S(0)}, add(w, m) {tp: S(1)}\n}\n");
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(g, mesh);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].op == OpKind::Full) {
      EXPECT_EQ(plan.nodes[i].output.str(g.mesh()), "{tp: R}");
    }
}

}  // namespace fusion_fuse_test
}  // namespace sf

namespace sf {
namespace fusion_fuse_test {

// Sibling reductions (horizontal fusion): independent reductions of one shape over
// the same dims that read a value in common become one kernel, which reads it once;
// other dims, no common value, or one reading the other's result keep them apart.
TEST(Fuse, SiblingReductionsOverOneShapeShareAKernel) {
  // A layer norm backward's weight and bias gradients: dy read once, not twice.
  Graph ln = parse(
      "graph g(dy: bf16[64, 32], xhat: bf16[64, 32]) {\n  gw = sum(mul(dy, xhat), dims=[0])\n"
      "  gb = sum(dy, dims=[0])\n  return gw, gb\n}\n");
  LocalProgram p = programs(ln)[0];
  ASSERT_EQ(p.kernels.size(), 1u) << explain_kernels(p);
  EXPECT_EQ(p.kernels[0].kind, KernelKind::Reduction);
  EXPECT_EQ(p.kernels[0].bytes_read, 2 * 64 * 32 * 2) << "dy and xhat, each once";
  EXPECT_EQ(p.kernels[0].group.outputs().size(), 2u);
  // Three whole-tensor statistics of one param.
  Graph stats = parse(
      "graph g(x: f32[8, 100]) {\n  s = sum(x)\n  m = max(x)\n  r = sqrt(mean(mul(x, x)))\n  return s, m, r\n}\n");
  EXPECT_EQ(programs(stats)[0].kernels.size(), 1u) << explain_kernels(programs(stats)[0]);
  // Other dims, or nothing read in common: a kernel each.
  Graph dims = parse("graph g(x: f32[8, 100]) {\n  a = sum(x, dims=[0])\n  b = sum(x, dims=[1])\n  return a, b\n}\n");
  EXPECT_EQ(programs(dims)[0].kernels.size(), 2u);
  Graph apart = parse(
      "graph g(x: f32[8, 100], y: f32[8, 100]) {\n  a = sum(x, dims=[1])\n  b = sum(y, dims=[1])\n  return a, b\n}\n");
  EXPECT_EQ(programs(apart)[0].kernels.size(), 2u);
  // The second reads the first's result through a matmul: one kernel would be a cycle.
  Graph chain = parse(
      "graph g(x: f32[8, 100], w: f32[1, 100]) {\n  a = sum(x, dims=[1], keepdim=true)\n"
      "  h = matmul(a, w)\n  b = sum(mul(x, h), dims=[1])\n  return b\n}\n");
  LocalProgram c = programs(chain)[0];
  EXPECT_EQ(c.kernels.size(), 3u) << explain_kernels(c);
}

}  // namespace fusion_fuse_test
}  // namespace sf
