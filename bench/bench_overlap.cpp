// Compute-communication overlap: serial vs overlapped vs decomposed schedules of the
// MLP, attention and transformer examples, and FLUX's overlap efficiency
// E_overlap = 1 - ECT_overlapped / ECT_serial, with ECT = T_total - T_compute.
//
// BM_OverlapCpu/<graph>: the graphs of bench/graphs/overlap/ (tp=4, CPU-sized) run on
// 4 CPU ranks as threads over Gloo with generated host kernels (a host Plan through
// the Plan executor, as `run` runs it), three ways:
//   serial      collectives where lowering put them, each waited for at once
//               (--no-reorder --no-decompose);
//   overlapped  the scheduler's raised starts and sunk waits (--no-decompose);
//   decomposed  collective matmuls as ring steps (--decompose always).
// Each is run once to compile its kernels, then `reps` times; the medians are the
// counters. T_compute is the largest rank's sum of kernel times in the serial run's
// trace, so extra compute in a schedule counts against it (as in FLUX).
// This machine has 2 cores for 4 ranks and their Gloo threads: compute and
// communication compete for the CPU, which a GPU does not have to; read these as
// the backend working, not as GPU overlap.
//
// BM_Simulated/<graph>/<system>: bench/graphs/overlap/full/ (tp=8, 8 x 2048 tokens,
// hidden 4096) through the timeline model (codegen/fusion/timeline.h) on the shipped 8xH100
// NVLink and 2x8 H100 InfiniBand systems, kernels timed by the roofline.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

#include "runtime/core/shard.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/llvm/backend.h"
#include "codegen/kernels/emitter.h"
#include "codegen/reference/evaluate.h"
#include "codegen/kernels/compile_plan.h"
#include "runtime/plan/plan_exec.h"
#include "codegen/fusion/timeline.h"

namespace sf {
namespace {

Graph load(const std::string& rel) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/" + rel);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

struct Mode {
  const char* name;
  bool reorder;
  DecomposeMode decompose;
};
constexpr Mode kModes[] = {{"serial", false, DecomposeMode::Never},
                           {"overlapped", true, DecomposeMode::Never},
                           {"decomposed", true, DecomposeMode::Always}};

std::vector<LocalProgram> programs_for(const Graph& g, const Mode& m) {
  DeviceMesh mesh(g.mesh());
  RankPipelineOptions po;
  po.reorder = m.reorder;
  po.decompose.mode = m.decompose;
  Result<std::vector<LocalProgram>> programs = rank_programs(g, propagate(g, mesh), mesh, po);
  if (!programs.ok()) throw std::runtime_error(programs.error().str());
  return std::move(programs).value();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_OverlapCpu(benchmark::State& state, const std::string& file, int reps) {
  const Graph g = load(file);
  const DeviceMesh mesh(g.mesh());
  const ShardingPlan plan = propagate(g, mesh);
  const std::vector<Tensor> global = random_inputs(g, 1);
  std::vector<std::vector<Tensor>> inputs(static_cast<size_t>(mesh.world()));
  for (int r = 0; r < mesh.world(); ++r)
    for (size_t i = 0; i < g.params().size(); ++i)
      inputs[static_cast<size_t>(r)].push_back(
          shard_tensor(global[i], plan.nodes[static_cast<size_t>(g.params()[i])].output, mesh, r));
  std::map<std::string, double> total_ms, compute_ms;
  for (auto _ : state) {
    for (const Mode& m : kModes) {
      // The graph compiled to a host Plan in memory and run through the Plan
      // executor, as `run` does.
      CompileOptions co;
      co.arch = "host";
      co.ptx = false;
      co.host = CompileOptions::HostCode::Jit;
      co.pipeline.reorder = m.reorder;
      co.pipeline.decompose.mode = m.decompose;
      Result<CompiledPlan> cp = compile_plan(g, co);
      if (!cp.ok()) {
        state.SkipWithError(cp.error().message.c_str());
        return;
      }
      GpuRunOptions eo;
      if (!run_plan_on_host(cp->plan, cp->host_kernels, inputs, eo).ok()) {  // warms up
        state.SkipWithError("run failed");
        return;
      }
      std::vector<double> totals, computes;
      for (int i = 0; i < reps; ++i) {
        TraceWriter trace;
        eo.trace = &trace;
        eo.trace_origin = std::chrono::steady_clock::now();
        auto t0 = std::chrono::steady_clock::now();
        Result<std::vector<std::vector<Tensor>>> out = run_plan_on_host(cp->plan, cp->host_kernels, inputs, eo);
        auto t1 = std::chrono::steady_clock::now();
        if (!out.ok()) {
          state.SkipWithError(out.error().message.c_str());
          return;
        }
        totals.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        std::map<int, double> per_rank;
        const nlohmann::json events = trace.to_json()["traceEvents"];  // a copy: to_json() is a temporary
        for (const auto& e : events)
          if (e.value("cat", "") == "kernel") per_rank[e["pid"].get<int>()] += e["dur"].get<double>() / 1e3;
        double most = 0;
        for (const auto& [r, ms] : per_rank) most = std::max(most, ms);
        computes.push_back(most);
      }
      total_ms[m.name] = median(totals);
      compute_ms[m.name] = median(computes);
    }
  }
  const double t_compute = compute_ms["serial"];
  const double ect_serial = total_ms["serial"] - t_compute;
  for (const Mode& m : kModes) {
    state.counters[std::string(m.name) + "_ms"] = total_ms[m.name];
    state.counters[std::string(m.name) + "_compute_ms"] = compute_ms[m.name];
  }
  state.counters["t_compute_ms"] = t_compute;
  state.counters["e_overlap_overlapped"] = overlap_efficiency(total_ms["overlapped"] - t_compute, ect_serial);
  state.counters["e_overlap_decomposed"] = overlap_efficiency(total_ms["decomposed"] - t_compute, ect_serial);
  state.counters["overlapped_over_serial"] = total_ms["overlapped"] / total_ms["serial"];
  state.counters["decomposed_over_serial"] = total_ms["decomposed"] / total_ms["serial"];
}

void BM_Simulated(benchmark::State& state, const std::string& file, const std::string& system) {
  Result<SystemSpec> sys = load_system(std::string(SF_SOURCE_DIR) + "/" + system);
  if (!sys.ok()) {
    state.SkipWithError(sys.error().str().c_str());
    return;
  }
  // tp over every GPU of the system: 8 in one node, or 16 across two nodes.
  Graph g = load(file);
  if (g.mesh().world_size() != sys->max_world()) {
    Mesh m = g.mesh();
    m.dims[0].size = sys->max_world();
    Result<Graph> r = remesh(g, m);
    if (!r.ok()) {
      state.SkipWithError(r.error().str().c_str());
      return;
    }
    g = std::move(r).value();
  }
  const DeviceMesh mesh(g.mesh());
  state.counters["world"] = mesh.world();
  const DeviceRates rates = device_rates(sys->gpu);
  TimelineModel model = timeline_model(*sys, [&](const LocalProgram& p, size_t step) {
    return roofline_us(step_work(p, step), rates);
  });
  std::vector<LocalProgram> plain = programs_for(g, kModes[1]);
  std::vector<LocalProgram> ring = programs_for(g, kModes[2]);
  Result<OverlapReport> over = simulate_overlap(plain, mesh, model);
  Result<OverlapReport> dec = simulate_overlap(plain, ring, mesh, model);
  for (auto _ : state) {
    // The model is deterministic: one evaluation is the measurement.
    benchmark::DoNotOptimize(over.ok());
  }
  if (!over.ok() || !dec.ok()) {
    state.SkipWithError((over.ok() ? dec.error() : over.error()).str().c_str());
    return;
  }
  state.counters["serial_us"] = over->serial.total_us;
  state.counters["overlapped_us"] = over->overlapped.total_us;
  state.counters["decomposed_us"] = dec->overlapped.total_us;
  state.counters["t_compute_us"] = over->t_compute;
  state.counters["e_overlap_overlapped"] = over->e_overlap;
  state.counters["e_overlap_decomposed"] = dec->e_overlap;
}

int register_all() {
  for (const char* g : {"seq_parallel_mlp", "tp_mlp", "tp_attention", "transformer_block", "fsdp_mlp"}) {
    benchmark::RegisterBenchmark((std::string("BM_OverlapCpu/") + g).c_str(), BM_OverlapCpu,
                                 std::string("bench/graphs/overlap/") + g + ".sf", 3)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (const char* s : {"h100x8_nvlink", "h100_2x8_ib"})
      benchmark::RegisterBenchmark((std::string("BM_Simulated/") + g + "/" + s).c_str(), BM_Simulated,
                                   std::string("bench/graphs/overlap/full/") + g + ".sf",
                                   std::string("examples/systems/") + s + ".json")
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace sf

BENCHMARK_MAIN();
