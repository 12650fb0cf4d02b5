// A kernel's fields in plan.json beyond its launch: TMA tensor maps
// (runtime/plan/plan.h's PlanTensorMap), how a kernel step's maps round-trip, and how a
// hand-edited map is refused, naming its field, before any driver sees it: a map
// reaches only inside the input buffer it is encoded over. Also its kind (one
// KernelKind) and its host code (version 2).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/plan/plan.h"

namespace sf {
namespace runtime_plan_tensor_map_test {

using json = nlohmann::json;

// y = x @ transpose(w) on sm_90a: x bf16[256, 512] and w bf16[384, 512], both K-major.
Plan tma_plan() {
  Plan p;
  p.graph = "lin";
  p.world = 1;
  p.arch = "sm_90a";
  p.params = {"x", "w"};
  p.outputs = {"y"};
  PlanKernel k;
  k.id = "k0_matmul";
  k.entry = "sf_k0_matmul";
  k.kind = KernelKind::Matmul;
  k.ptx_file = "k0_matmul.ptx";
  k.grid = {2, 1, 1};
  k.block = {256, 1, 1};
  k.shared_bytes = 196640;
  k.tensor_maps.push_back(PlanTensorMap{0, DType::BF16, 2, {512, 256, 1}, {1024, 0}, {64, 128, 1}});
  k.tensor_maps.push_back(PlanTensorMap{1, DType::BF16, 2, {512, 384, 1}, {1024, 0}, {64, 256, 1}});
  p.kernels.push_back(k);
  PlanRank r;
  r.buffers = {{"x", DType::BF16, {256, 512}}, {"w", DType::BF16, {384, 512}}, {"y", DType::BF16, {256, 384}}};
  r.inputs = {0, 1};
  r.input_specs = {"{}", "{}"};
  r.outputs = {2};
  r.output_specs = {"{}"};
  PlanStep s;
  s.op = "kernel";
  s.stream = "compute";
  s.kernel = "k0_matmul";
  s.in = {0, 1};
  s.out = {2};
  r.steps.push_back(s);
  p.ranks.push_back(r);
  return p;
}

TEST(PlanTensorMap, RoundTripsThroughPlanJson) {
  Plan p = tma_plan();
  p.kernels[0].tensor_maps[1] = PlanTensorMap{1, DType::BF16, 3, {512, 128, 3}, {1024, 131072}, {64, 64, 1}};
  const std::string text = plan_to_json(p);
  const json m = json::parse(text)["kernels"][0]["tensor_maps"][1];
  EXPECT_EQ(m["dims"], json::array({512, 128, 3}));
  EXPECT_EQ(m["strides"], json::array({1024, 131072}));
  EXPECT_EQ(m["box"], json::array({64, 64, 1}));
  Result<Plan> back = plan_from_json(text, "plan.json");
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->kernels[0].tensor_maps, p.kernels[0].tensor_maps);
  // The attention's maps over heads of permuted projections: rank 4 and 5, strides
  // in any order (x as [256 rows, 2 heads of 128, 2 more of 64] would not be one).
  p.kernels[0].tensor_maps[0] = PlanTensorMap{0, DType::BF16, 4, {128, 256, 2, 2, 1}, {1024, 256, 512}, {64, 64, 1, 1, 1}};
  p.kernels[0].tensor_maps[1] = PlanTensorMap{1, DType::BF16, 5, {64, 96, 2, 2, 2}, {1024, 128, 512, 256}, {64, 32, 1, 1, 1}};
  const std::string text5 = plan_to_json(p);
  EXPECT_EQ(json::parse(text5)["kernels"][0]["tensor_maps"][1]["strides"], json::array({1024, 128, 512, 256}));
  Result<Plan> back5 = plan_from_json(text5, "plan.json");
  ASSERT_TRUE(back5) << back5.error().str();
  EXPECT_EQ(back5->kernels[0].tensor_maps, p.kernels[0].tensor_maps);
  EXPECT_EQ(back5->kernels[0].tensor_maps[1].dims, (std::array<int64_t, 5>{64, 96, 2, 2, 2}));
  // A kernel without maps writes none.
  Plan q = tma_plan();
  q.kernels[0].tensor_maps.clear();
  EXPECT_FALSE(json::parse(plan_to_json(q))["kernels"][0].contains("tensor_maps"));
}

TEST(PlanTensorMap, AnEditedMapIsRefusedNamingItsField) {
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::string at = "plan.json: error: kernels[0].tensor_maps[0]";
  const std::vector<Case> cases = {
      {"an input the step lacks", [](json& m) { m["input"] = 2; }, at + ".input: 2 is not an input of ranks[0].steps[0]"},
      {"another dtype",
       [](json& m) {
         m["dtype"] = "f32";
         m["box"][0] = 32;
       },
       at + ".dtype: f32, but ranks[0].steps[0]'s input 0 is bf16"},
      {"an integer dtype", [](json& m) { m["dtype"] = "i32"; }, at + ".dtype: \"i32\" is not a tensor map dtype"},
      {"rows past the buffer", [](json& m) { m["dims"][1] = 257; }, at + ": reaches 263168 bytes into"},
      {"a stride past the buffer", [](json& m) { m["strides"][0] = 2048; }, at + ": reaches 523264 bytes into"},
      {"a stride off 16 bytes", [](json& m) { m["strides"][0] = 1000; }, at + ".strides[0]: 1000 is not a multiple of 16"},
      {"a stride of 0", [](json& m) { m["strides"][0] = 0; }, at + ".strides[0]: 0 is out of range"},
      {"a box wider than the swizzle", [](json& m) { m["box"][0] = 128; }, at + ".box: the innermost box side is 256 bytes"},
      {"a box of 257", [](json& m) { m["box"][1] = 257; }, at + ".box[1]: 257 is out of range"},
      {"six dims", [](json& m) { m["dims"] = {512, 256, 1, 1, 1, 1}; }, at + ".dims: 6 entries, more than"},
      {"one dim", [](json& m) { m["dims"] = {512}; }, at + ".dims: needs 2 to 5 extents"},
      {"a fourth dim past the buffer",
       [](json& m) {
         m["dims"] = {512, 128, 2, 2};
         m["strides"] = {1024, 131072, 16};
         m["box"] = {64, 128, 1, 1};
       },
       at + ": reaches 262160 bytes into"},
      {"strides that do not match the dims", [](json& m) { m["strides"] = {1024, 16}; }, at + ".strides: needs one stride"},
      {"a dim of 0", [](json& m) { m["dims"][0] = 0; }, at + ".dims[0]: 0 is out of range"},
      {"no box", [](json& m) { m.erase("box"); }, at + ": missing \"box\""},
  };
  const std::string good = plan_to_json(tma_plan());
  ASSERT_TRUE(plan_from_json(good, "plan.json")) << plan_from_json(good, "plan.json").error().str();
  for (const Case& c : cases) {
    json j = json::parse(good);
    c.edit(j["kernels"][0]["tensor_maps"][0]);
    Result<Plan> p = plan_from_json(j.dump(), "plan.json");
    ASSERT_FALSE(p) << c.what;
    EXPECT_NE(p.error().str().find(c.want), std::string::npos) << c.what << ": want '" << c.want << "' in\n"
                                                               << p.error().str();
  }
}

// A TMA store's map (PlanTensorMap::output): written with "output" in place of
// "input", read back the same, and held to its output buffer as an input's map is
// to its input: index, dtype and reach, and never both keys.
TEST(PlanTensorMap, AStoresMapIsOverAnOutputBuffer) {
  Plan p = tma_plan();
  PlanTensorMap o{0, DType::BF16, 2, {384, 256, 1}, {768, 0}, {64, 16, 1}};
  o.output = 0;
  p.kernels[0].tensor_maps.push_back(o);
  const std::string text = plan_to_json(p);
  const json m = json::parse(text)["kernels"][0]["tensor_maps"][2];
  EXPECT_EQ(m["output"], 0);
  EXPECT_FALSE(m.contains("input"));
  EXPECT_FALSE(json::parse(text)["kernels"][0]["tensor_maps"][0].contains("output"));
  Result<Plan> back = plan_from_json(text, "plan.json");
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->kernels[0].tensor_maps, p.kernels[0].tensor_maps);
  EXPECT_EQ(back->kernels[0].tensor_maps[2].output, 0);
  EXPECT_EQ(back->kernels[0].tensor_maps[0].output, -1);
  const std::string at = "plan.json: error: kernels[0].tensor_maps[2]";
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"an output the step lacks", [](json& j) { j["output"] = 1; }, at + ".output: 1 is not an output of ranks[0].steps[0] (it has 1)"},
      {"both keys", [](json& j) { j["input"] = 0; }, at + ": names both an input and an output"},
      {"rows past y", [](json& j) { j["dims"][1] = 257; }, at + ": reaches 197376 bytes into ranks[0].steps[0]'s output 0"},
      {"another dtype",
       [](json& j) {
         j["dtype"] = "f32";
         j["box"][0] = 32;
       },
       at + ".dtype: f32, but ranks[0].steps[0]'s output 0 is bf16"},
  };
  for (const Case& c : cases) {
    json j = json::parse(text);
    c.edit(j["kernels"][0]["tensor_maps"][2]);
    Result<Plan> bad = plan_from_json(j.dump(), "plan.json");
    ASSERT_FALSE(bad) << c.what;
    EXPECT_NE(bad.error().str().find(c.want), std::string::npos) << c.what << ": want '" << c.want << "' in\n"
                                                                 << bad.error().str();
  }
}

TEST(PlanKernelFields, KindAndHostCodeRoundTripAndBadOnesAreNamed) {
  Plan p = tma_plan();
  p.host_object = "host_kernels.so";
  p.kernels[0].host_symbol = "sf_k0_matmul";
  p.kernels[0].host_config = "host_tile_n=64";
  p.kernels[0].host_zero_outputs = true;
  p.kernels[0].workspace_bytes = 16388;  // a split-K kernel's
  const std::string text = plan_to_json(p);
  const json j = json::parse(text);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["kernels"][0]["kind"], "matmul");
  EXPECT_EQ(j["host_object"], "host_kernels.so");
  EXPECT_EQ(j["kernels"][0]["host"]["symbol"], "sf_k0_matmul");
  Result<Plan> back = plan_from_json(text, "plan.json");
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->kernels[0].kind, KernelKind::Matmul);
  EXPECT_EQ(back->host_object, "host_kernels.so");
  EXPECT_EQ(back->kernels[0].host_symbol, "sf_k0_matmul");
  EXPECT_EQ(back->kernels[0].host_config, "host_tile_n=64");
  EXPECT_TRUE(back->kernels[0].host_zero_outputs);
  EXPECT_EQ(j["kernels"][0]["workspace_bytes"], 16388);
  EXPECT_EQ(back->kernels[0].workspace_bytes, 16388);
  Plan none = tma_plan();
  EXPECT_FALSE(json::parse(plan_to_json(none))["kernels"][0].contains("workspace_bytes"));
  EXPECT_FALSE(json::parse(plan_to_json(none)).contains("precision"));
  none.precision = "eager";
  Result<Plan> eager = plan_from_json(plan_to_json(none), "plan.json");
  ASSERT_TRUE(eager) << eager.error().str();
  EXPECT_EQ(eager->precision, "eager");
  json bad_precision = json::parse(plan_to_json(none));
  bad_precision["precision"] = "approximate";
  Result<Plan> refused = plan_from_json(bad_precision.dump(), "plan.json");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().str().find("precision: \"approximate\" is not \"fused\" or \"eager\""), std::string::npos)
      << refused.error().str();

  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"unknown kind", [](json& k) { k["kind"] = "convolution"; }, "kernels[0].kind: unknown kernel kind \"convolution\""},
      {"host not an object", [](json& k) { k["host"] = "sf_k0"; }, "kernels[0].host: \"sf_k0\" is not an object"},
      {"empty host symbol", [](json& k) { k["host"]["symbol"] = ""; }, "kernels[0].host.symbol: must not be empty"},
      {"host without symbol", [](json& k) { k["host"].erase("symbol"); }, "kernels[0].host: missing \"symbol\""},
      {"negative workspace", [](json& k) { k["workspace_bytes"] = -4; }, "kernels[0].workspace_bytes"},
      {"huge workspace", [](json& k) { k["workspace_bytes"] = int64_t{1} << 60; }, "kernels[0].workspace_bytes"},
      {"workspace not a number", [](json& k) { k["workspace_bytes"] = "4k"; }, "kernels[0].workspace_bytes"},
  };
  for (const Case& c : cases) {
    json e = j;
    c.edit(e["kernels"][0]);
    Result<Plan> r = plan_from_json(e.dump(), "plan.json");
    ASSERT_FALSE(r) << c.what;
    EXPECT_NE(r.error().str().find(c.want), std::string::npos) << c.what << ": " << r.error().str();
  }
}

}  // namespace runtime_plan_tensor_map_test
}  // namespace sf
