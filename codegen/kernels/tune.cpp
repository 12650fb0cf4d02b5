#include "codegen/kernels/tune.h"

#include "codegen/kernels/attention.h"
#include "codegen/kernels/element.h"

#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/TargetParser/Host.h>

#include <chrono>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>

#include "autotune/ptxas.h"
#include "codegen/ir/printer.h"
#include "codegen/kernels/extern_gemm.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/reduction.h"
#include "codegen/reference/evaluate.h"

namespace sf {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// The group's text without its name and with every tensor type's extents erased:
// ops, dtypes, attributes and wiring, but not sizes (those are the key's shapes
// field, exact or bucketed).
std::string signature_of(const LocalKernel& k) {
  static const std::regex dims(R"(\b(f32|f16|bf16|i32|i64|bool)\[[^\]]*\])");
  std::string text = print_graph(k.group);
  // The first line names the graph (the kernel's name, which holds a rank-free but
  // program-dependent index); the body is what the kernel computes.
  size_t nl = text.find('\n');
  if (nl != std::string::npos) text = text.substr(nl + 1);
  return std::string(kernel_kind_name(k.kind)) + "\n" + std::regex_replace(text, dims, "$1[]");
}

const std::string& llvm_toolchain() {
  static const std::string s = std::string("llvm ") + LLVM_VERSION_STRING;
  return s;
}

// The kernel emitted for one candidate config (entry "sf_tune": every candidate
// is compiled on its own, so names never clash).
Result<EmittedKernel> emit_candidate(const LocalKernel& k, const KernelConfig& c, const llvmb::Target& t,
                                     bool allow_tf32 = false, bool tma = false) {
  KernelSpec spec{"sf_tune", k.kind, k.group};
  spec.allow_tf32 = allow_tf32;
  spec.tma = tma;
  return emitter_for(k.kind).emit(spec, c, t);
}

// The kernel ABI's arguments: the group's params, then its outputs.
std::vector<KernelArgSpec> input_specs(const LocalKernel& k) {
  std::vector<KernelArgSpec> v;
  for (ValueId p : k.group.params()) v.push_back({k.group.node(p).type.dtype, numel(k.group.node(p).type.shape)});
  return v;
}
std::vector<KernelArgSpec> output_specs(const LocalKernel& k) {
  std::vector<KernelArgSpec> v;
  for (const Output& o : k.group.outputs())
    v.push_back({k.group.node(o.value).type.dtype, numel(k.group.node(o.value).type.shape)});
  return v;
}

// Host artifacts: the optimised module, JIT-compiled on first use. Most built
// candidates are ranked out and never run, so they never pay for machine code.
struct HostArtifact final : Artifact {
  std::shared_ptr<llvmb::HostJit> jit;
  std::string entry;
  mutable std::mutex mu;
  mutable std::unique_ptr<llvm::LLVMContext> context;
  mutable std::unique_ptr<llvm::Module> module;
  mutable void (*fn)(void**) = nullptr;
  mutable std::string error;

  Result<void (*)(void**)> get() const {
    std::lock_guard<std::mutex> lock(mu);
    if (!fn && error.empty()) {
      Result<void*> f = jit->add(std::move(module), std::move(context), entry);
      if (f) fn = reinterpret_cast<void (*)(void**)>(*f);
      else error = f.error().message;
    }
    if (!fn) return Diag{"", {}, error};
    return fn;
  }
  ~HostArtifact() override {
    module.reset();  // before its context
  }
};

class HostCandidateBuilder final : public Builder {
 public:
  HostCandidateBuilder(const LocalKernel& k, std::shared_ptr<llvmb::HostJit> jit) : k_(k), jit_(std::move(jit)) {}
  BuildResult build(const KernelConfig& c) override {
    auto t0 = Clock::now();
    BuildResult r;
    Result<EmittedKernel> e = emit_candidate(k_, c, llvmb::Target::host());
    if (!e) {
      r.error = e.error().message;
      return r;
    }
    // Two configs whose optimised code is the same are one candidate.
    Result<std::string> ir = llvmb::optimized_ir(*e->module, llvmb::Target::host());
    if (!ir) {
      r.error = ir.error().message;
      return r;
    }
    r.code_hash = fnv1a_hex(*ir);
    auto a = std::make_shared<HostArtifact>();
    a->jit = jit_;
    a->entry = e->entry;
    a->context = std::move(e->context);
    a->module = std::move(e->module);
    r.artifact = a;
    r.build_ms = ms_since(t0);
    return r;
  }

 private:
  LocalKernel k_;
  std::shared_ptr<llvmb::HostJit> jit_;
};

class PtxCandidateBuilder final : public Builder {
 public:
  PtxCandidateBuilder(const LocalKernel& k, std::string arch, bool allow_tf32, bool tma)
      : k_(k), arch_(std::move(arch)), allow_tf32_(allow_tf32), tma_(tma), input_specs_(input_specs(k)),
        output_specs_(output_specs(k)) {}
  BuildResult build(const KernelConfig& c) override {
    auto t0 = Clock::now();
    BuildResult r;
    Result<EmittedKernel> e = emit_candidate(k_, c, llvmb::Target::nvptx(arch_), allow_tf32_, tma_);
    if (!e) {
      r.error = e.error().message;
      return r;
    }
    Result<std::string> ptx = llvmb::compile_to_ptx(*e->module, arch_);
    if (!ptx) {
      r.error = ptx.error().message;
      return r;
    }
    if (find_ptxas().ok()) {
      Result<std::vector<KernelResources>> res = run_ptxas(*ptx, arch_);
      if (!res) {
        r.error = "ptxas rejected it: " + res.error().message;
        return r;
      }
      if (!res->empty()) r.resources = (*res)[0];
    }
    const LaunchShape& l = e->launch;
    r.threads_per_block = l.block[0] * l.block[1] * l.block[2];
    r.dynamic_shared_bytes = l.shared_bytes;
    r.grid_blocks = l.grid[0] * l.grid[1] * l.grid[2];
    r.wgmma = ptx->find("wgmma.mma_async") != std::string::npos;
    r.tensor_cores = ptx_uses_tensor_cores(*ptx);
    r.tf32 = r.tensor_cores && ptx_uses_tf32(*ptx);
    if (k_.kind == KernelKind::Reduction)
      if (Result<ReductionInfo> ri = reduction_info(KernelSpec{"sf_tune", KernelKind::Reduction, k_.group}, c); ri.ok())
        r.row_reads = std::max(ri->row_reads(), 1);
    std::string launch = std::to_string(l.grid[0]) + "," + std::to_string(l.grid[1]) + "," + std::to_string(l.grid[2]) +
                         "/" + std::to_string(l.block[0]) + "," + std::to_string(l.block[1]) + "," +
                         std::to_string(l.block[2]) + "/" + std::to_string(l.shared_bytes) + (l.persistent ? "/p" : "");
    r.code_hash = fnv1a_hex(*ptx + "\n" + launch);
    auto a = std::make_shared<PtxArtifact>();
    a->config = config_str(k_.kind, ConfigTarget::Gpu, c);
    a->ptx = std::move(ptx).value();
    a->entry = e->entry;
    a->launch.grid = l.grid;
    a->launch.block = l.block;
    a->launch.shared_bytes = l.shared_bytes;
    a->launch.cluster = l.cluster;
    a->zero_outputs = l.zero_outputs;
    a->workspace_bytes = l.workspace_bytes;
    a->persistent = l.persistent;
    a->tensor_maps = l.tensor_maps;  // TensorMapSpec is PlanTensorMap
    a->inputs = input_specs_;
    a->outputs = output_specs_;
    r.artifact = a;
    r.build_ms = ms_since(t0);
    return r;
  }

 private:
  LocalKernel k_;
  std::string arch_;
  bool allow_tf32_ = false;
  bool tma_ = false;
  std::vector<KernelArgSpec> input_specs_, output_specs_;
};

class HostTimingRunner final : public Runner {
 public:
  HostTimingRunner(const LocalKernel& k, uint64_t seed) {
    inputs_ = random_inputs(k.group, seed);
    for (const Output& o : k.group.outputs()) {
      const TensorType& t = k.group.node(o.value).type;
      outputs_.emplace_back(t.dtype, t.shape);
    }
  }
  Result<Measurement> run(const Artifact& a, const BenchOptions& opts) override {
    auto* h = dynamic_cast<const HostArtifact*>(&a);
    if (!h) return Diag{"", {}, "not a host artifact"};
    Result<void (*)(void**)> fn = h->get();
    if (!fn) return fn.error();
    void (*entry)(void**) = *fn;
    std::vector<void*> args;
    for (Tensor& t : inputs_) args.push_back(t.data());
    for (Tensor& t : outputs_) args.push_back(t.data());
    BenchHooks hooks;
    // Outputs are separate buffers in the kernel ABI: nothing is written in place,
    // so there is nothing to restore.
    hooks.run = [&] {
      auto t0 = Clock::now();
      entry(args.data());
      return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    };
    BenchOptions o = opts;
    if (o.flush_bytes == 0) {
      // Enough to push this kernel's operands out of L1 and L2 and most of L3: four
      // times its working set, at least 32 MiB, at most 2x the last-level cache. A
      // server's shared L3 (hundreds of MiB) would otherwise cost ~0.1 s per repetition.
      const TargetInfo& t = host_target_info();
      int64_t ws = 0;
      for (const Tensor& x : inputs_) ws += static_cast<int64_t>(x.nbytes());
      for (const Tensor& x : outputs_) ws += static_cast<int64_t>(x.nbytes());
      o.flush_bytes = std::min<int64_t>(std::max<int64_t>(int64_t{32} << 20, 4 * ws), std::max<int64_t>(2 * t.llc_bytes, int64_t{32} << 20));
    }
    return measure(hooks, o);
  }

 private:
  std::vector<Tensor> inputs_, outputs_;
};

class UnavailableRunner final : public Runner {
 public:
  explicit UnavailableRunner(std::string why) : why_(std::move(why)) {}
  Result<Measurement> run(const Artifact&, const BenchOptions&) override { return Diag{"", {}, why_}; }

 private:
  std::string why_;
};

ConfigTarget config_target_of(const TuneSetup& s) { return s.device == "cpu" ? ConfigTarget::Host : ConfigTarget::Gpu; }

Result<TargetInfo> target_of(const TuneSetup& s) {
  if (config_target_of(s) == ConfigTarget::Host) return host_target_info();
  return gpu_target_info(s.arch);
}

}  // namespace

Result<TuneProblem> tune_problem(const LocalKernel& k) {
  TuneProblem p;
  p.kind = k.kind;
  p.name = k.name;
  p.signature = fnv1a_hex(signature_of(k));
  const Graph& g = k.group;
  int elem = 1;
  for (ValueId v : g.params()) {
    p.shapes.push_back(g.node(v).type.shape);
    elem = std::max(elem, dtype_size(g.node(v).type.dtype));
  }
  p.num_inputs = p.shapes.size();
  for (const Output& o : g.outputs()) {
    p.shapes.push_back(g.node(o.value).type.shape);
    elem = std::max(elem, dtype_size(g.node(o.value).type.dtype));
  }
  p.elem_bytes = elem;
  p.bytes = k.bytes_read + k.bytes_written;
  p.flops = k.flops;
  const Node& first_out = g.node(g.outputs().front().value);
  p.n = numel(first_out.type.shape);
  if (k.kind == KernelKind::Attention) {
    Result<AttentionKernelInfo> a = attention_info(g);
    if (!a) return a.error();
    p.batch = a->batches;
    p.m = a->match.l;
    p.n = a->match.s;
    p.k = a->match.e;
    p.cols = a->match.ev;
    p.operand_bytes = static_cast<int>(dtype_size(g.node(a->match.scores).type.dtype));
    return p;
  }
  for (const Node& n : g.nodes()) {
    if (k.kind == KernelKind::Reduction && op_info(n.op).category == OpCategory::Reduce) {
      const Shape& x = g.node(n.inputs[0]).type.shape;
      std::vector<int> rd = reduced_dims(n.attrs, static_cast<int>(x.size()));
      p.cols = 1;
      for (int d : rd) p.cols *= x[static_cast<size_t>(d)];
      p.rows = p.cols ? numel(x) / p.cols : 0;
      p.n = numel(x);
      p.outer = !x.empty() && std::find(rd.begin(), rd.end(), static_cast<int>(x.size()) - 1) == rd.end();
      if (Result<ReductionInfo> r = reduction_info(KernelSpec{"sf_tune", k.kind, g}, KernelConfig{}); r.ok())
        p.splittable = r->passes == 1 && r->x_outputs == 0;
      break;
    }
    if (k.kind == KernelKind::Matmul && n.op == OpKind::Matmul) {
      p.bare = g.outputs().size() == 1 && &g.node(g.outputs()[0].value) == &n && n.type.dtype == DType::F32;
      p.operand_bytes = static_cast<int>(dtype_size(n.type.dtype));
      const Shape& a = g.node(n.inputs[0]).type.shape;
      const Shape& out = n.type.shape;
      p.k = a.back();
      p.m = out.size() >= 2 ? out[out.size() - 2] : 1;
      p.n = out.back();
      p.batch = (p.m > 0 && p.n > 0) ? numel(out) / (p.m * p.n) : 1;
      break;
    }
  }
  return p;
}

KernelConfig default_kernel_config(const LocalKernel& k, ConfigTarget t, const std::string& arch, bool allow_tf32,
                                   bool tma) {
  KernelConfig c;
  const KernelKind kind = k.kind;
  if (t == ConfigTarget::Gpu && kind == KernelKind::Reduction)
    if (Result<KernelConfig> s = suggest_reduction_config(KernelSpec{"sf_default", kind, k.group}, c); s.ok()) {
      c = *s;
      // A block for each group of rows rather than a grid of max_blocks looping over
      // them, where that is at most 2^20 blocks: on an H200 the f32 softmax and
      // layer_norm over 16384 x 4096 took 134.4 and 135.1 us so (256 threads a row)
      // against 140.2 and 139.1 with the grid-stride loop over 4096 blocks (tune
      // --measure, run 9; runs 10 and 11: 133.6 and 134.2 against 139.0 and 138.4,
      // bench/results/tune-h200-run{9,10,11}/reduction_*). Rows up to max_blocks
      // groups launch the same grid either way.
      KernelConfig one = c;
      one.grid_stride = false;
      if (Result<ReductionInfo> r1 = reduction_info(KernelSpec{"sf_default", kind, k.group}, one);
          r1.ok() && r1->launch.grid[0] <= (int64_t{1} << 20))
        c = one;
    }
  if (t == ConfigTarget::Gpu && kind == KernelKind::Matmul && !arch.empty()) {
    KernelSpec spec{"sf_default", kind, k.group};
    spec.allow_tf32 = allow_tf32;
    spec.tma = tma;
    c = suggest_matmul_config(spec, c, arch);
  }
  if (t == ConfigTarget::Gpu && kind == KernelKind::Attention) {
    // The tensor-core attention (sm_80+) with head dims up to 128 and at least 128
    // query rows a head: 128-row blocks of 8 warps (16 rows a warp, the
    // register-resident form) over 64 keys a step, where the tile fits the arch's
    // shared memory. On an H200 that took the bf16 causal GQA attention (8 x 32 heads
    // x 2048 x 128) from 1.37 ms with 64 x 64 tiles of 4 warps to 1.32 ms (tune
    // --measure, runs 9 and 10: bench/results/tune-h200-run10/sdpa).
    KernelConfig w = c;
    w.block_m = 128;
    w.block_n = 64;
    w.warps = 8;
    Result<AttentionKernelInfo> info = attention_info(k.group);
    KernelSpec spec{"sf_default", kind, k.group};
    if (info && info->match.e <= 128 && info->match.ev <= 128 && info->match.l >= 128 &&
        attention_uses_tensor_cores(spec, w, arch) && attention_tiles_fit(k.group, w, arch))
      c = w;
    // sm_90a, where wgmma takes it (16-bit operands, head dims of whole 64-column
    // panels) and a head has 256 query rows or more: 256-row blocks of 16 warps (four
    // warpgroups) over 64 keys, each product one wgmma a warpgroup and k step. On an
    // H200 that took the same attention from 1.315 ms (the 128 x 64 mma.sync tile) to
    // 0.806 ms, the fastest of the 18 wgmma tiles run 11 timed (bench_kernels:
    // bench/results/bench_kernels-h200-attn-tiles-run11{b,c}.json).
    KernelConfig g = w;
    g.block_m = 256;
    g.warps = 16;
    g.wgmma = 1;
    if (info && c == w && info->match.l >= 256 && !attention_wgmma_unfit(k.group, g, arch) &&
        attention_tiles_fit(k.group, g, arch))
      c = g;
  }
  if (t == ConfigTarget::Gpu && kind == KernelKind::Pointwise) {
    // 16-byte accesses of the narrowest dtype the kernel reads or writes: 4 f32, 8
    // f16/bf16 (the emitter splits wider dtypes' vectors into 16-byte pieces).
    int64_t narrow = 16;
    for (ValueId v : k.group.params()) narrow = std::min<int64_t>(narrow, dtype_size(k.group.node(v).type.dtype));
    for (const Output& o : k.group.outputs()) narrow = std::min<int64_t>(narrow, dtype_size(k.group.node(o.value).type.dtype));
    c.vector = static_cast<int>(16 / std::max<int64_t>(narrow, 1));
    // sm_90 and later, a large kernel of 16-bit or 32-bit elements: 1024 threads a
    // block, 4 vectors a thread (16-bit) or 2 (32-bit), a persistent grid of two
    // blocks an SM (typical_sms; the runtime launches no more blocks than the device
    // holds, LaunchShape::persistent). The tuner's measurements on an H200
    // (bench/results/tune-h200-run10) put these ahead of 256 threads of one vector on
    // a 4096-block grid at every bf16 and f32 bench shape: 72.4 against 80.2 us for
    // bf16 bias + GELU at 16384x4096, 23.1 against 23.9 at 4096x4096, 138.6 against
    // 141.5 in f32. Kernels too small to fill that grid once keep the one-vector
    // default, which leaves more blocks to spread over the SMs.
    const std::optional<int> sm = kernels::sm_version(arch);
    const int ept = c.vector == 8 ? 4 : 2;
    const int64_t grid = 2 * int64_t{typical_sms(sm.value_or(0))};
    if (sm && *sm >= 90 && (c.vector == 4 || c.vector == 8) && !k.group.outputs().empty() &&
        numel(k.group.node(k.group.outputs().front().value).type.shape) >= int64_t{1024} * c.vector * ept * grid) {
      c.block = 1024;
      c.elems_per_thread = ept;
      c.grid_stride = true;
      c.max_blocks = static_cast<int>(grid);
    }
  }
  return c;
}

KernelConfig narrow_pointwise_default(const KernelConfig& c) {
  KernelConfig n;
  n.vector = c.vector;
  return n;
}

const GpuDeviceId& local_gpu_device() {
  static const GpuDeviceId id = [] {
    GpuDeviceId d;
    if (Result<cuda::DeviceInfo> i = cuda::device_info(0); i.ok()) {
      d.name = i->name;
      d.arch = i->arch();
      d.driver_version = i->driver_version;
    }
    return d;
  }();
  return id;
}

std::string target_id(const TargetInfo& t, const GpuDeviceId& dev) {
  if (t.kind == ConfigTarget::Gpu) return !dev.name.empty() && dev.arch == t.name ? t.name + ":" + dev.name : t.name;
  return "host:" + llvm::sys::getHostCPUName().str() + ":" + t.model;
}

std::string target_id(const TargetInfo& t) {
  return t.kind == ConfigTarget::Gpu ? target_id(t, local_gpu_device()) : target_id(t, GpuDeviceId{});
}

std::string toolchain_id(ConfigTarget t, const GpuDeviceId& dev) {
  if (t == ConfigTarget::Host) return llvm_toolchain();
  static const std::string gpu = [] {
    Result<std::string> v = ptxas_version();
    return llvm_toolchain() + "; ptxas " + (v ? *v : std::string("none"));
  }();
  return dev.driver_version > 0 ? gpu + "; driver " + std::to_string(dev.driver_version) : gpu;
}

std::string toolchain_id(ConfigTarget t) {
  return t == ConfigTarget::Gpu ? toolchain_id(t, local_gpu_device()) : llvm_toolchain();
}

std::shared_ptr<Builder> make_host_builder(const LocalKernel& k, std::shared_ptr<llvmb::HostJit> jit) {
  return std::make_shared<HostCandidateBuilder>(k, std::move(jit));
}

std::shared_ptr<Builder> make_ptx_builder(const LocalKernel& k, const std::string& arch, bool allow_tf32, bool tma) {
  return std::make_shared<PtxCandidateBuilder>(k, arch, allow_tf32, tma);
}

std::unique_ptr<Runner> make_host_runner(const LocalKernel& k, uint64_t seed) {
  return std::make_unique<HostTimingRunner>(k, seed);
}

Result<std::unique_ptr<Runner>> make_cuda_runner(const LocalKernel& k, const std::string& arch, uint64_t seed,
                                                 const CudaRunnerOptions& o) {
  Result<cuda::DeviceInfo> dev = cuda::device_info(o.device);
  if (!dev) return dev.error();
  if (!arch.empty() && dev->arch() != arch)
    return Diag{"", {}, "candidates for " + arch + " cannot be measured on " + dev->name + " (" + dev->arch() +
                            "): tune with --arch " + dev->arch() + " or on a " + arch + " device"};
  Result<std::unique_ptr<CudaRunner>> r = CudaRunner::create(random_inputs(k.group, seed), output_specs(k), o);
  if (!r) return Diag{"", {}, k.name + ": " + r.error().message};
  return std::unique_ptr<Runner>(std::move(r).value());
}

std::unique_ptr<Runner> make_unavailable_runner(std::string why) {
  return std::make_unique<UnavailableRunner>(std::move(why));
}

void mark_tf32(TuneProblem& p, const TuneSetup& setup) {
  if (setup.allow_tf32 && setup.device == "cuda" && p.kind == KernelKind::Matmul && p.operand_bytes == 4) {
    p.tf32 = true;
    p.signature += " tf32";
  }
}

Result<GraphTuneResult> tune_programs(const std::vector<LocalProgram>& programs, const TuneSetup& setup,
                                      TuneCache& cache, const TuneOptions& opts,
                                      const std::function<void(size_t, size_t, const TuneProgress&)>& progress,
                                      Runner* gpu_runner, const GpuRunnerFactory& gpu_runners) {
  Result<TargetInfo> target = target_of(setup);
  if (!target) return target.error();
  const ConfigTarget ct = target->kind;
  const std::string tid = setup.gpu ? target_id(*target, *setup.gpu) : target_id(*target);
  const std::string tool = setup.gpu ? toolchain_id(ct, *setup.gpu) : toolchain_id(ct);

  // Distinct kernels by key, in program order (rank 0's first).
  struct Job {
    const LocalKernel* k;
    TuneProblem p;
    TuneKey key;
  };
  std::vector<Job> jobs;
  std::set<std::string> seen;
  for (const LocalProgram& prog : programs)
    for (const LocalKernel& k : prog.kernels) {
      Result<TuneProblem> p = tune_problem(k);
      if (!p) continue;  // kinds without an emitter run on the reference evaluator
      mark_tf32(*p, setup);
      TuneKey key = make_tune_key(*p, setup.buckets, tid, tool);
      if (!seen.insert(key.hash()).second) continue;
      jobs.push_back({&k, std::move(p).value(), key});
    }

  std::shared_ptr<llvmb::HostJit> jit;
  if (ct == ConfigTarget::Host) {
    Result<std::unique_ptr<llvmb::HostJit>> j = llvmb::HostJit::create();
    if (!j) return j.error();
    jit = std::move(j).value();
  }
  GraphTuneResult out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    std::shared_ptr<Builder> builder =
        ct == ConfigTarget::Host ? make_host_builder(*j.k, jit)
                                 : make_ptx_builder(*j.k, setup.arch, setup.allow_tf32, setup.tma);
    std::unique_ptr<Runner> own_runner;
    Runner* runner = gpu_runner;
    if (ct == ConfigTarget::Host) {
      own_runner = make_host_runner(*j.k);
      runner = own_runner.get();
    } else if (!runner && gpu_runners) {
      own_runner = gpu_runners(*j.k, j.key);
      runner = own_runner.get();
    } else if (!runner) {
      // One CUDA Runner per kernel: its arguments are the kernel's. Without a device
      // every candidate is unmeasurable and the kernel keeps its default config.
      Result<std::unique_ptr<Runner>> cr = make_cuda_runner(*j.k, setup.arch);
      own_runner = cr ? std::move(cr).value() : make_unavailable_runner(cr.error().message);
      runner = own_runner.get();
    }
    KernelConfig def = default_kernel_config(*j.k, ct, setup.arch, setup.allow_tf32, setup.tma);
    // Library GEMMs beside the generated configs, where one can compute the kernel.
    std::string extern_note;
    std::vector<ExternCandidate> externs;
    if (ct == ConfigTarget::Gpu && j.p.kind == KernelKind::Matmul)
      externs = extern_candidates(*j.k, setup.allow_tf32, &extern_note, setup.arch,
                                  setup.libraries ? &*setup.libraries : nullptr);
    Result<TuneReport> r = tune_kernel(j.p, j.key, *target, def, builder, *runner, cache, opts,
                                       [&](const TuneProgress& tp) {
                                         if (progress) progress(i, jobs.size(), tp);
                                       },
                                       externs);
    if (!r) return Diag{"", {}, j.k->name + ": " + r.error().message};
    r->extern_note = extern_note;
    if (r->cache_hit()) ++out.cache_hits;
    if (r->measured > 0) ++out.measured_kernels;
    out.choices[j.key.hash()] = KernelChoice{r->best, r->source, r->best_str, r->best_extern};
    out.reports.push_back(std::move(r).value());
  }
  return out;
}

ConfigChooser::ConfigChooser(TuneSetup setup, TuneCache* cache) : setup_(std::move(setup)), cache_(cache) {
  Result<TargetInfo> t = target_of(setup_);
  target_ = t ? *t : host_target_info();
  toolchain_ = setup_.gpu ? toolchain_id(config_target_of(setup_), *setup_.gpu) : toolchain_id(config_target_of(setup_));
}

std::optional<TuneKey> ConfigChooser::key_of(const LocalKernel& k) const {
  Result<TuneProblem> p = tune_problem(k);
  if (!p) return std::nullopt;
  mark_tf32(*p, setup_);
  return make_tune_key(*p, setup_.buckets, setup_.gpu ? target_id(target_, *setup_.gpu) : target_id(target_), toolchain_);
}

KernelChoice ConfigChooser::choose(const LocalKernel& k) const {
  const ConfigTarget ct = config_target_of(setup_);
  KernelChoice c{default_kernel_config(k, ct, ct == ConfigTarget::Gpu ? setup_.arch : "", setup_.allow_tf32, setup_.tma),
                 ConfigSource::Default, "", ""};
  c.text = config_str(k.kind, ct, c.config);
  std::optional<TuneKey> key = key_of(k);
  if (!key) return c;
  const std::string h = key->hash();
  if (auto it = table_.find(h); it != table_.end()) return it->second;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = memo_.find(h); it != memo_.end()) return it->second;
  if (cache_) {
    if (std::optional<CacheEntry> e = cached_choice(*cache_, *key)) {
      // A library GEMM keeps the default config (for a fallback); a config goes over
      // the default, so fields the text leaves out keep the default's values.
      Result<KernelConfig> cfg = parse_config_str(e->config, c.config);
      if (e->is_extern()) c = KernelChoice{c.config, ConfigSource::Cache, e->config, e->extern_library};
      else if (cfg) c = KernelChoice{*cfg, ConfigSource::Cache, e->config, ""};
    }
  }
  memo_[h] = c;
  return c;
}

std::string choices_to_text(const std::map<std::string, KernelChoice>& t) {
  std::string s;
  for (const auto& [hash, c] : t) s += hash + " " + std::string(config_source_name(c.source)) + " " + c.text + "\n";
  return s;
}

Result<std::map<std::string, KernelChoice>> choices_from_text(const std::string& s) {
  std::map<std::string, KernelChoice> out;
  std::istringstream in(s);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    size_t a = line.find(' ');
    size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
    if (b == std::string::npos) return Diag{"<choices>", {n, 1}, "expected '<key hash> <source> <config>'"};
    std::string src = line.substr(a + 1, b - a - 1);
    KernelChoice c;
    if (src == "cache") c.source = ConfigSource::Cache;
    else if (src == "tuned") c.source = ConfigSource::Tuned;
    else if (src == "default") c.source = ConfigSource::Default;
    else return Diag{"<choices>", {n, static_cast<int>(a) + 2}, "unknown source '" + src + "'"};
    c.text = line.substr(b + 1);
    if (std::optional<std::string> lib = extern_library_of(c.text)) {
      c.library = *lib;
    } else {
      Result<KernelConfig> cfg = parse_config_str(c.text);
      if (!cfg) return Diag{"<choices>", {n, static_cast<int>(b) + 2}, cfg.error().message};
      c.config = *cfg;
    }
    out[line.substr(0, a)] = c;
  }
  return out;
}

}  // namespace sf
