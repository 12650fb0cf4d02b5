// arange, full, tril, triu and log_softmax in the IR: parsed and printed (a stable
// round trip), built from C++, and refused with located errors, hostile sizes and
// bounds included (docs/graph-format.md, "Generators" and "Masks").
#include <gtest/gtest.h>

#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/ir/printer.h"

namespace sf {
namespace ir_generators_test {

Graph parse_ok(const std::string& text) {
  Result<Graph> g = parse_graph(text, "g.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

TEST(Generators, ParseAndPrintRoundTrip) {
  const char* text = R"(graph g(x: f32[4, 6]) {
  r = arange(4)
  c = arange(end=-6, start=0, step=-1, dtype=f32)
  m = ge(reshape(r, shape=[4, 1]), arange(6))
  f = full(shape=[4, 6], value=-1e9)
  t = tril(x, diagonal=-1)
  u = triu(f, 2)
  l = log_softmax(x, dim=0)
  i = full([2], 3, dtype=i32)
  y = add(where(m, x, f), u)
  return y, t, l, c, i
}
)";
  Graph g = parse_ok(text);
  std::string printed = print_graph(g);
  // Required attributes positionally, defaults left out.
  EXPECT_NE(printed.find("r = arange(4)\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("c = arange(-6, step=-1, dtype=f32)\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("ge(reshape(r, [4, 1]), arange(6))"), std::string::npos) << printed;
  EXPECT_NE(printed.find("f = full([4, 6], -1e+09)\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("t = tril(x, diagonal=-1)\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("u = triu(f, diagonal=2)\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("l = log_softmax(x, dim=0)\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("i = full([2], 3.0, dtype=i32)\n"), std::string::npos) << printed;
  EXPECT_EQ(print_graph(parse_ok(printed)), printed);

  auto type = [&](size_t o) { return g.node(g.outputs()[o].value).type; };
  EXPECT_EQ(type(0), (TensorType{DType::F32, {4, 6}}));
  EXPECT_EQ(type(3), (TensorType{DType::F32, {6}}));
  EXPECT_EQ(type(4), (TensorType{DType::I32, {2}}));
  for (const Node& n : g.nodes())
    if (n.name == "m") {
      EXPECT_EQ(n.type, (TensorType{DType::Bool, {4, 6}}));
    }
}

TEST(Generators, AGraphWithoutParamsIsFine) {
  Graph g = parse_ok("graph g() {\n  y = add(arange(3, dtype=f32), full([2, 3], 0.5))\n  return y\n}\n");
  EXPECT_TRUE(g.params().empty());
  EXPECT_EQ(g.node(g.outputs()[0].value).type, (TensorType{DType::F32, {2, 3}}));
}

TEST(Generators, BuilderHelpers) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::BF16, {3, 5});
  Value a = arange(b, 1, 9, -3);  // 9, 6, 3
  Value f = full(b, {3, 5}, 0.25, DType::BF16);
  Value t = tril(x, 1), u = triu(f, -2), l = log_softmax(x, 0);
  EXPECT_EQ(a.type(), (TensorType{DType::I64, {3}}));
  EXPECT_EQ(f.type(), (TensorType{DType::BF16, {3, 5}}));
  EXPECT_EQ(b.node(t).attrs.get_int("diagonal"), 1);
  EXPECT_EQ(b.node(u).op, OpKind::Triu);
  EXPECT_EQ(b.node(l).attrs.get_int("dim"), 0);
  EXPECT_EQ(b.node(a).attrs.get_int("start"), 9);
  b.ret(t);
  b.ret(u);
  b.ret(l);
  b.ret(a);
  EXPECT_TRUE(b.finish().ok());
  GraphBuilder c("c");
  EXPECT_THROW(arange(c, 4, 0, 0), DiagError);
  EXPECT_THROW(full(c, {-1}, 0.0), DiagError);
  EXPECT_THROW(full(c, {int64_t{1} << 41}, 0.0), DiagError);  // above the limits, at the op
  EXPECT_THROW(tril(c.param("v", DType::F32, {4})), DiagError);
}

struct Bad {
  const char* stmt;   // the statement on line 2, after "  y = "
  const char* where;  // line:col
  const char* words;
};

TEST(Generators, ErrorsAreLocatedAndSayWhatIsWrong) {
  const Bad cases[] = {
      {"arange(8, step=0)", "2:7", "arange: step must be nonzero (start=0, end=8, step=0)"},
      {"arange()", "2:7", "arange: missing required attribute 'end'"},
      {"arange(x)", "2:7", "arange: attribute 'end' expects an integer"},
      {"arange(1.5)", "2:7", "arange: attribute 'end' expects an integer"},
      {"arange(0, start=5)", "2:7", "inconsistent with the step's sign (start=5, end=0, step=1)"},
      {"arange(9223372036854775807, start=-9223372036854775808)", "2:7",
       "gives 18446744073709551615 elements, above the limit of 2^40"},
      {"arange(4611686018427387904)", "2:7", "gives 4611686018427387904 elements"},
      {"arange(4, dtype=bool)", "2:7", "dtype bool is not supported"},
      {"arange(4, foo=1)", "2:7", "arange has no attribute 'foo' (it takes: end, start, step, dtype)"},
      {"full([2, 3])", "2:7", "full: missing required attribute 'value'"},
      {"full(shape=[-1, 2], value=0.0)", "2:7", "full: dimension -1 is negative in shape [-1, 2]"},
      {"full([1099511627776, 2], 0.0)", "2:7", "full: result f32[1099511627776, 2]"},
      {"full([4611686018427387904, 4611686018427387904], 1.0)", "2:7", "is above the limit of 2^40"},
      {"full([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 1.0)", "2:7", "full: result"},
      {"full([2], 0.5, dtype=i64)", "2:7", "full: value 0.5 is not an integer in the range of i64"},
      {"full([2], 3, f32, 4)", "2:25", "full takes 0 operand(s) and 3 attribute(s), found an extra argument '4'"},
      {"tril(sum(x))", "2:7", "tril expects an operand of rank >= 2 (it masks the last two dims), got f32[]"},
      {"triu(x, 1, 2)", "2:18", "triu takes 1 operand(s) and 1 attribute(s), found an extra argument '2'"},
      {"triu(x, diagonal=0.5)", "2:7", "triu: attribute 'diagonal' expects an integer"},
      {"triu(x, diagonal=99999999999999999999)", "2:24", "integer 99999999999999999999 does not fit in 64 bits"},
      {"log_softmax(x, dim=2)", "2:7", "log_softmax: dim 2 is out of range for a rank-2 operand"},
      {"log_softmax(cast(x, i32))", "2:7", "log_softmax expects a floating-point operand, got i32[4, 6]"},
  };
  for (const Bad& c : cases) {
    std::string text = "graph g(x: f32[4, 6]) {\n  y = " + std::string(c.stmt) + "\n  return y\n}\n";
    Result<Graph> g = parse_graph(text, "g.sf");
    ASSERT_FALSE(g.ok()) << c.stmt << " was accepted";
    std::string e = g.error().str();
    EXPECT_EQ(e.rfind(std::string("g.sf:") + c.where + ": error: ", 0), 0u) << c.stmt << ": " << e;
    EXPECT_NE(e.find(c.words), std::string::npos) << c.stmt << ": " << e;
  }
}

TEST(Generators, ExtremeDiagonalsAndBoundsAreAccepted) {
  Graph g = parse_ok(
      "graph g(x: f32[4, 6]) {\n"
      "  a = tril(x, diagonal=9223372036854775807)\n"
      "  b = triu(x, diagonal=-9223372036854775808)\n"
      "  c = arange(9223372036854775807, start=9223372036854775797, step=7)\n"
      "  d = arange(-9223372036854775808, step=-9223372036854775808)\n"
      "  return a, b, c, d\n}\n");
  EXPECT_EQ(g.node(g.outputs()[2].value).type.shape, Shape{2});
  EXPECT_EQ(g.node(g.outputs()[3].value).type.shape, Shape{1});
  EXPECT_EQ(print_graph(parse_ok(print_graph(g))), print_graph(g));
}

}  // namespace ir_generators_test
}  // namespace sf
