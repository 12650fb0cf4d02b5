// The C++ builder: operator overloads, eager shape checks, verified graphs, and
// that a built graph prints as the text a user would write.
#include <gtest/gtest.h>

#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/ir/printer.h"

namespace sf {
namespace ir_builder_test {

TEST(Builder, BuildsTheMlpWithOperators) {
  GraphBuilder b("mlp", Mesh{{{"tp", 4}}});
  Value x = b.param("x", DType::F32, {20, 10});
  Value w1 = b.param("w1", DType::F32, {16, 10}, b.spec({{"tp", Placement::shard(0)}}));
  Value b1 = b.param("b1", DType::F32, {16}, b.spec({{"tp", Placement::shard(0)}}));
  Value w2 = b.param("w2", DType::F32, {10, 16}, b.spec({{"tp", Placement::shard(1)}}));
  Value b2 = b.param("b2", DType::F32, {10});
  Value h = matmul(x, transpose(w1, 0, 1));
  b.name(h, "h");
  Value a = relu(h + b1);
  b.name(a, "a");
  Value y = matmul(a, transpose(w2, 0, 1)) + b2;
  b.name(y, "y");
  b.ret(y, b.spec({}));
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  EXPECT_EQ(g->op_count(), 7);
  EXPECT_EQ(g->node(g->outputs()[0].value).type.str(), "f32[20, 10]");

  const char* text = R"(mesh tp=4

graph mlp(x: f32[20, 10], w1: f32[16, 10] {tp: S(0)}, b1: f32[16] {tp: S(0)},
          w2: f32[10, 16] {tp: S(1)}, b2: f32[10]) {
  h = matmul(x, transpose(w1, 0, 1))
  a = relu(add(h, b1))
  y = add(matmul(a, transpose(w2, 0, 1)), b2)
  return y {tp: R}
}
)";
  EXPECT_EQ(print_graph(*g), text);
  Result<Graph> parsed = parse_graph(text);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(print_graph(*parsed), print_graph(*g));
}

TEST(Builder, ScalarsAreWeakAndSharedValuesGetNames) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F16, {4});
  Value s = sigmoid(x);      // anonymous, used twice: the printer must name it
  Value y = s * 2.0 + s / 3;  // weak scalars: stays f16
  b.ret(y);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  EXPECT_EQ(g->node(g->outputs()[0].value).type.dtype, DType::F16);
  std::string p = print_graph(*g);
  EXPECT_NE(p.find("  v1 = sigmoid(x)\n"), std::string::npos) << p;
  EXPECT_NE(p.find("return add(mul(v1, 2.0), div(v1, 3))"), std::string::npos) << p;
  Result<Graph> again = parse_graph(p);
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(print_graph(*again), p);
}

TEST(Builder, RejectsBadOpsEagerly) {
  GraphBuilder b("g");
  Value a = b.param("a", DType::F32, {2, 3});
  Value c = b.param("c", DType::F32, {4, 5});
  try {
    matmul(a, c);
    FAIL() << "matmul of [2,3] x [4,5] accepted";
  } catch (const DiagError& e) {
    EXPECT_NE(e.diag.message.find("contraction dims differ"), std::string::npos) << e.diag.message;
  }
  EXPECT_THROW(b.param("a", DType::F32, {1}), DiagError);
  EXPECT_THROW(b.param("n", DType::F32, {-1}), DiagError);
  EXPECT_THROW(b.spec({{"tp", Placement::shard(0)}}), DiagError);  // no such mesh dim
}

TEST(Builder, EmptyGraphFailsVerification) {
  GraphBuilder b("nothing");
  b.param("a", DType::F32, {2});
  Result<Graph> g = b.finish();
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("returns nothing"), std::string::npos);
}

}  // namespace ir_builder_test
}  // namespace sf
