// How well pruned autotuning does against exhaustive tuning, on the host CPU.
//
// The benchmark set is every distinct kernel (by tuning key) of
//   examples/tp_mlp.sf at world 4 and examples/transformer_block.sf at world 2, as
//   `shardfuse tune --device cpu` sees them (propagate, rank_programs with the host
//   emit checker), all of them tiny (a few microseconds at most), and
//   four larger graphs written below: a gelu_tanh/mul/add chain on f32[1024, 1024],
//   a softmax over f32[512, 2048], a matmul with a bias+relu epilogue and a bf16
//   linear layer.
// Each kernel is tuned twice into fresh, empty caches: exhaustively (prune=false:
// every config that builds is measured, one per distinct code) and pruned (rules,
// cost-model ranking, top_k = a fifth of the space (2..16) plus the default). Then the two chosen configs and
// the default are built again and timed back to back, alternating, with the same
// runner (same inputs), so the ratio compares them under the same conditions, not
// the two tuning runs' noisy medians (the exhaustive best is the minimum of many
// noisy medians and so is biased low; ratio_tuner_medians is that biased ratio).
// Where both choices compile to the same code the ratio is 1 by definition.
//
// Per kernel (BM_Tune/<graph>/<kernel>, one iteration, time = the pruned tuning's
// wall time): ratio_vs_exhaustive (pruned choice / exhaustive choice; target
// <= 1.05), measured_over_space (candidates measured by the pruned run / configs in
// the space; target <= 0.25), space, measured, rule_pruned, duplicates, ranked_out,
// tune_s_pruned, tune_s_exhaustive, speedup_vs_default (default config / exhaustive
// choice, both re-measured) and remeasure_spread (the re-measurement's noise: a
// ratio within it says nothing). BM_TuneSummary has the geometric mean and maximum
// ratio and the mean and maximum measured/space. A table goes to stderr.
//
// Candidates are timed for less than `shardfuse tune` does by default (warm-up 5
// ms, 20 ms, at most 30 repetitions, against 10 / 40 / 100): exhaustive tuning of
// the 20 kernels (up to 151 configs each) would otherwise take over 10 minutes on
// the 2-core development machine; this way the whole run takes about 3.5.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "autotune/cache.h"
#include "autotune/measure.h"
#include "autotune/tuner.h"
#include "runtime/core/device_mesh.h"
#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/tune.h"

namespace sf {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Graph must(Result<Graph> g) {
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

// The larger kernels: each candidate runs for 0.5 to 20 ms on one core, long
// enough that configs differ by more than the timing noise, short enough that
// exhaustive tuning of a matmul (~100 distinct candidates) takes 15-20 s.
constexpr const char* kLargeGraphs[] = {
    R"(graph pw_gelu(x: f32[1024, 1024], y: f32[1024, 1024]) {
  z = add(mul(gelu_tanh(x), y), x)
  return z
})",
    R"(graph softmax(x: f32[512, 2048]) {
  y = softmax(x, dim=-1)
  return y
})",
    R"(graph mm_bias_relu(x: f32[256, 512], w: f32[512, 512], b: f32[512]) {
  y = relu(add(matmul(x, w), b))
  return y
})",
    R"(graph linear_bf16(x: bf16[128, 512], w: bf16[512, 512], b: bf16[512]) {
  y = add(matmul(x, transpose(w, 0, 1)), b)
  return y
})",
};

struct BenchKernel {
  std::string name;  // "<graph>/<kernel>"
  LocalKernel kernel;
  TuneProblem problem;
  TuneKey key;
};

// What `shardfuse tune` does to a graph (tools/shardfuse/tune.cpp,
// programs_for_tuning): its distinct kernels by key, in program order.
void add_kernels(const std::string& label, const Graph& g, std::vector<BenchKernel>& out,
                 std::set<std::string>& seen) {
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(g, mesh);
  RankPipelineOptions po;
  po.can_emit = emit_checker(llvmb::Target::host());
  const TargetInfo& target = host_target_info();
  const std::string tid = target_id(target), tool = toolchain_id(ConfigTarget::Host);
  Result<std::vector<LocalProgram>> programs = rank_programs(g, plan, mesh, po);
  if (!programs.ok()) throw std::runtime_error(programs.error().str());
  for (const LocalProgram& prog : *programs)
    for (const LocalKernel& k : prog.kernels) {
      Result<TuneProblem> p = tune_problem(k);
      if (!p) continue;  // no emitter (gather): not tuned
      TuneKey key = make_tune_key(*p, ShapeBuckets::Exact, tid, tool);
      if (!seen.insert(key.hash()).second) continue;
      out.push_back({label + "/" + k.name, k, std::move(p).value(), key});
    }
}

Graph with_world(Graph g, int64_t world) {
  Mesh m = g.mesh();
  m.dims[0].size = world;
  return must(remesh(g, m));
}

std::vector<BenchKernel> benchmark_set() {
  std::vector<BenchKernel> out;
  std::set<std::string> seen;
  const std::string dir = std::string(SF_SOURCE_DIR) + "/examples/";
  add_kernels("tp_mlp", with_world(must(parse_file(dir + "tp_mlp.sf")), 4), out, seen);
  add_kernels("transformer_block", with_world(must(parse_file(dir + "transformer_block.sf")), 2), out, seen);
  for (const char* text : kLargeGraphs) {
    Graph g = must(parse_graph(text, "<bench_autotune>"));
    add_kernels(g.name(), g, out, seen);
  }
  return out;
}

// Candidate timing during tuning (see the header for why less than the CLI's).
BenchOptions tuning_bench() {
  BenchOptions b;
  b.warmup_ms = 5;
  b.rep_ms = 20;
  b.max_reps = 30;
  return b;
}

// The A/B re-measurement: rounds of one measure() per config, alternating, the
// median of each config's medians, so that a slow spell of the machine (another
// build, on these 2 cores) hits both configs alike. The examples' kernels run for
// about a microsecond, from cold caches, and their rounds still differ by ~10%.
constexpr int kRounds = 5;
BenchOptions remeasure_bench() {
  BenchOptions b;
  b.warmup_ms = 5;
  b.rep_ms = 25;
  b.max_reps = 50;
  return b;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "sf-bench-autotune-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

struct Outcome {
  std::string name, kind, shapes;
  TuneReport pruned, exhaustive;
  double tune_s_pruned = 0, tune_s_exhaustive = 0;
  bool same_code = false;  // the pruned and exhaustive choices compile to the same code
  double t_pruned_us = 0, t_exhaustive_us = 0, t_default_us = 0;
  double spread = 0;  // the larger Timing::spread of the two choices
  // The same ratio from the two tuning runs' own medians (winner's curse included).
  double tuner_ratio() const { return pruned.best_time.median_us / exhaustive.best_time.median_us; }
  double ratio() const { return same_code ? 1.0 : t_pruned_us / t_exhaustive_us; }
  // Over the 1.05 target by more than the re-measurement's own spread.
  bool over_ratio_target() const { return ratio() > 1.05; }
  bool beyond_noise() const { return ratio() - 1 > spread; }
  double measured_over_space() const {
    return pruned.space ? static_cast<double>(pruned.measured) / static_cast<double>(pruned.space) : 0;
  }
  double speedup_vs_default() const { return t_default_us / t_exhaustive_us; }
};

std::vector<Outcome>& outcomes() {
  static std::vector<Outcome> o;
  return o;
}

Result<TuneReport> tune_once(const BenchKernel& bk, Runner& runner, bool prune, double* seconds) {
  TempDir dir;
  Result<std::unique_ptr<TuneCache>> cache = TuneCache::open(dir.path);
  if (!cache) return cache.error();
  Result<std::unique_ptr<llvmb::HostJit>> jit = llvmb::HostJit::create();
  if (!jit) return jit.error();
  TuneOptions o;
  o.prune = prune;
  o.bench = tuning_bench();
  auto t0 = Clock::now();
  Result<TuneReport> r = tune_kernel(bk.problem, bk.key, host_target_info(),
                                     default_kernel_config(bk.kernel, ConfigTarget::Host),
                                     make_host_builder(bk.kernel, std::move(jit).value()), runner, **cache, o);
  *seconds = seconds_since(t0);
  return r;
}

// Builds `configs` of `bk` again, into a new JIT: nothing of the tuning runs is reused.
Result<std::vector<BuildResult>> build_fresh(const BenchKernel& bk, const std::vector<KernelConfig>& configs) {
  Result<std::unique_ptr<llvmb::HostJit>> jit = llvmb::HostJit::create();
  if (!jit) return jit.error();
  std::shared_ptr<Builder> b = make_host_builder(bk.kernel, std::move(jit).value());
  std::vector<BuildResult> out;
  for (const KernelConfig& c : configs) {
    out.push_back(b->build(c));
    if (!out.back().artifact) return Diag{"", {}, "rebuilding a chosen config failed: " + out.back().error};
  }
  return out;
}

// A config's time over the rounds: the median of the rounds' medians, and half
// their range relative to it (how far one round strays: the noise floor under
// which a ratio says nothing).
struct Timing {
  double us = 0, spread = 0;
};

// Times built configs back to back with `runner`: kRounds rounds, each config once
// per round in turn.

Result<std::vector<Timing>> time_ab(const std::vector<BuildResult>& built, Runner& runner) {
  std::vector<std::vector<double>> medians(built.size());
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < built.size(); ++i) {
      Result<Measurement> m = runner.run(*built[i].artifact, remeasure_bench());
      if (!m) return m.error();
      medians[i].push_back(m->median_us);
    }
  std::vector<Timing> out;
  for (std::vector<double>& v : medians) {
    std::sort(v.begin(), v.end());
    Timing t{v[v.size() / 2], 0};
    t.spread = (v.back() - v.front()) / 2 / t.us;
    out.push_back(t);
  }
  return out;
}

void BM_Tune(benchmark::State& state, const BenchKernel& bk) {
  for (auto _ : state) {
    Outcome o;
    o.name = bk.name;
    o.kind = bk.key.kind;
    o.shapes = bk.key.shapes;
    std::unique_ptr<Runner> runner = make_host_runner(bk.kernel);
    Result<TuneReport> ex = tune_once(bk, *runner, false, &o.tune_s_exhaustive);
    if (!ex) return state.SkipWithError(("exhaustive tuning: " + ex.error().message).c_str());
    Result<TuneReport> pr = tune_once(bk, *runner, true, &o.tune_s_pruned);
    if (!pr) return state.SkipWithError(("pruned tuning: " + pr.error().message).c_str());
    o.exhaustive = std::move(ex).value();
    o.pruned = std::move(pr).value();
    if (o.exhaustive.source != ConfigSource::Tuned || o.pruned.source != ConfigSource::Tuned)
      return state.SkipWithError("a tuning run measured nothing");

    const KernelConfig def = default_kernel_config(bk.kernel, ConfigTarget::Host);
    Result<std::vector<BuildResult>> built = build_fresh(bk, {o.pruned.best, o.exhaustive.best, def});
    if (!built) return state.SkipWithError(built.error().message.c_str());
    o.same_code = (*built)[0].code_hash == (*built)[1].code_hash;
    Result<std::vector<Timing>> t = time_ab(*built, *runner);
    if (!t) return state.SkipWithError(("re-measuring: " + t.error().message).c_str());
    o.t_pruned_us = (*t)[0].us;
    o.t_exhaustive_us = (*t)[1].us;
    o.t_default_us = (*t)[2].us;
    o.spread = std::max((*t)[0].spread, (*t)[1].spread);

    state.SetIterationTime(o.tune_s_pruned);
    state.counters["ratio_vs_exhaustive"] = o.ratio();
    state.counters["measured_over_space"] = o.measured_over_space();
    state.counters["space"] = static_cast<double>(o.pruned.space);
    state.counters["measured"] = static_cast<double>(o.pruned.measured);
    state.counters["measured_exhaustive"] = static_cast<double>(o.exhaustive.measured);
    state.counters["rule_pruned"] = static_cast<double>(o.pruned.rule_pruned);
    state.counters["duplicates"] = static_cast<double>(o.pruned.duplicates);
    state.counters["ranked_out"] = static_cast<double>(o.pruned.ranked_out);
    state.counters["tune_s_pruned"] = o.tune_s_pruned;
    state.counters["tune_s_exhaustive"] = o.tune_s_exhaustive;
    state.counters["us_pruned_choice"] = o.t_pruned_us;
    state.counters["us_exhaustive_choice"] = o.t_exhaustive_us;
    state.counters["us_default"] = o.t_default_us;
    state.counters["speedup_vs_default"] = o.speedup_vs_default();
    state.counters["same_code"] = o.same_code ? 1 : 0;
    state.counters["remeasure_spread"] = o.spread;
    state.counters["ratio_tuner_medians"] = o.tuner_ratio();
    state.SetLabel(o.kind + " " + o.shapes + " | pruned: " + o.pruned.best_str + " | exhaustive: " +
                   o.exhaustive.best_str);
    outcomes().push_back(std::move(o));
  }
}

struct Summary {
  size_t kernels = 0, over_ratio = 0, over_ratio_beyond_noise = 0, over_space = 0, same = 0;
  double geomean_ratio = 1, max_ratio = 0, mean_mos = 0, max_mos = 0, total_mos = 0, geomean_speedup = 1;
  double tune_s_pruned = 0, tune_s_exhaustive = 0;
};

Summary summarize_outcomes() {
  Summary s;
  const std::vector<Outcome>& os = outcomes();
  s.kernels = os.size();
  if (os.empty()) return s;
  double log_ratio = 0, log_speedup = 0;
  size_t measured = 0, space = 0;
  for (const Outcome& o : os) {
    log_ratio += std::log(o.ratio());
    log_speedup += std::log(o.speedup_vs_default());
    s.max_ratio = std::max(s.max_ratio, o.ratio());
    s.mean_mos += o.measured_over_space();
    s.max_mos = std::max(s.max_mos, o.measured_over_space());
    measured += o.pruned.measured;
    space += o.pruned.space;
    s.over_ratio += o.over_ratio_target();
    s.over_ratio_beyond_noise += o.over_ratio_target() && o.beyond_noise();
    s.over_space += o.measured_over_space() > 0.25;
    s.same += o.same_code;
    s.tune_s_pruned += o.tune_s_pruned;
    s.tune_s_exhaustive += o.tune_s_exhaustive;
  }
  const double n = static_cast<double>(os.size());
  s.geomean_ratio = std::exp(log_ratio / n);
  s.geomean_speedup = std::exp(log_speedup / n);
  s.mean_mos = s.mean_mos / n;
  s.total_mos = space ? static_cast<double>(measured) / static_cast<double>(space) : 0;
  return s;
}

// Runs after every BM_Tune (benchmarks run in registration order).
void BM_TuneSummary(benchmark::State& state) {
  for (auto _ : state) {
    Summary s = summarize_outcomes();
    if (s.kernels == 0) return state.SkipWithError("no BM_Tune ran");
    state.SetIterationTime(s.tune_s_pruned);
    state.counters["kernels"] = static_cast<double>(s.kernels);
    state.counters["geomean_ratio"] = s.geomean_ratio;
    state.counters["max_ratio"] = s.max_ratio;
    state.counters["kernels_over_1.05"] = static_cast<double>(s.over_ratio);
    state.counters["kernels_over_1.05_beyond_noise"] = static_cast<double>(s.over_ratio_beyond_noise);
    state.counters["mean_measured_over_space"] = s.mean_mos;
    state.counters["max_measured_over_space"] = s.max_mos;
    state.counters["total_measured_over_space"] = s.total_mos;
    state.counters["kernels_over_0.25"] = static_cast<double>(s.over_space);
    state.counters["same_choice"] = static_cast<double>(s.same);
    state.counters["geomean_speedup_vs_default"] = s.geomean_speedup;
    state.counters["tune_s_pruned"] = s.tune_s_pruned;
    state.counters["tune_s_exhaustive"] = s.tune_s_exhaustive;
  }
}

void print_table() {
  const std::vector<Outcome>& os = outcomes();
  if (os.empty()) return;
  // ratio: the A/B re-measurement; noise: its Timing::spread; tuner: the ratio of
  // the two tuning runs' own medians.
  std::fprintf(stderr, "\n%-42s %-9s %5s %4s %6s %6s %6s %6s %8s %8s %7s %10s %10s\n", "kernel", "kind", "space",
               "meas", "m/s", "ratio", "noise", "tuner", "tune_pr", "tune_ex", "speedup", "us_pruned", "us_exhaust");
  for (const Outcome& o : os)
    std::fprintf(stderr, "%-42s %-9s %5zu %4zu %6.3f %6.3f %5.1f%% %6.3f %7.2fs %7.2fs %6.2fx %10.2f %10.2f %s%s%s\n",
                 o.name.c_str(), o.kind.c_str(), o.pruned.space, o.pruned.measured, o.measured_over_space(), o.ratio(),
                 100 * o.spread, o.tuner_ratio(), o.tune_s_pruned, o.tune_s_exhaustive, o.speedup_vs_default(),
                 o.t_pruned_us, o.t_exhaustive_us, o.same_code ? "same" : "",
                 !o.over_ratio_target() ? "" : o.beyond_noise() ? " RATIO>1.05" : " RATIO>1.05(noise)",
                 o.measured_over_space() > 0.25 ? " M/S>0.25" : "");
  Summary s = summarize_outcomes();
  std::fprintf(stderr,
               "%zu kernels: ratio geomean %.3f, max %.3f (target <= 1.05; %zu over, %zu of them by more than "
               "the noise; %zu same choice); measured/space mean %.3f, max %.3f, overall %.3f (target <= 0.25; %zu "
               "over); speedup over default geomean %.2fx; tuning %.1f s pruned, %.1f s exhaustive\n",
               s.kernels, s.geomean_ratio, s.max_ratio, s.over_ratio, s.over_ratio_beyond_noise, s.same, s.mean_mos,
               s.max_mos, s.total_mos, s.over_space, s.geomean_speedup, s.tune_s_pruned, s.tune_s_exhaustive);
}

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  static std::vector<sf::BenchKernel> set;
  try {
    set = sf::benchmark_set();
  } catch (const std::exception& e) {
    std::cerr << "bench_autotune: " << e.what() << "\n";
    return 1;
  }
  for (const sf::BenchKernel& k : set)
    benchmark::RegisterBenchmark(("BM_Tune/" + k.name).c_str(), sf::BM_Tune, k)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_TuneSummary", sf::BM_TuneSummary)->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  sf::print_table();
  return 0;
}
