// Fusion's attention kernels (fuse.h, codegen/ir/attention_match.h): which steps one
// attention kernel takes (the scores, their chain, the softmax, the product with v,
// the prologue only it reads, the views it stores through), what stays out, and that
// no buffer of a rank's program holds the scores. Numerics: tests/kernels/
// flash_attention_test.cpp (the kernel) and the examples' `run --check`.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "codegen/dist/explain.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/attention_match.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "tests/result_util.h"

namespace sf {
namespace fusion_attention_test {

Graph parse(const std::string& text) {
  Result<Graph> g = parse_graph(text, "t.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

// An example with its one-dim mesh `mesh tp=4` given `world` ranks instead.
Graph example(const std::string& name, int world) {
  std::ifstream f(std::string(SF_SOURCE_DIR) + "/examples/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  const size_t at = text.find("mesh tp=4");
  if (at == std::string::npos) throw std::runtime_error(name + " has no `mesh tp=4`");
  text.replace(at, 9, "mesh tp=" + std::to_string(world));
  return parse(text);
}

std::vector<LocalProgram> programs(const Graph& g, bool flash = true) {
  DeviceMesh mesh(g.mesh());
  Graph d = decompose_for_sharding(g);
  RankPipelineOptions o;
  o.flash_attention = flash;
  return ok_value(rank_programs(d, propagate(d, mesh), mesh, o));
}

std::vector<const LocalKernel*> of_kind(const LocalProgram& p, KernelKind k) {
  std::vector<const LocalKernel*> out;
  for (const LocalKernel& x : p.kernels)
    if (x.kind == k) out.push_back(&x);
  return out;
}

bool has_op(const LocalKernel& k, const std::string& op) {
  return std::find(k.ops.begin(), k.ops.end(), op) != k.ops.end();
}

// A kernel that only moves data: pointwise, every op a view.
bool copies_only(const LocalKernel& k) {
  return k.kind == KernelKind::Pointwise && std::all_of(k.ops.begin(), k.ops.end(), [](const std::string& op) {
           std::optional<OpKind> o = find_op(op);
           return o && op_info(*o).category == OpCategory::Movement;
         });
}

// The LLaMA block: one attention kernel on every rank count, with q's RoPE (the
// rotate-half: neg of a slice, concat), the head splits and GQA's repeat inside it.
// k's RoPE is a pointwise kernel of its own: the attention would evaluate it again for
// every block of query rows (FuseAttention.KeysAndValuesTakeOnlyViewsAndCasts). On 2 ranks
// (heads split 2, 2) everything from the projections to the output projection is
// that kernel, which stores the head merge; on 4 (2 kv heads: the batch is split
// instead, q's RoPE before the all-to-all, the result redistributed back to the heads)
// the output projection reads the head merge in place. No kernel only copies. On 3 the
// projections' 24 features split 8, 8, 8 across heads of 6, so propagation moves the
// batch with all-to-alls around the permute and reshape, which stay copies (DTensor
// redistributes there too).
TEST(FuseAttention, LlamaBlockHasOneAttentionKernelAndNoCopies) {
  for (int world : {2, 3, 4}) {
    for (const LocalProgram& p : programs(example("llama_block.sf", world))) {
      std::vector<const LocalKernel*> a = of_kind(p, KernelKind::Attention);
      ASSERT_EQ(a.size(), 1u) << "world " << world << "\n" << explain_kernels(p);
      for (const char* op : {"matmul", "exp", "expand", "tril"})
        EXPECT_TRUE(has_op(*a[0], op)) << "world " << world << ": " << op << " not in " << a[0]->name;
      // q's RoPE in it, except on 4 ranks, where it comes before the all-to-all; k's
      // in a pointwise kernel (two such kernels on 4 ranks).
      const auto negs = std::count(a[0]->ops.begin(), a[0]->ops.end(), "neg");
      EXPECT_EQ(negs, world == 4 ? 0 : 1) << "world " << world << ": " << a[0]->name;
      EXPECT_EQ(std::count_if(p.kernels.begin(), p.kernels.end(),
                              [](const LocalKernel& k) { return k.kind == KernelKind::Pointwise && has_op(k, "neg"); }),
                world == 4 ? 2 : 1)
          << "world " << world << "\n" << explain_kernels(p);
      if (world == 3) continue;
      if (world == 2) {
        EXPECT_EQ(a[0]->ops.back(), "reshape") << "stores the head merge";
      }
      for (const LocalKernel& k : p.kernels) EXPECT_FALSE(copies_only(k)) << "world " << world << ": " << k.name;
    }
  }
  // q's RoPE reads its cos and sin tables, each written once by a kernel of its own
  // (FuseGenerators.ACostlyTableBroadcastIntoALargerReaderIsWrittenOnce): recomputed
  // in the attention they would cost libdevice's calls at every element of q.
  for (const LocalProgram& p : programs(example("llama_block.sf", 2))) {
    std::vector<const LocalKernel*> a = of_kind(p, KernelKind::Attention);
    for (const char* op : {"sin", "cos"}) {
      EXPECT_FALSE(has_op(*a[0], op)) << op << " (q's RoPE table) in " << a[0]->name;
      EXPECT_EQ(std::count_if(p.kernels.begin(), p.kernels.end(),
                              [&](const LocalKernel& k) {
                                return k.kind == KernelKind::Pointwise && has_op(k, op) && k.group.params().empty();
                              }),
                1)
          << op << "\n" << explain_kernels(p);
    }
  }
  // Without it (torch's math backend), the scores' matmul, the softmax and the product
  // with v are kernels of their own, and the views around them copy.
  const Graph g = example("llama_block.sf", 2);
  LocalProgram math = programs(g, false)[0];
  EXPECT_TRUE(of_kind(math, KernelKind::Attention).empty());
  EXPECT_GT(math.kernels.size(), programs(g)[0].kernels.size() + 5) << explain_kernels(math);
}

// At S = 2048 (the bench block's sequence) no value a rank's program reads or writes
// between kernels holds a [.., S, S] tensor: the scores live only inside the kernel.
// With --no-flash-attention they do.
TEST(FuseAttention, NoBufferHoldsTheScoresAtSequence2048) {
  const Graph g = parse(
      "mesh tp=2\n"
      "graph g(q: bf16[1, 4, 2048, 16] {tp: S(1)}, k: bf16[1, 2, 2048, 16] {tp: S(1)}, v: bf16[1, 2, 2048, 16] {tp: S(1)}) {\n"
      "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n"
      "  return out {tp: S(1)}\n}\n");
  auto largest = [](const LocalProgram& p) {
    int64_t most = 0;
    for (const LocalStep& s : p.steps) {
      std::vector<int> vals = s.in;
      vals.insert(vals.end(), s.outs.begin(), s.outs.end());
      if (s.out >= 0) vals.push_back(s.out);
      for (int v : vals) most = std::max(most, numel(p.types[static_cast<size_t>(v)].shape));
    }
    return most;
  };
  for (const LocalProgram& p : programs(g)) {
    ASSERT_EQ(of_kind(p, KernelKind::Attention).size(), 1u) << explain_kernels(p);
    EXPECT_LT(largest(p), int64_t{2048} * 2048) << explain_kernels(p);
  }
  EXPECT_GE(largest(programs(g, false)[0]), int64_t{2048} * 2048);
}

// What stays out of an attention kernel: scores or probabilities someone else reads
// (they must be written), and a softmax over another dim than the keys'.
TEST(FuseAttention, OnlyWhenNothingElseReadsTheScoresOrTheProbabilities) {
  const std::string params = "graph g(q: f32[2, 4, 8], k: f32[2, 4, 8], v: f32[2, 4, 8]) {\n";
  const std::string scores = "  s = mul(matmul(q, transpose(k, -2, -1)), 0.5)\n";
  struct Case {
    const char* what;
    std::string body;
    size_t attention;
  } cases[] = {
      {"plain", scores + "  o = matmul(softmax(s, dim=-1), v)\n  return o", 1},
      {"probabilities returned", scores + "  p = softmax(s, dim=-1)\n  o = matmul(p, v)\n  return o, p", 0},
      {"scores returned", scores + "  o = matmul(softmax(s, dim=-1), v)\n  return o, s", 0},
      {"scores read again", scores + "  o = add(matmul(softmax(s, dim=-1), v), sum(s, dims=[-1], keepdim=true))\n  return o", 0},
      {"softmax over the rows", scores + "  o = matmul(softmax(s, dim=-2), v)\n  return o", 0},
  };
  for (const Case& c : cases) {
    LocalProgram p = programs(parse(params + c.body + "\n}\n"))[0];
    EXPECT_EQ(of_kind(p, KernelKind::Attention).size(), c.attention) << c.what << "\n" << explain_kernels(p);
  }
}

// A prologue value that something else also reads stays a kernel's output: the
// attention kernel reads it and does not recompute it.
TEST(FuseAttention, APrologueValueReadElsewhereStaysOut) {
  LocalProgram p = programs(parse(
      "graph g(x: f32[2, 4, 8], k: f32[2, 4, 8], v: f32[2, 4, 8]) {\n"
      "  q = tanh(x)\n"
      "  o = matmul(softmax(mul(matmul(neg(q), transpose(k, -2, -1)), 0.5), dim=-1), v)\n"
      "  return o, q\n}\n"))[0];
  std::vector<const LocalKernel*> a = of_kind(p, KernelKind::Attention);
  ASSERT_EQ(a.size(), 1u) << explain_kernels(p);
  EXPECT_TRUE(has_op(*a[0], "neg")) << "read only by the attention: computed in its prologue";
  EXPECT_FALSE(has_op(*a[0], "tanh")) << "returned too: written once by its own kernel";
}

// k and v are evaluated once per block of query rows (L / block_m times over), so on
// their side only views and casts join the kernel. Arithmetic there is its own kernel,
// which computes each element once. q's prologue is evaluated once per element, so it
// takes arithmetic too.
TEST(FuseAttention, KeysAndValuesTakeOnlyViewsAndCasts) {
  const std::string params = "graph g(x: f32[2, 4, 8], y: f32[2, 4, 8], z: bf16[2, 4, 8]) {\n";
  struct Case {
    const char* what;
    std::string body;
    std::vector<const char*> in, out;  // ops in the attention kernel, ops in another kernel
  } cases[] = {
      {"arithmetic on q, k and v", "  o = matmul(softmax(mul(matmul(tanh(x), transpose(sin(y), -2, -1)), 0.5), dim=-1), neg(x))",
       {"tanh"}, {"sin", "neg"}},
      {"views and casts on k and v",
       "  o = matmul(softmax(mul(matmul(x, transpose(y, -2, -1)), 0.5), dim=-1), cast(permute(z, dims=[0, 1, 2]), dtype=f32))",
       {"transpose", "cast", "permute"}, {}},
      {"views after arithmetic",
       "  o = matmul(softmax(mul(matmul(x, transpose(reshape(sin(y), shape=[2, 4, 8]), -2, -1)), 0.5), dim=-1), x)",
       {"transpose", "reshape"}, {"sin"}},
  };
  for (const Case& c : cases) {
    LocalProgram p = programs(parse(params + c.body + "\n  return o\n}\n"))[0];
    std::vector<const LocalKernel*> a = of_kind(p, KernelKind::Attention);
    ASSERT_EQ(a.size(), 1u) << c.what << "\n" << explain_kernels(p);
    for (const char* op : c.in) EXPECT_TRUE(has_op(*a[0], op)) << c.what << ": " << op << "\n" << explain_kernels(p);
    for (const char* op : c.out) {
      EXPECT_FALSE(has_op(*a[0], op)) << c.what << ": " << op << "\n" << explain_kernels(p);
      EXPECT_TRUE(std::any_of(p.kernels.begin(), p.kernels.end(), [&](const LocalKernel& k) {
        return k.kind == KernelKind::Pointwise && has_op(k, op);
      })) << c.what << ": " << op << " computed once, in a pointwise kernel\n" << explain_kernels(p);
    }
    EXPECT_EQ(p.kernels.size(), 1 + c.out.size()) << c.what << "\n" << explain_kernels(p);
  }
}

// The share of (row, key) pairs a causal attention computes, counted by hand: rows
// see min(max(i + d + 1, 0), S) keys. The kernel's flops carry it.
TEST(FuseAttention, CausalWorkIsThePairsUnderTheDiagonal) {
  auto share = [](int64_t l, int64_t s, std::optional<int64_t> d) {
    AttentionMatch m;
    m.l = l;
    m.s = s;
    m.causal_diagonal = d;
    return visible_fraction(m);
  };
  EXPECT_DOUBLE_EQ(share(4, 4, 0), 10.0 / 16);        // 1 + 2 + 3 + 4
  EXPECT_DOUBLE_EQ(share(4, 10, 3), 22.0 / 40);       // 4 + 5 + 6 + 7
  EXPECT_DOUBLE_EQ(share(4, 9, -2), 3.0 / 36);        // 0 + 0 + 1 + 2
  EXPECT_DOUBLE_EQ(share(3, 2, 0), 5.0 / 6);          // 1 + 2 + 2
  EXPECT_DOUBLE_EQ(share(4, 4, 7), 1.0);              // every key
  EXPECT_DOUBLE_EQ(share(4, 4, -9), 0.0);             // none
  EXPECT_DOUBLE_EQ(share(4, 4, std::nullopt), 1.0);   // not causal
  EXPECT_NEAR(share(2048, 2048, 0), 0.5, 1e-3);
  // The kernel of a causal 8 x 8 attention does 36 of the 64 pairs' work: the plain
  // one's, plus the mask's `where` on the 64 scores, times 36 / 64.
  auto flops = [&](bool causal) {
    LocalProgram p = programs(parse(std::string("graph g(q: f32[1, 1, 8, 4], k: f32[1, 1, 8, 4], v: f32[1, 1, 8, 4]) {\n") +
                                    "  o = scaled_dot_product_attention(q, k, v, is_causal=" + (causal ? "true" : "false") +
                                    ")\n  return o\n}\n"))[0];
    return of_kind(p, KernelKind::Attention).at(0)->flops;
  };
  EXPECT_NEAR(static_cast<double>(flops(true)), (flops(false) + 64) * 36.0 / 64, 1.0);
}

}  // namespace fusion_attention_test
}  // namespace sf
