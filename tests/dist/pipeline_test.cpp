// The whole distribution pipeline on the shipped examples and on small graphs:
// propagate -> lower -> schedule -> every rank run in lockstep, outputs gathered and
// compared with the reference evaluator on the global graph (the DTensorConverter
// idea applied to whole programs).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "codegen/dist/explain.h"
#include "tests/dist/pipeline_util.h"
#include "codegen/dist/lower.h"
#include "codegen/dist/schedule.h"
#include "codegen/fusion/pipeline.h"
#include "runtime/core/shard.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "codegen/dist/lockstep.h"
#include "tests/sanitized.h"

namespace sf {
namespace dist_pipeline_test {

using namespace dist_test;

TEST(Pipeline, EveryExampleMatchesTheReference) {
  for (const char* e : kExamples) {
    run_and_check(example(e), 1, e);
    run_and_check(example(e), 1, std::string(e) + " unfused", /*fused=*/false);
  }
}

TEST(Pipeline, OneDimExamplesOnThreeRanksWithUnevenShards) {
  for (const char* e : kExamples) {
    Graph g = example(e);
    if (g.mesh().dims.size() != 1) continue;
    Mesh m = g.mesh();
    m.dims[0].size = 3;
    Result<Graph> g3 = remesh(g, m);
    ASSERT_TRUE(g3.ok()) << g3.error().str();
    run_and_check(*g3, 2, std::string(e) + " on 3 ranks");
  }
}

TEST(Pipeline, ConstraintsAndUnevenAndEmptyShards) {
  // 5 rows on 4 ranks: chunks 2, 2, 1, 0; a constraint forces a reshard mid-graph.
  GraphBuilder b("g", Mesh{{{"tp", 4}}});
  Value x = b.param("x", DType::F32, {5, 3}, b.spec({{"tp", Placement::shard(0)}}));
  Value w = b.param("w", DType::F32, {3, 2});
  Value h = relu(matmul(x, w));
  b.name(h, "h");
  const PlacementSpec cols = b.spec({{"tp", Placement::shard(1)}});
  b.constrain(h, cols);
  Value s = sum(h * 2.0, {1});
  b.ret(s, b.spec({}));
  b.ret(h);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  Ran r = run_and_check(*g, 6, "constrained");
  EXPECT_EQ(r.plan.nodes[static_cast<size_t>(h.id)].value, cols);
}

TEST(Pipeline, TwoDimMeshWithNestedSharding) {
  GraphBuilder b("g", Mesh{{{"dp", 2}, {"tp", 2}}});
  Value x = b.param("x", DType::F32, {7, 6}, b.spec({{"dp", Placement::shard(0)}, {"tp", Placement::shard(0)}}));
  Value y = softmax(x * 3.0, -1) + 1.0;
  b.ret(y, b.spec({{"tp", Placement::shard(1)}}));
  b.ret(sum(x, {0}));
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  run_and_check(*g, 7, "nested");
}

// The DTensorConverter idea over whole programs: every op as a one-op graph, every
// combination of input placements (R, S(0), S(-1), P) on mesh [4], and a sample of
// them on [2, 2]; propagation must redistribute whatever it is given and the
// gathered result must equal the reference. Shapes are uneven on 4 ranks (5, 6, 7).
struct OpCase {
  std::vector<std::pair<std::string, std::string>> params;  // name, type
  std::string expr;
};

std::vector<OpCase> op_cases() {
  std::vector<OpCase> c;
  const std::pair<std::string, std::string> a{"a", "f32[5, 6]"}, b{"b", "f32[6]"};
  for (const char* u : {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "silu", "sin", "cos",
                        "reciprocal", "erf", "gelu", "gelu_tanh"})
    c.push_back({{a}, std::string(u) + "(a)"});
  c.push_back({{a}, "cast(a, bf16)"});
  for (const char* bin : {"add", "sub", "mul", "div", "maximum", "minimum", "pow"})
    c.push_back({{a, b}, std::string(bin) + "(a, b)"});
  c.push_back({{a}, "mul(a, 2.5)"});
  c.push_back({{{"a", "f32[5, 1]"}, {"b", "f32[1, 7]"}}, "add(a, b)"});
  for (const char* cmp : {"eq", "ne", "lt", "le", "gt", "ge"}) c.push_back({{a, b}, std::string(cmp) + "(a, b)"});
  c.push_back({{a, b}, "where(gt(a, 0.0), a, b)"});
  c.push_back({{a}, "sum(a, dims=[0])"});
  c.push_back({{a}, "max(a, dims=[1], keepdim=true)"});
  c.push_back({{a}, "min(a)"});
  c.push_back({{a}, "mean(a, dims=[1])"});
  c.push_back({{a, {"w", "f32[6, 7]"}}, "matmul(a, w)"});
  c.push_back({{{"x", "f32[2, 5, 6]"}, {"w", "f32[6, 3]"}}, "matmul(x, w)"});
  c.push_back({{a}, "transpose(a, 0, 1)"});
  c.push_back({{{"x", "f32[2, 5, 6]"}}, "permute(x, dims=[2, 0, 1])"});
  c.push_back({{{"x", "f32[8, 4]"}}, "reshape(x, shape=[32])"});
  c.push_back({{{"x", "f32[32]"}}, "reshape(x, shape=[8, 4])"});
  c.push_back({{{"x", "f32[5, 1]"}}, "expand(x, shape=[3, 5, 6])"});
  c.push_back({{a}, "slice(a, dim=1, start=1, end=6, step=2)"});
  c.push_back({{a}, "slice(a, dim=0, start=-4, end=-1)"});
  c.push_back({{a, {"c", "f32[5, 2]"}}, "concat(c, neg(a), c, dim=-1)"});
  c.push_back({{{"i", "i64[5, 2]"}, {"w", "f32[10, 4]"}}, "embedding(i, w)"});
  // Index ops: x sharded or Partial through them; the vocabulary-parallel lookups when
  // the table is S(0) (embedding) or S(dim) (index_select) and the indices are whole.
  c.push_back({{{"x", "f32[5, 6]"}, {"i", "i64[5, 3]"}}, "gather(x, i, dim=1)"});
  c.push_back({{{"x", "f32[5, 6]"}, {"i", "i32[7]"}}, "index_select(exp(x), i, dim=0)"});
  c.push_back({{{"x", "f32[5, 6]"}, {"i", "i64[3, 6]"}, {"s", "f32[3, 6]"}}, "scatter_add(x, i, s, dim=0)"});
  c.push_back({{a}, "softmax(a, dim=1)"});
  c.push_back({{a, {"w", "f32[6]"}, {"c", "f32[6]"}}, "layer_norm(a, w, c)"});
  c.push_back({{a, {"w", "f32[6]"}}, "rms_norm(a, w)"});
  c.push_back({{a}, "redistribute(a, {tp: S(1)})"});
  c.push_back({{{"x", "i32[5, 6]"}, {"y", "i32[6]"}}, "mul(add(x, y), 3)"});
  c.push_back({{{"x", "bf16[5, 6]"}}, "sum(x, dims=[1])"});
  c.push_back({{}, "arange(7, start=-3, step=2, dtype=f32)"});
  c.push_back({{}, "full(shape=[5, 6], value=1.5)"});
  c.push_back({{a}, "tril(a, diagonal=1)"});
  c.push_back({{a}, "triu(a, diagonal=-2)"});
  c.push_back({{a}, "log_softmax(a, dim=1)"});
  // cumsum over each dim (S(0) of 5 rows on 4 ranks: the carry over uneven chunks),
  // argmax/argmin of a value with ties and NaN-free random data.
  c.push_back({{a}, "cumsum(a, dim=0)"});
  c.push_back({{{"x", "i32[5, 6]"}}, "cumsum(x, dim=-1)"});
  c.push_back({{a}, "argmax(a, dim=0)"});
  c.push_back({{a}, "argmin(a, dim=1, keepdim=true)"});
  // The mask is drawn by global index: every placement must give the reference's mask
  // (a wrong mask is a 0 where the reference has 2a, far beyond the tolerance).
  c.push_back({{a}, "dropout(a, p=0.5, seed=7)"});
  c.push_back({{a, b}, "add(dropout(a, 3, p=0.25), b)"});
  // cross_entropy, decomposed before propagation: S(-1) shards the 7 classes 2, 2, 2, 1
  // (vocabulary parallel); ignore_index 2 is among the random targets in [0, 7).
  c.push_back({{{"x", "f32[5, 7]"}, {"t", "i64[5]"}}, "cross_entropy(x, t, ignore_index=2)"});
  c.push_back({{{"x", "f32[3, 5, 2]"}, {"t", "i32[3, 2]"}}, "cross_entropy(x, t, reduction=none)"});
  // Attention: causal GQA (6 query heads over 3 kv heads; the sweep's S(0) cuts the
  // heads), and a bool mask made from aranges with a batch dim and a given scale.
  c.push_back({{{"q", "f32[6, 5, 2]"}, {"k", "f32[3, 4, 2]"}, {"v", "f32[3, 4, 3]"}},
               "scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)"});
  c.push_back({{{"q", "f32[2, 2, 5, 2]"}, {"k", "f32[2, 2, 4, 2]"}, {"v", "f32[2, 2, 4, 2]"}},
               "scaled_dot_product_attention(q, k, v, le(arange(4), reshape(arange(5), shape=[5, 1])), scale=0.5)"});
  // Generated operands of a sharded op: each rank builds only its chunk of them.
  c.push_back({{a}, "add(a, triu(full([5, 6], -3.0), diagonal=2))"});
  c.push_back({{a}, "where(ge(reshape(arange(5), shape=[5, 1]), arange(6)), a, 0.0)"});
  return c;
}

TEST(Converter, EveryOpUnderEveryInputPlacement) {
  const Placement choices[] = {Placement::replicate(), Placement::shard(0), Placement::shard(-1), Placement::partial()};
  // Every combination on the 1-D mesh (a sample in the sanitizer build, below); on the
  // 2-D one every 7th (every 15th in the sanitizer build, tests/sanitized.h), walking
  // through the pairs of placements.
  const std::pair<Mesh, size_t> meshes[] = {{Mesh{{{"tp", 4}}}, 1},
                                            {Mesh{{{"dp", 2}, {"tp", 2}}}, test::kSanitized ? 15 : 7}};
  std::set<std::string> covered;
  int runs = 0;
  for (const OpCase& oc : op_cases()) {
    covered.insert(oc.expr.substr(0, oc.expr.find('(')));
    for (const auto& [mesh, stride] : meshes) {
      size_t per_param = static_cast<size_t>(std::pow(4, mesh.dims.size()));
      size_t combos = 1;
      for (size_t k = 0; k < oc.params.size(); ++k) combos *= per_param;
      // The sanitizer build's sample of the 1-D mesh: with two or more params every
      // fifth combination (5 is coprime to 4, so each param still takes every
      // placement); one param keeps all four.
      size_t step = test::kSanitized && stride == 1 && oc.params.size() >= 2 ? 5 : stride;
      // On the 2-D mesh an op of three params has 4096 combinations, 274 runs at every
      // 15th: most of the test's 47 s under the sanitizers (18 s since, docs/testing.md,
      // "CI time"). There every 127th (33 runs; 127 is 15 mod 16, so the first param
      // still walks all 16 of its 2-D placements, and the others move on as it wraps).
      if (test::kSanitized && stride > 1 && oc.params.size() >= 3) step = 127;
      for (size_t combo = 0; combo < combos; combo += step) {
        std::string params;
        size_t rest = combo;
        for (const auto& [name, type] : oc.params) {
          size_t pick = rest % per_param;
          rest /= per_param;
          std::string spec = "{";
          for (size_t d = 0; d < mesh.dims.size(); ++d) {
            spec += (d ? ", " : "") + mesh.dims[d].name + ": " + choices[pick % 4].str();
            pick /= 4;
          }
          params += (params.empty() ? "" : ", ") + name + ": " + type + " " + spec + "}";
        }
        std::string text = "mesh " + mesh.str() + "\ngraph g(" + params + ") {\n  out = " + oc.expr + "\n  return out\n}\n";
        Result<Graph> g = parse_graph(text, "case.sf");
        ASSERT_TRUE(g.ok()) << g.error().str() << "\n" << text;
        run_and_check(*g, combo, text);
        ++runs;
        if (HasFailure()) return;
      }
    }
  }
  for (const OpInfo& info : all_ops()) {
    if (info.category == OpCategory::Leaf || info.category == OpCategory::Collective) continue;
    EXPECT_TRUE(covered.count(std::string(info.name))) << info.name << " has no case";
  }
  EXPECT_TRUE(covered.count("redistribute"));
  RecordProperty("runs", runs);
}

}  // namespace dist_pipeline_test
}  // namespace sf
