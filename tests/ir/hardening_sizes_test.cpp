// Sizes that overflow (issue 14, class 2): every element count, byte count and
// mesh size is computed with checked arithmetic, and any value (a param or any
// op's result) or mesh above the limits of codegen/ir/limits.h is refused with a
// located error, through the parser and through the C++ builder alike.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/ir/builder.h"
#include "codegen/ir/limits.h"
#include "codegen/ir/parser.h"

namespace sf {
namespace ir_hardening_sizes_test {

// The located error a graph text gets from the parser (empty if it is accepted).
std::string error_of(const std::string& text) {
  Result<Graph> g = parse_graph(text, "g.sf");
  return g.ok() ? std::string() : g.error().str();
}

#define EXPECT_ERROR_AT(text, where, words)                                                  \
  do {                                                                                       \
    std::string e_ = error_of(text);                                                         \
    EXPECT_EQ(e_.rfind(std::string("g.sf:") + (where) + ": error: ", 0), 0u) << "got: " << e_; \
    EXPECT_NE(e_.find(words), std::string::npos) << "got: " << e_;                           \
  } while (0)

TEST(CheckedArithmetic, ReportsWhatWouldWrap) {
  EXPECT_EQ(checked_mul(int64_t{1} << 62, 4), std::nullopt);
  EXPECT_EQ(checked_mul(-(int64_t{1} << 62), 2), INT64_MIN);  // fits exactly
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_EQ(checked_add(INT64_MAX, 1), std::nullopt);
  // numel() of the same shape wraps to 0: the sum-of-nothing bug.
  EXPECT_EQ(checked_numel({int64_t{1} << 62, 4}), std::nullopt);
  EXPECT_EQ(checked_numel({3, 0, int64_t{1} << 62}), 0);
  EXPECT_EQ(checked_numel({-1, 2}), std::nullopt);
  EXPECT_EQ(checked_nbytes({DType::I64, {int64_t{1} << 61}}), std::nullopt);
  EXPECT_EQ(checked_nbytes({DType::BF16, {3, 5}}), 30);
  EXPECT_EQ(checked_world_size(Mesh{{{"a", int64_t{1} << 32}, {"b", int64_t{1} << 32}}}), std::nullopt);
  EXPECT_EQ(checked_world_size(Mesh{{{"a", 3}, {"b", 5}}}), 15);
}

TEST(SizeLimits, TypesAtTheLimitPassAndOneStepBeyondFails) {
  EXPECT_EQ(check_type_limits({DType::F32, {kMaxElements}}), std::nullopt);  // 4 TiB: the byte limit exactly
  EXPECT_NE(check_type_limits({DType::F32, {kMaxElements + 1}}), std::nullopt);
  EXPECT_NE(check_type_limits({DType::I64, {kMaxElements}}), std::nullopt);  // 8 TiB
  EXPECT_EQ(check_type_limits({DType::I64, {kMaxElements / 2}}), std::nullopt);
  EXPECT_EQ(check_type_limits({DType::F32, Shape(kMaxRank, 1)}), std::nullopt);
  EXPECT_NE(check_type_limits({DType::F32, Shape(kMaxRank + 1, 1)}), std::nullopt);
  // An empty tensor is still held to its other dims: its strides are their products.
  EXPECT_NE(check_type_limits({DType::F32, {0, int64_t{1} << 30, int64_t{1} << 30}}), std::nullopt);
  EXPECT_NE(check_type_limits({DType::F32, {0, int64_t{1} << 62}}), std::nullopt);
  EXPECT_EQ(check_type_limits({DType::F32, {0, int64_t{1} << 20, int64_t{1} << 20}}), std::nullopt);
  EXPECT_NE(check_type_limits({DType::F32, {-1}}), std::nullopt);
  EXPECT_EQ(check_mesh_limits(Mesh{{{"dp", 32}, {"tp", 32}}}), std::nullopt);
  EXPECT_NE(check_mesh_limits(Mesh{{{"dp", 32}, {"tp", 33}}}), std::nullopt);
}

// The first case: check said ok, run summed nothing and printed 0.
TEST(SizeLimits, ExpandResultAboveTheLimitIsALocatedError) {
  EXPECT_ERROR_AT(
      "graph g(x: f32[1, 4]) {\n  y = expand(x, shape=[4611686018427387904, 4])\n  s = sum(y)\n  return s\n}\n",
      "2:7", "expand: result f32[4611686018427387904, 4]: dim 4611686018427387904 is above the limit of 2^40");
}

// Operands within the limits whose result is not: the matmul segfaulted.
TEST(SizeLimits, MatmulAndBroadcastResultsAreChecked) {
  EXPECT_ERROR_AT(
      "graph g(x: f32[1, 1], w: f32[1, 1]) {\n"
      "  a = expand(x, shape=[2097152, 1])\n"
      "  b = expand(w, shape=[1, 2097152])\n"
      "  y = matmul(a, b)\n"
      "  return y\n}\n",
      "4:7", "matmul: result f32[2097152, 2097152] has more than 2^40 elements");
  EXPECT_ERROR_AT(
      "graph g(x: f32[1073741824, 1], w: f32[1, 1073741824]) {\n  y = add(x, w)\n  return y\n}\n", "2:7",
      "add: result f32[1073741824, 1073741824] has more than 2^40 elements");
  // Each operand fine, the three-way broadcast of where is not.
  EXPECT_ERROR_AT(
      "graph g(c: bool[1048576, 1, 1], x: f32[1, 1048576, 1], w: f32[1, 1, 2]) {\n"
      "  y = where(c, x, w)\n  return y\n}\n",
      "2:7", "where: result");
}

TEST(SizeLimits, ParametersAreHeldToTheSameLimits) {
  // 2^41 elements: under the parser's old overflow bound (2^59), over the limit.
  EXPECT_ERROR_AT("graph g(x: f32[2097152, 1048576]) {\n  return x\n}\n", "1:9",
                  "parameter 'x': f32[2097152, 1048576] has more than 2^40 elements");
  EXPECT_ERROR_AT("graph g(x: i64[1099511627776]) {\n  return x\n}\n", "1:9", "has more than 2^42 bytes");
  EXPECT_ERROR_AT("graph g(x: f32[0, 4611686018427387904]) {\n  return x\n}\n", "1:9", "is above the limit");
  EXPECT_ERROR_AT("graph g(x: f32[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]) {\n  return x\n}\n", "1:9",
                  "17 dims is above the limit of 16 dims");
}

TEST(SizeLimits, ReshapeCountsAreChecked) {
  // The product of the target wrapped to 0 and matched the empty operand.
  EXPECT_ERROR_AT("graph g(x: f32[0]) {\n  y = reshape(x, shape=[4611686018427387904, 4, 0])\n  return y\n}\n", "2:7",
                  "reshape: [4611686018427387904, 4, 0] has more elements than fit in 64 bits");
  EXPECT_ERROR_AT("graph g(x: f32[0]) {\n  y = reshape(x, shape=[0, 1099511627777])\n  return y\n}\n", "2:7",
                  "reshape: result");
  EXPECT_ERROR_AT("graph g(x: f32[1]) {\n  y = reshape(x, shape=[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1])\n  return y\n}\n",
                  "2:7", "20 dims is above the limit");
  // Huge and negative attribute values are range errors, not wrapped indices.
  EXPECT_ERROR_AT("graph g(x: f32[2, 3]) {\n  y = permute(x, dims=[0, -9223372036854775808])\n  return y\n}\n", "2:7",
                  "permute: dim -9223372036854775808 is out of range");
  EXPECT_ERROR_AT("graph g(x: f32[2, 3]) {\n  y = sum(x, dims=[9223372036854775807])\n  return y\n}\n", "2:7",
                  "sum: dim 9223372036854775807 is out of range");
  EXPECT_ERROR_AT("graph g(x: f32[2, 3]) {\n  y = expand(x, shape=[-9223372036854775808, 2, 3])\n  return y\n}\n",
                  "2:7", "must be >= 0");
}

TEST(SizeLimits, MeshWhoseProductWrapsIsRefused) {
  // 2^32 * 2^32 wrapped to 0: check said "(0 ranks)" and run aborted.
  EXPECT_ERROR_AT("mesh a=4294967296 b=4294967296\ngraph g(x: f32[4]) {\n  return x\n}\n", "1:1",
                  "mesh 'a=4294967296 b=4294967296' has more than 2^63 - 1 ranks, above the limit of 1024");
  EXPECT_ERROR_AT("mesh dp=2 tp=513\ngraph g(x: f32[4]) {\n  return x\n}\n", "1:1",
                  "has 1026 ranks, above the limit of 1024");
  // tp=5000 took explain 3.9 s, and 20000 over 50 s (work grows as world^2).
  EXPECT_ERROR_AT("mesh tp=5000\ngraph g(x: f32[4]) {\n  return x\n}\n", "1:1", "above the limit of 1024");
  EXPECT_EQ(error_of("mesh dp=2 tp=512\ngraph g(x: f32[4]) {\n  return x\n}\n"), "");
}

// The verifier (which every Graph passes) applies the same limits as the parser:
// remesh rebuilds the graph on a new mesh through the builder and finish().
TEST(SizeLimits, RemeshOntoAMeshAboveTheLimitIsRefused) {
  Result<Graph> g = parse_graph("mesh tp=4\ngraph g(x: f32[8] {tp: S(0)}) {\n  y = neg(x)\n  return y\n}\n", "g.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  Result<Graph> big = remesh(*g, Mesh{{{"tp", int64_t{1} << 20}}});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("has 1048576 ranks, above the limit of 1024"), std::string::npos)
      << big.error().message;
  Result<Graph> wrapped = remesh(*g, Mesh{{{"tp", -1}}});
  ASSERT_FALSE(wrapped.ok());
}

TEST(SizeLimits, TheCppBuilderRefusesAtTheOp) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {1, 4});
  try {
    b.op(OpKind::Expand, {x}, {AttrValue(std::vector<int64_t>{int64_t{1} << 62, 4})}, {}, SourceLoc{7, 3});
    FAIL() << "expand to 2^64 elements was accepted";
  } catch (const DiagError& e) {
    EXPECT_EQ(e.diag.loc.line, 7);
    EXPECT_NE(e.diag.message.find("expand: result"), std::string::npos) << e.diag.message;
  }
}

// The limits leave room for every shipped graph: the examples and the real-size
// benchmark graphs all pass.
TEST(SizeLimits, EveryShippedGraphIsWithinThem) {
  namespace fs = std::filesystem;
  int n = 0;
  for (const char* dir : {"examples", "bench/graphs"})
    for (const auto& e : fs::recursive_directory_iterator(fs::path(SF_SOURCE_DIR) / dir)) {
      if (e.path().extension() != ".sf") continue;
      Result<Graph> g = parse_file(e.path().string());
      EXPECT_TRUE(g.ok()) << g.error().str();
      ++n;
    }
  EXPECT_GT(n, 10);
}

}  // namespace ir_hardening_sizes_test
}  // namespace sf
