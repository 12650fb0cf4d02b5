// Whole programs on generated host kernels: every example on every rank, and every
// op under many input placements, run with HostKernelRunner (each fused kernel
// emitted and JIT-compiled for the host) and compared with the reference evaluator
// on the global graph. No kernel may fall back to the reference.
#include <gtest/gtest.h>

#include <cmath>

#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "tests/kernels/host_program_check.h"

namespace sf {
namespace kernels_generated_programs_test {

void check(const Graph& g, uint64_t seed, const std::string& what) { kernel_test::check_on_host_kernels(g, seed, what); }

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
