// The fused attention kernel (KernelKind::Attention, codegen/kernels/attention.h)
// against the same attention as separate kernels (FusionOptions::attention = false:
// torch's "math" backend), as generated host code on one core.
//
// The graph is causal F.scaled_dot_product_attention, f32, q, k, v [8, 512, 64]
// (batch x heads = 8, L = S = 512, E = 64). Both cases take their kernels from the
// pipeline's own stages on one rank:
//   fused:   rank_programs, as compile and run make them: one Attention kernel
//            (FlashAttention's online softmax over key tiles, the key tiles above
//            the diagonal skipped, the scores never in memory);
//   unfused: lower, decompose, fuse with FusionOptions::attention = false,
//            schedule: the scores matmul (scale in its epilogue), the masked
//            softmax reduction and the product with v, each writing its
//            [8, 512, 512] result to memory.
// Each kernel is emitted with emitter_for(kind) for llvmb::Target::host() (the
// default KernelConfig, as `run --device cpu` without a tuned cache) and JIT
// compiled; every buffer is allocated once, before timing.
//
// Before any timing, main() runs both once on the same seeded inputs and compares
// them with each other and with the float64 reference evaluator: a max abs error of
// 1e-4 or more exits 1 without timing anything.
//
// Benchmarks (milliseconds, one iteration = one attention):
//   BM_AttentionFused, BM_AttentionUnfused: each on its own; counters `kernels`,
//     `intermediate_bytes` (buffers written by one kernel and read by another:
//     0 fused, the scores and probabilities unfused), `tile_bytes` (the fused
//     kernel's stack tiles per block) and `GFLOPs` (the useful causal flops,
//     2 * 2 * 8 * 512 * 513 / 2 * 64, over the time).
//   BM_AttentionFusedOverUnfused: each iteration runs the fused kernel then the
//     unfused kernels, timed apart; counters `fused_ms`, `unfused_ms` (the medians of
//     those per-iteration times) and `ratio` = fused_ms / unfused_ms: measured
//     side by side, so load on the machine affects both alike.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "autotune/space.h"
#include "codegen/dist/lower.h"
#include "codegen/dist/propagate.h"
#include "codegen/dist/schedule.h"
#include "codegen/fusion/decompose_program.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/emitter.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace {

constexpr int64_t kBatchHeads = 8, kSeq = 512, kHeadDim = 64;
constexpr uint64_t kSeed = 7;
constexpr double kMaxAbsErr = 1e-4;

std::string graph_text() {
  const std::string t = "f32[" + std::to_string(kBatchHeads) + ", " + std::to_string(kSeq) + ", " +
                        std::to_string(kHeadDim) + "]";
  return "graph sdpa(q: " + t + ", k: " + t + ", v: " + t +
         ") {\n"
         "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n"
         "  return out\n"
         "}\n";
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_attention: error: %s\n", msg.c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r, const std::string& what) {
  if (!r.ok()) die(what + ": " + r.error().str());
  return std::move(r).value();
}

const Graph& global_graph() {
  static const Graph g = must(parse_graph(graph_text(), "bench_attention.sf"), "parse");
  return g;
}

// Rank 0's program (the only rank: the graph has no mesh).
LocalProgram program(bool fused_attention) {
  const Graph g = decompose_for_sharding(global_graph());
  DeviceMesh mesh(g.mesh());
  const ShardingPlan plan = propagate(g, mesh);
  if (fused_attention) return must(rank_program(g, plan, mesh, 0), "rank_program");
  // The stages rank_programs runs (codegen/fusion/pipeline.cpp) with the fusion
  // option it does not expose; collective-matmul has nothing to do on one rank.
  FusionOptions fo;
  fo.attention = false;
  return schedule(fuse(decompose_program(lower(g, plan, mesh, 0)), fo));
}

using Entry = void (*)(void**);

llvmb::HostJit& jit() {
  static std::unique_ptr<llvmb::HostJit> j = [] { return must(llvmb::HostJit::create(), "host JIT"); }();
  return *j;
}

// A program's kernels JIT-compiled, one buffer per local value (inputs filled),
// ready to run its kernel steps in order.
struct Runnable {
  LocalProgram prog;
  std::vector<Entry> entries;                // per prog.kernels
  std::vector<Tensor> values;                // per local value
  std::vector<std::vector<void*>> args;      // per step: inputs then outputs
  int64_t intermediate_bytes = 0;
  int kernels = 0;

  Runnable(LocalProgram p, const std::vector<Tensor>& inputs, const std::string& tag) : prog(std::move(p)) {
    for (size_t i = 0; i < prog.kernels.size(); ++i) {
      const LocalKernel& k = prog.kernels[i];
      KernelSpec spec{"sf_bench_" + tag + "_" + std::to_string(i), k.kind, k.group};
      EmittedKernel e = must(emitter_for(k.kind).emit(spec, KernelConfig{}, llvmb::Target::host()),
                             "emit " + k.name + " (" + std::string(kernel_kind_name(k.kind)) + ")");
      void* fn = must(jit().add(std::move(e.module), std::move(e.context), e.entry), "JIT " + k.name);
      entries.push_back(reinterpret_cast<Entry>(fn));
    }
    for (const TensorType& t : prog.types) values.emplace_back(t.dtype, t.shape);
    for (size_t i = 0; i < prog.param_values.size(); ++i) values[static_cast<size_t>(prog.param_values[i])] = inputs[i];
    std::vector<bool> is_output(prog.types.size(), false), is_param(prog.types.size(), false);
    for (int v : prog.output_values) is_output[static_cast<size_t>(v)] = true;
    for (int v : prog.param_values) is_param[static_cast<size_t>(v)] = true;
    for (const LocalStep& s : prog.steps) {
      if (s.kind != LocalStep::Kind::Kernel)
        die("the program has a step that is not a kernel; this benchmark runs kernels only");
      std::vector<void*> a;
      for (int v : s.in) a.push_back(values[static_cast<size_t>(v)].data());
      for (int v : s.outs) {
        a.push_back(values[static_cast<size_t>(v)].data());
        if (!is_output[static_cast<size_t>(v)] && !is_param[static_cast<size_t>(v)])
          intermediate_bytes += static_cast<int64_t>(values[static_cast<size_t>(v)].nbytes());
      }
      args.push_back(std::move(a));
      ++kernels;
    }
  }

  void run() {
    for (size_t i = 0; i < prog.steps.size(); ++i) entries[static_cast<size_t>(prog.steps[i].kernel)](args[i].data());
  }
  const Tensor& output() const { return values[static_cast<size_t>(prog.output_values.at(0))]; }
  bool has(KernelKind kind) const {
    return std::any_of(prog.kernels.begin(), prog.kernels.end(), [&](const LocalKernel& k) { return k.kind == kind; });
  }
};

const std::vector<Tensor>& inputs() {
  static const std::vector<Tensor> in = random_inputs(global_graph(), kSeed);
  return in;
}

Runnable& fused() {
  static Runnable r(program(true), inputs(), "fused");
  return r;
}

Runnable& unfused() {
  static Runnable r(program(false), inputs(), "unfused");
  return r;
}

double max_abs_err(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(a.get(i) - b.get(i));
    if (!(d <= m)) m = d;  // NaN wins
  }
  return m;
}

// Fails (exit 1) unless the fused program is one Attention kernel, the unfused one
// has none, and the two agree with each other and with the reference.
void check() {
  Runnable& f = fused();
  Runnable& u = unfused();
  if (f.kernels != 1 || !f.has(KernelKind::Attention))
    die("expected the fused program to be one Attention kernel, got " + std::to_string(f.kernels) + " kernels");
  if (u.has(KernelKind::Attention)) die("the unfused program (FusionOptions::attention = false) has an Attention kernel");
  f.run();
  u.run();
  const std::vector<Tensor> want = must(evaluate(global_graph(), inputs()), "reference");
  const double fu = max_abs_err(f.output(), u.output());
  const double fr = max_abs_err(f.output(), want[0]);
  const double ur = max_abs_err(u.output(), want[0]);
  std::fprintf(stderr, "bench_attention: max abs err fused vs unfused %.3g, fused vs reference %.3g, unfused vs reference %.3g\n",
               fu, fr, ur);
  if (!(fu < kMaxAbsErr && fr < kMaxAbsErr && ur < kMaxAbsErr))
    die("the outputs disagree (max abs err must be < 1e-4); not timing");
}

// Useful flops of causal attention: q k^T and p v over the (L + 1) L / 2 visible
// (query, key) pairs, 2 flops per multiply-add.
constexpr double kFlops = 2.0 * 2.0 * kBatchHeads * (kSeq * (kSeq + 1) / 2) * kHeadDim;

void counters(benchmark::State& state, const Runnable& r) {
  state.counters["kernels"] = r.kernels;
  state.counters["intermediate_bytes"] = static_cast<double>(r.intermediate_bytes);
  state.counters["GFLOPs"] = benchmark::Counter(kFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionFused(benchmark::State& state) {
  Runnable& r = fused();
  for (auto _ : state) {
    r.run();
    benchmark::ClobberMemory();
  }
  counters(state, r);
  state.counters["tile_bytes"] = static_cast<double>(
      attention_tile_bytes(KernelConfig{}.block_m, KernelConfig{}.block_n, kHeadDim, kHeadDim));
}

void BM_AttentionUnfused(benchmark::State& state) {
  Runnable& r = unfused();
  for (auto _ : state) {
    r.run();
    benchmark::ClobberMemory();
  }
  counters(state, r);
}

double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

void BM_AttentionFusedOverUnfused(benchmark::State& state) {
  Runnable& f = fused();
  Runnable& u = unfused();
  using clock = std::chrono::steady_clock;
  std::vector<double> tf, tu;
  for (auto _ : state) {
    const auto t0 = clock::now();
    f.run();
    benchmark::ClobberMemory();
    const auto t1 = clock::now();
    u.run();
    benchmark::ClobberMemory();
    const auto t2 = clock::now();
    tf.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    tu.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  const double mf = median(tf), mu = median(tu);
  state.counters["fused_ms"] = mf;
  state.counters["unfused_ms"] = mu;
  state.counters["ratio"] = mu > 0 ? mf / mu : 0;
}

BENCHMARK(BM_AttentionFused)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionUnfused)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionFusedOverUnfused)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  sf::check();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
