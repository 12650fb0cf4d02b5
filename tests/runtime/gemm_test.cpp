// The library GEMM description (runtime/gpu/gemm.h) and the Plan's gemm step: names,
// gemm_check against buffers, plan.json round trips, and plan_verify's refusals of a
// step edited by hand (each naming its field).
#include "runtime/gpu/gemm.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "runtime/plan/plan.h"

namespace sf {
namespace runtime_gemm_test {

using nlohmann::json;

// C[64, 48] = relu(x[64, 32] @ w[48, 32]^T + b[48]): nn.Linear's layout.
GemmDesc linear(GemmEpilogue e = GemmEpilogue::BiasRelu) {
  GemmDesc d;
  d.dtype = DType::F32;
  d.m = 64;
  d.n = 48;
  d.k = 32;
  d.trans_b = true;
  d.lda = 32;
  d.ldb = 32;
  d.ldc = 48;
  d.stride_a = 64 * 32;
  d.stride_b = 48 * 32;
  d.stride_c = 64 * 48;
  d.epilogue = e;
  return d;
}

std::vector<TensorType> linear_in(DType t = DType::F32) { return {{t, {64, 32}}, {t, {48, 32}}, {t, {48}}}; }
TensorType linear_out(DType t = DType::F32) { return {t, {64, 48}}; }

TEST(Gemm, NamesRoundTrip) {
  for (GemmLibrary l : {GemmLibrary::CublasLt, GemmLibrary::Cublas})
    EXPECT_EQ(parse_gemm_library(gemm_library_name(l)), l);
  for (GemmEpilogue e : {GemmEpilogue::None, GemmEpilogue::Bias, GemmEpilogue::Relu, GemmEpilogue::BiasRelu,
                         GemmEpilogue::GeluTanh, GemmEpilogue::BiasGeluTanh})
    EXPECT_EQ(parse_gemm_epilogue(gemm_epilogue_name(e)), e);
  EXPECT_EQ(gemm_library_name(GemmLibrary::CublasLt), "cublaslt");
  EXPECT_EQ(gemm_epilogue_name(GemmEpilogue::BiasGeluTanh), "bias_gelu_tanh");
  EXPECT_FALSE(parse_gemm_library("cutlass"));
  EXPECT_FALSE(parse_gemm_epilogue("gelu")) << "the erf GELU is no library epilogue";
  EXPECT_TRUE(gemm_epilogue_has_bias(GemmEpilogue::BiasRelu));
  EXPECT_FALSE(gemm_epilogue_has_bias(GemmEpilogue::GeluTanh));
}

TEST(Gemm, CheckAcceptsACallThatFitsItsBuffers) {
  EXPECT_FALSE(gemm_check(linear(), linear_in(), linear_out()));
  GemmDesc bare = linear(GemmEpilogue::None);
  bare.library = GemmLibrary::Cublas;
  EXPECT_FALSE(gemm_check(bare, {linear_in()[0], linear_in()[1]}, linear_out()));
  // A transposed A read from a [K, M] buffer, and B broadcast over a batch of 3.
  GemmDesc d = linear(GemmEpilogue::None);
  d.trans_a = true;
  d.lda = 64;
  d.batch = 3;
  d.stride_a = 32 * 64;
  d.stride_b = 0;
  EXPECT_FALSE(gemm_check(d, {{DType::F32, {3, 32, 64}}, {DType::F32, {48, 32}}}, {DType::F32, {3, 64, 48}}));
}

TEST(Gemm, CheckNamesTheFieldThatDoesNotFit) {
  struct Case {
    std::string what;
    std::function<void(GemmDesc&, std::vector<TensorType>&, TensorType&)> edit;
    std::string field, says;
  };
  const std::vector<Case> cases = {
      {"m of 0", [](GemmDesc& d, auto&, auto&) { d.m = 0; }, "m", "out of range"},
      {"k over 2^31", [](GemmDesc& d, auto&, auto&) { d.k = int64_t{1} << 31; }, "k", "out of range"},
      {"an i32 GEMM", [](GemmDesc& d, auto&, auto&) { d.dtype = DType::I32; }, "dtype", "f32, f16 or bf16"},
      {"tf32 on bf16", [](GemmDesc& d, auto& in, auto& out) {
         d.dtype = DType::BF16;
         d.tf32 = true;
         for (TensorType& t : in) t.dtype = DType::BF16;
         out.dtype = DType::BF16;
       }, "tf32", "f32"},
      {"cuBLAS with an epilogue", [](GemmDesc& d, auto&, auto&) { d.library = GemmLibrary::Cublas; }, "epilogue",
       "no epilogue"},
      {"a bias epilogue without a bias", [](GemmDesc&, auto& in, auto&) { in.pop_back(); }, "in", "reads 3"},
      {"a bias without a bias epilogue", [](GemmDesc& d, auto&, auto&) { d.epilogue = GemmEpilogue::Relu; }, "in",
       "reads 2"},
      {"B of another dtype", [](GemmDesc&, auto& in, auto&) { in[1].dtype = DType::F16; }, "in[1]", "not f32"},
      {"C of another dtype", [](GemmDesc&, auto&, auto& out) { out.dtype = DType::BF16; }, "out[0]", "not f32"},
      {"rows of A overlapping", [](GemmDesc& d, auto&, auto&) { d.lda = 31; }, "lda", "less than the 32"},
      {"A read past its end", [](GemmDesc& d, auto&, auto&) { d.lda = 33; }, "in[0]", "reads past the end"},
      {"a second matrix past the buffers", [](GemmDesc& d, auto&, auto&) {
         d.batch = 2;
         d.stride_c = 64 * 48;
       }, "in[0]", "reads past the end"},
      {"a negative batch stride", [](GemmDesc& d, auto&, auto&) { d.stride_b = -1; }, "stride_b", "negative"},
      {"a bias of M", [](GemmDesc&, auto& in, auto&) { in[2].shape = {64}; }, "in[2]", "not a vector of n = 48"},
      {"C with a row stride", [](GemmDesc& d, auto&, auto&) { d.ldc = 64; }, "ldc", "contiguous"},
      {"C of another size", [](GemmDesc&, auto&, auto& out) { out.shape = {64, 47}; }, "out[0]", "batch x m x n"},
      {"sizes whose offsets overflow", [](GemmDesc& d, auto&, auto&) {
         d.batch = kMaxGemmDim;
         d.stride_a = int64_t{1} << 40;
       }, "in[0]", "reads past the end"},
  };
  for (const Case& c : cases) {
    GemmDesc d = linear();
    std::vector<TensorType> in = linear_in();
    TensorType out = linear_out();
    c.edit(d, in, out);
    std::optional<GemmIssue> why = gemm_check(d, in, out);
    ASSERT_TRUE(why) << c.what;
    EXPECT_EQ(why->field, c.field) << c.what << ": " << why->message;
    EXPECT_NE(why->message.find(c.says), std::string::npos) << c.what << ": " << why->message;
  }
}

TEST(Gemm, StrAndFlops) {
  EXPECT_EQ(gemm_str(linear()), "cublaslt f32 [64x48x32] A [M,K] lda 32, B^T [N,K] ldb 32, epilogue bias_relu");
  EXPECT_EQ(gemm_flops(linear()), 2 * 64 * 48 * 32);
  GemmDesc huge = linear();
  huge.m = huge.n = huge.k = huge.batch = kMaxGemmDim;
  EXPECT_EQ(gemm_flops(huge), INT64_MAX) << "clamped, not overflowed";
}

// One rank: x, w, b in, y out, and one gemm step between them.
Plan gemm_plan() {
  Plan p;
  p.graph = "lin";
  p.world = 1;
  p.arch = "sm_90a";
  p.params = {"x", "w", "b"};
  p.outputs = {"y"};
  PlanRank r;
  r.buffers = {{"x", DType::F32, {64, 32}}, {"w", DType::F32, {48, 32}}, {"b", DType::F32, {48}},
               {"y", DType::F32, {64, 48}}};
  r.inputs = {0, 1, 2};
  r.input_specs = {"{}", "{}", "{}"};
  r.outputs = {3};
  r.output_specs = {"{}"};
  PlanStep s;
  s.op = "gemm";
  s.stream = "compute";
  s.in = {0, 1, 2};
  s.out = {3};
  s.gemm.name = "k0_matmul_add_relu";
  s.gemm.desc = linear();
  r.steps.push_back(s);
  p.ranks.push_back(r);
  return p;
}

TEST(PlanGemm, RoundTripsThroughPlanJson) {
  Plan p = gemm_plan();
  p.ranks[0].steps[0].gemm.desc.tf32 = true;
  const std::string text = plan_to_json(p);
  const json j = json::parse(text);
  const json& s = j["ranks"][0]["steps"][0];
  EXPECT_EQ(s["op"], "gemm");
  EXPECT_EQ(s["library"], "cublaslt");
  EXPECT_EQ(s["epilogue"], "bias_relu");
  EXPECT_EQ(s["trans_b"], true);
  EXPECT_EQ(s["ldb"], 32);
  EXPECT_FALSE(s.contains("kernel")) << "a gemm step names no PTX kernel";
  Result<Plan> back = plan_from_json(text, "plan.json");
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->ranks[0].steps[0].gemm.desc, p.ranks[0].steps[0].gemm.desc);
  EXPECT_EQ(back->ranks[0].steps[0].gemm.name, "k0_matmul_add_relu");
  EXPECT_EQ(back->ranks[0].steps[0].in, (std::vector<int>{0, 1, 2}));
}

TEST(PlanGemm, AnEditedStepIsRefusedNamingItsField) {
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::string at = "plan.json: error: ranks[0].steps[0]";
  const std::vector<Case> cases = {
      {"unknown library", [](json& s) { s["library"] = "cutlass"; }, at + ".library: unknown library \"cutlass\""},
      {"unknown epilogue", [](json& s) { s["epilogue"] = "gelu"; }, at + ".epilogue: unknown epilogue \"gelu\""},
      {"unknown dtype", [](json& s) { s["dtype"] = "f64"; }, at + ".dtype: unknown dtype"},
      {"m of 0", [](json& s) { s["m"] = 0; }, at + ".m: 0 is out of range"},
      {"n of 2^31", [](json& s) { s["n"] = int64_t{1} << 31; }, at + ".n: 2147483648 is out of range"},
      {"k of 2.5", [](json& s) { s["k"] = 2.5; }, at + ".k: 2.5 is not an integer"},
      {"a huge lda", [](json& s) { s["lda"] = 1e30; }, at + ".lda: 1e+30 is not an integer"},
      {"a negative stride", [](json& s) { s["stride_b"] = -2; }, at + ".stride_b: -2 is out of range"},
      {"no trans_a", [](json& s) { s.erase("trans_a"); }, at + ": missing \"trans_a\""},
      {"trans_b not a bool", [](json& s) { s["trans_b"] = 1; }, at + ".trans_b: 1 is not true or false"},
      {"no library", [](json& s) { s.erase("library"); }, at + ": missing \"library\""},
      {"a buffer that does not exist", [](json& s) { s["in"][1] = 9; }, at + ".in[1]: buffer 9 does not exist"},
      {"k that does not match the buffers", [](json& s) { s["k"] = 40; }, at + ".lda: 32 is less than the 40"},
      {"A read past its buffer", [](json& s) { s["m"] = 65; }, at + ".in[0]: A"},
      {"the bias as C", [](json& s) { s["out"][0] = 2; }, at + ".out[0]: C is f32[48], not batch x m x n"},
      {"a bias epilogue without the bias", [](json& s) { s["in"] = {0, 1}; }, at + ".in: 2 buffer(s)"},
      {"cuBLAS with an epilogue", [](json& s) { s["library"] = "cublas"; }, at + ".epilogue: bias_relu: cuBLAS's GemmEx"},
      {"two outputs", [](json& s) { s["out"] = {3, 3}; }, at + ".out: a gemm step writes one buffer"},
      {"on the comm stream", [](json& s) { s["stream"] = "comm"; }, at + ".stream: \"comm\": a gemm step runs on the compute"},
      {"C of another dtype", [](json& s) { s["dtype"] = "bf16"; }, at + ".in[0]: A is f32[64, 32], not bf16"},
  };
  const std::string good = plan_to_json(gemm_plan());
  ASSERT_TRUE(plan_from_json(good, "plan.json"));
  for (const Case& c : cases) {
    json j = json::parse(good);
    c.edit(j["ranks"][0]["steps"][0]);
    Result<Plan> p = plan_from_json(j.dump(), "plan.json");
    ASSERT_FALSE(p) << c.what;
    EXPECT_NE(p.error().str().find(c.want), std::string::npos) << c.what << ": want '" << c.want << "' in\n"
                                                               << p.error().str();
  }
}

TEST(PlanGemm, CMustNotBeAnOperand) {
  // x made [64, 48] so that it could hold C: then only the aliasing is wrong.
  Plan p = gemm_plan();
  p.ranks[0].buffers[0].shape = {64, 48};
  p.ranks[0].buffers[1].shape = {48, 48};
  GemmDesc& d = p.ranks[0].steps[0].gemm.desc;
  d.k = d.lda = d.ldb = 48;
  ASSERT_TRUE(plan_from_json(plan_to_json(p), "plan.json"));
  p.ranks[0].steps[0].out = {0};
  p.ranks[0].outputs = {0};
  Result<Plan> r = plan_from_json(plan_to_json(p), "plan.json");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().str().find("ranks[0].steps[0].out[0]: C is buffer 0, which in[0] also is"), std::string::npos)
      << r.error().str();
}

}  // namespace runtime_gemm_test
}  // namespace sf
