// Unary, binary, comparison, where and cast ops of the reference evaluator against
// values worked out by hand (the literals below), not produced by the evaluator.
#include <gtest/gtest.h>

#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_elementwise_test {

using test::expect_close;
using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

// Applies a unary op to a param of type `t`.
Tensor unary_op(OpKind k, const Tensor& x) {
  GraphBuilder b("u");
  Value p = b.param("x", x.dtype(), x.shape());
  b.ret(b.op(k, {p}));
  Graph g = test::finish(b);
  auto out = run(g, {x});
  return out.empty() ? Tensor{} : out[0];
}

Tensor binary_op(OpKind k, const Tensor& x, const Tensor& y) {
  GraphBuilder b("bin");
  Value p = b.param("a", x.dtype(), x.shape());
  Value q = b.param("b", y.dtype(), y.shape());
  b.ret(b.op(k, {p, q}));
  Graph g = test::finish(b);
  auto out = run(g, {x, y});
  return out.empty() ? Tensor{} : out[0];
}

Tensor cast_to(const Tensor& x, DType t) {
  GraphBuilder b("c");
  b.ret(cast(b.param("x", x.dtype(), x.shape()), t));
  Graph g = test::finish(b);
  auto out = run(g, {x});
  return out.empty() ? Tensor{} : out[0];
}

struct UnaryCase {
  OpKind op;
  std::vector<double> want;
};

TEST(EvaluateUnary, TranscendentalsOnHalfOneMinusOneTwo) {
  Tensor x = tensor(DType::F32, {4}, {0.5, 1.0, -1.0, 2.0});
  const UnaryCase cases[] = {
      {OpKind::Neg, {-0.5, -1, 1, -2}},
      {OpKind::Abs, {0.5, 1, 1, 2}},
      {OpKind::Relu, {0.5, 1, 0, 2}},
      {OpKind::Exp, {1.6487212707, 2.7182818285, 0.3678794412, 7.3890560989}},
      {OpKind::Tanh, {0.4621171573, 0.7615941560, -0.7615941560, 0.9640275801}},
      {OpKind::Sigmoid, {0.6224593312, 0.7310585786, 0.2689414214, 0.8807970780}},
      {OpKind::Silu, {0.3112296656, 0.7310585786, -0.2689414214, 1.7615941560}},
      {OpKind::Sin, {0.4794255386, 0.8414709848, -0.8414709848, 0.9092974268}},
      {OpKind::Cos, {0.8775825619, 0.5403023059, 0.5403023059, -0.4161468365}},
      {OpKind::Erf, {0.5204998778, 0.8427007929, -0.8427007929, 0.9953222650}},
      // gelu(x) = x/2 (1 + erf(x/sqrt 2)); gelu_tanh with sqrt(2/pi) = 0.7978845608.
      {OpKind::Gelu, {0.3457312306, 0.8413447461, -0.1586552539, 1.9544997361}},
      {OpKind::GeluTanh, {0.3457140098, 0.8411919906, -0.1588080094, 1.9545976941}},
  };
  for (const UnaryCase& c : cases) {
    SCOPED_TRACE(std::string(op_name(c.op)));
    Tensor y = unary_op(c.op, x);
    EXPECT_EQ(y.type(), x.type());
    expect_close(values(y), c.want);
  }
}

TEST(EvaluateUnary, PositiveDomainOps) {
  Tensor x = tensor(DType::F32, {5}, {0.25, 1.0, 2.0, 4.0, 0.0});
  const UnaryCase cases[] = {
      {OpKind::Log, {-1.3862943611, 0, 0.6931471806, 1.3862943611, -kInf}},
      {OpKind::Sqrt, {0.5, 1, 1.4142135624, 2, 0}},
      {OpKind::Rsqrt, {2, 1, 0.7071067812, 0.5, kInf}},
      {OpKind::Reciprocal, {4, 1, 0.5, 0.25, kInf}},
  };
  for (const UnaryCase& c : cases) {
    SCOPED_TRACE(std::string(op_name(c.op)));
    expect_close(values(unary_op(c.op, x)), c.want);
  }
  expect_close(values(unary_op(OpKind::Log, tensor(DType::F32, {1}, {-1.0}))), {kNaN});
  expect_close(values(unary_op(OpKind::Relu, tensor(DType::F32, {1}, {kNaN}))), {kNaN});
}

TEST(EvaluateUnary, IntegerNegAbsReluAreExactInInt64) {
  // 2^53 + 1 is not a double; INT64_MIN negates to itself (two's complement wrap).
  Tensor x = itensor(DType::I64, {4}, {9007199254740993, -5, kMin64, -3});
  Tensor n = unary_op(OpKind::Neg, x);
  EXPECT_EQ(n.dtype(), DType::I64);
  EXPECT_EQ(ivalues(n), (std::vector<int64_t>{-9007199254740993, 5, kMin64, 3}));
  EXPECT_EQ(ivalues(unary_op(OpKind::Abs, x)),
            (std::vector<int64_t>{9007199254740993, 5, kMin64, 3}));
  EXPECT_EQ(ivalues(unary_op(OpKind::Relu, x)), (std::vector<int64_t>{9007199254740993, 0, 0, 0}));
  Tensor i32 = unary_op(OpKind::Neg, itensor(DType::I32, {2}, {-2147483648LL, 7}));
  EXPECT_EQ(ivalues(i32), (std::vector<int64_t>{-2147483648LL, -7}));
}

TEST(EvaluateUnary, HalfInputsRoundOnlyTheResult) {
  // exp(1) = 2.71828...; the f16 neighbours are 2.716796875 and 2.71875 (spacing
  // 2^-9), and 2.71828 is nearer 2.71875. bf16 (spacing 2^-6): 2.703125 or 2.71875.
  expect_close(values(unary_op(OpKind::Exp, tensor(DType::F16, {1}, {1.0}))), {2.71875}, 0);
  expect_close(values(unary_op(OpKind::Exp, tensor(DType::BF16, {1}, {1.0}))), {2.71875}, 0);
}

TEST(EvaluateBinary, BroadcastsColumnWithRow) {
  Tensor a = tensor(DType::F32, {2, 1}, {1, 2});
  Tensor b = tensor(DType::F32, {3}, {10, 20, 30});
  Tensor add = binary_op(OpKind::Add, a, b);
  EXPECT_EQ(add.type(), (TensorType{DType::F32, {2, 3}}));
  expect_close(values(add), {11, 21, 31, 12, 22, 32});
  expect_close(values(binary_op(OpKind::Sub, a, b)), {-9, -19, -29, -8, -18, -28});
  expect_close(values(binary_op(OpKind::Mul, a, b)), {10, 20, 30, 20, 40, 60});
  expect_close(values(binary_op(OpKind::Div, a, b)),
               {0.1, 0.05, 0.0333333333, 0.2, 0.1, 0.0666666667});
  Tensor c = tensor(DType::F32, {3}, {1.5, 0.5, 2});
  expect_close(values(binary_op(OpKind::Maximum, a, c)), {1.5, 1, 2, 2, 2, 2});
  expect_close(values(binary_op(OpKind::Minimum, a, c)), {1, 0.5, 1, 1.5, 0.5, 2});
  expect_close(values(binary_op(OpKind::Pow, a, c)), {1, 1, 1, 2.8284271247, 1.4142135624, 4});
  // The other way round ([3] with [2, 1]) gives the same shape.
  EXPECT_EQ(binary_op(OpKind::Add, b, a).shape(), (Shape{2, 3}));
}

TEST(EvaluateBinary, MaximumMinimumPropagateNaN) {
  Tensor a = tensor(DType::F32, {2}, {kNaN, 1});
  Tensor b = tensor(DType::F32, {2}, {1, kNaN});
  expect_close(values(binary_op(OpKind::Maximum, a, b)), {kNaN, kNaN});
  expect_close(values(binary_op(OpKind::Minimum, a, b)), {kNaN, kNaN});
}

TEST(EvaluateBinary, WeakScalarKeepsTensorDtype) {
  GraphBuilder b("w");
  Value x = b.param("x", DType::F16, {2});
  b.ret(x * 2.5);  // f16 * python float stays f16
  Graph g = test::finish(b);
  auto out = run(g, {tensor(DType::F16, {2}, {1.0, 3.0})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype(), DType::F16);
  expect_close(values(out[0]), {2.5, 7.5}, 0);
}

TEST(EvaluateBinary, IntegerArithmeticIsExactAndWraps) {
  const int64_t two53p1 = 9007199254740993;  // 2^53 + 1: a double would lose the 1
  const int64_t two62p1 = 4611686018427387905;
  Tensor a = itensor(DType::I64, {4}, {two53p1, two62p1, kMin64, 3});
  Tensor b = itensor(DType::I64, {4}, {1, two62p1, 1, 40});
  Tensor add = binary_op(OpKind::Add, a, b);
  EXPECT_EQ(add.dtype(), DType::I64);
  // 2^62+1 + 2^62+1 = 2^63 + 2 wraps to -2^63 + 2; 3 + 40 = 43.
  EXPECT_EQ(ivalues(add),
            (std::vector<int64_t>{9007199254740994, -9223372036854775806, kMin64 + 1, 43}));
  EXPECT_EQ(ivalues(binary_op(OpKind::Sub, a, b)),
            (std::vector<int64_t>{9007199254740992, 0, kMax64, -37}));
  Tensor three = itensor(DType::I64, {4}, {1, 3, -1, 2});
  // (2^62+1)*3 = 2^63 + 2^62 + 3 wraps to -2^62 + 3; INT64_MIN * -1 wraps to itself.
  EXPECT_EQ(ivalues(binary_op(OpKind::Mul, a, three)),
            (std::vector<int64_t>{two53p1, -4611686018427387901, kMin64, 6}));
  Tensor c = itensor(DType::I64, {4}, {9007199254740992, two62p1 + 1, kMax64, 4});
  EXPECT_EQ(ivalues(binary_op(OpKind::Maximum, a, c)),
            (std::vector<int64_t>{two53p1, two62p1 + 1, kMax64, 4}));
  EXPECT_EQ(ivalues(binary_op(OpKind::Minimum, a, c)),
            (std::vector<int64_t>{9007199254740992, two62p1, kMin64, 3}));
  // 3^40 = 12157665459056928801 > 2^63 wraps to 3^40 - 2^64; 2^62 exact; x^0 = 1.
  Tensor base = itensor(DType::I64, {4}, {3, 2, 7, 0});
  Tensor expo = itensor(DType::I64, {4}, {40, 62, 0, 0});
  EXPECT_EQ(ivalues(binary_op(OpKind::Pow, base, expo)),
            (std::vector<int64_t>{-6289078614652622815, 4611686018427387904, 1, 1}));
}

TEST(EvaluateBinary, Int32WrapsAndMixesWithI64ScalarWeakly) {
  GraphBuilder b("i32");
  Value x = b.param("x", DType::I32, {2});
  b.ret(x + 1);  // an integer literal is a weak i64: the result stays i32
  Graph g = test::finish(b);
  auto out = run(g, {itensor(DType::I32, {2}, {2147483647, -5})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype(), DType::I32);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{-2147483648LL, -4}));
}

TEST(EvaluateBinary, IntegerPowWithNegativeExponentIsADiag) {
  GraphBuilder b("p");
  b.ret(b.op(OpKind::Pow, {b.param("a", DType::I64, {1}), b.param("e", DType::I64, {1})}));
  Graph g = test::finish(b);
  std::string e = test::run_error(g, {itensor(DType::I64, {1}, {2}), itensor(DType::I64, {1}, {-1})});
  EXPECT_NE(e.find("negative integer powers"), std::string::npos) << e;
  EXPECT_NE(e.find("2 ** -1"), std::string::npos) << e;
}

TEST(EvaluateBinary, DivOfIntegersIsTrueDivisionInF32) {
  Tensor a = itensor(DType::I32, {4}, {7, -7, 1, 0});
  Tensor b = itensor(DType::I32, {4}, {2, 2, 0, 0});
  Tensor q = binary_op(OpKind::Div, a, b);
  EXPECT_EQ(q.dtype(), DType::F32);
  expect_close(values(q), {3.5, -3.5, kInf, kNaN});
  // i64 / i64 too, and an i64 with an f16: f16 wins (floats outrank integers).
  EXPECT_EQ(binary_op(OpKind::Div, itensor(DType::I64, {1}, {1}), itensor(DType::I64, {1}, {4})).dtype(),
            DType::F32);
  Tensor h = binary_op(OpKind::Div, itensor(DType::I64, {1}, {1}), tensor(DType::F16, {1}, {4}));
  EXPECT_EQ(h.dtype(), DType::F16);
  expect_close(values(h), {0.25}, 0);
}

TEST(EvaluateBinary, MixedHalfTypesPromoteToF32) {
  // 1 + 2^-12 is exact in f32 but would round to 1 in f16 (spacing 2^-10) or bf16 (2^-7).
  Tensor s = binary_op(OpKind::Add, tensor(DType::F16, {1}, {1.0}), tensor(DType::BF16, {1}, {0x1p-12}));
  EXPECT_EQ(s.dtype(), DType::F32);
  expect_close(values(s), {1.0 + 0x1p-12}, 0);
}

TEST(EvaluateCompare, BroadcastingComparisons) {
  Tensor a = tensor(DType::F32, {2, 1}, {1, 2});
  Tensor b = tensor(DType::F32, {3}, {1, 2, 3});
  struct Case {
    OpKind op;
    std::vector<int64_t> want;
  };
  const Case cases[] = {
      {OpKind::Eq, {1, 0, 0, 0, 1, 0}}, {OpKind::Ne, {0, 1, 1, 1, 0, 1}},
      {OpKind::Lt, {0, 1, 1, 0, 0, 1}}, {OpKind::Le, {1, 1, 1, 0, 1, 1}},
      {OpKind::Gt, {0, 0, 0, 1, 0, 0}}, {OpKind::Ge, {1, 0, 0, 1, 1, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(op_name(c.op)));
    Tensor r = binary_op(c.op, a, b);
    EXPECT_EQ(r.type(), (TensorType{DType::Bool, {2, 3}}));
    EXPECT_EQ(ivalues(r), c.want);
  }
}

TEST(EvaluateCompare, IntegersCompareExactlyAndNaNIsUnordered) {
  Tensor a = itensor(DType::I64, {1}, {9007199254740993});
  Tensor b = itensor(DType::I64, {1}, {9007199254740992});  // equal as doubles
  EXPECT_EQ(ivalues(binary_op(OpKind::Gt, a, b)), (std::vector<int64_t>{1}));
  EXPECT_EQ(ivalues(binary_op(OpKind::Eq, a, b)), (std::vector<int64_t>{0}));
  Tensor n = tensor(DType::F32, {1}, {kNaN});
  EXPECT_EQ(ivalues(binary_op(OpKind::Eq, n, n)), (std::vector<int64_t>{0}));
  EXPECT_EQ(ivalues(binary_op(OpKind::Ne, n, n)), (std::vector<int64_t>{1}));
  // An int against a float compares values: 2 < 2.5.
  EXPECT_EQ(ivalues(binary_op(OpKind::Lt, itensor(DType::I32, {1}, {2}), tensor(DType::F32, {1}, {2.5}))),
            (std::vector<int64_t>{1}));
}

TEST(EvaluateWhere, SelectsWithBroadcastingAndAWeakScalar) {
  GraphBuilder b("w");
  Value c = b.param("c", DType::Bool, {2, 1});
  Value x = b.param("x", DType::F32, {3});
  b.ret(where(c, x, b.constant(0.0)));
  Graph g = test::finish(b);
  auto out = run(g, {itensor(DType::Bool, {2, 1}, {1, 0}), tensor(DType::F32, {3}, {1, 2, 3})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type(), (TensorType{DType::F32, {2, 3}}));
  expect_close(values(out[0]), {1, 2, 3, 0, 0, 0});
}

TEST(EvaluateWhere, I64IsExact) {
  GraphBuilder b("w");
  Value c = b.param("c", DType::Bool, {2});
  Value x = b.param("x", DType::I64, {2});
  b.ret(where(c, x, b.param("y", DType::I64, {2})));
  Graph g = test::finish(b);
  auto out = run(g, {itensor(DType::Bool, {2}, {1, 0}), itensor(DType::I64, {2}, {9007199254740993, 1}),
                     itensor(DType::I64, {2}, {2, kMax64})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{9007199254740993, kMax64}));
}

TEST(EvaluateCast, F16RoundsToNearestEven) {
  // f16 has 10 mantissa bits: the spacing above 1 is 2^-10.
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even -> 1.
  // 1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even) -> 1 + 2^-9.
  // 65520 is halfway between 65504 (max) and 65536 (even, out of range) -> inf.
  Tensor x = tensor(DType::F32, {5}, {1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 65520.0, 65519.0, 0x1p-25});
  Tensor h = cast_to(x, DType::F16);
  EXPECT_EQ(h.dtype(), DType::F16);
  // 2^-25 is half the smallest subnormal 2^-24: ties to even -> 0.
  expect_close(values(h), {1.0, 1.0 + 0x1p-9, kInf, 65504.0, 0.0}, 0);
}

TEST(EvaluateCast, BF16RoundsToNearestEven) {
  // bf16 has 7 mantissa bits: spacing 2^-7 above 1.
  Tensor x = tensor(DType::F32, {3}, {1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-8 + 0x1p-20});
  expect_close(values(cast_to(x, DType::BF16)), {1.0, 1.0 + 0x1p-6, 1.0 + 0x1p-7}, 0);
}

TEST(EvaluateCast, FloatToIntTruncatesAndSaturates) {
  Tensor x = tensor(DType::F32, {5}, {2.7, -2.7, 3e9, -3e9, kNaN});
  EXPECT_EQ(ivalues(cast_to(x, DType::I32)), (std::vector<int64_t>{2, -2, 2147483647, -2147483648LL, 0}));
  Tensor y = tensor(DType::F32, {3}, {1e19, -1e19, -0.5});
  EXPECT_EQ(ivalues(cast_to(y, DType::I64)), (std::vector<int64_t>{kMax64, kMin64, 0}));
}

TEST(EvaluateCast, ToAndFromBoolAndBetweenIntegers) {
  EXPECT_EQ(ivalues(cast_to(tensor(DType::F32, {4}, {0.0, 0.5, -0.0, kNaN}), DType::Bool)),
            (std::vector<int64_t>{0, 1, 0, 1}));
  expect_close(values(cast_to(itensor(DType::Bool, {2}, {1, 0}), DType::F32)), {1, 0});
  // i64 -> i32 keeps the low 32 bits, as torch's .to(torch.int32) does.
  EXPECT_EQ(ivalues(cast_to(itensor(DType::I64, {3}, {(int64_t{1} << 32) + 5, -1, 3}), DType::I32)),
            (std::vector<int64_t>{5, -1, 3}));
  EXPECT_EQ(ivalues(cast_to(itensor(DType::I32, {1}, {-7}), DType::I64)), (std::vector<int64_t>{-7}));
}

TEST(EvaluateCast, I64ToFloatRoundsOnce) {
  // 2^24 + 1 is a tie in f32 -> 2^24. 2^60 + 2^36 + 1 is just above the tie between 2^60
  // and 2^60 + 2^37 -> 2^60 + 2^37 (going through a double first would drop the 1, land
  // on the tie, and give 2^60).
  Tensor x = itensor(DType::I64, {3}, {16777217, (int64_t{1} << 60) + (int64_t{1} << 36) + 1, -16777219});
  Tensor f = cast_to(x, DType::F32);
  expect_close(values(f), {16777216.0, 1152921642045800448.0, -16777220.0}, 0);
  // f16: 2049 is a tie between 2048 and 2050 -> 2048; 2051 -> 2052.
  expect_close(values(cast_to(itensor(DType::I64, {2}, {2049, 2051}), DType::F16)), {2048, 2052}, 0);
}

TEST(EvaluateConstant, ScalarsOfTheirDtype) {
  GraphBuilder b("k");
  Value x = b.param("x", DType::F32, {2});
  b.ret(x + b.constant(0.1, DType::F32));
  b.ret(b.constant(0.1, DType::BF16));
  Graph g = test::finish(b);
  auto out = run(g, {tensor(DType::F32, {2}, {1, 2})});
  ASSERT_EQ(out.size(), 2u);
  // The f32 constant is 0.1 rounded to f32 = 0.100000001490116.
  expect_close(values(out[0]), {1.1000000015, 2.1000000015}, 1e-7);
  EXPECT_EQ(out[1].type(), (TensorType{DType::BF16, {}}));
  expect_close(values(out[1]), {0.10009765625}, 0);  // 0.1 in bf16: 205 * 2^-11
}

}  // namespace reference_evaluate_elementwise_test
}  // namespace sf
