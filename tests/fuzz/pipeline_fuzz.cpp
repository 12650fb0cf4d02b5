// libFuzzer target past the parser: the bytes become a small graph (graph_gen.h);
// when `check` accepts it (parse_graph: parse + verify), every command's library
// path must finish without a crash, hang or sanitizer report:
//   explain   propagation, per-rank lowering, fusion and scheduling, the explain text;
//   run --kernels reference   a host Plan, every rank as a thread over Gloo through the
//             Plan executor, kernels on the reference evaluator, gathered to global shapes;
//   run       the same with generated host kernels (JIT), split where an emitter
//             cannot go, as `run` does;
//   compile   compile_plan for sm_90a without ptxas (compile --no-ptxas).
// Where the reference evaluator produces a result, both runs must produce it too and
// agree with it within the tolerances `run --check` uses (check_tolerance), the
// generated kernels under --precision eager where fused precision differs: a run that fails, or
// differs, on a graph `check` accepted aborts with the graph's text.
//
// SF_FUZZ_VERBOSE=1 prints each generated graph before it runs (to turn a crash
// input into a .sf file for the CLI). docs/testing.md says how to run it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "codegen/dist/explain.h"
#include "codegen/dist/propagate.h"
#include "codegen/ir/decompose.h"
#include "runtime/core/shard.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "runtime/plan/plan_exec.h"
#include "tests/fuzz/graph_gen.h"
#include "tests/result_util.h"

namespace {

using namespace sf;

[[noreturn]] void fail(const std::string& text, const std::string& what) {
  std::fprintf(stderr, "==== graph ====\n%s==== %s\n", text.c_str(), what.c_str());
  std::abort();
}

// Compiles the graph to a host Plan in memory and runs every rank as a thread
// through the Plan executor, gathering the outputs (the CLI's `run` without
// --rank): the global outputs, or the error the compile or the run reported.
Result<std::vector<Tensor>> run_all(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh,
                                    const RankPipelineOptions& po, const std::vector<Tensor>& global_in,
                                    CompileOptions::HostCode host, Precision precision = Precision::Fused) {
  CompileOptions co;
  co.arch = "host";
  co.ptx = false;
  co.host = host;
  co.precision = precision;
  co.pipeline = po;
  Result<CompiledPlan> cp = compile_plan(g, co);
  if (!cp) return cp.error();
  std::vector<std::vector<Tensor>> inputs;
  for (int r = 0; r < mesh.world(); ++r) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < g.params().size(); ++i)
      in.push_back(shard_tensor(global_in[i], plan.nodes[static_cast<size_t>(g.params()[i])].output, mesh, r));
    inputs.push_back(std::move(in));
  }
  GpuRunOptions eo;
  // Far above what these sizes need; libFuzzer's -timeout reports a real hang first.
  eo.timeout = std::chrono::seconds(60);
  Result<std::vector<std::vector<Tensor>>> out = run_plan_on_host(cp->plan, cp->host_kernels, inputs, eo);
  if (!out) return out.error();
  std::vector<Tensor> global;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    std::vector<Tensor> locals;
    for (int r = 0; r < mesh.world(); ++r) locals.push_back((*out)[static_cast<size_t>(r)][i]);
    Result<Tensor> t = unshard_tensor(locals, g.node(g.outputs()[i].value).type, plan.outputs[i], mesh);
    if (!t) return t.error();
    global.push_back(std::move(t).value());
  }
  return global;
}

// The tolerance is run --check's (check_tolerance): under the default fused
// precision a kernel keeps f16/bf16 values in f32 where the reference rounds them, so
// an f32 output computed from them may differ by their rounding.
// The first output that differs, as a message; "" when all agree.
std::string mismatch(const Graph& g, const char* what, const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  if (got.size() != want.size()) return std::string(what) + ": wrong number of outputs";
  for (size_t i = 0; i < want.size(); ++i) {
    Comparison c = compare(got[i], want[i], check_tolerance(g, g.outputs()[i].value));
    if (!c.ok())
      return std::string(what) + ": output " + std::to_string(i) + " differs from the reference: " +
             std::to_string(c.mismatches) + " mismatches, first at " + std::to_string(c.first_mismatch) + " (got " +
             std::to_string(got[i].get(c.first_mismatch)) + ", want " + std::to_string(want[i].get(c.first_mismatch)) +
             "), max abs err " + std::to_string(c.max_abs_err);
  }
  return "";
}

void check_against(const std::string& text, const Graph& g, const char* what, const Result<std::vector<Tensor>>& got,
                   const std::vector<Tensor>& want) {
  if (!got) fail(text, std::string(what) + " failed where the reference evaluator did not: " + got.error().str());
  if (std::string m = mismatch(g, what, got.value(), want); !m.empty()) fail(text, m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("SF_FUZZ_VERBOSE") != nullptr;
  sf::fuzz::GeneratedCase c = sf::fuzz::generate_graph(data, size);
  if (verbose) std::fprintf(stderr, "==== graph (seed %llu, fuse %d, reorder %d, decompose %d) ====\n%s",
                            static_cast<unsigned long long>(c.seed), c.fuse, c.reorder, c.decompose, c.text.c_str());
  Result<Graph> parsed = parse_graph(c.text, "fuzz.sf");
  if (!parsed) {
    if (verbose) std::fprintf(stderr, "rejected: %s\n", parsed.error().str().c_str());
    return -1;  // not worth keeping in the corpus: check refuses it
  }
  const Graph& g = *parsed;
  // What every command propagates and lowers (compile_plan does the same); the
  // reference evaluates g itself.
  const Graph gs = decompose_for_sharding(g);

  // explain
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(gs, mesh);
  RankPipelineOptions po;
  po.fuse = c.fuse;
  po.reorder = c.reorder;
  po.decompose.mode = c.decompose == 1 ? DecomposeMode::Always : c.decompose == 2 ? DecomposeMode::Never : DecomposeMode::Auto;
  std::vector<DecomposeDecision> decisions;
  po.decisions = &decisions;
  std::vector<LocalProgram> programs = ok_value(rank_programs(gs, plan, mesh, po));
  po.decisions = nullptr;
  std::string explained = explain_sharding(gs, plan, mesh) + explain_kernels(programs[0]) + explain_schedule(programs[0], mesh);
  for (const LocalStep& s : programs[0].steps) explained += step_line(programs[0], s, mesh);
  if (explained.empty()) fail(c.text, "explain printed nothing");

  // The oracle, on the global graph.
  std::vector<Tensor> inputs = random_inputs(g, c.seed);
  Result<std::vector<Tensor>> want = evaluate(g, inputs);

  // run --kernels reference
  RankPipelineOptions rpo = po;
  rpo.decisions = nullptr;
  Result<std::vector<Tensor>> ref_run = run_all(gs, plan, mesh, rpo, inputs, CompileOptions::HostCode::Reference);
  if (want) check_against(c.text, g, "run --kernels reference", ref_run, *want);

  // run (generated host kernels, split where an emitter cannot go)
  {
    Result<std::vector<Tensor>> gen_run = run_all(gs, plan, mesh, rpo, inputs, CompileOptions::HostCode::Jit);
    if (want) {
      if (!gen_run) fail(c.text, "run failed where the reference evaluator did not: " + gen_run.error().str());
      // Fused precision keeps f16/bf16 values in f32 where the reference rounds at every
      // op; an ill-conditioned chain (rsqrt(log(rsqrt(x))) near x = 1) then differs
      // beyond any fixed tolerance, closer to the exact value. Such a run must match
      // under --precision eager, which rounds as the reference does.
      if (std::string m = mismatch(g, "run", gen_run.value(), *want); !m.empty()) {
        Result<std::vector<Tensor>> eager_run =
            run_all(gs, plan, mesh, rpo, inputs, CompileOptions::HostCode::Jit, Precision::Eager);
        check_against(c.text, g, "run --precision eager (fused differed)", eager_run, *want);
      }
    }
  }

  // compile --no-ptxas: a Plan or a located refusal, nothing else.
  CompileOptions co;
  co.run_ptxas = false;
  co.host = CompileOptions::HostCode::None;  // the host path ran above
  co.pipeline = po;
  Result<CompiledPlan> compiled = compile_plan(g, co);
  if (!compiled && compiled.error().message.empty()) fail(c.text, "compile failed without a message");
  return 0;
}
