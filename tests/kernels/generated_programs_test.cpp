// Whole programs on generated host kernels: every example on every rank, and every
// op under many input placements, run with HostKernelRunner (each fused kernel
// emitted and JIT-compiled for the host) and compared with the reference evaluator
// on the global graph. No kernel may fall back to the reference.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/core/shard.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "codegen/dist/lockstep.h"

namespace sf {
namespace kernels_generated_programs_test {

HostKernelRunner& runner() {
  static std::unique_ptr<HostKernelRunner> r = [] {
    auto x = HostKernelRunner::create();
    if (!x.ok()) throw std::runtime_error(x.error().message);
    return std::move(x).value();
  }();
  return *r;
}

void check(const Graph& g, uint64_t seed, const std::string& what) {
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(g, mesh);
  std::vector<LocalProgram> ps = rank_programs(g, plan, mesh);
  std::vector<Tensor> global = random_inputs(g, seed);
  std::vector<std::vector<Tensor>> inputs;
  for (int r = 0; r < mesh.world(); ++r) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < g.params().size(); ++i)
      in.push_back(shard_tensor(global[i], plan.nodes[static_cast<size_t>(g.params()[i])].output, mesh, r));
    inputs.push_back(in);
  }
  int fallbacks_before = runner().stats().fallbacks;
  auto out = simulate(ps, mesh, inputs, runner());
  ASSERT_TRUE(out.ok()) << what << ": " << out.error().str();
  EXPECT_EQ(runner().stats().fallbacks, fallbacks_before) << what << ": a kernel ran on the reference: " << [] { std::string s; for (const auto& [k, why] : runner().stats().fallback_reasons) s += k + ": " + why + "; "; return s; }();
  auto want = evaluate(g, global);
  ASSERT_TRUE(want.ok()) << what;
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    std::vector<Tensor> locals;
    for (int r = 0; r < mesh.world(); ++r) locals.push_back((*out)[static_cast<size_t>(r)][o]);
    Result<Tensor> got = unshard_tensor(locals, g.node(g.outputs()[o].value).type, plan.outputs[o], mesh);
    ASSERT_TRUE(got.ok()) << what;
    Comparison c = compare(*got, (*want)[o], default_tolerance(got->dtype()));
    EXPECT_TRUE(c.ok()) << what << " output " << o << ": max_abs_err " << c.max_abs_err << " at "
                        << c.first_mismatch;
  }
}

Graph example(const std::string& name, int64_t world = 0) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + name);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  if (world == 0) return std::move(g).value();
  Mesh m = g->mesh();
  m.dims[0].size = world;
  Result<Graph> r = remesh(*g, m);
  if (!r.ok()) throw std::runtime_error(r.error().str());
  return std::move(r).value();
}

TEST(GeneratedPrograms, EveryExampleOnEveryRank) {
  for (const char* e : {"tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf", "transformer_block.sf", "fsdp_tp_2d.sf",
                        "fsdp_mlp.sf", "rope.sf"})
    check(example(e), 21, e);
  for (const char* e : {"tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf", "transformer_block.sf", "fsdp_mlp.sf",
                        "rope.sf"}) {
    check(example(e, 3), 22, std::string(e) + " on 3 ranks");
    check(example(e, 2), 23, std::string(e) + " on 2 ranks");
  }
}

TEST(GeneratedPrograms, OpsUnderInputPlacements) {
  struct Case {
    std::string params, expr;
  };
  const Case cases[] = {
      {"a: f32[5, 6] {A}, b: f32[6] {B}", "gelu(add(a, b))"},
      {"a: f32[5, 6] {A}, b: f32[6] {B}", "where(gt(a, b), exp(a), tanh(b))"},
      {"a: f32[5, 6] {A}, b: f32[6] {B}", "softmax(mul(a, b), dim=1)"},
      {"a: f32[5, 6] {A}, b: f32[6] {B}", "rms_norm(a, b)"},
      {"a: f32[5, 6] {A}, b: f32[6] {B}", "layer_norm(a, b, b)"},
      {"a: f32[5, 6] {A}, b: f32[6, 7] {B}", "relu(matmul(a, b))"},
      {"a: f32[2, 5, 6] {A}, b: f32[6, 3] {B}", "matmul(a, b)"},
      {"a: f32[5, 6] {A}, b: f32[7, 6] {B}", "matmul(a, transpose(b, 0, 1))"},
      {"a: bf16[5, 6] {A}, b: bf16[6] {B}", "sum(mul(a, b), dims=[1])"},
      {"a: f16[5, 6] {A}, b: f16[6] {B}", "max(sub(a, b), dims=[0], keepdim=true)"},
      {"a: f32[8, 4] {A}, b: f32[32] {B}", "add(reshape(a, shape=[32]), b)"},
      {"a: i32[5, 6] {A}, b: i32[6] {B}", "sum(mul(a, b), dims=[0])"},
      {"a: i64[5, 2] {A}, b: f32[10, 4] {B}", "relu(embedding(a, b))"},
      {"a: f32[5, 6] {A}, b: f32[5, 6] {B}", "mul(concat(neg(slice(a, dim=1, start=3)), slice(b, dim=1, end=3), dim=1), b)"},
      {"a: f32[5, 6] {A}, b: f32[6] {B}",
       "sum(mul(concat(slice(a, dim=1, start=1, step=2), slice(a, dim=1, end=3)), slice(b, dim=0, end=3)), dims=[0])"},
  };
  const Placement choices[] = {Placement::replicate(), Placement::shard(0), Placement::shard(-1), Placement::partial()};
  for (const Case& c : cases)
    for (const Placement& pa : choices)
      for (const Placement& pb : choices) {
        std::string params = c.params;
        params.replace(params.find("{A}"), 3, "{tp: " + pa.str() + "}");
        params.replace(params.find("{B}"), 3, "{tp: " + pb.str() + "}");
        std::string text = "mesh tp=4\ngraph g(" + params + ") {\n  out = " + c.expr + "\n  return out\n}\n";
        Result<Graph> g = parse_graph(text, "case.sf");
        ASSERT_TRUE(g.ok()) << g.error().str() << "\n" << text;
        check(*g, 31, text);
        if (HasFailure()) return;
      }
}

}  // namespace kernels_generated_programs_test
}  // namespace sf
