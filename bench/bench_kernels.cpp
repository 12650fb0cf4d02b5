// shardfuse's fused GPU kernels against same-run baselines (docs/benchmarks-gpu.md).
//
// The kernels come as Plan directories compiled elsewhere (this binary has no
// LLVM): `scripts/bench-gpu plans [ARCH]` compiles bench/graphs/kernels/*.sf and
// bench/graphs/{mlp,attention,transformer_block}.sf into bench/plans/<arch>/<name>/,
// and `--plans DIR` (default $SF_SOURCE_DIR/bench/plans/<the device's arch>) says
// where they are. A plan directory's name says what it is:
//
//   pointwise_<name>, reduction_<name>   BM_Pointwise/<name>, BM_Reduction/<name>:
//       GB/s over the plan's inputs and outputs (each read or written once: the
//       least traffic the graph needs), and `ratio` = that / the GB/s of
//       BM_D2DCopy/<same bytes> (cuMemcpyDtoDAsync moving half the bytes, so that
//       its reads plus writes are the same count), measured in the same run;
//   matmul_<dtype>_<M>x<N>x<K>            BM_Matmul/<dtype>/<M>x<N>x<K>: our matmul with
//       its fused bias + GELU epilogue, against
//       BM_CublasGemm/...          cublasGemmEx alone (f32 compute; bf16 storage for bf16),
//       BM_CublasGemmEpilogue/...  cublasGemmEx then our separate bias + GELU kernel
//                                  (the plan pointwise_bias_gelu_<dtype>_<M>x<N>),
//       BM_CublasLtGemmBiasGelu/... one cuBLASLt matmul with CUBLASLT_EPILOGUE_GELU_BIAS;
//       TFLOPs counts 2*M*N*K for all of them, so their ratios are ratios of time.
//       BM_Matmul's `ratio` is ours / cuBLAS GEMM alone, `ratio_vs_epilogue` ours /
//       (GEMM + epilogue), `ratio_vs_cublaslt` ours / the cuBLASLt epilogue (> 1: ours
//       is faster);
//   matmul_<dtype>_<M>x<N>x<K>_gemm       BM_MatmulGemm/<dtype>/<M>x<N>x<K>: our matmul alone,
//       no epilogue, `ratio` against BM_CublasGemm of the same shape: what the main
//       loop gives, apart from what the fused epilogue costs;
//   block_<block> (or any other name)     BM_Block/<block>, BM_Block/<block>/cuda_graph: the
//       whole single-rank plan, its kernels launched one by one or as CUDA graphs
//       (RankExec::enqueue), TFLOPs over its matmul kernels' flops (2*M*N*K, as
//       bench/peers/peers.py counts them) and its fused attention kernels' flops (the
//       compiler's count: q k^T and p v over every score, masked ones included, and
//       the softmax chain's element ops; peers.py's causal sdpa counts half the scores).
//
// Every iteration: a 256 MiB cuMemsetD32Async (more than an H100's 50 MiB or an
// H200's 60 MiB of L2; --flush-mib N changes it, for runs on the fake driver whose
// memsets are host memsets) so no iteration finds its data in L2, then a pair of CUDA
// events around the work on the same stream, the events' time being the
// iteration's manual time (UseManualTime). One untimed run first (first-launch
// costs). Baselines run before what is compared with them (registration order);
// with --benchmark_repetitions a ratio uses the median of the baseline's
// repetitions. A copy baseline that was filtered out is measured on the spot; a
// cuBLAS one that was filtered out (or failed) leaves its ratio out.
//
// The JSON context gets device, driver, arch, plans, cuBLAS's library and the
// command ($SF_BENCH_COMMAND, else the command line) from here; scripts/bench-gpu
// adds commit and date with --benchmark_context, as scripts/bench does.
// Without a CUDA device it prints "no CUDA device: ..." and exits 0 having run
// nothing, so CI can run it as a smoke test.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/gpu/cublas.h"
#include "runtime/gpu/cuda.h"
#include "autotune/cuda_runner.h"
#include "runtime/plan/plan_exec.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFlushBytes = int64_t{256} << 20;
constexpr size_t kLtWorkspace = size_t{32} << 20;

struct Env {
  std::shared_ptr<cuda::Context> ctx;
  std::string plans;
  cuda::Buffer flush;
  uint32_t flush_value = 0;
  // Baselines, one value per repetition (--benchmark_repetitions); ratios use their median.
  std::map<int64_t, std::vector<double>> d2d_gbps;              // by bytes moved (read + write)
  std::map<std::string, std::vector<double>> cublas_tflops;     // by "<dtype>/<M>x<N>x<K>"
  std::map<std::string, std::vector<double>> epilogue_tflops;
  std::map<std::string, std::vector<double>> lt_tflops;
};

template <class K>
std::optional<double> median_of(const std::map<K, std::vector<double>>& m, const K& key) {
  auto it = m.find(key);
  if (it == m.end() || it->second.empty()) return std::nullopt;
  std::vector<double> v = it->second;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

Env& env() {
  static Env e;
  return e;
}

std::string str(const Diag& d) { return d.message; }

// A host tensor of seeded random values; large ones repeat a 1 Mi-element random
// block, which costs a memcpy per block instead of a generator call per element.
Tensor tiled_random(DType dt, const Shape& shape, uint64_t seed) {
  const int64_t n = numel(shape);
  constexpr int64_t kBlock = int64_t{1} << 20;
  if (n <= kBlock) return random_tensor(dt, shape, seed);
  Tensor block = random_tensor(dt, {kBlock}, seed);
  Tensor t(dt, shape);
  for (size_t at = 0; at < t.nbytes(); at += block.nbytes())
    std::memcpy(t.data() + at, block.data(), std::min(block.nbytes(), t.nbytes() - at));
  return t;
}

// A device buffer of seeded random values.
Result<cuda::Buffer> random_buffer(DType dt, int64_t elements, uint64_t seed) {
  Result<cuda::Buffer> b = cuda::Buffer::allocate(*env().ctx, static_cast<size_t>(elements * dtype_size(dt)));
  if (!b) return b.error();
  Tensor t = tiled_random(dt, {elements}, seed);
  if (t.nbytes() > 0)
    SF_TRY(cuda::check(env().ctx->drv().MemcpyHtoD(b->ptr(), t.data(), t.nbytes()), "cuMemcpyHtoD"));
  return b;
}

// Flushes L2, then times `work` on `s` with a pair of events: seconds.
class Timer {
 public:
  static Result<Timer> create() {
    Timer t;
    Result<cuda::Event> a = cuda::Event::create(*env().ctx), b = cuda::Event::create(*env().ctx);
    if (!a) return a.error();
    if (!b) return b.error();
    t.start_ = std::move(a).value();
    t.end_ = std::move(b).value();
    return t;
  }
  Result<double> time(const cuda::Stream& s, const std::function<Result<void>()>& work) {
    Env& e = env();
    SF_TRY(cuda::check(e.ctx->drv().MemsetD32Async(e.flush.ptr(), ++e.flush_value, e.flush.bytes() / 4, s.get()),
                       "cuMemsetD32Async (L2 flush)"));
    SF_TRY(start_.record(s));
    SF_TRY(work());
    SF_TRY(end_.record(s));
    SF_TRY(end_.synchronize());
    Result<float> ms = cuda::Event::elapsed_ms(start_, end_);
    if (!ms) return ms.error();
    return static_cast<double>(*ms) / 1000.0;
  }

 private:
  cuda::Event start_, end_;
};

// The benchmark loop: one untimed run, then every iteration timed. The mean
// seconds per iteration (what Google Benchmark reports as the time), or 0 after
// SkipWithError.
double run_loop(benchmark::State& state, const cuda::Stream& s, const std::function<Result<void>()>& work) {
  Result<Timer> timer = Timer::create();
  if (!timer) {
    state.SkipWithError(str(timer.error()).c_str());
    return 0;
  }
  if (Result<double> warm = timer->time(s, work); !warm) {
    state.SkipWithError(str(warm.error()).c_str());
    return 0;
  }
  double total = 0;
  int64_t n = 0;
  for (auto _ : state) {
    Result<double> t = timer->time(s, work);
    if (!t) {
      state.SkipWithError(str(t.error()).c_str());
      return 0;
    }
    if (*t <= 0) {
      // Never on a GPU; the fake driver's clock moves only with kernel launches.
      state.SkipWithError("the events measured no time (no kernel ran between them?)");
      return 0;
    }
    state.SetIterationTime(*t);
    total += *t;
    ++n;
  }
  return n ? total / static_cast<double>(n) : 0;
}

// --- baselines -----------------------------------------------------------------------

// Copies half of `bytes` device to device: `bytes` read plus written. Mean seconds.
double time_d2d(benchmark::State* state, int64_t bytes, int reps_if_no_state = 20) {
  Env& e = env();
  const int64_t half = bytes / 2;
  Result<cuda::Buffer> src = random_buffer(DType::I32, std::max<int64_t>(half / 4, 1), 1);
  Result<cuda::Buffer> dst = cuda::Buffer::allocate(*e.ctx, static_cast<size_t>(std::max<int64_t>(half, 4)));
  Result<cuda::Stream> s = cuda::Stream::create(*e.ctx);
  auto fail = [&](const Diag& d) {
    if (state) state->SkipWithError(str(d).c_str());
    return 0.0;
  };
  if (!src) return fail(src.error());
  if (!dst) return fail(dst.error());
  if (!s) return fail(s.error());
  auto work = [&]() {
    return cuda::check(e.ctx->drv().MemcpyDtoDAsync(dst->ptr(), src->ptr(), static_cast<size_t>(half), s->get()),
                       "cuMemcpyDtoDAsync");
  };
  if (state) return run_loop(*state, *s, work);
  // A ratio whose baseline was filtered out: the median of a few copies.
  Result<Timer> timer = Timer::create();
  if (!timer) return 0;
  std::vector<double> t;
  for (int i = 0; i < reps_if_no_state + 1; ++i) {
    Result<double> x = timer->time(*s, work);
    if (!x) return 0;
    if (i > 0) t.push_back(*x);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double d2d_gbps(int64_t bytes) {
  Env& e = env();
  if (std::optional<double> g = median_of(e.d2d_gbps, bytes)) return *g;
  double s = time_d2d(nullptr, bytes);
  double gbps = s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0;
  if (gbps > 0) e.d2d_gbps[bytes].push_back(gbps);
  return gbps;
}

void BM_D2DCopy(benchmark::State& state, int64_t bytes) {
  double s = time_d2d(&state, bytes);
  if (s <= 0) return;
  const double bps = static_cast<double>(bytes) / s;
  state.counters["bytes_per_second"] = bps;
  env().d2d_gbps[bytes].push_back(bps / 1e9);
}

// --- plans ---------------------------------------------------------------------------

struct LoadedPlan {
  std::shared_ptr<GpuPlan> plan;
  std::unique_ptr<RankExec> rank;
  int64_t io_bytes = 0;       // the plan's inputs and outputs
  int64_t matmul_flops = 0;   // flops of its matmul and attention kernels
  int64_t kernels = 0;        // kernel launches per run
};

int64_t buffer_bytes(const PlanBuffer& b) { return numel(b.shape) * dtype_size(b.dtype); }

// Reads, loads and sets up rank 0 of a single-rank plan with seeded random inputs;
// with cuda_graph, its kernels run as CUDA graphs captured on the first run.
Result<LoadedPlan> load_plan(const std::string& name, bool cuda_graph = false) {
  Env& e = env();
  Result<PlanSource> src = read_plan_dir((fs::path(e.plans) / name).string());
  if (!src) return src.error();
  if (src->plan.world != 1 || src->plan.ranks.size() != 1)
    return Diag{"", {}, name + ": a single-rank plan was expected (world " + std::to_string(src->plan.world) + ")"};
  LoadedPlan p;
  Result<std::shared_ptr<GpuPlan>> gp = GpuPlan::load(e.ctx, *src);
  if (!gp) return gp.error();
  p.plan = *gp;
  GpuRunOptions o;
  o.cuda_graph = cuda_graph;
  Result<std::unique_ptr<RankExec>> rank = RankExec::create_cuda(p.plan, 0, o);
  if (!rank) return rank.error();
  p.rank = std::move(rank).value();
  const PlanRank& r = src->plan.ranks[0];
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const PlanBuffer& b = r.buffers[static_cast<size_t>(r.inputs[i])];
    inputs.push_back(tiled_random(b.dtype, b.shape, 1 + i));
    p.io_bytes += buffer_bytes(b);
  }
  for (int o : r.outputs) p.io_bytes += buffer_bytes(r.buffers[static_cast<size_t>(o)]);
  SF_TRY(p.rank->upload_inputs(inputs));
  std::map<std::string, const PlanKernel*> by_id;
  for (const PlanKernel& k : src->plan.kernels) by_id[k.id] = &k;
  for (const PlanStep& s : r.steps) {
    if (s.op != "kernel") continue;
    ++p.kernels;
    const PlanKernel* k = by_id[s.kernel];
    if (k && (k->kind == KernelKind::Matmul || k->kind == KernelKind::Attention)) p.matmul_flops += k->flops;
  }
  return p;
}

// Gives back what a benchmark allocated, so that the next finds the memory free.
struct ReleaseCache {
  ~ReleaseCache() { env().ctx->allocator().empty_cache(); }
};

// BM_Pointwise / BM_Reduction: GB/s and the ratio to the same-run copy.
void BM_Memory(benchmark::State& state, std::string plan) {
  ReleaseCache release;
  Result<LoadedPlan> p = load_plan(plan);
  if (!p) {
    state.SkipWithError(str(p.error()).c_str());
    return;
  }
  RankExec& rank = *p->rank;
  double s = run_loop(state, rank.stream(), [&] { return rank.enqueue(); });
  if (s <= 0) return;
  const double gbps = static_cast<double>(p->io_bytes) / s / 1e9;
  state.counters["bytes_per_second"] = gbps * 1e9;
  state.counters["bytes"] = static_cast<double>(p->io_bytes);
  if (double base = d2d_gbps(p->io_bytes); base > 0) state.counters["ratio"] = gbps / base;
}

// --- matmuls -------------------------------------------------------------------------

struct MatmulShape {
  DType dtype = DType::F32;
  int64_t m = 0, n = 0, k = 0;
  std::string key() const {
    return std::string(dtype_name(dtype)) + "/" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string bias_gelu_plan() const {
    return "pointwise_bias_gelu_" + std::string(dtype_name(dtype)) + "_" + std::to_string(m) + "x" + std::to_string(n);
  }
};

// The GEMM operands in nn.Linear's layout: A [M, K], B [N, K], bias [N], C [M, N].
struct GemmOperands {
  cuda::Buffer a, b, bias, c;
  static Result<GemmOperands> create(const MatmulShape& sh) {
    GemmOperands o;
    Result<cuda::Buffer> a = random_buffer(sh.dtype, sh.m * sh.k, 1), b = random_buffer(sh.dtype, sh.n * sh.k, 2),
                         bias = random_buffer(sh.dtype, sh.n, 3);
    Result<cuda::Buffer> c = cuda::Buffer::allocate(*env().ctx, static_cast<size_t>(sh.m * sh.n * dtype_size(sh.dtype)));
    for (auto* r : {&a, &b, &bias, &c})
      if (!*r) return r->error();
    o.a = std::move(a).value();
    o.b = std::move(b).value();
    o.bias = std::move(bias).value();
    o.c = std::move(c).value();
    return o;
  }
};

struct CublasSetup {
  cublas::Handle handle;
  cuda::Stream stream;
  GemmOperands ops;
};

Result<CublasSetup> cublas_setup(const MatmulShape& sh) {
  CublasSetup c;
  Result<cublas::Handle> h = cublas::Handle::create(*env().ctx);
  if (!h) return h.error();
  Result<cuda::Stream> s = cuda::Stream::create(*env().ctx);
  if (!s) return s.error();
  Result<GemmOperands> ops = GemmOperands::create(sh);
  if (!ops) return ops.error();
  c.handle = std::move(h).value();
  c.stream = std::move(s).value();
  c.ops = std::move(ops).value();
  return c;
}

void set_tflops(benchmark::State& state, const MatmulShape& sh, double s,
                std::map<std::string, std::vector<double>>* store) {
  const double tflops = sh.flops() / s / 1e12;
  state.counters["TFLOPs"] = tflops;
  if (store) (*store)[sh.key()].push_back(tflops);
}

void BM_CublasGemm(benchmark::State& state, MatmulShape sh) {
  ReleaseCache release;
  Result<CublasSetup> c = cublas_setup(sh);
  if (!c) {
    state.SkipWithError(str(c.error()).c_str());
    return;
  }
  double s = run_loop(state, c->stream, [&] {
    return c->handle.gemm(c->stream, sh.dtype, sh.m, sh.n, sh.k, c->ops.a.ptr(), c->ops.b.ptr(), c->ops.c.ptr());
  });
  if (s > 0) set_tflops(state, sh, s, &env().cublas_tflops);
}

// cublasGemmEx, then our bias + GELU kernel from its own plan, reading the GEMM's
// output in place: what the matmul costs unfused.
void BM_CublasGemmEpilogue(benchmark::State& state, MatmulShape sh) {
  ReleaseCache release;
  Result<CublasSetup> c = cublas_setup(sh);
  if (!c) {
    state.SkipWithError(str(c.error()).c_str());
    return;
  }
  const std::string name = sh.bias_gelu_plan();
  Result<PlanSource> src = read_plan_dir((fs::path(env().plans) / name).string());
  if (!src) {
    state.SkipWithError(str(src.error()).c_str());
    return;
  }
  const PlanRank& r = src->plan.ranks.at(0);
  if (r.steps.size() != 1 || r.steps[0].op != "kernel" || r.inputs.size() != 2 || r.outputs.size() != 1) {
    state.SkipWithError((name + ": expected one kernel of (h, b) -> y").c_str());
    return;
  }
  Result<std::shared_ptr<GpuPlan>> gp = GpuPlan::load(env().ctx, *src);
  if (!gp) {
    state.SkipWithError(str(gp.error()).c_str());
    return;
  }
  Result<cuda::Buffer> y = cuda::Buffer::allocate(*env().ctx, c->ops.c.bytes());
  if (!y) {
    state.SkipWithError(str(y.error()).c_str());
    return;
  }
  // The plan's buffers, as ours: h is the GEMM's output, b the bias, y a new buffer.
  std::map<int, CUdeviceptr> ptr = {{r.inputs[0], c->ops.c.ptr()}, {r.inputs[1], c->ops.bias.ptr()},
                                    {r.outputs[0], y->ptr()}};
  std::vector<CUdeviceptr> args;
  for (int b : r.steps[0].in) args.push_back(ptr.at(b));
  for (int b : r.steps[0].out) args.push_back(ptr.at(b));
  const GpuPlan::Loaded& k = (*gp)->kernel(r.steps[0].kernel);
  double s = run_loop(state, c->stream, [&]() -> Result<void> {
    SF_TRY(c->handle.gemm(c->stream, sh.dtype, sh.m, sh.n, sh.k, c->ops.a.ptr(), c->ops.b.ptr(), c->ops.c.ptr()));
    return cuda::launch(*env().ctx, k.fn, k.dims, args, c->stream);
  });
  if (s > 0) set_tflops(state, sh, s, &env().epilogue_tflops);
}

void BM_CublasLtGemmBiasGelu(benchmark::State& state, MatmulShape sh) {
  ReleaseCache release;
  Result<CublasSetup> c = cublas_setup(sh);
  if (!c) {
    state.SkipWithError(str(c.error()).c_str());
    return;
  }
  Result<cuda::Buffer> ws = cuda::Buffer::allocate(*env().ctx, kLtWorkspace);
  if (!ws) {
    state.SkipWithError(str(ws.error()).c_str());
    return;
  }
  Result<cublas::GemmCall> g = c->handle.prepare(
      cublas::linear_gemm(GemmLibrary::CublasLt, sh.dtype, sh.m, sh.n, sh.k, GemmEpilogue::BiasGeluTanh), kLtWorkspace);
  if (!g) {
    state.SkipWithError(str(g.error()).c_str());
    return;
  }
  double s = run_loop(state, c->stream, [&] {
    return g->enqueue(c->stream, c->ops.a.ptr(), c->ops.b.ptr(), c->ops.bias.ptr(), c->ops.c.ptr(), ws->ptr());
  });
  if (s > 0) set_tflops(state, sh, s, &env().lt_tflops);
}

// gemm_only: the plan is the product alone (matmul_..._gemm), compared with cuBLAS's
// GEMM alone.
void BM_Matmul(benchmark::State& state, std::string plan, MatmulShape sh, bool gemm_only) {
  ReleaseCache release;
  Result<LoadedPlan> p = load_plan(plan);
  if (!p) {
    state.SkipWithError(str(p.error()).c_str());
    return;
  }
  RankExec& rank = *p->rank;
  double s = run_loop(state, rank.stream(), [&] { return rank.enqueue(); });
  if (s <= 0) return;
  set_tflops(state, sh, s, nullptr);
  const double ours = sh.flops() / s / 1e12;
  const Env& e = env();
  if (std::optional<double> t = median_of(e.cublas_tflops, sh.key())) state.counters["ratio"] = ours / *t;
  if (gemm_only) return;
  if (std::optional<double> t = median_of(e.epilogue_tflops, sh.key())) state.counters["ratio_vs_epilogue"] = ours / *t;
  if (std::optional<double> t = median_of(e.lt_tflops, sh.key())) state.counters["ratio_vs_cublaslt"] = ours / *t;
}

// --- blocks --------------------------------------------------------------------------

void BM_Block(benchmark::State& state, std::string plan, bool cuda_graph) {
  ReleaseCache release;
  Result<LoadedPlan> p = load_plan(plan, cuda_graph);
  if (!p) {
    state.SkipWithError(str(p.error()).c_str());
    return;
  }
  RankExec& rank = *p->rank;
  double s = run_loop(state, rank.stream(), [&] { return rank.enqueue(); });
  if (s <= 0) return;
  state.counters["TFLOPs"] = static_cast<double>(p->matmul_flops) / s / 1e12;
  state.counters["kernels"] = static_cast<double>(p->kernels);
}

// --- registration --------------------------------------------------------------------

benchmark::internal::Benchmark* timed(benchmark::internal::Benchmark* b) {
  return b->UseManualTime()->Unit(benchmark::kMillisecond);
}

// Registers everything the plans directory holds; returns how many benchmarks.
int register_all(const std::string& dir, const std::string& device_arch) {
  std::vector<std::string> names;
  for (const fs::directory_entry& d : fs::directory_iterator(dir))
    if (d.is_directory() && fs::exists(d.path() / "plan.json")) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  std::vector<std::string> memory, blocks;
  std::vector<std::tuple<std::string, MatmulShape, bool>> matmuls;  // plan, shape, gemm only
  std::map<int64_t, bool> copies;
  static const std::regex mm(R"(matmul_(f32|bf16|f16)_(\d+)x(\d+)x(\d+)(_gemm)?)");
  for (const std::string& n : names) {
    Result<PlanSource> src = read_plan_dir((fs::path(dir) / n).string());
    if (!src) {
      std::cerr << "bench_kernels: skipping " << n << ": " << src.error().str() << "\n";
      continue;
    }
    if (src->plan.arch != device_arch)
      std::cerr << "bench_kernels: warning: " << n << " was compiled for " << src->plan.arch << ", the device is "
                << device_arch << "\n";
    std::smatch m;
    if (n.rfind("pointwise_", 0) == 0 || n.rfind("reduction_", 0) == 0) {
      memory.push_back(n);
      int64_t bytes = 0;
      const PlanRank& r = src->plan.ranks.at(0);
      for (int b : r.inputs) bytes += buffer_bytes(r.buffers[static_cast<size_t>(b)]);
      for (int b : r.outputs) bytes += buffer_bytes(r.buffers[static_cast<size_t>(b)]);
      copies[bytes] = true;
    } else if (std::regex_match(n, m, mm)) {
      MatmulShape sh;
      sh.dtype = *parse_dtype(m[1].str());
      sh.m = std::stoll(m[2].str());
      sh.n = std::stoll(m[3].str());
      sh.k = std::stoll(m[4].str());
      matmuls.emplace_back(n, sh, m[5].matched);
    } else if (n.rfind("matmul_", 0) == 0) {
      std::cerr << "bench_kernels: skipping " << n << ": a matmul plan is named matmul_<dtype>_<M>x<N>x<K>[_gemm]\n";
    } else {
      // block_<name>, or a plan named after its graph (scripts/gpu-pack: mlp, attention, ...).
      blocks.push_back(n);
    }
  }
  int count = 0;
  // Baselines first: the ratios read them.
  for (const auto& [bytes, _] : copies) {
    timed(benchmark::RegisterBenchmark(("BM_D2DCopy/" + std::to_string(bytes)).c_str(), BM_D2DCopy, bytes));
    ++count;
  }
  for (const std::string& n : memory) {
    const bool pw = n.rfind("pointwise_", 0) == 0;
    const std::string label = (pw ? "BM_Pointwise/" : "BM_Reduction/") + n.substr(10);
    timed(benchmark::RegisterBenchmark(label.c_str(), BM_Memory, n));
    ++count;
  }
  // A shape's baselines once, before its plans (names sort the fused plan before its
  // _gemm twin); a product alone needs only cuBLAS's GEMM.
  std::set<std::string> baselined;
  for (const auto& [n, sh, gemm_only] : matmuls) {
    if (baselined.insert(sh.key()).second) {
      timed(benchmark::RegisterBenchmark(("BM_CublasGemm/" + sh.key()).c_str(), BM_CublasGemm, sh));
      ++count;
      if (!gemm_only) {
        if (std::find(names.begin(), names.end(), sh.bias_gelu_plan()) != names.end()) {
          timed(benchmark::RegisterBenchmark(("BM_CublasGemmEpilogue/" + sh.key()).c_str(), BM_CublasGemmEpilogue, sh));
          ++count;
        } else {
          std::cerr << "bench_kernels: no " << sh.bias_gelu_plan() << " plan: BM_CublasGemmEpilogue/" << sh.key()
                    << " is left out\n";
        }
        timed(
            benchmark::RegisterBenchmark(("BM_CublasLtGemmBiasGelu/" + sh.key()).c_str(), BM_CublasLtGemmBiasGelu, sh));
        ++count;
      }
    }
    timed(benchmark::RegisterBenchmark(("BM_Matmul" + std::string(gemm_only ? "Gemm/" : "/") + sh.key()).c_str(),
                                       BM_Matmul, n, sh, gemm_only));
    ++count;
  }
  for (const std::string& n : blocks) {
    const std::string block = n.rfind("block_", 0) == 0 ? n.substr(6) : n;
    timed(benchmark::RegisterBenchmark(("BM_Block/" + block).c_str(), BM_Block, n, false));
    timed(benchmark::RegisterBenchmark(("BM_Block/" + block + "/cuda_graph").c_str(), BM_Block, n, true));
    count += 2;
  }
  return count;
}

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  // --plans DIR and --flush-mib N are ours; everything else is Google Benchmark's.
  std::string plans;
  int64_t flush_mib = sf::kFlushBytes >> 20;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    std::optional<std::string> value;
    std::string flag = a.substr(0, a.find('='));
    if ((a == "--plans" || a == "--flush-mib") && i + 1 < argc) value = argv[++i];
    else if ((flag == "--plans" || flag == "--flush-mib") && a.size() > flag.size()) value = a.substr(flag.size() + 1);
    else flag.clear();
    if (flag == "--plans" || a == "--plans") {
      plans = *value;
    } else if (flag == "--flush-mib" || a == "--flush-mib") {
      char* end = nullptr;
      flush_mib = std::strtoll(value->c_str(), &end, 10);
      if (!end || *end || flush_mib < 1) {
        std::cerr << "bench_kernels: error: --flush-mib " << *value << ": expected a size in MiB >= 1\n";
        return 1;
      }
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;

  sf::Result<std::shared_ptr<sf::cuda::Context>> ctx = sf::cuda::Context::primary(0);
  if (!ctx) {
    // CI runs this without a GPU as a smoke test: say why and succeed.
    std::cout << ctx.error().message << "\nbench_kernels: nothing was run\n";
    return 0;
  }
  sf::Env& e = sf::env();
  e.ctx = *ctx;
  const sf::cuda::DeviceInfo& dev = e.ctx->info();
  e.plans = plans.empty() ? std::string(SF_SOURCE_DIR) + "/bench/plans/" + dev.arch() : plans;
  std::error_code ec;
  if (!std::filesystem::is_directory(e.plans, ec)) {
    std::cerr << e.plans << ": error: no plans here; compile them with `scripts/bench-gpu plans " << dev.arch()
              << "` on a machine with LLVM and copy bench/plans/ over, or pass --plans DIR (docs/benchmarks-gpu.md)\n";
    return 1;
  }
  sf::Result<sf::cuda::Buffer> flush = sf::cuda::Buffer::allocate(*e.ctx, static_cast<size_t>(flush_mib) << 20);
  if (!flush) {
    std::cerr << "error: the L2 flush buffer: " << flush.error().message << "\n";
    return 1;
  }
  e.flush = std::move(flush).value();
  sf::Result<const sf::cublas::Api*> blas = sf::cublas::api();
  benchmark::AddCustomContext("device", dev.name);
  benchmark::AddCustomContext("driver", std::to_string(dev.driver_version));
  benchmark::AddCustomContext("arch", dev.arch());
  benchmark::AddCustomContext("plans", e.plans);
  benchmark::AddCustomContext("cublas", blas ? (*blas)->library : blas.error().message);
  // scripts/bench-gpu names the command it ran; run by hand, the command line.
  std::string command;
  if (const char* c = std::getenv("SF_BENCH_COMMAND"); c && *c) {
    command = c;
  } else {
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  }
  benchmark::AddCustomContext("command", command);
  if (sf::register_all(e.plans, dev.arch()) == 0) {
    std::cerr << e.plans << ": error: no plan directories to benchmark (docs/benchmarks-gpu.md)\n";
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // The flush buffer goes back before the context does at exit.
  e.flush = {};
  return 0;
}
