#include "runtime/plan_exec.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "codegen/dist/device_mesh.h"
#include "codegen/dist/host_collectives.h"
#include "codegen/dist/shard.h"
#include "runtime/agree.h"

namespace sf {

namespace {

namespace fs = std::filesystem;

Diag file_error(const std::string& file, const std::string& what) { return Diag{file, {}, what}; }

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Whether `ptx` declares `.entry <name>(` (the name followed by a parameter list).
bool has_entry(const std::string& ptx, const std::string& name) {
  const std::string needle = ".entry " + name;
  for (size_t at = ptx.find(needle); at != std::string::npos; at = ptx.find(needle, at + 1)) {
    size_t end = at + needle.size();
    while (end < ptx.size() && (ptx[end] == ' ' || ptx[end] == '\t' || ptx[end] == '\n' || ptx[end] == '\r')) ++end;
    if (end < ptx.size() && ptx[end] == '(') return true;
  }
  return false;
}

// "dp=2 tp=2" (Mesh::str) back into a Mesh.
Result<Mesh> parse_mesh(const std::string& s, const std::string& file) {
  Mesh m;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok) {
    size_t eq = tok.find('=');
    int64_t n = 0;
    try {
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument(tok);
      size_t used = 0;
      n = std::stoll(tok.substr(eq + 1), &used);
      if (used != tok.size() - eq - 1 || n < 1) throw std::invalid_argument(tok);
    } catch (const std::exception&) {
      return file_error(file, "\"mesh\": \"" + s + "\" is not a list of name=size");
    }
    m.dims.push_back({tok.substr(0, eq), n});
  }
  return m;
}

std::string step_name(const PlanRank& r, size_t i) {
  const PlanStep& s = r.steps[i];
  return "rank " + std::to_string(r.rank) + ", step " + std::to_string(i) + " (" + s.op +
         (s.kernel.empty() ? "" : " " + s.kernel) + ")";
}

bool is_device_step(const PlanStep& s) { return s.op == "kernel" || s.op == "partialize"; }

}  // namespace

Result<PlanSource> read_plan_dir(const std::string& dir) {
  const std::string json_path = (fs::path(dir) / "plan.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return file_error(dir, "not a Plan directory (it does not exist or is not a directory)");
  std::optional<std::string> text = read_file(json_path);
  if (!text) return file_error(json_path, "cannot read it: a Plan directory holds plan.json (shardfuse compile writes one)");
  Result<Plan> plan = plan_from_json(*text, json_path);
  if (!plan) return plan.error();
  PlanSource src;
  src.plan = std::move(plan).value();
  src.dir = dir;
  for (const PlanKernel& k : src.plan.kernels) {
    if (k.ptx_file.empty() || k.ptx_file.find('/') != std::string::npos || k.ptx_file == "." || k.ptx_file == "..")
      return file_error(json_path, "kernel " + k.id + ": \"ptx\": \"" + k.ptx_file +
                                       "\" must be a file name inside the Plan directory");
    if (src.ptx.count(k.ptx_file)) continue;
    const std::string path = (fs::path(dir) / k.ptx_file).string();
    std::optional<std::string> ptx = read_file(path);
    if (!ptx) return file_error(path, "missing: plan.json names it as kernel " + k.id + "'s PTX");
    if (ptx->empty()) return file_error(path, "empty: kernel " + k.id + " has no PTX");
    src.ptx.emplace(k.ptx_file, std::move(*ptx));
  }
  for (const PlanKernel& k : src.plan.kernels)
    if (!has_entry(src.ptx.at(k.ptx_file), k.entry))
      return file_error((fs::path(dir) / k.ptx_file).string(),
                        "has no `.entry " + k.entry + "`, the entry plan.json gives kernel " + k.id);
  return src;
}

// --- GpuPlan -----------------------------------------------------------------------------

Result<std::shared_ptr<GpuPlan>> GpuPlan::load(std::shared_ptr<cuda::Context> ctx, const PlanSource& src) {
  auto p = std::shared_ptr<GpuPlan>(new GpuPlan());
  p->ctx_ = ctx;
  p->src_ = src;
  Result<Mesh> mesh = parse_mesh(src.plan.mesh, src.dir.empty() ? "plan.json" : (fs::path(src.dir) / "plan.json").string());
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
    l.zero_outputs = k.zero_outputs;
    p->kernels_.emplace(k.id, l);
  }
  return p;
}

// --- GpuRank -----------------------------------------------------------------------------

Result<std::unique_ptr<GpuRank>> GpuRank::create(std::shared_ptr<GpuPlan> plan, int rank, const GpuRunOptions& opts) {
  const Plan& p = plan->plan();
  if (rank < 0 || rank >= static_cast<int>(p.ranks.size()))
    return Diag{"", {}, "rank " + std::to_string(rank) + " is not in the plan (world " + std::to_string(p.world) + ")"};
  std::unique_ptr<GpuRank> r(new GpuRank());
  r->plan_ = plan;
  r->rank_ = &p.ranks[static_cast<size_t>(rank)];
  r->opts_ = opts;
  cuda::Context& ctx = plan->context();
  if (auto e = ctx.make_current()) return *e;
  Result<cuda::Stream> s = cuda::Stream::create(ctx);
  if (!s) return s.error();
  r->stream_ = std::move(s).value();
  for (const PlanBuffer& b : r->rank_->buffers) {
    Result<cuda::Buffer> buf = cuda::Buffer::allocate(ctx, static_cast<size_t>(numel(b.shape) * dtype_size(b.dtype)));
    if (!buf) return Diag{"", {}, "rank " + std::to_string(rank) + ", buffer " + b.name + ": " + buf.error().message};
    r->buffers_.push_back(std::move(buf).value());
  }
  return r;
}

GpuRank::~GpuRank() {
  // Nothing may still use the buffers when they go back to the allocator.
  if (stream_.get()) (void)stream_.synchronize();
}

std::optional<Diag> GpuRank::upload(int buffer, const Tensor& t) {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  if (t.dtype() != b.dtype || t.shape() != b.shape)
    return Diag{"", {}, "buffer " + b.name + " is " + TensorType{b.dtype, b.shape}.str() + ", got " + t.type().str()};
  if (t.nbytes() == 0) return std::nullopt;
  const cuda::Driver& d = plan_->context().drv();
  if (auto e = cuda::check(d.MemcpyHtoDAsync(buffers_[static_cast<size_t>(buffer)].ptr(), t.data(), t.nbytes(),
                                             stream_.get()),
                           "cuMemcpyHtoDAsync (" + b.name + ")"))
    return e;
  // The host tensor need not outlive this call.
  return stream_.synchronize();
}

Result<Tensor> GpuRank::download(int buffer) {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  Tensor t(b.dtype, b.shape);
  if (t.nbytes() == 0) return t;
  const cuda::Driver& d = plan_->context().drv();
  if (auto e = cuda::check(d.MemcpyDtoHAsync(t.data(), buffers_[static_cast<size_t>(buffer)].ptr(), t.nbytes(),
                                             stream_.get()),
                           "cuMemcpyDtoHAsync (" + b.name + ")"))
    return *e;
  if (auto e = stream_.synchronize()) return *e;
  return t;
}

std::optional<Diag> GpuRank::upload_inputs(const std::vector<Tensor>& inputs) {
  if (auto e = plan_->context().make_current()) return e;
  if (inputs.size() != rank_->inputs.size())
    return Diag{"", {}, "rank " + std::to_string(rank_->rank) + ": " + std::to_string(inputs.size()) +
                            " inputs for " + std::to_string(rank_->inputs.size()) + " params"};
  for (size_t i = 0; i < inputs.size(); ++i)
    if (auto e = upload(rank_->inputs[i], inputs[i]))
      return Diag{"", {}, "rank " + std::to_string(rank_->rank) + ", input " + std::to_string(i) + ": " + e->message};
  return std::nullopt;
}

Result<std::vector<Tensor>> GpuRank::download_outputs() {
  if (auto e = plan_->context().make_current()) return *e;
  std::vector<Tensor> out;
  for (int b : rank_->outputs) {
    Result<Tensor> t = download(b);
    if (!t) return t.error();
    out.push_back(std::move(t).value());
  }
  return out;
}

std::optional<Diag> GpuRank::launch_step(const PlanStep& s) {
  const GpuPlan::Loaded& k = plan_->kernel(s.kernel);
  const cuda::Driver& d = plan_->context().drv();
  if (k.dims.grid[0] * k.dims.grid[1] * k.dims.grid[2] == 0) return std::nullopt;  // an empty shard
  std::vector<CUdeviceptr> args;
  for (int b : s.in) args.push_back(buffers_[static_cast<size_t>(b)].ptr());
  for (int b : s.out) args.push_back(buffers_[static_cast<size_t>(b)].ptr());
  if (k.zero_outputs)
    for (int b : s.out)
      if (auto e = cuda::check(d.MemsetD8Async(buffers_[static_cast<size_t>(b)].ptr(), 0,
                                               buffers_[static_cast<size_t>(b)].bytes(), stream_.get()),
                               "cuMemsetD8Async (zero_outputs)"))
        return e;
  ++launches_;
  return cuda::launch(plan_->context(), k.fn, k.dims, args, stream_);
}

std::optional<Diag> GpuRank::local_step(const PlanStep& s) {
  if (s.op == "kernel") return launch_step(s);
  if (s.op == "partialize") {
    const cuda::Driver& d = plan_->context().drv();
    const cuda::Buffer& in = buffers_[static_cast<size_t>(s.in.at(0))];
    const cuda::Buffer& out = buffers_[static_cast<size_t>(s.out.at(0))];
    if (out.bytes() == 0) return std::nullopt;
    if (!s.keep) return cuda::check(d.MemsetD8Async(out.ptr(), 0, out.bytes(), stream_.get()), "cuMemsetD8Async");
    if (in.ptr() == out.ptr()) return std::nullopt;
    return cuda::check(d.MemcpyDtoDAsync(out.ptr(), in.ptr(), out.bytes(), stream_.get()), "cuMemcpyDtoDAsync");
  }
  if (s.op == "slice") {
    // Rare (a Replicate -> Shard redistribution): staged through the host.
    Result<Tensor> x = download(s.in.at(0));
    if (!x) return x.error();
    const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
    bool fits = s.offset.size() == ob.shape.size() && ob.shape.size() == x->shape().size();
    for (size_t d = 0; fits && d < ob.shape.size(); ++d)
      fits = s.offset[d] >= 0 && s.offset[d] + ob.shape[d] <= x->shape()[d];
    if (!fits) return Diag{"", {}, "the slice's offset and output shape do not fit its input"};
    return upload(s.out.at(0), slice_block(*x, s.offset, ob.shape));
  }
  if (s.op == "concat") {
    // A decomposed all_gather -> matmul assembling its per-shard results; staged
    // through the host for now (a strided device copy would do).
    const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
    const int rank = static_cast<int>(ob.shape.size());
    bool fits = s.dim >= 0 && s.dim < rank;
    int64_t total = 0;
    for (int b : s.in) {
      const PlanBuffer& pb = rank_->buffers[static_cast<size_t>(b)];
      fits = fits && pb.dtype == ob.dtype && pb.shape.size() == ob.shape.size();
      for (int d = 0; fits && d < rank; ++d)
        if (d != s.dim) fits = pb.shape[static_cast<size_t>(d)] == ob.shape[static_cast<size_t>(d)];
      if (fits) total += pb.shape[static_cast<size_t>(s.dim)];
    }
    if (!fits || total != ob.shape[static_cast<size_t>(s.dim)])
      return Diag{"", {}, "the parts do not join into the output along dim " + std::to_string(s.dim)};
    std::vector<Tensor> parts;
    for (int b : s.in) {
      Result<Tensor> t = download(b);
      if (!t) return t.error();
      parts.push_back(std::move(t).value());
    }
    return upload(s.out.at(0), concat(parts, s.dim));
  }
  return Diag{"", {}, "not a local step"};
}

std::optional<Diag> GpuRank::collective(const PlanStep& s, Comm& comm, std::map<int, Work>& pending) {
  if (s.op == "wait") {
    auto it = pending.find(s.handle);
    if (it == pending.end()) return Diag{"", {}, "wait for handle " + std::to_string(s.handle) + " with no start"};
    Result<Tensor> t = it->second.wait();
    pending.erase(it);
    if (!t) return t.error();
    return upload(s.out.at(0), *t);
  }
  // A start: the operand, once the kernels before it have written it, to the host.
  Result<Tensor> x = download(s.in.at(0));
  if (!x) return x.error();
  std::optional<int> dim = plan_->mesh().find(s.mesh_dim);
  if (!dim) return Diag{"", {}, "mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" + plan_->plan().mesh + "\""};
  ReduceOp op = ReduceOp::Sum;
  if (!s.reduce_op.empty()) {
    std::optional<ReduceOp> r = parse_reduce_op(s.reduce_op);
    if (!r) return Diag{"", {}, "unknown reduce_op \"" + s.reduce_op + "\""};
    op = *r;
  }
  if (s.op == "all_gather") pending.emplace(s.handle, comm.all_gather(*dim, std::move(x).value(), s.dim, s.sizes));
  else if (s.op == "reduce_scatter")
    pending.emplace(s.handle, comm.reduce_scatter(*dim, std::move(x).value(), s.dim, s.sizes, op));
  else if (s.op == "all_reduce") pending.emplace(s.handle, comm.all_reduce(*dim, std::move(x).value(), op));
  else if (s.op == "all_to_all")
    pending.emplace(s.handle, comm.all_to_all(*dim, std::move(x).value(), s.dim, s.sizes, s.dim2, s.sizes2));
  else return Diag{"", {}, "unknown step op \"" + s.op + "\""};
  return std::nullopt;
}

std::optional<Diag> GpuRank::timed(const std::string& name, nlohmann::json args,
                                   const std::function<std::optional<Diag>()>& enqueue) {
  if (!opts_.trace) return enqueue();
  Result<cuda::Event> a = cuda::Event::create(plan_->context()), b = cuda::Event::create(plan_->context());
  if (!a) return a.error();
  if (!b) return b.error();
  if (auto e = a->record(stream_)) return e;
  if (auto e = enqueue()) return e;
  if (auto e = b->record(stream_)) return e;
  device_events_.push_back({name, std::move(args), std::move(a).value(), std::move(b).value()});
  return std::nullopt;
}

std::optional<Diag> GpuRank::run_segment(size_t begin, size_t end) {
  const bool per_kernel = opts_.trace && !opts_.cuda_graph;
  auto body = [&]() -> std::optional<Diag> {
    for (size_t i = begin; i < end; ++i) {
      const PlanStep& st = rank_->steps[i];
      std::optional<Diag> e;
      if (per_kernel && st.op == "kernel") {
        e = timed(st.kernel, {{"step", i}, {"kind", "kernel"}}, [&] { return local_step(st); });
      } else {
        e = local_step(st);
      }
      if (e) return Diag{"", {}, step_name(*rank_, i) + ": " + e->message};
    }
    return std::nullopt;
  };
  if (!opts_.cuda_graph) return body();
  auto it = graphs_.find(begin);
  if (it == graphs_.end()) {
    // Capturing enqueues nothing; count the kernels it records once, then per replay.
    const int64_t before = launches_;
    Result<cuda::Graph> g = cuda::Graph::capture(plan_->context(), stream_, body);
    const int64_t kernels = launches_ - before;
    launches_ = before;
    if (!g) return g.error();
    it = graphs_.emplace(begin, Captured{std::move(g).value(), kernels}).first;
  }
  ++graph_launches_;
  launches_ += it->second.kernels;
  const cuda::Graph& graph = it->second.graph;
  return timed("graph of steps " + std::to_string(begin) + ".." + std::to_string(end - 1),
               {{"kernels", it->second.kernels}}, [&] { return graph.launch(stream_); });
}

std::optional<Diag> GpuRank::enqueue() {
  if (auto e = plan_->context().make_current()) return e;
  for (size_t i = 0; i < rank_->steps.size(); ++i)
    if (!is_device_step(rank_->steps[i]))
      return Diag{"", {}, step_name(*rank_, i) + ": enqueue() runs only kernels; this step needs the host"};
  return run_segment(0, rank_->steps.size());
}

double GpuRank::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - opts_.trace_origin).count();
}

std::optional<Diag> GpuRank::run(Comm* comm) {
  if (auto e = plan_->context().make_current()) return e;
  if (auto e = run_steps(comm)) return e;
  if (auto e = stream_.synchronize()) return e;
  if (!opts_.trace) return std::nullopt;
  // Device events become trace events, placed by their distance from the reference
  // event recorded when the run began.
  opts_.trace->add_rank(rank_->rank);
  for (DeviceEvent& d : device_events_) {
    Result<float> from = cuda::Event::elapsed_ms(*ref_event_, d.start);
    Result<float> dur = cuda::Event::elapsed_ms(d.start, d.end);
    if (!from) return from.error();
    if (!dur) return dur.error();
    opts_.trace->add(rank_->rank, Stream::Compute, d.name, ref_us_ + *from * 1e3, *dur * 1e3, std::move(d.args),
                     "kernel");
  }
  device_events_.clear();
  return std::nullopt;
}

std::optional<Diag> GpuRank::run_steps(Comm* comm) {
  if (opts_.trace) {
    Result<cuda::Event> ref = cuda::Event::create(plan_->context());
    if (!ref) return ref.error();
    ref_event_ = std::make_unique<cuda::Event>(std::move(ref).value());
    if (auto e = stream_.synchronize()) return e;
    if (auto e = ref_event_->record(stream_)) return e;
    if (auto e = ref_event_->synchronize()) return e;
    ref_us_ = now_us();
  }
  std::map<int, std::pair<double, std::string>> issued;  // handle -> (issue time, name), for the trace
  std::map<int, Work> pending;
  const std::vector<PlanStep>& steps = rank_->steps;
  size_t i = 0;
  while (i < steps.size()) {
    if (is_device_step(steps[i])) {
      size_t j = i;
      while (j < steps.size() && is_device_step(steps[j])) ++j;
      if (auto e = run_segment(i, j)) return e;
      i = j;
      continue;
    }
    const PlanStep& s = steps[i];
    std::optional<Diag> e;
    if (s.op == "slice" || s.op == "concat") {
      e = local_step(s);
    } else if (!comm) {
      e = Diag{"", {}, "a collective, but no comm backend was given"};
    } else {
      const double t0 = opts_.trace ? now_us() : 0;
      e = collective(s, *comm, pending);
      if (opts_.trace && !e) {
        if (s.op != "wait") {
          issued[s.handle] = {t0, s.op + " " + rank_->buffers[static_cast<size_t>(s.in.at(0))].name};
        } else {
          const double t1 = now_us();
          const auto& [at, name] = issued[s.handle];
          opts_.trace->add(rank_->rank, Stream::Comm, name + " (host-staged)", at, t1 - at,
                           {{"step", i}, {"bytes", buffers_[static_cast<size_t>(s.out.at(0))].bytes()}}, "collective");
          opts_.trace->add(rank_->rank, Stream::Compute, "wait " + rank_->buffers[static_cast<size_t>(s.out.at(0))].name,
                           t0, t1 - t0, {{"step", i}}, "wait");
        }
      }
    }
    if (e) return Diag{"", {}, step_name(*rank_, i) + ": " + e->message};
    ++i;
  }
  return std::nullopt;
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

// --- every rank as a thread --------------------------------------------------------------

Result<std::vector<std::vector<Tensor>>> run_plan_on_gpu(const PlanSource& src,
                                                         const std::vector<std::vector<Tensor>>& inputs,
                                                         const GpuRunOptions& opts, GpuRunStats* stats) {
  const Plan& plan = src.plan;
  Result<Mesh> mesh = parse_mesh(plan.mesh, src.dir.empty() ? "plan.json" : (fs::path(src.dir) / "plan.json").string());
  if (!mesh) return mesh.error();
  DeviceMesh dm(*mesh);
  if (dm.world() != plan.world || static_cast<int>(inputs.size()) != plan.world)
    return Diag{"", {}, "the plan's mesh \"" + plan.mesh + "\" has " + std::to_string(dm.world()) + " rank(s), world is " +
                            std::to_string(plan.world) + ", inputs for " + std::to_string(inputs.size())};
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(opts.device);
  if (!ctx) return ctx.error();
  Result<std::shared_ptr<GpuPlan>> loaded = GpuPlan::load(*ctx, src);
  if (!loaded) return loaded.error();
  if (stats) stats->device = (*ctx)->info().name;

  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(plan.world));
  std::mutex mu;
  std::optional<Diag> failed = on_rank_threads(dm, opts.timeout, [&](Comm& comm) -> std::optional<Diag> {
    const int r = comm.rank();
    if (opts.trace) opts.trace->add_rank(r);
    Result<std::unique_ptr<GpuRank>> gr = GpuRank::create(*loaded, r, opts);
    if (!gr) return gr.error();
    if (auto e = (*gr)->upload_inputs(inputs[static_cast<size_t>(r)])) return e;
    if (auto e = (*gr)->run(&comm)) return e;
    if (stats) {
      std::lock_guard<std::mutex> lock(mu);
      stats->launches += (*gr)->launches();
      stats->graph_launches += (*gr)->graph_launches();
    }
    Result<std::vector<Tensor>> out = (*gr)->download_outputs();
    if (!out) return out.error();
    outputs[static_cast<size_t>(r)] = std::move(out).value();
    return std::nullopt;
  });
  if (failed) return *failed;
  return outputs;
}

}  // namespace sf
