// decompose(): composites become primitives with the same values (checked with the
// reference evaluator), and everything else about the graph is kept.
#include "codegen/ir/decompose.h"

#include <gtest/gtest.h>

#include <functional>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_decompose_test {

using test::run;

int count_composites(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes()) n += op_info(node.op).category == OpCategory::Composite;
  return n;
}

// Evaluates g and decompose(g) on the same seeded inputs and compares every output
// within atol = rtol = tol. Also checks the decomposition removed every composite.
void expect_same_values(const Graph& g, double tol) {
  Graph d = decompose(g);
  EXPECT_EQ(count_composites(d), 0);
  EXPECT_GT(d.nodes().size(), g.nodes().size());
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::vector<Tensor> in = random_inputs(g, seed);
    auto want = run(g, in);
    auto got = run(d, in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < want.size(); ++o) {
      ASSERT_EQ(got[o].type(), want[o].type());
      for (int64_t i = 0; i < want[o].numel(); ++i) {
        double w = want[o].get(i), v = got[o].get(i);
        EXPECT_NEAR(v, w, tol + tol * std::fabs(w)) << "output " << o << " element " << i << " seed " << seed;
      }
    }
  }
}

// f32 math with one rounding vs f32 math rounding every step: a few f32 ulps. bf16:
// the two may round to neighbouring bf16 values (spacing 2^-8 relative).
double tolerance(DType t) { return t == DType::F32 ? 1e-5 : 1.6e-2; }

class DecomposeTest : public ::testing::TestWithParam<DType> {};

Graph one_op(DType t, const std::function<Value(GraphBuilder&, Value)>& f, Shape shape = {3, 8}) {
  GraphBuilder b("g");
  Value x = b.param("x", t, shape);
  b.ret(f(b, x * 3.0));  // inputs in [-3, 3) reach the interesting parts of gelu/softmax
  return test::finish(b);
}

TEST_P(DecomposeTest, Gelu) {
  expect_same_values(one_op(GetParam(), [](GraphBuilder&, Value x) { return gelu(x); }), tolerance(GetParam()));
}

TEST_P(DecomposeTest, GeluTanh) {
  expect_same_values(one_op(GetParam(), [](GraphBuilder&, Value x) { return unary(OpKind::GeluTanh, x); }),
                     tolerance(GetParam()));
}

TEST_P(DecomposeTest, SoftmaxLastAndFirstDim) {
  expect_same_values(one_op(GetParam(), [](GraphBuilder&, Value x) { return softmax(x, -1); }),
                     tolerance(GetParam()));
  expect_same_values(one_op(GetParam(), [](GraphBuilder&, Value x) { return softmax(x, 0); }, {5, 2, 3}),
                     tolerance(GetParam()));
}

TEST_P(DecomposeTest, LogSoftmaxLastAndFirstDim) {
  expect_same_values(one_op(GetParam(), [](GraphBuilder&, Value x) { return log_softmax(x, -1); }),
                     tolerance(GetParam()));
  expect_same_values(one_op(GetParam(), [](GraphBuilder&, Value x) { return log_softmax(x, 0); }, {5, 2, 3}),
                     tolerance(GetParam()));
}

TEST_P(DecomposeTest, LayerNorm) {
  DType t = GetParam();
  expect_same_values(one_op(t, [t](GraphBuilder& b, Value x) {
                       Value w = b.param("w", t, {8});
                       return layer_norm(x, w, b.param("b", t, {8}));
                     }),
                     tolerance(t));
  // Over two trailing dims, with an f32 weight for a half input.
  expect_same_values(one_op(t, [](GraphBuilder& b, Value x) {
                       Value w = b.param("w", DType::F32, {2, 3});
                       return layer_norm(x, w, b.param("b", DType::F32, {2, 3}), 1e-3);
                     }, {4, 2, 3}),
                     tolerance(t));
}

TEST_P(DecomposeTest, RmsNorm) {
  DType t = GetParam();
  expect_same_values(one_op(t, [t](GraphBuilder& b, Value x) { return rms_norm(x, b.param("w", t, {8})); }),
                     tolerance(t));
}

TEST_P(DecomposeTest, HalfTypesComputeInF32) {
  DType t = GetParam();
  Graph d = decompose(one_op(t, [](GraphBuilder&, Value x) { return softmax(x); }));
  for (const Node& n : d.nodes()) {
    if (n.op == OpKind::Exp || n.op == OpKind::Sum || n.op == OpKind::Max || n.op == OpKind::Div) {
      EXPECT_EQ(n.type.dtype, DType::F32) << op_name(n.op);
    }
  }
  EXPECT_EQ(d.node(d.outputs()[0].value).type.dtype, t);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DecomposeTest, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Decompose, TransformerBlockKeepsNamesPlacementsAndOutputs) {
  GraphBuilder b("block", Mesh{{{"dp", 1}, {"tp", 2}}});
  Value x = b.param("x", DType::BF16, {4, 8}, b.spec({{"dp", Placement::shard(0)}}));
  Value w = b.param("w", DType::BF16, {8, 8}, b.spec({{"tp", Placement::shard(1)}}));
  Value g1 = b.param("g1", DType::BF16, {8});
  Value b1 = b.param("b1", DType::BF16, {8});
  Value h = layer_norm(x, g1, b1);
  b.name(h, "h");
  Value m = matmul(h, w);
  b.name(m, "m");
  b.constrain(m, b.spec({{"tp", Placement::shard(1)}}));
  Value a = gelu(m);
  b.name(a, "a");
  b.constrain(a, b.spec({{"tp", Placement::shard(1)}}));
  Value p = softmax(a + x);
  b.ret(a, b.spec({{"tp", Placement::shard(1)}}));
  b.ret(p);
  b.ret(rms_norm(m, g1), b.spec({}));
  Graph g = test::finish(b);
  ASSERT_EQ(count_composites(g), 4);

  Graph d = decompose(g);
  EXPECT_EQ(count_composites(d), 0);
  EXPECT_EQ(d.name(), g.name());
  EXPECT_EQ(d.mesh(), g.mesh());
  ASSERT_EQ(d.params().size(), g.params().size());
  for (size_t i = 0; i < g.params().size(); ++i) {
    const Node& want = g.node(g.params()[i]);
    const Node& got = d.node(d.params()[i]);
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.type, want.type);
    EXPECT_EQ(got.placement, want.placement);
  }
  // Every named value of g has the same name, type and constraint in d.
  for (const Node& want : g.nodes()) {
    if (want.name.empty()) continue;
    const Node* got = nullptr;
    for (const Node& n : d.nodes())
      if (n.name == want.name) got = &n;
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->type, want.type) << want.name;
    EXPECT_EQ(got->placement, want.placement) << want.name;
  }
  ASSERT_EQ(d.outputs().size(), g.outputs().size());
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    EXPECT_EQ(d.outputs()[i].name, g.outputs()[i].name);
    EXPECT_EQ(d.outputs()[i].placement, g.outputs()[i].placement);
    EXPECT_EQ(d.node(d.outputs()[i].value).type, g.node(g.outputs()[i].value).type);
  }
  EXPECT_TRUE(verify(d).ok());

  for (uint64_t seed : {7u, 8u}) {
    std::vector<Tensor> in = random_inputs(g, seed);
    auto want = run(g, in);
    auto got = run(d, in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < want.size(); ++o)
      for (int64_t i = 0; i < want[o].numel(); ++i)
        EXPECT_NEAR(got[o].get(i), want[o].get(i), 0.05 + 0.02 * std::fabs(want[o].get(i)))
            << "output " << o << " element " << i;
  }
}

TEST(Decompose, GraphWithoutCompositesComesBackUnchanged) {
  GraphBuilder b("plain", Mesh{{{"tp", 2}}});
  Value x = b.param("x", DType::F32, {2, 4}, b.spec({{"tp", Placement::shard(1)}}));
  Value y = relu(x * 2.0) + exp(x);
  b.name(y, "y");
  b.ret(sum(y, {1}), b.spec({{"tp", Placement::partial()}}));
  Graph g = test::finish(b);
  Graph d = decompose(g);
  ASSERT_EQ(d.nodes().size(), g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    EXPECT_EQ(d.nodes()[i].op, g.nodes()[i].op);
    EXPECT_EQ(d.nodes()[i].inputs, g.nodes()[i].inputs);
    EXPECT_EQ(d.nodes()[i].attrs, g.nodes()[i].attrs);
    EXPECT_EQ(d.nodes()[i].name, g.nodes()[i].name);
    EXPECT_EQ(d.nodes()[i].placement, g.nodes()[i].placement);
  }
  EXPECT_EQ(d.outputs().size(), g.outputs().size());
  EXPECT_EQ(d.outputs()[0].placement, g.outputs()[0].placement);
}

TEST(Decompose, SoftmaxOfAnEmptyTensor) {
  GraphBuilder b("e");
  b.ret(softmax(b.param("x", DType::F32, {3, 0}), -1));
  Graph g = test::finish(b);
  Graph d = decompose(g);
  EXPECT_EQ(count_composites(d), 0);
  auto out = run(d, {Tensor(DType::F32, {3, 0})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{3, 0}));
}

}  // namespace reference_decompose_test
}  // namespace sf
