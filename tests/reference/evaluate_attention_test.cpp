// scaled_dot_product_attention: the reference evaluator and the decomposition (run by
// the same evaluator as primitives) against values worked out by hand on a tiny case,
// and the two against each other on seeded inputs (GQA, masks, per-rank attributes).
//
// The hand case: one head, L = S = 2, E = Ev = 1, scale 1 (1/sqrt(E) with E = 1):
//   q = [1, 0], k = [0, ln 3], v = [2, 6]
//   row 0 scores [0, ln 3] -> softmax [1/4, 3/4] -> 2/4 + 18/4 = 5
//   row 1 scores [0, 0]    -> softmax [1/2, 1/2] -> 4
//   causal (key j for query i when j <= i): row 0 keeps only key 0 -> 2; row 1 -> 4.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "codegen/ir/decompose.h"
#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_attention_test {

using test::expect_close;
using test::run;
using test::tensor;
using test::values;

const double kLn3 = std::log(3.0);

struct Attn {
  Shape q, k, v;
  std::optional<Tensor> mask;
  std::vector<std::pair<std::string, AttrValue>> attrs;
};

// The op's outputs from the reference and from its decomposition.
std::pair<std::vector<double>, std::vector<double>> both(const Attn& a, const Tensor& q, const Tensor& k,
                                                         const Tensor& v) {
  GraphBuilder b("a");
  std::vector<Value> in{b.param("q", DType::F32, a.q), b.param("k", DType::F32, a.k), b.param("v", DType::F32, a.v)};
  std::vector<Tensor> args{q, k, v};
  if (a.mask) {
    in.push_back(b.param("m", a.mask->dtype(), a.mask->shape()));
    args.push_back(*a.mask);
  }
  b.ret(b.op(OpKind::ScaledDotProductAttention, in, {}, a.attrs));
  Graph g = test::finish(b);
  auto want = run(g, args);
  auto got = run(decompose(g), args);
  if (want.empty() || got.empty()) return {};
  return {values(want[0]), values(got[0])};
}

void expect_both(const Attn& a, const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<double>& want) {
  auto [ref, dec] = both(a, q, k, v);
  expect_close(ref, want, 1e-6);
  expect_close(dec, want, 1e-6);
}

Tensor q1() { return tensor(DType::F32, {1, 2, 1}, {1, 0}); }
Tensor k1() { return tensor(DType::F32, {1, 2, 1}, {0, kLn3}); }
Tensor v1() { return tensor(DType::F32, {1, 2, 1}, {2, 6}); }

TEST(EvaluateAttention, HandCase) {
  expect_both({{1, 2, 1}, {1, 2, 1}, {1, 2, 1}, {}, {}}, q1(), k1(), v1(), {5, 4});
}

TEST(EvaluateAttention, CausalIsTopLeftAligned) {
  expect_both({{1, 2, 1}, {1, 2, 1}, {1, 2, 1}, {}, {{"is_causal", true}}}, q1(), k1(), v1(), {2, 4});
  // query_offset 1 (a rank holding global rows from 1 on): row 0 is global row 1 and
  // sees both keys (5), row 1 is global row 2 (4).
  expect_both({{1, 2, 1}, {1, 2, 1}, {1, 2, 1}, {}, {{"is_causal", true}, {"query_offset", int64_t{1}}}}, q1(), k1(),
              v1(), {5, 4});
  // Bottom-right alignment by hand: L = 1 query against S = 2 keys with query_offset
  // S - L = 1 sees both keys; with 0, only key 0.
  Tensor q = tensor(DType::F32, {1, 1, 1}, {1});
  expect_both({{1, 1, 1}, {1, 2, 1}, {1, 2, 1}, {}, {{"is_causal", true}, {"query_offset", int64_t{1}}}}, q, k1(), v1(),
              {5});
  expect_both({{1, 1, 1}, {1, 2, 1}, {1, 2, 1}, {}, {{"is_causal", true}}}, q, k1(), v1(), {2});
}

TEST(EvaluateAttention, ScaleGiven) {
  // scale 2: row 0 scores [0, 2 ln 3] -> [1/10, 9/10] -> 0.2 + 5.4 = 5.6; row 1 -> 4.
  expect_both({{1, 2, 1}, {1, 2, 1}, {1, 2, 1}, {}, {{"scale", 2.0}}}, q1(), k1(), v1(), {5.6, 4});
  // The default is 1/sqrt(E): E = 4 with q = [1, 1, 1, 1] and k rows [0, 0, 0, 0] and
  // [1, 1, 1, 1] gives scores [0, 4 / 2] = [0, 2] -> [1, e^2] / (1 + e^2) on v [2, 6]:
  // (2 + 6 e^2) / (1 + e^2).
  const double e2 = std::exp(2.0);
  expect_both({{1, 1, 4}, {1, 2, 4}, {1, 2, 1}, {}, {}}, tensor(DType::F32, {1, 1, 4}, {1, 1, 1, 1}),
              tensor(DType::F32, {1, 2, 4}, {0, 0, 0, 0, 1, 1, 1, 1}), v1(), {(2 + 6 * e2) / (1 + e2)});
}

TEST(EvaluateAttention, BoolAndAdditiveMasks) {
  // true takes part: row 0 only key 0 (2), row 1 only key 1 (6).
  Attn a{{1, 2, 1}, {1, 2, 1}, {1, 2, 1}, test::itensor(DType::Bool, {2, 2}, {1, 0, 0, 1}), {}};
  expect_both(a, q1(), k1(), v1(), {2, 6});
  // Added: row 0 [0, ln 3 - ln 3] = [0, 0] -> 4; row 1 [0, -1e9] -> 2. The mask
  // broadcasts over its missing head dim.
  a.mask = tensor(DType::F32, {2, 2}, {0, -kLn3, 0, -1e9});
  expect_both(a, q1(), k1(), v1(), {4, 2});
}

TEST(EvaluateAttention, FullyMaskedRowIsNaN) {
  Attn a{{1, 2, 1}, {1, 2, 1}, {1, 2, 1}, test::itensor(DType::Bool, {2, 2}, {0, 0, 1, 1}), {}};
  auto [ref, dec] = both(a, q1(), k1(), v1());
  ASSERT_EQ(ref.size(), 2u);
  ASSERT_EQ(dec.size(), 2u);
  EXPECT_TRUE(std::isnan(ref[0]));
  EXPECT_TRUE(std::isnan(dec[0]));
  EXPECT_NEAR(ref[1], 4, 1e-6);
  EXPECT_NEAR(dec[1], 4, 1e-6);
}

TEST(EvaluateAttention, NoKeysGiveZeros) {
  Tensor none(DType::F32, {1, 0, 1});
  expect_both({{1, 2, 1}, {1, 0, 1}, {1, 0, 1}, {}, {}}, q1(), none, none, {0, 0});
}

// Two kv heads: head 0 as the hand case; head 1 has k = [ln 3, 0] and v = [10, 2]:
// row 0 scores [ln 3, 0] -> [3/4, 1/4] -> 7.5 + 0.5 = 8; row 1 -> (10 + 2) / 2 = 6.
Tensor k2() { return tensor(DType::F32, {2, 2, 1}, {0, kLn3, kLn3, 0}); }
Tensor v2() { return tensor(DType::F32, {2, 2, 1}, {2, 6, 10, 2}); }

TEST(EvaluateAttention, GroupedQueryHeadsReadTheirKvHead) {
  // 4 query heads, all q = [1, 0], over 2 kv heads: heads 0, 1 read kv head 0 and
  // heads 2, 3 kv head 1 (torch's repeat_interleave).
  Tensor q = tensor(DType::F32, {4, 2, 1}, {1, 0, 1, 0, 1, 0, 1, 0});
  expect_both({{4, 2, 1}, {2, 2, 1}, {2, 2, 1}, {}, {{"enable_gqa", true}}}, q, k2(), v2(), {5, 4, 5, 4, 8, 6, 8, 6});
}

TEST(EvaluateAttention, PerRankHeadsReadTheKvHeadsOfTheirGlobalIndex) {
  // A rank holding global query heads 1..2 of 4 (groups of 2) with both kv heads:
  // head_offset 1, gqa_group 2: local head 0 is global 1 (kv 0), local 1 is global 2
  // (kv 1).
  Tensor q = tensor(DType::F32, {2, 2, 1}, {1, 0, 1, 0});
  expect_both({{2, 2, 1}, {2, 2, 1}, {2, 2, 1}, {}, {{"head_offset", int64_t{1}}, {"gqa_group", int64_t{2}}}}, q, k2(),
              v2(), {5, 4, 8, 6});
  // Without GQA a rank holding global head 1 of 2 with both kv heads: head_offset 1.
  expect_both({{1, 2, 1}, {2, 2, 1}, {2, 2, 1}, {}, {{"head_offset", int64_t{1}}, {"gqa_group", int64_t{1}}}}, q1(),
              k2(), v2(), {8, 6});
}

// The decomposition against the reference on seeded inputs: batch dims, GQA with a
// head offset, causal with a query offset, masks, bf16.
TEST(EvaluateAttention, DecompositionMatchesTheReference) {
  struct Case {
    DType t;
    Shape q, k, v;
    std::optional<std::pair<DType, Shape>> mask;
    std::vector<std::pair<std::string, AttrValue>> attrs;
  };
  const Case cases[] = {
      {DType::F32, {2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 3}, {}, {{"is_causal", true}}},
      {DType::F32, {6, 5, 4}, {2, 7, 4}, {2, 7, 4}, {}, {{"enable_gqa", true}, {"is_causal", true}}},
      {DType::F32, {3, 5, 4}, {2, 7, 4}, {2, 7, 4}, {}, {{"head_offset", int64_t{2}}, {"gqa_group", int64_t{3}},
                                                         {"is_causal", true}, {"query_offset", int64_t{3}}}},
      {DType::F32, {2, 5, 4}, {2, 7, 4}, {2, 7, 2}, std::pair{DType::Bool, Shape{5, 7}}, {{"scale", 0.3}}},
      {DType::F32, {2, 5, 4}, {2, 7, 4}, {2, 7, 2}, std::pair{DType::F32, Shape{2, 1, 7}}, {}},
      {DType::BF16, {2, 5, 8}, {1, 7, 8}, {1, 7, 8}, {}, {{"enable_gqa", true}, {"is_causal", true}}},
      // No query heads (0 is a multiple of 2): nothing to compute, k and v picked empty.
      {DType::F32, {0, 5, 4}, {2, 7, 4}, {2, 7, 4}, {}, {{"enable_gqa", true}}},
  };
  for (const Case& c : cases) {
    GraphBuilder b("a");
    std::vector<Value> in{b.param("q", c.t, c.q), b.param("k", c.t, c.k), b.param("v", c.t, c.v)};
    if (c.mask) in.push_back(b.param("m", c.mask->first, c.mask->second));
    b.ret(b.op(OpKind::ScaledDotProductAttention, in, {}, c.attrs));
    Graph g = test::finish(b);
    const double tol = c.t == DType::F32 ? 1e-5 : 3e-2;
    for (uint64_t seed : {1u, 2u}) {
      std::vector<Tensor> args = random_inputs(g, seed);
      auto want = run(g, args);
      auto got = run(decompose(g), args);
      ASSERT_EQ(want.size(), 1u);
      ASSERT_EQ(got.size(), 1u);
      ASSERT_EQ(got[0].type(), want[0].type());
      for (int64_t i = 0; i < want[0].numel(); ++i) {
        const double w = want[0].get(i), v = got[0].get(i);
        if (std::isnan(w)) EXPECT_TRUE(std::isnan(v)) << i;
        else EXPECT_NEAR(v, w, tol + tol * std::fabs(w)) << "element " << i << " seed " << seed;
      }
    }
  }
}

}  // namespace reference_evaluate_attention_test
}  // namespace sf
