// slice and concat in the IR: shapes by Python's slicing and torch.cat's rules, the
// parser's variadic operands, printer round trips, the builder's helpers, and every
// bad input as a located error (hostile values included).
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/ir/printer.h"

namespace sf {
namespace ir_slice_concat_test {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// The type of `expr` on the params "x: f32[4, 10], y: f32[4, 6], z: i32[4, 10], w: f32[0, 10]".
Result<TensorType> type_of(const std::string& expr) {
  Result<Graph> g = parse_graph("graph g(x: f32[4, 10], y: f32[4, 6], z: i32[4, 10], w: f32[0, 10]) {\n  r = " + expr +
                                    "\n  return r\n}\n",
                                "t.sf");
  if (!g) return g.error();
  return g->node(g->outputs()[0].value).type;
}

std::string type_str(const std::string& expr) {
  Result<TensorType> t = type_of(expr);
  return t ? t->str() : "error: " + t.error().str();
}

// The located message of a rejected `expr`.
std::string error_of(const std::string& expr) {
  Result<TensorType> t = type_of(expr);
  if (t) return "accepted: " + t->str();
  return t.error().str();
}

// `expr` is rejected with a message containing `words`.
void expect_error(const std::string& expr, const std::string& words) {
  std::string e = error_of(expr);
  EXPECT_NE(e.find(words), std::string::npos) << expr << " gave: " << e;
}

TEST(Slice, ShapesFollowPythonSlicing) {
  EXPECT_EQ(type_str("slice(x, dim=1, start=2, end=7)"), "f32[4, 5]");
  EXPECT_EQ(type_str("slice(x, 1, start=2, end=7)"), "f32[4, 5]");             // dim positionally
  EXPECT_EQ(type_str("slice(x, dim=-1, start=-3)"), "f32[4, 3]");              // x[..., -3:]
  EXPECT_EQ(type_str("slice(x, dim=1, end=-2)"), "f32[4, 8]");                 // x[..., :-2]
  EXPECT_EQ(type_str("slice(x, dim=1, start=-100, end=100)"), "f32[4, 10]");   // both clamp
  EXPECT_EQ(type_str("slice(x, dim=1, start=1, end=10, step=2)"), "f32[4, 5]");  // 1 3 5 7 9
  EXPECT_EQ(type_str("slice(x, dim=1, start=0, end=10, step=3)"), "f32[4, 4]");  // 0 3 6 9
  EXPECT_EQ(type_str("slice(x, dim=1, start=7, end=3)"), "f32[4, 0]");         // empty, not negative
  EXPECT_EQ(type_str("slice(x, dim=0, start=4)"), "f32[0, 10]");               // start at the end
  EXPECT_EQ(type_str("slice(z, dim=0, start=1, end=3)"), "i32[2, 10]");        // dtype kept
  EXPECT_EQ(type_str("slice(w, dim=0, start=0, end=5)"), "f32[0, 10]");        // of an empty tensor
  // Hostile values clamp like any other; no sum overflows.
  EXPECT_EQ(type_str("slice(x, dim=1, start=-9223372036854775808, end=9223372036854775807)"), "f32[4, 10]");
  EXPECT_EQ(type_str("slice(x, dim=1, start=9223372036854775807)"), "f32[4, 0]");
  EXPECT_EQ(type_str("slice(x, dim=1, step=9223372036854775807)"), "f32[4, 1]");
}

TEST(Slice, SliceRangeIsPythonsSliceIndices) {
  // (size, start, end, step) -> (start, length), as slice(start, end, step).indices(size).
  EXPECT_EQ(slice_range(10, 2, 7, 1).start, 2);
  EXPECT_EQ(slice_range(10, 2, 7, 1).length, 5);
  EXPECT_EQ(slice_range(10, -3, kMax, 1).start, 7);
  EXPECT_EQ(slice_range(10, -3, kMax, 1).length, 3);
  EXPECT_EQ(slice_range(10, kMin, kMax, 4).length, 3);  // 0 4 8
  EXPECT_EQ(slice_range(10, 12, 20, 1).start, 10);
  EXPECT_EQ(slice_range(10, 12, 20, 1).length, 0);
  EXPECT_EQ(slice_range(0, -1, 1, 1).length, 0);
  EXPECT_EQ(slice_range(10, 9, 10, kMax).length, 1);
}

TEST(Slice, BadInputIsALocatedError) {
  expect_error("slice(x, dim=1, start=0, end=4, step=0)", "t.sf:2:7: error: slice: step must be positive, got 0 (as in torch)");
  expect_error("slice(x, dim=1, step=-1)", "slice: step must be positive, got -1");
  expect_error("slice(x, dim=2)", "slice: dim 2 is out of range for a rank-2 operand (expected -2..1)");
  expect_error("slice(x, dim=-9223372036854775808)", "out of range");
  expect_error("slice(x, start=1)", "slice: missing required attribute 'dim'");
  expect_error("slice(x, dim=0, stop=1)", "slice has no attribute 'stop' (it takes: dim, start, end, step)");
  expect_error("slice(2.0, dim=0)", "slice expects an operand of rank >= 1, got f32[]");
  expect_error("slice(x, dim=0, start=9223372036854775808)",
               "t.sf:2:29: error: integer 9223372036854775808 does not fit in 64 bits");
  expect_error("slice(x, y, dim=0)", "slice: attribute 'dim' expects an integer");
}

TEST(Concat, ShapesFollowTorchCat) {
  EXPECT_EQ(type_str("concat(x, y, dim=1)"), "f32[4, 16]");
  EXPECT_EQ(type_str("concat(x, y, x, dim=-1)"), "f32[4, 26]");  // three operands, negative dim
  EXPECT_EQ(type_str("concat(x, w)"), "f32[4, 10]");              // dim defaults to 0; a zero-size operand
  EXPECT_EQ(type_str("concat(w, w, dim=0)"), "f32[0, 10]");       // all empty
  EXPECT_EQ(type_str("concat(neg(x), slice(x, dim=1, start=0, end=6), dim=1)"), "f32[4, 16]");
}

TEST(Concat, BadInputIsALocatedError) {
  expect_error("concat(x, dim=0)", "t.sf:2:7: error: concat expects 2 or more operand(s), got 1");
  expect_error("concat(dim=0)", "concat expects 2 or more operand(s), got 0");
  expect_error("concat()", "concat expects 2 or more operand(s), got 0");
  expect_error("concat(x, y, dim=0)",
               "concat: operand 2 f32[4, 6] differs from operand 1 f32[4, 10] in dim 1 (6 vs 10); only dim 0, the concat "
               "dim, may differ");
  expect_error("concat(x, z, dim=1)",
               "concat: operand 2 i32[4, 10] and operand 1 f32[4, 10] differ in dtype; concat takes one dtype (cast first)");
  expect_error("concat(x, reshape(x, shape=[40]))", "has rank 1 but operand 1 f32[4, 10] has rank 2");
  expect_error("concat(x, y, dim=2)", "concat: dim 2 is out of range for a rank-2 operand");
  expect_error("concat(x, x, 1)", "concat: operand 3 is a number literal; concat joins tensors");
  expect_error("concat(sum(x), sum(x))", "concat: operand 1 f32[] is a scalar (rank 0)");
  expect_error("concat(x, x, dim=0, dim=1)", "attribute 'dim' is given twice");
  expect_error("concat(x, x, dim=[0])", "attribute 'dim' expects an integer");
  expect_error("concat(x, x, dim=0, x)", "a positional argument follows key=value arguments");
}

TEST(Concat, SizesThatDoNotFitAreRefused) {
  // 2^40 rows each: the sum is past the limit per tensor, and a named error, not a wrap.
  Result<Graph> g = parse_graph(
      "graph g(a: bool[1099511627776]) {\n  r = concat(a, a, a, a)\n  return r\n}\n", "t.sf");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().str().find("t.sf:2:7: error: concat: result"), std::string::npos) << g.error().str();
}

constexpr const char* kRope = R"(mesh tp=2

graph rope(x: f32[2, 4, 8] {tp: S(0)}, c: f32[4, 8], s: f32[4, 8]) {
  x1 = slice(x, -1, end=4)
  x2 = slice(x, -1, start=4)
  r = concat(neg(x2), x1, dim=-1)
  e = slice(x, 1, start=-3, end=9223372036854775807, step=2)
  y = add(mul(x, c), mul(r, s))
  return y {tp: S(0)}, e, concat(x, x), concat(x, x, x, dim=2)
}
)";

TEST(SliceConcatPrinter, RoundTripsWithDefaultsLeftOut) {
  Result<Graph> g = parse_graph(kRope, "rope.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  std::string once = print_graph(*g);
  EXPECT_NE(once.find("  x1 = slice(x, -1, end=4)\n"), std::string::npos) << once;
  EXPECT_NE(once.find("  x2 = slice(x, -1, start=4)\n"), std::string::npos) << once;
  EXPECT_NE(once.find("  r = concat(neg(x2), x1, dim=-1)\n"), std::string::npos) << once;
  EXPECT_NE(once.find("  e = slice(x, 1, start=-3, step=2)\n"), std::string::npos) << once;  // end is the default
  EXPECT_NE(once.find("concat(x, x), concat(x, x, x, dim=2)"), std::string::npos) << once;   // dim=0 left out
  Result<Graph> again = parse_graph(once, "printed.sf");
  ASSERT_TRUE(again.ok()) << again.error().str() << "\n" << once;
  EXPECT_EQ(print_graph(*again), once);
  // Equal nodes whatever the text said: the attributes are complete.
  EXPECT_EQ(g->node(g->outputs()[1].value).attrs, again->node(again->outputs()[1].value).attrs);
}

TEST(SliceConcatBuilder, HelpersBuildTheSameNodesAsTheText) {
  GraphBuilder b("b");
  Value x = b.param("x", DType::F16, {3, 8});
  Value h = slice(x, 1, 0, 4);
  Value t = slice(x, -1, 4);
  Value e = slice(x, 0, -2, std::numeric_limits<int64_t>::max(), 2);
  Value c = concat({-t, h, x}, -1);
  EXPECT_EQ(h.type().str(), "f16[3, 4]");
  EXPECT_EQ(e.type().str(), "f16[1, 8]");
  EXPECT_EQ(c.type().str(), "f16[3, 16]");
  b.ret(c);
  b.ret(e);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  EXPECT_NE(print_graph(*g).find("concat(neg(slice(x, -1, start=4)), slice(x, 1, end=4), x, dim=-1)"), std::string::npos)
      << print_graph(*g);
  // Fewer than two operands is a DiagError, as every rejected op is.
  GraphBuilder b2("b2");
  Value y = b2.param("y", DType::F32, {2});
  EXPECT_THROW(concat({y}), DiagError);
  EXPECT_THROW(concat({}), DiagError);
  EXPECT_THROW(slice(y, 0, 0, 1, 0), DiagError);
}

}  // namespace ir_slice_concat_test
}  // namespace sf
