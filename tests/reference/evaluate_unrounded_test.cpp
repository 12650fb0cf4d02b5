// evaluate_unrounded(): the reference that never rounds f16/bf16 values, against
// values worked out here in f32 arithmetic with one rounding at the end.
#include "codegen/reference/evaluate_unrounded.h"

#include <gtest/gtest.h>

#include "codegen/ir/builder.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace reference_evaluate_unrounded_test {

// Whether `g` has an f16 or bf16 value.
bool has_16bit_values(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.type.dtype == DType::F16 || n.type.dtype == DType::BF16) return true;
  return false;
}

// One rounding of `v` to `t` (Tensor::set rounds to nearest even).
double round_to(DType t, double v) {
  Tensor x(t, {1});
  x.set(0, v);
  return x.get(0);
}

// A bf16 chain, x * x + x: the eager reference rounds x * x to bf16 before the add;
// this one adds in f32 and rounds once, at the output. Random inputs differ between
// the two somewhere, and this one equals the f32 computation rounded once everywhere.
TEST(EvaluateUnrounded, ABf16ChainRoundsOnceAtTheOutput) {
  GraphBuilder b("chain");
  Value x = b.param("x", DType::BF16, {1024});
  b.ret(x * x + x);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  std::vector<Tensor> in = random_inputs(*g, 7);
  Result<std::vector<Tensor>> eager = evaluate(*g, in);
  Result<std::vector<Tensor>> once = evaluate_unrounded(*g, in);
  ASSERT_TRUE(eager.ok() && once.ok());
  ASSERT_EQ((*once)[0].dtype(), DType::BF16);
  int differ = 0;
  for (int64_t i = 0; i < 1024; ++i) {
    const float v = static_cast<float>(in[0].get(i));
    const float f32 = v * v + v;  // each op rounded to f32, as the widened graph does
    ASSERT_EQ((*once)[0].get(i), round_to(DType::BF16, f32)) << "element " << i;
    EXPECT_EQ((*eager)[0].get(i), round_to(DType::BF16, round_to(DType::BF16, double(v) * v) + v)) << "element " << i;
    if ((*once)[0].get(i) != (*eager)[0].get(i)) ++differ;
  }
  EXPECT_GT(differ, 0) << "the two references must differ somewhere, or this test shows nothing";
}

// A cast to bf16 and back is the identity here (the value is never rounded), and a
// round trip in the eager reference; integer values (argmax) and f32 params stay.
TEST(EvaluateUnrounded, CastsToSixteenBitsDoNotRoundAndIntegersStay) {
  GraphBuilder b("casts");
  Value x = b.param("x", DType::F32, {3});
  b.ret(cast(cast(x, DType::BF16), DType::F32));
  b.ret(argmax(cast(x, DType::F16), 0));
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  EXPECT_TRUE(has_16bit_values(*g));
  Result<Graph> wide = widen_16bit(*g);
  ASSERT_TRUE(wide.ok()) << wide.error().str();
  EXPECT_FALSE(has_16bit_values(*wide));
  EXPECT_EQ(wide->node(wide->outputs()[1].value).type.dtype, DType::I64);
  Tensor in(DType::F32, {3});
  in.set(0, 1.00390625);  // 1 + 2^-8: between two bf16 values
  in.set(1, -2.5);
  in.set(2, 1.0039065);  // above it in f32, the same f16 value
  Result<std::vector<Tensor>> eager = evaluate(*g, {in});
  Result<std::vector<Tensor>> once = evaluate_unrounded(*g, {in});
  ASSERT_TRUE(eager.ok() && once.ok());
  EXPECT_EQ((*once)[0].get(0), 1.00390625);
  EXPECT_EQ((*eager)[0].get(0), 1.0);  // the tie to even
  EXPECT_EQ((*once)[1].get_int(0), 2);  // 1.0039065 > 1.00390625 unrounded
  EXPECT_EQ((*eager)[1].get_int(0), 0);  // both 1.00390625 in f16: the first of the ties
}

// A graph without f16/bf16 values has nothing to widen: the two references agree bit
// for bit.
TEST(EvaluateUnrounded, AnF32GraphIsTheEagerReference) {
  GraphBuilder b("f32");
  Value x = b.param("x", DType::F32, {64});
  b.ret(x * x + x);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(has_16bit_values(*g));
  std::vector<Tensor> in = random_inputs(*g, 3);
  Result<std::vector<Tensor>> eager = evaluate(*g, in);
  Result<std::vector<Tensor>> once = evaluate_unrounded(*g, in);
  ASSERT_TRUE(eager.ok() && once.ok());
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ((*once)[0].get(i), (*eager)[0].get(i)) << "element " << i;
}

}  // namespace reference_evaluate_unrounded_test
}  // namespace sf
