// random_inputs(): deterministic per seed, in the documented ranges, and valid for
// embeddings.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_random_inputs_test {

bool same_bytes(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i].type() == b[i].type()) || std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()) != 0)
      return false;
  return true;
}

Graph mixed_graph() {
  GraphBuilder b("mixed");
  Value x = b.param("x", DType::F32, {16, 8});
  Value h = b.param("h", DType::BF16, {32});
  Value c = b.param("c", DType::Bool, {64});
  Value n = b.param("n", DType::I32, {64});
  Value tok = b.param("tok", DType::I64, {200});
  Value w = b.param("w", DType::F32, {5, 8});
  b.ret(x);
  b.ret(h);
  b.ret(c);
  b.ret(n);
  b.ret(embedding(tok, w));
  return test::finish(b);
}

TEST(RandomInputs, OneTensorPerParamOfItsType) {
  Graph g = mixed_graph();
  auto in = random_inputs(g, 0);
  ASSERT_EQ(in.size(), g.params().size());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i].type(), g.node(g.params()[i]).type);
  // The inputs are valid for the evaluator.
  EXPECT_TRUE(evaluate(g, in).ok());
}

TEST(RandomInputs, DeterministicPerSeed) {
  Graph g = mixed_graph();
  EXPECT_TRUE(same_bytes(random_inputs(g, 42), random_inputs(g, 42)));
  EXPECT_FALSE(same_bytes(random_inputs(g, 42), random_inputs(g, 43)));
  // Each param's tensor differs between seeds, not just one of them.
  auto a = random_inputs(g, 42), b = random_inputs(g, 43);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NE(std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()), 0) << "param " << i;
}

TEST(RandomInputs, Ranges) {
  Graph g = mixed_graph();
  auto in = random_inputs(g, 5);
  double lo = 1, hi = -1;
  for (int64_t i = 0; i < in[0].numel(); ++i) {
    double v = in[0].get(i);
    EXPECT_GE(v, -1.0);
    EXPECT_LT(v, 1.0);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LT(lo, -0.5);  // 128 draws spread over [-1, 1)
  EXPECT_GT(hi, 0.5);
  for (int64_t i = 0; i < in[1].numel(); ++i) {  // bf16 may round up to 1.0
    EXPECT_GE(in[1].get(i), -1.0);
    EXPECT_LE(in[1].get(i), 1.0);
  }
  int trues = 0;
  for (int64_t i = 0; i < in[2].numel(); ++i) trues += static_cast<int>(in[2].get_int(i));
  EXPECT_GT(trues, 0);
  EXPECT_LT(trues, 64);
  std::vector<int> seen(8, 0);
  for (int64_t i = 0; i < in[3].numel(); ++i) {
    int64_t v = in[3].get_int(i);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 8);
    ++seen[static_cast<size_t>(v)];
  }
  for (int s : seen) EXPECT_GT(s, 0);  // 64 draws over 8 values
}

TEST(RandomInputs, EmbeddingIndicesAreRowsOfTheWeight) {
  Graph g = mixed_graph();
  for (uint64_t seed = 0; seed < 10; ++seed) {
    auto in = random_inputs(g, seed);
    std::vector<int> seen(5, 0);
    for (int64_t i = 0; i < in[4].numel(); ++i) {
      int64_t v = in[4].get_int(i);
      ASSERT_GE(v, 0);
      ASSERT_LT(v, 5);
      ++seen[static_cast<size_t>(v)];
    }
    for (int s : seen) EXPECT_GT(s, 0);  // 200 draws over 5 rows
  }
}

TEST(RandomInputs, IndicesThroughAReshapeUseTheSmallestWeight) {
  GraphBuilder b("e");
  Value tok = b.param("tok", DType::I32, {4, 25});
  Value flat = reshape(tok, {100});
  b.ret(embedding(flat, b.param("big", DType::F32, {50, 2})));
  b.ret(embedding(tok, b.param("small", DType::F32, {3, 2})));
  Graph g = test::finish(b);
  auto in = random_inputs(g, 9);
  for (int64_t i = 0; i < in[0].numel(); ++i) ASSERT_LT(in[0].get_int(i), 3);
  EXPECT_TRUE(evaluate(g, in).ok());
}

}  // namespace reference_random_inputs_test
}  // namespace sf
