// Compute-communication overlap measured on GPUs: bench_overlap's serial,
// overlapped and decomposed schedules of the MLP, attention and transformer
// graphs at real size, every rank on its own GPU with NCCL on a comm stream
// (runtime/plan/plan_exec.h), and FLUX's E_overlap = 1 - ECT_overlapped / ECT_serial,
// ECT = T_total - T_compute.
//
// No LLVM here: the schedules come as Plan directories compiled elsewhere by
// `scripts/bench-gpu plans` (bench/graphs/overlap/full/<graph>.sf for tp = 2, 4 and 8):
//   <plans>/<graph>.tp<N>.serial       compile --no-reorder --no-decompose
//   <plans>/<graph>.tp<N>.overlapped   compile --no-decompose
//   <plans>/<graph>.tp<N>.decomposed   compile --decompose always
// BM_OverlapGpu/<graph>/tp<N> is registered for every graph and N with all three,
// and runs when there are N GPUs and NCCL; otherwise it is skipped, saying why.
//
// Per schedule, every rank (a thread, rank r on GPU r) allocates its buffers and
// makes its communicator once, runs the Plan once untimed, then `--reps` times
// (default 10): the ranks meet at a barrier, each times its whole run (enqueue
// and wait for both streams) by wall clock, and a run's time is its slowest
// rank's. The counters are medians over the runs. T_compute is one more run of
// the serial Plan with every kernel timed by CUDA events, summed per rank, the
// largest rank's sum.
//
// Flags (ours; the rest are Google Benchmark's): --plans DIR (default
// $SF_SOURCE_DIR/bench/plans/<the device's arch>/overlap), --reps N,
// --nccl-max-ctas N (ncclConfig_t.maxCTAs), --copy-standin.
//
// --copy-standin: for one GPU, where NCCL cannot run two ranks. Rank 0 alone runs
// on GPU 0 with every collective replaced by a device-to-device copy of its bus
// bytes on the comm stream (RankExec::use_copy_standin), ordered by the same events
// as NCCL's: it times how the comm stream interleaves with the kernels, not NCCL or
// the links (a copy inside HBM is faster than a ring over NVLink, and the other
// ranks do not exist). The benchmarks are named BM_OverlapGpuCopyStandin/... and the
// context says "collectives": "d2d copy stand-in".
// Without a CUDA device it prints "no CUDA device: ..." and exits 0 having run
// nothing. The JSON context gets device, gpus, nccl and plans.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <barrier>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/agree.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/comm/nccl.h"
#include "runtime/plan/plan_exec.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string plans;
  int reps = 10;
  int max_ctas = 0;
  int gpus = 0;
  bool standin = false;
};
Config& config() {
  static Config c;
  return c;
}

constexpr const char* kModes[] = {"serial", "overlapped", "decomposed"};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Measured {
  std::vector<double> run_ms;  // per timed run: the slowest rank's wall time
  double compute_ms = 0;       // with `trace`: the largest rank's sum of kernel times
};

// Zeros of rank r's local input shapes: the kernels' time does not depend on the values.
std::vector<Tensor> zero_inputs(const Plan& plan, int r) {
  std::vector<Tensor> inputs;
  const PlanRank& pr = plan.ranks[static_cast<size_t>(r)];
  for (int b : pr.inputs)
    inputs.emplace_back(pr.buffers[static_cast<size_t>(b)].dtype, pr.buffers[static_cast<size_t>(b)].shape);
  return inputs;
}

// The largest rank's sum of kernel times in a trace, in ms.
double kernel_ms(const TraceWriter& trace) {
  std::map<int, double> per_rank;
  const nlohmann::json events = trace.to_json()["traceEvents"];
  for (const auto& e : events)
    if (e.value("cat", "") == "kernel") per_rank[e["pid"].get<int>()] += e["dur"].get<double>() / 1e3;
  double most = 0;
  for (const auto& [r, t] : per_rank) most = std::max(most, t);
  return most;
}

// --copy-standin: rank 0 alone on GPU 0, its collectives copies on the comm stream.
Result<Measured> measure_standin(const PlanSource& src, int reps, bool trace_kernels) {
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(0);
  if (!ctx) return ctx.error();
  Result<std::shared_ptr<GpuPlan>> loaded = GpuPlan::load(*ctx, src);
  if (!loaded) return loaded.error();
  GpuRunOptions opts;
  TraceWriter trace;
  if (trace_kernels) opts.trace = &trace;
  Result<std::unique_ptr<RankExec>> rank = RankExec::create_cuda(*loaded, 0, opts);
  if (!rank) return rank.error();
  SF_TRY((*rank)->use_copy_standin());
  SF_TRY((*rank)->upload_inputs(zero_inputs(src.plan, 0)));
  SF_TRY((*rank)->run(nullptr));  // first-launch costs
  Measured m;
  for (int i = 0; i < (trace_kernels ? 0 : reps); ++i) {
    const auto t0 = Clock::now();
    SF_TRY((*rank)->run(nullptr));
    m.run_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  if (trace_kernels) m.compute_ms = kernel_ms(trace);
  return m;
}

// Runs the Plan in `dir` `reps` times on its world's GPUs (after one untimed run).
Result<Measured> measure(const std::string& dir, int reps, bool trace_kernels) {
  Result<PlanSource> src = read_plan_dir(dir);
  if (!src) return src.error();
  if (config().standin) return measure_standin(*src, reps, trace_kernels);
  const Plan& plan = src->plan;
  if (plan.world > config().gpus)
    return Diag{"", {}, dir + ": needs " + std::to_string(plan.world) + " GPUs, the driver sees " +
                            std::to_string(config().gpus)};
  std::vector<std::shared_ptr<GpuPlan>> loaded;
  for (int g = 0; g < plan.world; ++g) {
    Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(g);
    if (!ctx) return ctx.error();
    Result<std::shared_ptr<GpuPlan>> p = GpuPlan::load(*ctx, *src);
    if (!p) return p.error();
    loaded.push_back(std::move(p).value());
  }
  const DeviceMesh mesh(loaded[0]->mesh());
  GpuRunOptions opts;
  opts.timeout = std::chrono::milliseconds(120000);
  TraceWriter trace;
  if (trace_kernels) opts.trace = &trace;
  nccl::Options nopts;
  nopts.max_ctas = config().max_ctas;
  nopts.timeout = opts.timeout;

  std::vector<std::vector<double>> ms(static_cast<size_t>(plan.world), std::vector<double>(static_cast<size_t>(reps)));
  std::barrier sync(plan.world);
  Result<void> failed = on_rank_threads(mesh, opts.timeout, [&](Comm& comm) -> Result<void> {
    const int r = comm.rank();
    Result<void> err;
    std::unique_ptr<RankExec> rank;
    {
      Result<std::unique_ptr<RankExec>> gr = RankExec::create_cuda(loaded[static_cast<size_t>(r)], r, opts);
      if (!gr) err = gr.error();
      else rank = std::move(gr).value();
    }
    std::vector<std::unique_ptr<nccl::NcclComm>> comms;
    for (int d = 0; d < mesh.ndim(); ++d) {
      // Every rank joins every exchange, failed or not, so none waits for another.
      Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(comm, d, r, nopts);
      if (!c && err.ok()) err = c.error();
      if (c) comms.push_back(std::move(c).value());
    }
    if (err.ok()) err = rank->use_nccl(std::move(comms));
    if (err.ok()) err = rank->upload_inputs(zero_inputs(plan, r));
    if (err.ok()) err = rank->run(&comm);  // first-launch and NCCL set-up costs
    // Every rank meets the barrier `reps` times whatever happened, so none waits forever.
    for (int i = 0; i < (trace_kernels ? 0 : reps); ++i) {
      sync.arrive_and_wait();
      if (!err.ok()) continue;
      const auto t0 = Clock::now();
      err = rank->run(&comm);
      ms[static_cast<size_t>(r)][static_cast<size_t>(i)] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    return err;
  });
  SF_TRY(failed);
  Measured m;
  for (int i = 0; i < (trace_kernels ? 0 : reps); ++i) {
    double slowest = 0;
    for (const auto& per_rank : ms) slowest = std::max(slowest, per_rank[static_cast<size_t>(i)]);
    m.run_ms.push_back(slowest);
  }
  if (trace_kernels) m.compute_ms = kernel_ms(trace);
  return m;
}

void BM_OverlapGpu(benchmark::State& state, const std::string& stem) {
  std::map<std::string, double> total;
  double t_compute = 0;
  for (auto _ : state) {
    for (const char* mode : kModes) {
      Result<Measured> m = measure(stem + "." + mode, config().reps, false);
      if (!m) {
        state.SkipWithError((std::string(mode) + ": " + m.error().message).c_str());
        return;
      }
      total[mode] = median(m->run_ms);
    }
    Result<Measured> c = measure(stem + ".serial", 0, true);
    if (!c) {
      state.SkipWithError(("T_compute: " + c.error().message).c_str());
      return;
    }
    t_compute = c->compute_ms;
    state.SetIterationTime(total["overlapped"] / 1e3);
  }
  const double ect_serial = total["serial"] - t_compute;
  auto e_overlap = [&](double t) { return ect_serial != 0 ? 1.0 - (t - t_compute) / ect_serial : 0.0; };
  for (const char* mode : kModes) state.counters[std::string(mode) + "_ms"] = total[mode];
  state.counters["t_compute_ms"] = t_compute;
  state.counters["e_overlap_overlapped"] = e_overlap(total["overlapped"]);
  state.counters["e_overlap_decomposed"] = e_overlap(total["decomposed"]);
  state.counters["overlapped_over_serial"] = total["overlapped"] / total["serial"];
  state.counters["decomposed_over_serial"] = total["decomposed"] / total["serial"];
  state.counters["reps"] = config().reps;
}

// Registers a benchmark per <graph>.tp<N> with all three schedules in `dir`.
int register_all(const std::string& dir) {
  std::map<std::string, int> found;  // stem -> schedules present
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* mode : kModes) {
      const std::string suffix = std::string(".") + mode;
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        ++found[name.substr(0, name.size() - suffix.size())];
    }
  }
  int n = 0;
  for (const auto& [stem, count] : found) {
    if (count != 3) continue;
    const size_t dot = stem.rfind('.');
    const std::string label = std::string(config().standin ? "BM_OverlapGpuCopyStandin/" : "BM_OverlapGpu/") +
                              stem.substr(0, dot) + "/" + stem.substr(dot + 1);
    benchmark::RegisterBenchmark(label.c_str(), BM_OverlapGpu, (fs::path(dir) / stem).string())
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    ++n;
  }
  return n;
}

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  using namespace sf;
  std::vector<char*> rest = {argv[0]};
  Config& c = config();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::cerr << "bench_overlap_gpu: " << flag << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--plans") c.plans = value("--plans");
    else if (a == "--reps") c.reps = std::max(1, std::atoi(value("--reps")));
    else if (a == "--nccl-max-ctas") c.max_ctas = std::max(0, std::atoi(value("--nccl-max-ctas")));
    else if (a == "--copy-standin") c.standin = true;
    else rest.push_back(argv[i]);
  }
  Result<int> gpus = cuda::device_count();
  if (!gpus) {
    std::cout << gpus.error().message << "\n";  // "no CUDA device: ..."
    return 0;
  }
  c.gpus = *gpus;
  Result<cuda::DeviceInfo> dev = cuda::device_info(0);
  if (!dev) {
    std::cout << dev.error().message << "\n";
    return 0;
  }
  if (c.plans.empty()) c.plans = std::string(SF_SOURCE_DIR) + "/bench/plans/" + dev->arch() + "/overlap";
  Result<const nccl::Library*> lib = nccl::library();
  benchmark::AddCustomContext("device", dev->name);
  benchmark::AddCustomContext("gpus", std::to_string(c.gpus));
  benchmark::AddCustomContext("nccl", lib ? (*lib)->version_str() : lib.error().message);
  benchmark::AddCustomContext("plans", c.plans);
  benchmark::AddCustomContext("collectives", c.standin ? "d2d copy stand-in (rank 0 alone on GPU 0; not NCCL)" : "nccl");
  if (register_all(c.plans) == 0) {
    std::cerr << "bench_overlap_gpu: no <graph>.tp<N>.{serial,overlapped,decomposed} Plans in " << c.plans
              << " (scripts/bench-gpu plans compiles them)\n";
    return 1;
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
