#include "autotune/cuda_runner.h"

#include <algorithm>
#include <cmath>

#include "autotune/measure.h"

namespace sf {

namespace {

std::string specs_str(const std::vector<KernelArgSpec>& v) {
  std::string s;
  for (const KernelArgSpec& a : v) {
    if (!s.empty()) s += ", ";
    s += std::string(dtype_name(a.dtype)) + "[" + std::to_string(a.elements) + "]";
  }
  return "(" + s + ")";
}

double median3(double a, double b, double c) { return std::max(std::min(a, b), std::min(std::max(a, b), c)); }

}  // namespace

GemmLibraries local_gemm_libraries() {
  GemmLibraries l;
  Result<const cublas::Api*> api = cublas::api();
  if (!api) {
    l.error = api.error().message;
    return l;
  }
  l.cublas_version = (*api)->version();
  if ((*api)->lt_error.empty()) l.cublaslt_version = (*api)->lt_version();
  else l.cublaslt_error = (*api)->lt_error;
  return l;
}

Tensor random_tensor(DType dtype, const Shape& shape, uint64_t seed) {
  Tensor t(dtype, shape);
  // splitmix64: a fast generator with the same output on every platform.
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (is_float(dtype)) {
      t.set(i, -1.0 + 2.0 * (static_cast<double>(z >> 11) * 0x1p-53));
    } else if (dtype == DType::Bool) {
      t.set_int(i, static_cast<int64_t>(z >> 63));
    } else {
      t.set_int(i, static_cast<int64_t>(z % 8));
    }
  }
  return t;
}

Result<std::unique_ptr<CudaRunner>> CudaRunner::create(std::vector<Tensor> inputs, std::vector<KernelArgSpec> outputs,
                                                       CudaRunnerOptions o) {
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(o.device);
  if (!ctx) return ctx.error();
  std::unique_ptr<CudaRunner> r(new CudaRunner());
  r->ctx_ = *ctx;
  r->opts_ = o;
  for (const Tensor& t : inputs) r->input_specs_.push_back({t.dtype(), t.numel()});
  r->host_inputs_ = std::move(inputs);
  r->output_specs_ = std::move(outputs);
  // Allocate and upload now, so a device that cannot hold the arguments says so
  // before any candidate is built.
  SF_TRY(r->ensure_ready(o.flush_bytes));
  return r;
}

CudaRunner::~CudaRunner() {
  // Let queued work finish before the buffers go back to the allocator.
  if (ready_ && ctx_ && ctx_->generation() == generation_) (void)stream_.synchronize();
}

void CudaRunner::drop_handles() {
  stream_ = {};
  start_ = {};
  end_ = {};
  inputs_.clear();
  outputs_.clear();
  flush_ = {};
  blas_.reset();
  gemm_workspace_ = {};
  gemm_product_ = {};
}

Result<void> CudaRunner::ensure_ready(int64_t flush_bytes) {
  if (ready_ && ctx_->generation() != generation_) {
    // Someone reset the context since: every handle below is dead.
    ready_ = false;
  }
  SF_TRY(ctx_->make_current());
  if (!ready_) {
    drop_handles();
    generation_ = ctx_->generation();
    Result<cuda::Stream> s = cuda::Stream::create(*ctx_);
    if (!s) return s.error();
    stream_ = std::move(s).value();
    Result<cuda::Event> a = cuda::Event::create(*ctx_), b = cuda::Event::create(*ctx_);
    if (!a) return a.error();
    if (!b) return b.error();
    start_ = std::move(a).value();
    end_ = std::move(b).value();
    for (const Tensor& t : host_inputs_) {
      Result<cuda::Buffer> buf = cuda::Buffer::allocate(*ctx_, t.nbytes());
      if (!buf) return Diag{"", {}, "kernel inputs: " + buf.error().message};
      if (t.nbytes() > 0)
        SF_TRY(cuda::check(ctx_->drv().MemcpyHtoD(buf->ptr(), t.data(), t.nbytes()), "cuMemcpyHtoD"));
      inputs_.push_back(std::move(buf).value());
    }
    for (const KernelArgSpec& s : output_specs_) {
      Result<cuda::Buffer> buf = cuda::Buffer::allocate(*ctx_, static_cast<size_t>(s.bytes()));
      if (!buf) return Diag{"", {}, "kernel outputs: " + buf.error().message};
      outputs_.push_back(std::move(buf).value());
    }
    ready_ = true;
  }
  if (flush_bytes > 0 && flush_.bytes() != static_cast<size_t>(flush_bytes)) {
    flush_ = {};
    Result<cuda::Buffer> f = cuda::Buffer::allocate(*ctx_, static_cast<size_t>(flush_bytes));
    if (!f) return Diag{"", {}, "the L2 flush buffer: " + f.error().message};
    flush_ = std::move(f).value();
  }
  return {};
}

std::string CudaRunner::recover() {
  if (!ctx_ || !ctx_->make_current().ok()) return "";
  // A sticky error (a fault in the kernel) fails every later call; a plain launch
  // error (bad arguments, too many resources) leaves the context usable.
  CUresult r = ctx_->drv().CtxSynchronize();
  if (r == CUDA_SUCCESS) return "";
  ready_ = false;
  ++recoveries_;
  info_.recovered = true;
  if (Result<void> e = ctx_->reset(); !e.ok()) {
    lost_ = true;
    return "; CUDA cannot be used again in this process: the fault outlived a reset of the context (" +
           e.error().message + ")";
  }
  // Every handle is dead now (their destructors skip the driver); drop them.
  drop_handles();
  return "; the context was reset";
}

Result<cublas::GemmCall> CudaRunner::prepare_gemm(const GemmArtifact& g) {
  // The artifact's arguments must be this runner's, with the types the GEMM reads.
  auto arg = [&](int i, const std::vector<KernelArgSpec>& specs) -> std::optional<TensorType> {
    if (i < 0 || i >= static_cast<int>(specs.size())) return std::nullopt;
    const KernelArgSpec& s = specs[static_cast<size_t>(i)];
    return TensorType{s.dtype, {s.elements}};
  };
  std::vector<TensorType> in;
  for (int i : {g.a, g.b, g.bias}) {
    if (i == g.bias && i < 0) break;
    std::optional<TensorType> t = arg(i, input_specs_);
    if (!t) return Diag{"", {}, "the GEMM's argument " + std::to_string(i) + " is not one of the runner's " +
                                    std::to_string(input_specs_.size()) + " inputs"};
    in.push_back(*t);
  }
  std::optional<TensorType> out = arg(g.c, output_specs_);
  if (g.c == kGemmProduct && g.epilogue) {
    // A buffer of the runner's own, of exactly the product's size (gemm_check below
    // checks that the call writes it whole).
    int64_t mn = 0, elements = 0;
    if (__builtin_mul_overflow(g.desc.m, g.desc.n, &mn) || __builtin_mul_overflow(mn, g.desc.batch, &elements) ||
        elements < 1)
      return Diag{"", {}, "the GEMM's product (" + gemm_str(g.desc) + ") has no size"};
    out = TensorType{g.desc.dtype, {elements}};
  }
  if (!out) return Diag{"", {}, "the GEMM's output " + std::to_string(g.c) + " is not one of the runner's outputs"};
  if (std::optional<GemmIssue> why = gemm_check(g.desc, in, *out))
    return Diag{"", {}, "the GEMM does not fit the runner's arguments: " + why->field + ": " + why->message};
  if (!blas_) {
    Result<cublas::Handle> h = cublas::Handle::create(*ctx_);
    if (!h) return h.error();
    blas_ = std::move(h).value();
  }
  if (g.desc.library == GemmLibrary::CublasLt && gemm_workspace_.bytes() < kGemmWorkspaceBytes) {
    Result<cuda::Buffer> w = cuda::Buffer::allocate(*ctx_, kGemmWorkspaceBytes);
    if (!w) return Diag{"", {}, "the cuBLASLt workspace: " + w.error().message};
    gemm_workspace_ = std::move(w).value();
  }
  return blas_->prepare(g.desc, g.desc.library == GemmLibrary::CublasLt ? kGemmWorkspaceBytes : 0);
}

Result<std::vector<CUdeviceptr>> CudaRunner::epilogue_args(const GemmArtifact& g) {
  const PtxArtifact& e = *g.epilogue;
  if (!e.tensor_maps.empty() || e.zero_outputs || e.workspace_bytes > 0)
    return Diag{"", {}, "an epilogue kernel with tensor maps, zeroed outputs or a workspace is not supported"};
  if (g.epilogue_in.size() != e.inputs.size() || g.epilogue_out.size() != e.outputs.size() || e.outputs.empty())
    return Diag{"", {}, "the epilogue kernel takes " + specs_str(e.inputs) + " -> " + specs_str(e.outputs) + ", but " +
                            std::to_string(g.epilogue_in.size()) + " input(s) and " +
                            std::to_string(g.epilogue_out.size()) + " output(s) are given"};
  const KernelArgSpec product{g.desc.dtype, g.desc.m * g.desc.n * g.desc.batch};  // prepare_gemm checked it
  if (g.c == kGemmProduct && gemm_product_.bytes() != static_cast<size_t>(product.bytes())) {
    gemm_product_ = {};
    Result<cuda::Buffer> b = cuda::Buffer::allocate(*ctx_, static_cast<size_t>(product.bytes()));
    if (!b) return Diag{"", {}, "the GEMM's product buffer: " + b.error().message};
    gemm_product_ = std::move(b).value();
  }
  std::vector<CUdeviceptr> args;
  auto take = [&](int i, const KernelArgSpec& want, bool output) -> Result<void> {
    const std::vector<KernelArgSpec>& specs = output ? output_specs_ : input_specs_;
    const std::vector<cuda::Buffer>& bufs = output ? outputs_ : inputs_;
    KernelArgSpec have;
    if (!output && i == kGemmProduct) {
      have = product;
      args.push_back(g.c == kGemmProduct ? gemm_product_.ptr() : outputs_[static_cast<size_t>(g.c)].ptr());
    } else if (i >= 0 && i < static_cast<int>(specs.size())) {
      have = specs[static_cast<size_t>(i)];
      args.push_back(bufs[static_cast<size_t>(i)].ptr());
    } else {
      return Diag{"", {}, "the epilogue kernel's " + std::string(output ? "output " : "input ") + std::to_string(i) +
                              " is not one of the runner's " + std::to_string(specs.size()) +
                              (output ? " outputs" : " inputs")};
    }
    if (have != want)
      return Diag{"", {}, "the epilogue kernel's argument " + std::to_string(args.size() - 1) + " is " +
                              specs_str({want}) + ", the buffer it is given " + specs_str({have})};
    return {};
  };
  for (size_t j = 0; j < g.epilogue_in.size(); ++j)
    SF_TRY(take(g.epilogue_in[j], e.inputs[j], false));
  for (size_t j = 0; j < g.epilogue_out.size(); ++j)
    SF_TRY(take(g.epilogue_out[j], e.outputs[j], true));
  return args;
}

Result<Measurement> CudaRunner::run(const Artifact& a, const BenchOptions& bench) {
  info_ = {};
  const auto* p = dynamic_cast<const PtxArtifact*>(&a);
  const auto* gemm = dynamic_cast<const GemmArtifact*>(&a);
  if (!p && !gemm) return Diag{"", {}, "the CUDA Runner runs PTX and library GEMM artifacts only"};
  if (lost_)
    return Diag{"", {}, "not run: an earlier candidate's fault left CUDA unusable in this process"};
  if (p && (!p->inputs.empty() || !p->outputs.empty()) && (p->inputs != input_specs_ || p->outputs != output_specs_))
    return Diag{"", {}, "the candidate's arguments " + specs_str(p->inputs) + " -> " + specs_str(p->outputs) +
                            " are not this runner's " + specs_str(input_specs_) + " -> " + specs_str(output_specs_)};
  const int64_t flush_bytes = !bench.flush_cache ? 0 : bench.flush_bytes > 0 ? bench.flush_bytes : opts_.flush_bytes;
  SF_TRY(ensure_ready(flush_bytes));

  // What one run of the candidate enqueues: a launch of its PTX, or the library call.
  std::vector<CUdeviceptr> args;
  for (const cuda::Buffer& b : inputs_) args.push_back(b.ptr());
  for (const cuda::Buffer& b : outputs_) args.push_back(b.ptr());
  std::optional<cuda::Module> module;
  CUfunction fn{};
  cuda::LaunchDims dims;
  // A kernel's launch as exec makes it: a persistent walk on at most the blocks the
  // device holds at once.
  auto launch_of = [&](CUfunction f, const PtxArtifact& k) -> Result<cuda::LaunchDims> {
    return k.persistent ? cuda::resident_grid(*ctx_, f, k.launch) : Result<cuda::LaunchDims>(k.launch);
  };
  std::optional<cublas::GemmCall> call;
  const bool zero_outputs = p && p->zero_outputs;
  std::vector<cuda::Buffer> maps;
  if (p)
    for (const PlanTensorMap& m : p->tensor_maps) {
      // An input's map, or a TMA store's over an output.
      const bool store = m.output >= 0;
      const std::vector<cuda::Buffer>& side = store ? outputs_ : inputs_;
      const int which = store ? m.output : m.input;
      if (which < 0 || which >= static_cast<int>(side.size()))
        return Diag{"", {}, std::string("tensor map of ") + (store ? "output " : "input ") + std::to_string(which) +
                                ": the kernel has " + std::to_string(side.size()) + (store ? " outputs" : " inputs")};
      Result<cuda::Buffer> b = cuda::encode_tensor_map(*ctx_, m, side[static_cast<size_t>(which)].ptr());
      if (!b) return b.error();
      args.push_back(b->ptr());
      maps.push_back(std::move(b).value());
    }
  // A split-K kernel's workspace, after the tensor maps: zeroed here, and every
  // launch leaves it zero (graph mode replays launches with nothing between them).
  cuda::Buffer workspace;
  if (p && p->workspace_bytes > 0) {
    Result<cuda::Buffer> w = cuda::Buffer::allocate(*ctx_, static_cast<size_t>(p->workspace_bytes));
    if (!w) return Diag{"", {}, "the kernel's workspace of " + std::to_string(p->workspace_bytes) + " bytes: " + w.error().message};
    workspace = std::move(w).value();
    SF_TRY(cuda::check(ctx_->drv().MemsetD8Async(workspace.ptr(), 0, workspace.bytes(), stream_.get()), "cuMemsetD8Async(workspace)"));
    args.push_back(workspace.ptr());
  }
  if (p) {
    Result<cuda::Module> m = cuda::Module::load_ptx(*ctx_, p->ptx, p->entry);
    if (!m) return m.error();  // carries the JIT's error log
    module = std::move(m).value();
    Result<CUfunction> f = module->function(p->entry);
    if (!f) return f.error();
    fn = *f;
    Result<cuda::LaunchDims> d = launch_of(fn, *p);
    if (!d) return d.error();
    dims = *d;
  } else {
    Result<cublas::GemmCall> c = prepare_gemm(*gemm);
    if (!c) return c.error();
    call = std::move(c).value();
  }
  // A split candidate's epilogue kernel, launched after the call in every run.
  std::optional<cuda::Module> epilogue_module;
  CUfunction epilogue_fn{};
  cuda::LaunchDims epilogue_dims;
  std::vector<CUdeviceptr> epi_args;
  if (gemm && gemm->epilogue) {
    Result<std::vector<CUdeviceptr>> ea = epilogue_args(*gemm);
    if (!ea) return ea.error();
    epi_args = std::move(ea).value();
    Result<cuda::Module> m = cuda::Module::load_ptx(*ctx_, gemm->epilogue->ptx, gemm->epilogue->entry);
    if (!m) return Diag{"", {}, "the epilogue kernel: " + m.error().message};
    epilogue_module = std::move(m).value();
    Result<CUfunction> f = epilogue_module->function(gemm->epilogue->entry);
    if (!f) return f.error();
    epilogue_fn = *f;
    Result<cuda::LaunchDims> d = launch_of(epilogue_fn, *gemm->epilogue);
    if (!d) return Diag{"", {}, "the epilogue kernel: " + d.error().message};
    epilogue_dims = *d;
  }
  const cuda::Driver& d = ctx_->drv();

  auto failed = [&](const Diag& e) -> Diag {
    std::string note = recover();
    return Diag{e.file, e.loc, e.message + note};
  };
  auto zero = [&]() -> Result<void> {
    if (!zero_outputs) return {};
    ++info_.zeroings;
    for (const cuda::Buffer& b : outputs_)
      if (b.bytes() > 0)
        SF_TRY(cuda::check(d.MemsetD8Async(b.ptr(), 0, b.bytes(), stream_.get()), "cuMemsetD8Async(outputs)"));
    return {};
  };
  auto launch_once = [&]() -> Result<void> {
    if (call) {
      auto ptr = [&](const std::vector<cuda::Buffer>& v, int i) { return i < 0 ? CUdeviceptr{0} : v[static_cast<size_t>(i)].ptr(); };
      const CUdeviceptr c = gemm->c == kGemmProduct ? gemm_product_.ptr() : ptr(outputs_, gemm->c);
      SF_TRY(call->enqueue(stream_, ptr(inputs_, gemm->a), ptr(inputs_, gemm->b), ptr(inputs_, gemm->bias), c,
                           gemm_workspace_.ptr()));
      if (!gemm->epilogue) return {};
      return cuda::launch(*ctx_, epilogue_fn, epilogue_dims, epi_args, stream_);
    }
    return cuda::launch(*ctx_, fn, dims, args, stream_);
  };
  // Records start, enqueues `work`, records end and waits: the events' time in us.
  auto timed = [&](const std::function<Result<void>()>& work) -> Result<double> {
    ++info_.timed_runs;
    SF_TRY(start_.record(stream_));
    SF_TRY(work());
    SF_TRY(end_.record(stream_));
    SF_TRY(end_.synchronize());
    Result<float> ms = cuda::Event::elapsed_ms(start_, end_);
    if (!ms) return ms.error();
    return static_cast<double>(*ms) * 1000.0;
  };

  // One launch, waited for: a fault or a bad launch shows here, untimed.
  if (Result<void> e = zero(); !e.ok()) return failed(e.error());
  if (Result<void> e = launch_once(); !e.ok())
    return failed(Diag{"", {}, "the candidate failed to launch: " + e.error().message});
  if (Result<void> e = stream_.synchronize(); !e.ok())
    return failed(Diag{"", {}, "the candidate faulted: " + e.error().message});

  // The estimate that picks the mode: the median of three single timed launches.
  double t[3] = {0, 0, 0};
  for (double& v : t) {
    if (Result<void> e = zero(); !e.ok()) return failed(e.error());
    Result<double> us = timed(launch_once);
    if (!us) return failed(Diag{"", {}, "the candidate failed: " + us.error().message});
    v = *us;
  }
  info_.estimate_us = median3(t[0], t[1], t[2]);

  std::optional<cuda::Graph> graph;
  int n = 1;
  if (opts_.graph_below_us > 0 && info_.estimate_us < opts_.graph_below_us) {
    n = static_cast<int>(std::lround(opts_.graph_target_us / std::max(info_.estimate_us, 0.05)));
    n = std::clamp(n, 2, std::max(2, opts_.max_graph_launches));
    Result<cuda::Graph> g = cuda::Graph::capture(*ctx_, stream_, [&]() -> Result<void> {
      for (int i = 0; i < n; ++i)
        SF_TRY(launch_once());
      return {};
    });
    if (!g) return failed(Diag{"", {}, "capturing the candidate in a CUDA graph: " + g.error().message});
    graph = std::move(g).value();
    info_.graph_mode = true;
    info_.launches_per_timing = n;
  }

  // measure()'s hooks return times, not errors: the first error is kept, and
  // every later call returns at once without touching the device.
  Result<void> error;
  BenchHooks hooks;
  hooks.restore = [&] {
    if (!error.ok()) return;
    error = zero();
  };
  if (flush_bytes > 0) {
    const size_t words = flush_.bytes() / 4;
    hooks.flush = [&, words] {
      if (!error.ok()) return;
      ++info_.flushes;
      // A new value each time: no write can be skipped as already holding it.
      error = cuda::check(d.MemsetD32Async(flush_.ptr(), ++flush_value_, words, stream_.get()),
                          "cuMemsetD32Async(L2 flush)");
    };
  }
  hooks.run = [&]() -> double {
    if (!error.ok()) return 0;
    Result<double> us = graph ? timed([&] { return graph->launch(stream_); }) : timed(launch_once);
    if (!us) {
      error = us.error();
      return 0;
    }
    return *us / n;
  };
  // No device flush buffer: no flush at all (measure() would otherwise write a host one).
  BenchOptions o = bench;
  if (flush_bytes <= 0) o.flush_cache = false;
  Measurement m = measure(hooks, o);
  if (!error.ok()) return failed(Diag{"", {}, "the candidate failed while being timed: " + error.error().message});
  if (m.reps == 0) return Diag{"", {}, "no repetition gave a time"};
  return m;
}

}  // namespace sf
