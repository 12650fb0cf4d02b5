// Every kind of malformed graph gets `file:line:col: error: ...`: a table of inputs
// with the location and words the message must have (columns counted by hand).
#include <gtest/gtest.h>

#include "codegen/ir/parser.h"

namespace sf {
namespace ir_parse_errors_test {

struct BadInput {
  const char* name;
  std::string text;
  const char* where;  // "line:col"
  const char* words;  // a substring the message must contain
};

std::string nested_negs(int depth) {
  std::string s = "graph g(x: f32[2]) {\n  y = ";
  for (int i = 0; i < depth; ++i) s += "neg(";
  s += "x";
  for (int i = 0; i < depth; ++i) s += ")";
  return s + "\n  return y\n}\n";
}

const BadInput kCases[] = {
    {"UnclosedParen", "graph g(x: f32[2]) {\n  y = add(x, x\n  return y\n}\n", "3:3",
     "expected ',' or ')' to close 'add(' opened at 2:10, found 'return'"},
    {"UnclosedBrace", "graph g(x: f32[2]) {\n  y = neg(x)\n  return y\n", "4:1",
     "unexpected end of file: expected '}' to close graph 'g' opened at 1:20"},
    {"TruncatedInCall", "graph g(x: f32[2]) {\n  y = add(x,", "2:13",
     "unexpected end of file: expected ')' to close 'add(' opened at 2:10"},
    {"TruncatedInParams", "graph g(x: f32[2", "1:17", "expected ',' or ']' to close the shape"},
    {"Empty", "", "1:1", "expected 'graph'"},
    {"UndefinedValue", "graph g(x: f32[2]) {\n  y = neg(z)\n  return y\n}\n", "2:11",
     "undefined value 'z'"},
    {"RedefinedValue", "graph g(x: f32[2]) {\n  x = neg(x)\n  return x\n}\n", "2:3",
     "'x' is already defined at 1:9"},
    {"RedefinedParam", "graph g(x: f32[2], x: f32[3]) {\n  return x\n}\n", "1:20",
     "'x' is already defined at 1:9"},
    {"UnknownOp", "graph g(x: f32[2]) {\n  y = foo(x)\n  return y\n}\n", "2:7", "unknown op 'foo'"},
    {"UnknownAttribute", "graph g(x: f32[2]) {\n  y = sum(x, axis=[0])\n  return y\n}\n", "2:7",
     "sum has no attribute 'axis' (it takes: dims, keepdim)"},
    {"AttributeWrongType", "graph g(x: f32[2]) {\n  y = sum(x, keepdim=[0])\n  return y\n}\n", "2:7",
     "attribute 'keepdim' expects true or false"},
    {"MissingOperand", "graph g(x: f32[2]) {\n  y = add(x)\n  return y\n}\n", "2:7",
     "add expects 2 operand(s), got 1"},
    {"ConcatOfOneOperand", "graph g(x: f32[2]) {\n  y = concat(x, dim=0)\n  return y\n}\n", "2:7",
     "concat expects 2 or more operand(s), got 1"},
    {"GatherIndexRank", "graph g(x: f32[4, 5], i: i64[4]) {\n  y = gather(x, i, dim=1)\n  return y\n}\n", "2:7",
     "gather: index i64[4] has rank 1 but x f32[4, 5] has rank 2 (they need the same rank, as in torch)"},
    {"GatherMissingDim", "graph g(x: f32[4, 5], i: i64[4, 5]) {\n  y = gather(x, i)\n  return y\n}\n", "2:7",
     "gather: missing required attribute 'dim'"},
    {"IndexSelectFloatIndex", "graph g(x: f32[4, 5], i: f32[2]) {\n  y = index_select(x, i, 0)\n  return y\n}\n",
     "2:7", "index_select expects integer indices (i32 or i64) as its second operand, got f32[2]"},
    {"ScatterAddDim", "graph g(x: f32[4], i: i64[2], s: f32[2]) {\n  y = scatter_add(x, i, s, dim=1)\n  return y\n}\n",
     "2:7", "scatter_add: dim 1 is out of range for a rank-1 operand (expected -1..0)"},
    {"CrossEntropyBadReduction",
     "graph g(x: f32[4, 10], t: i64[4]) {\n  y = cross_entropy(x, t, reduction=avg)\n  return y\n}\n", "2:7",
     "cross_entropy: reduction 'avg' is not one of mean, sum, none"},
    {"CrossEntropyTargetRank", "graph g(x: f32[4, 10], t: i64[4, 10]) {\n  y = cross_entropy(x, t)\n  return y\n}\n",
     "2:7", "cross_entropy: target i64[4, 10] does not match logits f32[4, 10] (expected target shape [4]"},
    {"CrossEntropyFloatTarget", "graph g(x: f32[4, 10], t: f32[4]) {\n  y = cross_entropy(x, t)\n  return y\n}\n",
     "2:7", "cross_entropy expects integer class indices (i32 or i64) as its target, got f32[4]"},
    {"CrossEntropyIgnoreIndexType",
     "graph g(x: f32[4, 10], t: i64[4]) {\n  y = cross_entropy(x, t, ignore_index=1.5)\n  return y\n}\n", "2:",
     "ignore_index"},
    {"AttentionOfTwoOperands", "graph g(x: f32[1, 2, 2]) {\n  y = scaled_dot_product_attention(x, x)\n  return y\n}\n",
     "2:7", "scaled_dot_product_attention expects 3 or 4 operand(s), got 2"},
    {"AttentionFifthOperand",
     "graph g(x: f32[1, 2, 2]) {\n  y = scaled_dot_product_attention(x, x, x, x, x)\n  return y\n}\n", "2:48",
     "scaled_dot_product_attention takes 3 or 4 operands (its attributes by name), found an extra argument 'x'"},
    {"AttentionCausalAndMask",
     "graph g(x: f32[1, 2, 2], m: bool[2, 2]) {\n  y = scaled_dot_product_attention(x, x, x, m, is_causal=true)\n"
     "  return y\n}\n",
     "2:7", "scaled_dot_product_attention: is_causal=true together with an attn_mask is an error"},
    {"AttentionGqaHeads",
     "graph g(q: f32[3, 2, 2], k: f32[2, 2, 2]) {\n  y = scaled_dot_product_attention(q, k, k, enable_gqa=true)\n"
     "  return y\n}\n",
     "2:7", "with enable_gqa, q's 3 heads must be a multiple of k's and v's 2"},
    {"AttentionMaskShape",
     "graph g(x: f32[1, 2, 2], m: f32[3, 2]) {\n  y = scaled_dot_product_attention(x, x, x, m)\n  return y\n}\n",
     "2:7", "attn_mask f32[3, 2] does not broadcast to the scores' shape [1, 2, 2]"},
    {"SliceStepZero", "graph g(x: f32[2]) {\n  y = slice(x, 0, step=0)\n  return y\n}\n", "2:7",
     "slice: step must be positive, got 0 (as in torch)"},
    {"ExtraOperand", "graph g(x: f32[2]) {\n  y = neg(x, x)\n  return y\n}\n", "2:14",
     "neg takes 1 operand(s), found an extra argument 'x'"},
    {"MissingRequiredAttribute", "graph g(x: f32[2, 3]) {\n  y = transpose(x, 0)\n  return y\n}\n",
     "2:7", "missing required attribute 'dim1'"},
    {"MatmulShapes", "graph g(a: f32[2, 3], b: f32[4, 5]) {\n  y = matmul(a, b)\n  return y\n}\n",
     "2:7", "matmul: contraction dims differ: f32[2, 3] has 3 columns but f32[4, 5] has 4 rows"},
    {"BroadcastShapes", "graph g(a: f32[2, 3], b: f32[4]) {\n  y = add(a, b)\n  return y\n}\n", "2:7",
     "add: shapes [2, 3] and [4] do not broadcast"},
    {"CumsumMissingDim", "graph g(x: f32[2, 3]) {\n  y = cumsum(x)\n  return y\n}\n", "2:7",
     "missing required attribute 'dim'"},
    {"CumsumDimOutOfRange", "graph g(x: f32[2, 3]) {\n  y = cumsum(x, dim=-3)\n  return y\n}\n", "2:7",
     "cumsum: dim -3 is out of range for a rank-2 operand (expected -2..1)"},
    {"ArgmaxOfBool", "graph g(x: bool[4]) {\n  y = argmax(x, 0)\n  return y\n}\n", "2:7",
     "argmax does not take bool operands"},
    {"ArgminOverEmptyDim", "graph g(x: f32[3, 0]) {\n  y = argmin(x, dim=1, keepdim=true)\n  return y\n}\n",
     "2:7", "argmin: dim 1 of f32[3, 0] is empty"},
    {"ArgmaxKeepdimNotBool", "graph g(x: f32[3]) {\n  y = argmax(x, dim=0, keepdim=1)\n  return y\n}\n",
     "2:7", "attribute 'keepdim' expects true or false"},
    {"ReshapeCount", "graph g(a: f32[2, 3]) {\n  y = reshape(a, shape=[4, 2])\n  return y\n}\n",
     "2:7", "reshape: f32[2, 3] has 6 elements but [4, 2] has 8"},
    {"ReductionDimRange", "graph g(a: f32[2, 3]) {\n  y = sum(a, dims=[2])\n  return y\n}\n", "2:7",
     "sum: dim 2 is out of range for a rank-2 operand (expected -2..1)"},
    {"TransposeDimRange", "graph g(a: f32[2, 3]) {\n  y = transpose(a, 0, -3)\n  return y\n}\n",
     "2:7", "transpose: dim1 -3 is out of range"},
    {"ShardDimRange", "mesh tp=2\ngraph g(a: f32[2, 3] {tp: S(2)}) {\n  return a\n}\n", "2:22",
     "parameter 'a': placement tp: S(2) is out of range for a rank-2 value"},
    {"ShardDimRangeOnStatement",
     "mesh tp=2\ngraph g(a: f32[2, 3]) {\n  y = neg(a) {tp: S(-3)}\n  return y\n}\n", "3:14",
     "placement tp: S(-3) is out of range"},
    {"UnknownMeshDim", "mesh tp=2\ngraph g(a: f32[2, 3] {pp: S(0)}) {\n  return a\n}\n", "2:23",
     "unknown mesh dimension 'pp' (the mesh is 'tp=2')"},
    {"UnknownMeshDimInCollective",
     "mesh tp=2\ngraph g(a: f32[2, 3]) {\n  y = all_gather(a, mesh_dim=pp)\n  return y\n}\n", "3:7",
     "all_gather: unknown mesh dimension 'pp'"},
    {"MeshSizeZero", "mesh tp=0\ngraph g(a: f32[2]) {\n  return a\n}\n", "1:9",
     "mesh dimension 'tp' has size 0 (expected >= 1)"},
    {"UnknownDtype", "graph g(x: f33[2]) {\n  return x\n}\n", "1:12", "unknown dtype 'f33'"},
    {"NegativeDim", "graph g(x: f32[-2]) {\n  return x\n}\n", "1:16", "dimension -2 is negative"},
    {"OverflowingDim", "graph g(x: f32[99999999999999999999]) {\n  return x\n}\n", "1:16",
     "dimension 99999999999999999999 does not fit in 64 bits"},
    {"OverflowingElementCount", "graph g(x: f32[4294967296, 4294967296]) {\n  return x\n}\n", "1:28",
     "overflows"},
    {"BinaryGarbage", std::string("graph g(x: f32[2]) {\x01\x02\xff", 23), "1:21",
     "unexpected byte 0x01 (is this a text file?)"},
    {"BinaryFile", std::string("\x7f" "ELF\x02\x01\x01\x00", 8), "1:1", "unexpected byte 0x7f"},
    {"ReturnUndefined", "graph g(x: f32[2]) {\n  return q\n}\n", "2:10", "undefined value 'q'"},
    {"NoReturn", "graph g(x: f32[2]) {\n  y = neg(x)\n}\n", "3:1", "graph 'g' has no return statement"},
    {"TooDeep", nested_negs(300), "2:", "calls nest deeper than"},
    {"TrailingGarbage", "graph g(x: f32[2]) {\n  return x\n}\nextra\n", "4:1",
     "unexpected 'extra' after the graph"},
    {"UnknownPlacement", "mesh tp=2\ngraph g(a: f32[2] {tp: Q}) {\n  return a\n}\n", "2:24",
     "unknown placement 'Q'"},
    {"FloatOperandForMatmulMismatch",
     "graph g(a: f32[2, 2], b: f16[2, 2]) {\n  y = matmul(a, b)\n  return y\n}\n", "2:7",
     "matmul expects operands of one dtype"},
    {"WhereNeedsBool", "graph g(a: f32[2]) {\n  y = where(a, a, a)\n  return y\n}\n", "2:7",
     "where expects a bool condition"},
    {"DropoutPOutOfRange", "graph g(x: f32[2]) {\n  y = dropout(x, p=1.5, seed=3)\n  return y\n}\n", "2:7",
     "dropout: p must be in [0, 1] (the probability of zeroing an element), got 1.5"},
    {"DropoutNegativeSeed", "graph g(x: f32[2]) {\n  y = dropout(x, -3, p=0.1)\n  return y\n}\n", "2:7",
     "dropout: seed must be a non-negative integer (a Philox key), got -3"},
    {"DropoutMissingSeed", "graph g(x: f32[2]) {\n  y = dropout(x, p=0.1)\n  return y\n}\n", "2:7",
     "dropout: missing required attribute 'seed'"},
    {"DropoutOfIntegers", "graph g(x: i32[2]) {\n  y = dropout(x, seed=1)\n  return y\n}\n", "2:7",
     "dropout expects a floating-point operand, got i32[2] (cast it first)"},
};

class ParseError : public ::testing::TestWithParam<BadInput> {};

TEST_P(ParseError, IsLocatedAndSaysWhatWasExpected) {
  const BadInput& c = GetParam();
  Result<Graph> g = parse_graph(c.text, "bad.sf");
  ASSERT_FALSE(g.ok()) << c.name << " was accepted";
  std::string msg = g.error().str();
  EXPECT_EQ(msg.rfind(std::string("bad.sf:") + c.where, 0), 0u) << msg;
  EXPECT_NE(msg.find(": error: "), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.words), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, ParseError, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ParseFile, MissingFileNamesIt) {
  Result<Graph> g = parse_file("/nonexistent/dir/g.sf");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().str(),
            "/nonexistent/dir/g.sf: error: cannot open file: No such file or directory (expected a graph file (.sf))");
}

}  // namespace ir_parse_errors_test
}  // namespace sf
