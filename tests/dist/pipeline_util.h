// Shared by the distribution tests (pipeline, propagate, lower, schedule): an
// example graph, and one run of the pipeline on every rank in lockstep whose outputs
// are gathered and checked against the reference evaluator on the global graph.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "codegen/dist/lockstep.h"
#include "codegen/dist/lower.h"
#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "runtime/core/shard.h"
#include "tests/result_util.h"

namespace sf::dist_test {

struct Ran {
  std::vector<LocalProgram> programs;
  ShardingPlan plan;
};

// Runs g on its mesh with seeded inputs and checks every output against the reference.
// Kernel steps run through `kernels` (the reference evaluator by default; the kernel
// tests pass generated host code).
// The pipeline runs decompose_for_sharding(g), as compile_plan does (ran.plan is that
// graph's); the reference evaluates g itself.
inline Ran run_and_check(const Graph& g0, uint64_t seed, const std::string& what, bool fused = true,
                         const KernelRunner& kernels = reference_kernel_runner()) {
  const Graph g = decompose_for_sharding(g0);
  DeviceMesh mesh(g.mesh());
  Ran ran;
  ran.plan = propagate(g, mesh);
  std::vector<Tensor> global = random_inputs(g0, seed);
  ran.programs = ok_value(rank_programs(g, ran.plan, mesh, [&] { RankPipelineOptions o; o.fuse = fused; return o; }()));
  std::vector<std::vector<Tensor>> inputs;
  for (int r = 0; r < mesh.world(); ++r) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < g.params().size(); ++i)
      in.push_back(shard_tensor(global[i], ran.plan.nodes[static_cast<size_t>(g.params()[i])].output, mesh, r));
    inputs.push_back(in);
  }
  auto out = simulate(ran.programs, mesh, inputs, kernels);
  EXPECT_TRUE(out.ok()) << what << ": " << (out.ok() ? "" : out.error().str());
  if (!out.ok()) return ran;
  auto want = evaluate(g0, global);
  EXPECT_TRUE(want.ok()) << what;
  if (!want.ok()) return ran;
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    std::vector<Tensor> locals;
    for (int r = 0; r < mesh.world(); ++r) locals.push_back((*out)[static_cast<size_t>(r)][o]);
    Result<Tensor> got = unshard_tensor(locals, g.node(g.outputs()[o].value).type, ran.plan.outputs[o], mesh);
    EXPECT_TRUE(got.ok()) << what << ": " << (got.ok() ? "" : got.error().str());
    if (!got.ok()) continue;
    Comparison c = compare(*got, (*want)[o], default_tolerance(got->dtype()));
    EXPECT_TRUE(c.ok()) << what << " output " << g.outputs()[o].name << ": max_abs_err " << c.max_abs_err;
  }
  return ran;
}

inline Graph example(const std::string& name) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + name);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

inline const char* kExamples[] = {"tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf", "transformer_block.sf",
                           "fsdp_tp_2d.sf", "fsdp_mlp.sf", "causal_attention.sf", "vocab_parallel_loss.sf",
                           "llama_block.sf"};

}  // namespace sf::dist_test
