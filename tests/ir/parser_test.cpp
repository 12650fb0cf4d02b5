// Parser and printer: round trips and every bad-input kind with its location.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "codegen/ir/parser.h"
#include "codegen/ir/printer.h"

namespace sf {
namespace ir_parser_test {

constexpr const char* kMlp = R"(# Megatron-style tensor-parallel MLP
mesh tp=4

graph mlp(x: f32[20, 10],
          w1: f32[16, 10] {tp: S(0)}, b1: f32[16] {tp: S(0)},
          w2: f32[10, 16] {tp: S(1)}, b2: f32[10]) {
  h = matmul(x, transpose(w1, 0, 1))
  a = relu(add(h, b1))
  y = add(matmul(a, transpose(w2, 0, 1)), b2)
  return y {tp: R}
}
)";

Graph parse_ok(const std::string& text) {
  Result<Graph> g = parse_graph(text, "t.sf");
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().str());
  if (!g.ok()) throw std::runtime_error("parse failed");
  return std::move(g).value();
}

TEST(Parser, ParsesDesignExample) {
  Graph g = parse_ok(kMlp);
  EXPECT_EQ(g.name(), "mlp");
  ASSERT_EQ(g.mesh().dims.size(), 1u);
  EXPECT_EQ(g.mesh().dims[0].name, "tp");
  EXPECT_EQ(g.mesh().dims[0].size, 4);
  ASSERT_EQ(g.params().size(), 5u);
  const Node& w1 = g.node(g.params()[1]);
  EXPECT_EQ(w1.name, "w1");
  EXPECT_EQ(w1.type.str(), "f32[16, 10]");
  ASSERT_TRUE(w1.placement.has_value());
  EXPECT_EQ(w1.placement->per_dim[0], Placement::shard(0));
  EXPECT_EQ(g.node(g.params()[4]).placement, std::nullopt);

  EXPECT_EQ(g.op_count(), 7);  // matmul x2, transpose x2, add x2, relu
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.outputs()[0].name, "y");
  EXPECT_EQ(g.node(g.outputs()[0].value).type.str(), "f32[20, 10]");
  EXPECT_EQ(g.outputs()[0].placement->per_dim[0], Placement::replicate());
}

TEST(Printer, KeepsNestingAndPlacements) {
  std::string printed = print_graph(parse_ok(kMlp));
  EXPECT_NE(printed.find("mesh tp=4\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("  h = matmul(x, transpose(w1, 0, 1))\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("  a = relu(add(h, b1))\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("w1: f32[16, 10] {tp: S(0)}"), std::string::npos) << printed;
  EXPECT_NE(printed.find("  return y {tp: R}\n"), std::string::npos) << printed;
  EXPECT_EQ(printed.find('#'), std::string::npos) << "comments are not kept";
}

TEST(Printer, RoundTripIsStable) {
  std::string once = print_graph(parse_ok(kMlp));
  std::string twice = print_graph(parse_ok(once));
  EXPECT_EQ(once, twice);
}

TEST(Printer, AttributesLiteralsAndDefaults) {
  const char* text = R"(mesh dp=2 tp=2
graph g(x: f16[4, 6] {dp: S(0), tp: S(-1)}, i: i32[3]) {
  s = sum(x, dims=[1], keepdim=true)
  m = max(x)
  c = cast(mul(x, 2.5), dtype=bf16)
  r = reshape(x, shape=[2, -1])
  p = softmax(x, dim=0)
  q = layer_norm(x, cast(expand(1.0, shape=[6]), f16), cast(expand(0, shape=[6]), f16), eps=1e-6)
  k = add(i, 1)
  z = redistribute(x, {dp: P(max)}) {tp: S(0)}
  return s, m, c, r, p, q, k, z {dp: R, tp: R}
}
)";
  Graph g = parse_ok(text);
  std::string printed = print_graph(g);
  EXPECT_NE(printed.find("sum(x, dims=[1], keepdim=true)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("m = max(x)\n"), std::string::npos) << "defaults are not printed: " << printed;
  EXPECT_NE(printed.find("mul(x, 2.5)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("cast(mul(x, 2.5), bf16)"), std::string::npos) << "required attrs are positional: " << printed;
  EXPECT_NE(printed.find("softmax(x, dim=0)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("eps=1e-06"), std::string::npos);
  EXPECT_NE(printed.find("add(i, 1)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("redistribute(x, {dp: P(max)}) {tp: S(0)}"), std::string::npos) << printed;
  EXPECT_NE(printed.find("x: f16[4, 6] {dp: S(0), tp: S(-1)}"), std::string::npos) << printed;
  EXPECT_NE(printed.find("z {dp: R, tp: R}"), std::string::npos) << printed;
  EXPECT_EQ(print_graph(parse_ok(printed)), printed);
  // Weak scalars: f16 * 2.5 stays f16, i32 + 1 stays i32.
  EXPECT_EQ(g.node(g.outputs()[2].value).type.dtype, DType::BF16);
  EXPECT_EQ(g.node(g.outputs()[6].value).type.dtype, DType::I32);
  EXPECT_EQ(g.node(g.outputs()[0].value).type.shape, (Shape{4, 1}));
  EXPECT_EQ(g.node(g.outputs()[1].value).type.shape, Shape{});
  EXPECT_EQ(g.node(g.outputs()[3].value).type.shape, (Shape{2, 12}));
}

}  // namespace ir_parser_test
}  // namespace sf

namespace sf {
namespace ir_parser_test {

class ExampleRoundTrip : public ::testing::TestWithParam<const char*> {};

// parse -> print -> parse -> print gives the same text, and the printed graph has
// the same params, ops and outputs as the file.
TEST_P(ExampleRoundTrip, PrintIsStable) {
  std::string path = std::string(SF_SOURCE_DIR) + "/examples/" + GetParam();
  Result<Graph> g = parse_file(path);
  ASSERT_TRUE(g.ok()) << g.error().str();
  std::string once = print_graph(*g);
  Result<Graph> again = parse_graph(once, "printed.sf");
  ASSERT_TRUE(again.ok()) << again.error().str() << "\n" << once;
  EXPECT_EQ(print_graph(*again), once);
  EXPECT_EQ(again->op_count(), g->op_count());
  EXPECT_EQ(again->params().size(), g->params().size());
  ASSERT_EQ(again->outputs().size(), g->outputs().size());
  for (size_t i = 0; i < g->outputs().size(); ++i) {
    EXPECT_EQ(again->node(again->outputs()[i].value).type, g->node(g->outputs()[i].value).type);
    EXPECT_EQ(again->outputs()[i].placement, g->outputs()[i].placement);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleRoundTrip,
                         ::testing::Values("tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf",
                                           "transformer_block.sf", "fsdp_tp_2d.sf", "fsdp_mlp.sf",
                                           "causal_attention.sf", "vocab_parallel_embedding.sf",
                                           "dropout_mlp.sf",
                                           "vocab_parallel_loss.sf", "llama_block.sf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n.substr(0, n.find('.'));
                         });

}  // namespace ir_parser_test
}  // namespace sf
