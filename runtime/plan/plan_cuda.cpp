#include "runtime/plan/plan_cuda.h"

#include <algorithm>
#include <filesystem>

namespace sf {

namespace fs = std::filesystem;

Result<std::unique_ptr<CudaPlanDevice>> CudaPlanDevice::create(std::shared_ptr<GpuPlan> plan) {
  std::unique_ptr<CudaPlanDevice> d(new CudaPlanDevice());
  d->plan_ = std::move(plan);
  cuda::Context& ctx = d->plan_->context();
  SF_TRY(ctx.make_current());
  Result<cuda::Stream> s = cuda::Stream::create(ctx);
  if (!s) return s.error();
  d->stream_ = std::move(s).value();
  return d;
}

CudaPlanDevice::~CudaPlanDevice() {
  // Nothing may still use the buffers when they go back to the allocator.
  if (comm_stream_.get()) (void)comm_stream_.synchronize();
  if (stream_.get()) (void)stream_.synchronize();
}

Result<void> CudaPlanDevice::make_comm_stream() {
  Result<cuda::Stream> cs = cuda::Stream::create(context());
  if (!cs) return cs.error();
  comm_stream_ = std::move(cs).value();
  return {};
}

Result<PlanDevice::Addr> CudaPlanDevice::allocate(size_t bytes) {
  Result<cuda::Buffer> b = cuda::Buffer::allocate(context(), bytes);
  if (!b) return b.error();
  buffers_.push_back(std::move(b).value());
  return static_cast<Addr>(buffers_.back().ptr());
}

Result<void> CudaPlanDevice::prepare(const PlanRank& rank, const std::vector<Addr>& buffers) {
  // Kernel steps whose kernel reads inputs (or writes outputs) by TMA: each of its
  // tensor maps encoded over the step's input (output) buffer now (a map the driver refuses is an error naming
  // the step), passed after the outputs at every launch.
  const Plan& p = plan_->plan();
  int64_t workspace = 0;
  for (size_t i = 0; i < rank.steps.size(); ++i) {
    const PlanStep& s = rank.steps[i];
    if (s.op != "kernel") continue;
    auto k = std::find_if(p.kernels.begin(), p.kernels.end(), [&](const PlanKernel& pk) { return pk.id == s.kernel; });
    if (k != p.kernels.end()) workspace = std::max(workspace, k->workspace_bytes);
    if (k == p.kernels.end() || k->tensor_maps.empty()) continue;
    std::vector<cuda::Buffer> maps;
    for (const PlanTensorMap& m : k->tensor_maps) {
      // verify_plan checked the index; a TMA store's map is over an output buffer.
      const int b = m.output >= 0 ? s.out[static_cast<size_t>(m.output)] : s.in[static_cast<size_t>(m.input)];
      Result<cuda::Buffer> map = cuda::encode_tensor_map(context(), m, buffers[static_cast<size_t>(b)]);
      if (!map) return with_context(plan_step_name(rank, i) + ": ", map.error());
      maps.push_back(std::move(map).value());
    }
    tensor_maps_.emplace(i, std::move(maps));
  }
  // One workspace for every kernel step (split-K matmuls sum there), as large as the
  // largest asks.
  if (workspace > 0) {
    Result<cuda::Buffer> w = cuda::Buffer::allocate(context(), static_cast<size_t>(workspace));
    if (!w) return with_context("the kernels' workspace of " + std::to_string(workspace) + " bytes: ", w.error());
    workspace_ = std::move(w).value();
    SF_TRY(zero(workspace_.ptr(), workspace_.bytes()));
  }
  return {};
}

Result<void> CudaPlanDevice::upload(Addr dst, const void* src, size_t bytes) {
  if (bytes == 0) return {};
  SF_TRY(cuda::check(context().drv().MemcpyHtoDAsync(dst, src, bytes, stream_.get()), "cuMemcpyHtoDAsync"));
  // The host memory need not outlive this call.
  return stream_.synchronize();
}

Result<void> CudaPlanDevice::download(void* dst, Addr src, size_t bytes) {
  if (bytes == 0) return {};
  SF_TRY(cuda::check(context().drv().MemcpyDtoHAsync(dst, src, bytes, stream_.get()), "cuMemcpyDtoHAsync"));
  return stream_.synchronize();
}

Result<void> CudaPlanDevice::zero(Addr dst, size_t bytes) {
  if (bytes == 0) return {};
  return cuda::check(context().drv().MemsetD8Async(dst, 0, bytes, stream_.get()), "cuMemsetD8Async");
}

Result<void> CudaPlanDevice::copy_2d(Addr dst, size_t dst_pitch, Addr src, size_t src_pitch, size_t width,
                                     size_t height) {
  return cuda::copy_2d(context(), dst, dst_pitch, src, src_pitch, width, height, stream_);
}

Result<void> CudaPlanDevice::launch(size_t step, const PlanStep& s, const std::vector<Mem>& args,
                                    size_t inputs) {
  const GpuPlan::Loaded& k = plan_->kernel(s.kernel);
  if (k.dims.grid[0] * k.dims.grid[1] * k.dims.grid[2] == 0) return {};  // an empty shard
  std::vector<CUdeviceptr> ptrs;
  for (const Mem& m : args) ptrs.push_back(m.addr);
  if (auto m = tensor_maps_.find(step); m != tensor_maps_.end())
    for (const cuda::Buffer& map : m->second) ptrs.push_back(map.ptr());
  if (k.zero_outputs)
    for (size_t o = inputs; o < args.size(); ++o)
      if (Result<void> e = zero(args[o].addr, args[o].bytes); !e.ok()) return with_context("zero_outputs: ", e.error());
  if (k.workspace_bytes > 0) {
    // prepare() sized it for every kernel step of the rank.
    if (workspace_.bytes() < static_cast<size_t>(k.workspace_bytes))
      return Diag{"", {}, "kernel " + s.kernel + ": its workspace of " + std::to_string(k.workspace_bytes) +
                              " bytes was not prepared"};
    ptrs.push_back(workspace_.ptr());
  }
  return cuda::launch(context(), k.fn, k.dims, ptrs, stream_);
}

Result<void> CudaPlanDevice::synchronize() { return stream_.synchronize(); }

Result<int> CudaPlanDevice::mark(Stream stream) {
  Result<cuda::Event> e = cuda::Event::create(context());
  if (!e) return e.error();
  SF_TRY(e->record(stream == Stream::Comm ? comm_stream_ : stream_));
  marks_.push_back(std::move(e).value());
  return static_cast<int>(marks_.size()) - 1;
}

Result<double> CudaPlanDevice::elapsed_us(int from, int to) {
  Result<float> ms = cuda::Event::elapsed_ms(marks_.at(static_cast<size_t>(from)), marks_.at(static_cast<size_t>(to)));
  if (!ms) return ms.error();
  return static_cast<double>(*ms) * 1e3;
}

Result<std::shared_ptr<GpuPlan>> GpuPlan::load(std::shared_ptr<cuda::Context> ctx, const PlanSource& src) {
  auto p = std::shared_ptr<GpuPlan>(new GpuPlan());
  p->ctx_ = ctx;
  p->src_ = src;
  Result<Mesh> mesh = parse_plan_mesh(src.plan.mesh, src.dir.empty() ? "plan.json" : (fs::path(src.dir) / "plan.json").string());
  if (!mesh) return mesh.error();
  p->mesh_ = std::move(mesh).value();
  std::map<std::string, size_t> module_of;  // ptx file -> modules_ index
  for (const PlanKernel& k : src.plan.kernels) {
    auto it = module_of.find(k.ptx_file);
    if (it == module_of.end()) {
      auto text = src.ptx.find(k.ptx_file);
      if (text == src.ptx.end()) return Diag{"", {}, "kernel " + k.id + ": no PTX for " + k.ptx_file};
      std::string name = src.dir.empty() ? k.ptx_file : (fs::path(src.dir) / k.ptx_file).string();
      Result<cuda::Module> m = cuda::Module::load_ptx(*ctx, text->second, name);
      if (!m) return m.error();
      p->modules_.push_back(std::move(m).value());
      it = module_of.emplace(k.ptx_file, p->modules_.size() - 1).first;
    }
    Result<CUfunction> fn = p->modules_[it->second].function(k.entry);
    if (!fn) return fn.error();
    Loaded l;
    l.fn = *fn;
    l.dims.grid = k.grid;
    l.dims.block = k.block;
    l.dims.shared_bytes = k.shared_bytes;
    l.dims.cluster = k.cluster;
    if (k.persistent) {
      Result<cuda::LaunchDims> d = cuda::resident_grid(*ctx, *fn, l.dims);
      if (!d) return with_context("kernel " + k.id + ": ", d.error());
      l.dims = *d;
    }
    l.zero_outputs = k.zero_outputs;
    l.workspace_bytes = k.workspace_bytes;
    p->kernels_.emplace(k.id, l);
  }
  return p;
}

std::optional<std::string> arch_mismatch(const std::string& arch, const cuda::DeviceInfo& dev) {
  int num = 0;
  size_t used = 0;
  bool specific = false;
  try {
    if (arch.rfind("sm_", 0) != 0) throw std::invalid_argument(arch);
    num = std::stoi(arch.substr(3), &used);
    std::string rest = arch.substr(3 + used);
    if (rest == "a") specific = true;
    else if (!rest.empty()) throw std::invalid_argument(arch);
  } catch (const std::exception&) {
    return "arch \"" + arch + "\" is not of the form sm_XY or sm_XYa";
  }
  const int cc = dev.cc_major * 10 + dev.cc_minor;
  const std::string have = dev.name + " is compute capability " + std::to_string(dev.cc_major) + "." +
                           std::to_string(dev.cc_minor) + " (" + dev.arch() + ")";
  if (specific && cc != num)
    return "the Plan's PTX is for " + arch + ", which runs only on compute capability " + std::to_string(num / 10) +
           "." + std::to_string(num % 10) + "; " + have + ": recompile with --arch " + dev.arch();
  if (cc < num) return "the Plan's PTX is for " + arch + "; " + have + ": recompile with --arch " + dev.arch();
  return std::nullopt;
}

}  // namespace sf
