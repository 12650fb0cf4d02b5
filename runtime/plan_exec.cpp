#include "runtime/plan_exec.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "codegen/dist/device_mesh.h"
#include "codegen/ir/file_io.h"
#include "codegen/dist/host_collectives.h"
#include "codegen/dist/shard.h"
#include "runtime/agree.h"
#include "runtime/plan_cuda.h"
#include "runtime/plan_host.h"
#include "runtime/plan_verify.h"

namespace sf {

namespace {

namespace fs = std::filesystem;

Diag file_error(const std::string& file, const std::string& what) { return Diag{file, {}, what}; }

// A Plan file, refused unless it is a regular file under kMaxPlanFileBytes (a .ptx
// linked to /dev/zero or a FIFO must not hang `exec`). `missing` is the message for
// a file that is not there at all.
Result<std::string> read_plan_file(const std::string& path, const std::string& missing) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return file_error(path, missing);
  return read_regular_file(path, kMaxPlanFileBytes, "");
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

bool is_device_step(const PlanStep& s) { return s.op == "kernel" || s.op == "partialize"; }

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= v[i];
  return p;
}

// A slice of a row-major tensor as one strided copy: the input's rows around the
// one dim where the slice differs from its input (or one row for a full copy).
struct Block2D {
  size_t src_offset = 0, src_pitch = 0, dst_pitch = 0, width = 0, height = 0;  // bytes, except height
};
std::optional<Block2D> slice_block_2d(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                      const std::vector<int64_t>& offset, size_t elem) {
  if (in.size() != out.size() || offset.size() != in.size()) return std::nullopt;
  std::optional<size_t> dim;
  for (size_t d = 0; d < in.size(); ++d) {
    if (offset[d] < 0 || offset[d] + out[d] > in[d]) return std::nullopt;
    if (offset[d] != 0 || out[d] != in[d]) {
      if (dim) return std::nullopt;  // two sliced dims: not one strided copy
      dim = d;
    }
  }
  const size_t d = dim.value_or(0);
  const size_t inner = static_cast<size_t>(prod(in, d + 1, in.size())) * elem;
  Block2D b;
  b.height = static_cast<size_t>(prod(in, 0, d));
  b.src_offset = static_cast<size_t>(in.empty() ? 0 : offset[d]) * inner;
  b.src_pitch = static_cast<size_t>(in.empty() ? 1 : in[d]) * inner;
  b.dst_pitch = static_cast<size_t>(out.empty() ? 1 : out[d]) * inner;
  b.width = b.dst_pitch;
  return b;
}

}  // namespace

std::string plan_step_name(const PlanRank& r, size_t i) {
  const PlanStep& s = r.steps[i];
  std::string what = s.kernel.empty() ? "" : " " + s.kernel;
  if (s.op == "gemm") what = " " + s.gemm.name + " via " + std::string(gemm_library_name(s.gemm.desc.library));
  return "rank " + std::to_string(r.rank) + ", step " + std::to_string(i) + " (" + s.op + what + ")";
}

Result<PlanSource> read_plan_dir(const std::string& dir) {
  const std::string json_path = (fs::path(dir) / "plan.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return file_error(dir, "not a Plan directory (it does not exist or is not a directory)");
  Result<std::string> text =
      read_plan_file(json_path, "cannot read it: a Plan directory holds plan.json (shardfuse compile writes one)");
  if (!text) return text.error();
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
    Result<std::string> ptx = read_plan_file(path, "missing: plan.json names it as kernel " + k.id + "'s PTX");
    if (!ptx) return ptx.error();
    if (ptx->empty()) return file_error(path, "empty: kernel " + k.id + " has no PTX");
    src.ptx.emplace(k.ptx_file, std::move(*ptx));
  }
  for (const PlanKernel& k : src.plan.kernels) {
    if (!has_entry(src.ptx.at(k.ptx_file), k.entry))
      return file_error((fs::path(dir) / k.ptx_file).string(),
                        "has no `.entry " + k.entry + "`, the entry plan.json gives kernel " + k.id);
    // A launch passes one pointer per buffer: as many as the entry takes, or the
    // kernel would read parameters that were never passed.
    if (auto e = verify_kernel_arity(src.plan, k.id, ptx_entry_params(src.ptx.at(k.ptx_file), k.entry),
                                     (fs::path(dir) / k.ptx_file).string()))
      return *e;
  }
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

// --- RankExec ----------------------------------------------------------------------------

Result<std::unique_ptr<RankExec>> RankExec::create_cuda(std::shared_ptr<GpuPlan> plan, int rank,
                                                        const GpuRunOptions& opts) {
  Result<std::unique_ptr<CudaPlanDevice>> dev = CudaPlanDevice::create(plan);
  if (!dev) return dev.error();
  CudaPlanDevice* cuda = dev->get();
  Result<std::unique_ptr<RankExec>> r = create(plan->plan(), std::move(dev).value(), rank, opts, plan, cuda);
  if (!r) return r.error();
  return r;
}

Result<std::unique_ptr<RankExec>> RankExec::create_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels,
                                                        int rank, const GpuRunOptions& opts) {
  if (opts.cuda_graph) return Diag{"", {}, "CUDA graphs need --device cuda"};
  if (opts.collectives == GpuCollectives::Nccl) return Diag{"", {}, "NCCL needs --device cuda"};
  return create(plan, std::make_unique<HostPlanDevice>(std::move(kernels)), rank, opts, nullptr, nullptr);
}

Result<std::unique_ptr<RankExec>> RankExec::create(const Plan& p, std::unique_ptr<PlanDevice> dev, int rank,
                                                   const GpuRunOptions& opts, std::shared_ptr<GpuPlan> gpu_plan,
                                                   CudaPlanDevice* cuda) {
  if (rank < 0 || rank >= static_cast<int>(p.ranks.size()))
    return Diag{"", {}, "rank " + std::to_string(rank) + " is not in the plan (world " + std::to_string(p.world) + ")"};
  Result<Mesh> mesh = parse_mesh(p.mesh, "plan.json");
  if (!mesh) return mesh.error();
  std::unique_ptr<RankExec> r(new RankExec());
  r->plan_ = &p;
  r->mesh_ = std::move(mesh).value();
  r->gpu_plan_ = std::move(gpu_plan);
  r->rank_ = &p.ranks[static_cast<size_t>(rank)];
  r->opts_ = opts;
  r->dev_ = std::move(dev);
  r->cuda_ = cuda;
  for (const PlanKernel& k : p.kernels) r->kernels_.emplace(k.id, &k);
  for (const PlanBuffer& b : r->rank_->buffers) {
    Result<PlanDevice::Addr> a = r->dev_->allocate(static_cast<size_t>(numel(b.shape) * dtype_size(b.dtype)));
    if (!a) return Diag{"", {}, "rank " + std::to_string(rank) + ", buffer " + b.name + ": " + a.error().message};
    r->buffers_.push_back(*a);
  }
  if (auto e = r->prepare_gemm_steps()) return *e;
  if (auto e = r->dev_->prepare(*r->rank_, r->buffers_)) return *e;
  return r;
}

RankExec::~RankExec() {
  // Nothing may still use the buffers when they go back to the allocator. A
  // collective whose peer is gone would keep the comm stream busy forever: wait
  // for it under the timeout, which aborts the communicator (and so ends its
  // kernels) when it passes.
  if (cuda_ && !nccl_.empty() && !cuda_->context().make_current())
    for (auto& c : nccl_)
      if (!c->aborted()) (void)c->wait_with_timeout(cuda_->comm_stream().get());
  if (dev_) (void)dev_->synchronize();
}

cuda::Stream& RankExec::stream() { return cuda_->stream(); }
cuda::Stream& RankExec::comm_stream() { return cuda_->comm_stream(); }

size_t RankExec::bytes(int buffer) const {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  return static_cast<size_t>(numel(b.shape) * dtype_size(b.dtype));
}

std::optional<Diag> RankExec::upload(int buffer, const Tensor& t) {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  if (t.dtype() != b.dtype || t.shape() != b.shape)
    return Diag{"", {}, "buffer " + b.name + " is " + TensorType{b.dtype, b.shape}.str() + ", got " + t.type().str()};
  if (auto e = dev_->upload(addr(buffer), t.data(), t.nbytes())) return with_context(b.name + ": ", *e);
  return std::nullopt;
}

Result<Tensor> RankExec::download(int buffer) {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  Tensor t(b.dtype, b.shape);
  if (auto e = dev_->download(t.data(), addr(buffer), t.nbytes())) return with_context(b.name + ": ", *e);
  return t;
}

std::optional<Diag> RankExec::upload_inputs(const std::vector<Tensor>& inputs) {
  if (cuda_)
    if (auto e = cuda_->context().make_current()) return e;
  if (inputs.size() != rank_->inputs.size())
    return Diag{"", {}, "rank " + std::to_string(rank_->rank) + ": " + std::to_string(inputs.size()) +
                            " inputs for " + std::to_string(rank_->inputs.size()) + " params"};
  for (size_t i = 0; i < inputs.size(); ++i)
    if (auto e = upload(rank_->inputs[i], inputs[i]))
      return Diag{"", {}, "rank " + std::to_string(rank_->rank) + ", input " + std::to_string(i) + ": " + e->message};
  return std::nullopt;
}

Result<std::vector<Tensor>> RankExec::download_outputs() {
  if (cuda_)
    if (auto e = cuda_->context().make_current()) return *e;
  std::vector<Tensor> out;
  for (int b : rank_->outputs) {
    Result<Tensor> t = download(b);
    if (!t) return t.error();
    out.push_back(std::move(t).value());
  }
  return out;
}

std::optional<Diag> RankExec::launch_step(size_t i) {
  const PlanStep& s = rank_->steps[i];
  std::vector<PlanDevice::Mem> args;
  for (int b : s.in) args.push_back({addr(b), bytes(b)});
  for (int b : s.out) args.push_back({addr(b), bytes(b)});
  ++launches_;
  return dev_->launch(i, s, args, s.in.size());
}

std::optional<Diag> RankExec::local_step(size_t i) {
  const PlanStep& s = rank_->steps[i];
  if (s.op == "kernel") return launch_step(i);
  if (s.op == "partialize") {
    const int in = s.in.at(0), out = s.out.at(0);
    if (bytes(out) == 0) return std::nullopt;
    if (!s.keep) return dev_->zero(addr(out), bytes(out));
    if (addr(in) == addr(out)) return std::nullopt;
    return dev_->copy_2d(addr(out), bytes(out), addr(in), bytes(out), bytes(out), 1);
  }
  if (s.op == "slice") {
    const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
    const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
    std::optional<Block2D> b = slice_block_2d(ib.shape, ob.shape, s.offset, static_cast<size_t>(dtype_size(ob.dtype)));
    if (!b) return host_slice(s);
    return dev_->copy_2d(addr(s.out.at(0)), b->dst_pitch, addr(s.in.at(0)) + b->src_offset, b->src_pitch, b->width,
                         b->height);
  }
  if (s.op == "concat") {
    // A decomposed all_gather -> matmul assembling its per-shard results: one
    // strided copy per part, into its columns of the output.
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
    const size_t d = static_cast<size_t>(s.dim);
    const size_t inner = static_cast<size_t>(prod(ob.shape, d + 1, ob.shape.size()) * dtype_size(ob.dtype));
    const size_t rows = static_cast<size_t>(prod(ob.shape, 0, d));
    size_t at = 0;
    for (int b : s.in) {
      const size_t width = static_cast<size_t>(rank_->buffers[static_cast<size_t>(b)].shape[d]) * inner;
      if (auto e = dev_->copy_2d(addr(s.out.at(0)) + at, static_cast<size_t>(ob.shape[d]) * inner, addr(b), width,
                                 width, rows))
        return e;
      at += width;
    }
    return std::nullopt;
  }
  return Diag{"", {}, "not a local step"};
}

std::optional<Diag> RankExec::host_slice(const PlanStep& s) {
  // A slice along several dims at once (no strided copy does it): through the host.
  Result<Tensor> x = download(s.in.at(0));
  if (!x) return x.error();
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
  bool fits = s.offset.size() == ob.shape.size() && ob.shape.size() == x->shape().size();
  for (size_t d = 0; fits && d < ob.shape.size(); ++d)
    fits = s.offset[d] >= 0 && s.offset[d] + ob.shape[d] <= x->shape()[d];
  if (!fits) return Diag{"", {}, "the slice's offset and output shape do not fit its input"};
  return upload(s.out.at(0), slice_block(*x, s.offset, ob.shape));
}

bool RankExec::on_device(size_t i) const {
  const PlanStep& s = rank_->steps[i];
  if (is_device_step(s) || s.op == "concat") return true;
  if (s.op != "slice") return false;
  const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
  return slice_block_2d(ib.shape, ob.shape, s.offset, static_cast<size_t>(dtype_size(ob.dtype))).has_value();
}

std::optional<Diag> RankExec::collective(const PlanStep& s, Comm& comm, std::map<int, Work>& pending) {
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
  std::optional<int> dim = mesh_.find(s.mesh_dim);
  if (!dim) return Diag{"", {}, "mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" + plan_->mesh + "\""};
  ReduceOp op = ReduceOp::Sum;
  if (!s.reduce_op.empty()) {
    std::optional<ReduceOp> r = parse_reduce_op(s.reduce_op);
    if (!r) return Diag{"", {}, "unknown reduce_op \"" + s.reduce_op + "\""};
    op = *r;
  }
  std::optional<CollectiveKind> kind = s.collective();
  if (!kind) return Diag{"", {}, "unknown step op \"" + s.op + "\""};
  switch (*kind) {
    case CollectiveKind::AllGather:
      pending.emplace(s.handle, comm.all_gather(*dim, std::move(x).value(), s.dim, s.sizes));
      break;
    case CollectiveKind::ReduceScatter:
      pending.emplace(s.handle, comm.reduce_scatter(*dim, std::move(x).value(), s.dim, s.sizes, op));
      break;
    case CollectiveKind::AllReduce: pending.emplace(s.handle, comm.all_reduce(*dim, std::move(x).value(), op)); break;
    case CollectiveKind::AllToAll:
      pending.emplace(s.handle, comm.all_to_all(*dim, std::move(x).value(), s.dim, s.sizes, s.dim2, s.sizes2));
      break;
  }
  return std::nullopt;
}

std::optional<Diag> RankExec::timed(const std::string& name, nlohmann::json args,
                                    const std::function<std::optional<Diag>()>& enqueue, Stream track) {
  if (!opts_.trace) return enqueue();
  Result<int> a = dev_->mark(track);
  if (!a) return a.error();
  if (auto e = enqueue()) return e;
  Result<int> b = dev_->mark(track);
  if (!b) return b.error();
  marked_.push_back({name, std::move(args), *a, *b, track});
  return std::nullopt;
}

std::optional<Diag> RankExec::run_segment(size_t begin, size_t end) {
  const bool per_kernel = opts_.trace && !opts_.cuda_graph;
  auto body = [&]() -> std::optional<Diag> {
    for (size_t i = begin; i < end; ++i) {
      const PlanStep& st = rank_->steps[i];
      std::optional<Diag> e;
      if (per_kernel && st.op == "kernel") {
        const PlanKernel& k = *kernels_.at(st.kernel);
        e = timed(st.kernel,
                  {{"step", i}, {"kind", "kernel"}, {"flops", k.flops}, {"bytes", k.bytes_read + k.bytes_written}},
                  [&] { return local_step(i); });
      } else {
        e = local_step(i);
      }
      if (e) return with_context(plan_step_name(*rank_, i) + ": ", *e);
    }
    return std::nullopt;
  };
  if (!opts_.cuda_graph) return body();
  auto it = graphs_.find(begin);
  if (it == graphs_.end()) {
    // Capturing enqueues nothing; count the kernels it records once, then per replay.
    const int64_t before = launches_;
    Result<cuda::Graph> g = cuda::Graph::capture(cuda_->context(), cuda_->stream(), body);
    const int64_t kernels = launches_ - before;
    launches_ = before;
    if (!g) return g.error();
    it = graphs_.emplace(begin, Captured{std::move(g).value(), kernels}).first;
  }
  ++graph_launches_;
  launches_ += it->second.kernels;
  const cuda::Graph& graph = it->second.graph;
  return timed("graph of steps " + std::to_string(begin) + ".." + std::to_string(end - 1),
               {{"kernels", it->second.kernels}}, [&] { return graph.launch(cuda_->stream()); });
}

std::optional<Diag> RankExec::enqueue() {
  if (cuda_)
    if (auto e = cuda_->context().make_current()) return e;
  const size_t n = rank_->steps.size();
  for (size_t i = 0; i < n; ++i)
    if (!on_device(i) && rank_->steps[i].op != "gemm")
      return Diag{"", {}, plan_step_name(*rank_, i) + ": enqueue() runs only kernels and library GEMMs; this step needs the host"};
  // Device segments between gemm steps, as run_steps() splits them.
  for (size_t i = 0; i < n;) {
    if (rank_->steps[i].op == "gemm") {
      if (auto e = gemm_step(i)) return with_context(plan_step_name(*rank_, i) + ": ", *e);
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && on_device(j)) ++j;
    if (auto e = run_segment(i, j)) return e;
    i = j;
  }
  return std::nullopt;
}

double RankExec::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - opts_.trace_origin).count();
}

std::optional<Diag> RankExec::run(Comm* comm) {
  if (cuda_)
    if (auto e = cuda_->context().make_current()) return e;
  if (auto e = run_steps(comm)) return e;
  // The comm stream first, under the timeout: a peer that never joins a
  // collective aborts the communicator here instead of hanging the sync.
  for (auto& c : nccl_)
    if (auto e = c->wait_with_timeout(cuda_->comm_stream().get())) return e;
  if (auto e = dev_->synchronize()) return e;
  if (!opts_.trace) return std::nullopt;
  // Marked events become trace events, placed by their distance from the reference
  // mark made when the run began.
  opts_.trace->add_rank(rank_->rank);
  for (MarkedEvent& d : marked_) {
    Result<double> from = dev_->elapsed_us(ref_mark_, d.start);
    Result<double> dur = dev_->elapsed_us(d.start, d.end);
    if (!from) return from.error();
    if (!dur) return dur.error();
    opts_.trace->add(rank_->rank, d.track, d.name, ref_us_ + *from, *dur, std::move(d.args),
                     d.track == Stream::Comm ? "collective" : "kernel");
  }
  marked_.clear();
  return std::nullopt;
}

std::optional<Diag> RankExec::run_steps(Comm* comm) {
  if (opts_.trace) {
    if (auto e = dev_->synchronize()) return e;
    Result<int> ref = dev_->mark(Stream::Compute);
    if (!ref) return ref.error();
    ref_mark_ = *ref;
    if (auto e = dev_->synchronize()) return e;
    ref_us_ = now_us();
  }
  std::map<int, std::pair<double, std::string>> issued;  // handle -> (issue time, name), for the trace
  std::map<int, Work> pending;
  const std::vector<PlanStep>& steps = rank_->steps;
  size_t i = 0;
  while (i < steps.size()) {
    if (comm && comm->aborted()) {
      Diag d{"", {}, plan_step_name(*rank_, i) + ": aborted because another rank failed"};
      d.from_peer = true;
      return d;
    }
    if (opts_.before_step) {
      std::optional<Diag> stop;
      try {
        stop = opts_.before_step(rank_->rank, i, comm);
      } catch (const std::exception& ex) {
        stop = Diag{"", {}, ex.what()};
      }
      if (stop) return with_context(plan_step_name(*rank_, i) + ": ", *stop);
    }
    if (on_device(i)) {
      // With a test hook every step is its own segment, so the hook sees each.
      size_t j = i + 1;
      while (!opts_.before_step && j < steps.size() && on_device(j)) ++j;
      if (auto e = run_segment(i, j)) return e;
      i = j;
      continue;
    }
    const PlanStep& s = steps[i];
    std::optional<Diag> e;
    if (s.op == "slice") {
      e = host_slice(s);
    } else if (s.op == "gemm") {
      e = gemm_step(i);
    } else if (!nccl_.empty()) {
      e = s.op == "wait" ? nccl_wait(i) : nccl_start(i);
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
                           {{"step", i}, {"bytes", bytes(s.out.at(0))}}, "collective");
          opts_.trace->add(rank_->rank, Stream::Compute, "wait " + rank_->buffers[static_cast<size_t>(s.out.at(0))].name,
                           t0, t1 - t0, {{"step", i}}, "wait");
        }
      }
    }
    if (e) return with_context(plan_step_name(*rank_, i) + ": ", *e);
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

namespace {

// What a run needs to know before its ranks start: the mesh, how many GPUs,
// whether NCCL carries the collectives (and its options). Fills the stats'
// `collectives`.
struct RunSetup {
  DeviceMesh mesh{Mesh{}};
  int gpus = 1;
  bool use_nccl = false;
  nccl::Options nccl;
};

Result<RunSetup> setup_run(const PlanSource& src, const GpuRunOptions& opts, int gpus_for_world, GpuRunStats* stats) {
  const Plan& plan = src.plan;
  Result<Mesh> mesh = parse_mesh(plan.mesh, src.dir.empty() ? "plan.json" : (fs::path(src.dir) / "plan.json").string());
  if (!mesh) return mesh.error();
  RunSetup rs;
  rs.mesh = DeviceMesh(*mesh);
  if (rs.mesh.world() != plan.world)
    return Diag{"", {}, "the plan's mesh \"" + plan.mesh + "\" has " + std::to_string(rs.mesh.world()) +
                            " rank(s), world is " + std::to_string(plan.world)};
  rs.gpus = gpus_for_world;
  bool has_collectives = false;
  for (const PlanRank& r : plan.ranks)
    for (const PlanStep& st : r.steps) has_collectives = has_collectives || st.op == "wait";
  rs.use_nccl = opts.collectives == GpuCollectives::Nccl && has_collectives;
  if (rs.use_nccl && rs.gpus < plan.world)
    return Diag{"", {}, "NCCL needs a GPU per rank: world " + std::to_string(plan.world) + " on " +
                            std::to_string(rs.gpus) + " GPU(s) (stage the collectives through the host instead)"};
  rs.nccl = opts.nccl;
  rs.nccl.timeout = opts.timeout;
  if (rs.use_nccl) {
    Result<const nccl::Library*> lib = nccl::library();
    if (!lib) return lib.error();
    if (auto e = nccl::check_options(rs.nccl)) return *e;
    if (stats) stats->collectives = "NCCL " + (*lib)->version_str() + " on a comm stream";
  } else if (stats) {
    stats->collectives = has_collectives ? "host-staged (Gloo)" : "none";
  }
  return rs;
}

// Uploads the inputs, runs the steps, adds the counts to the stats, downloads the
// outputs.
Result<std::vector<Tensor>> run_and_collect(RankExec& rank, Comm& comm, const std::vector<Tensor>& inputs,
                                            GpuRunStats* stats, std::mutex& mu) {
  if (auto e = rank.upload_inputs(inputs)) return *e;
  if (auto e = rank.run(&comm)) return *e;
  if (stats) {
    std::lock_guard<std::mutex> lock(mu);
    stats->launches += rank.launches();
    stats->library_gemms += rank.library_calls();
    stats->graph_launches += rank.graph_launches();
    stats->nccl_ops += rank.nccl_ops();
  }
  return rank.download_outputs();
}

// One rank on its GPU: buffers, NCCL communicators if the setup says so, the run,
// the outputs.
Result<std::vector<Tensor>> run_one_rank(const std::shared_ptr<GpuPlan>& loaded, const RunSetup& rs, int device,
                                         Comm& comm, const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                         GpuRunStats* stats, std::mutex& mu) {
  const int r = comm.rank();
  if (opts.trace) opts.trace->add_rank(r);
  Result<std::unique_ptr<RankExec>> gr = RankExec::create_cuda(loaded, r, opts);
  if (!gr) return gr.error();
  if (rs.use_nccl) {
    // One communicator per mesh dim, its unique id exchanged through Gloo.
    std::vector<std::unique_ptr<nccl::NcclComm>> comms;
    for (int d = 0; d < rs.mesh.ndim(); ++d) {
      Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(comm, d, device, rs.nccl);
      if (!c) return c.error();
      comms.push_back(std::move(c).value());
    }
    if (auto e = (*gr)->use_nccl(std::move(comms))) return *e;
  }
  return run_and_collect(**gr, comm, inputs, stats, mu);
}

Result<std::shared_ptr<GpuPlan>> load_on(const PlanSource& src, int device, GpuRunStats* stats) {
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(device);
  if (!ctx) return Diag{"", {}, "GPU " + std::to_string(device) + ": " + ctx.error().message};
  if (stats && stats->device.empty()) stats->device = (*ctx)->info().name;
  return GpuPlan::load(*ctx, src);
}

}  // namespace

Result<std::vector<std::vector<Tensor>>> run_plan_on_gpu(const PlanSource& src,
                                                         const std::vector<std::vector<Tensor>>& inputs,
                                                         const GpuRunOptions& opts, GpuRunStats* stats) {
  const Plan& plan = src.plan;
  if (static_cast<int>(inputs.size()) != plan.world)
    return Diag{"", {}, "inputs for " + std::to_string(inputs.size()) + " rank(s), the plan's world is " +
                            std::to_string(plan.world)};
  Result<RunSetup> rs = setup_run(src, opts, std::max(1, std::min(opts.gpus, plan.world)), stats);
  if (!rs) return rs.error();
  // The Plan's modules, loaded once per GPU.
  std::vector<std::shared_ptr<GpuPlan>> loaded;
  for (int g = 0; g < rs->gpus; ++g) {
    Result<std::shared_ptr<GpuPlan>> p = load_on(src, opts.device + g, stats);
    if (!p) return p.error();
    loaded.push_back(std::move(p).value());
  }
  if (stats) stats->gpus = rs->gpus;
  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(plan.world));
  std::mutex mu;
  std::optional<Diag> failed = on_rank_threads(rs->mesh, opts.timeout, [&](Comm& comm) -> std::optional<Diag> {
    const int r = comm.rank();
    const int g = r % rs->gpus;
    Result<std::vector<Tensor>> out = run_one_rank(loaded[static_cast<size_t>(g)], *rs, opts.device + g, comm,
                                                   inputs[static_cast<size_t>(r)], opts, stats, mu);
    if (!out) return out.error();
    outputs[static_cast<size_t>(r)] = std::move(out).value();
    return std::nullopt;
  });
  if (failed) return *failed;
  return outputs;
}

Result<std::vector<Tensor>> run_rank_on_gpu(const PlanSource& src, Comm& comm, const std::vector<Tensor>& inputs,
                                            const GpuRunOptions& opts, GpuRunStats* stats) {
  const int r = comm.rank();
  if (r < 0 || r >= src.plan.world)
    return Diag{"", {}, "rank " + std::to_string(r) + " is not in the plan (world " + std::to_string(src.plan.world) + ")"};
  // Each process drives one GPU, so NCCL's one-GPU-per-rank holds by construction
  // (across machines, or with one process per GPU of this one).
  Result<RunSetup> rs = setup_run(src, opts, src.plan.world, stats);
  if (!rs) return rs.error();
  const int device = opts.device + r % std::max(1, opts.gpus);
  Result<std::shared_ptr<GpuPlan>> loaded = load_on(src, device, stats);
  if (!loaded) return loaded.error();
  if (stats) stats->gpus = 1;
  std::mutex mu;
  return run_one_rank(*loaded, *rs, device, comm, inputs, opts, stats, mu);
}

// --- on the host CPU ----------------------------------------------------------------------

namespace {

Result<DeviceMesh> host_setup(const Plan& plan, const GpuRunOptions& opts, GpuRunStats* stats) {
  if (opts.cuda_graph) return Diag{"", {}, "CUDA graphs need --device cuda"};
  if (opts.collectives == GpuCollectives::Nccl) return Diag{"", {}, "NCCL needs --device cuda"};
  Result<Mesh> mesh = parse_mesh(plan.mesh, "plan.json");
  if (!mesh) return mesh.error();
  DeviceMesh dm(*mesh);
  if (dm.world() != plan.world)
    return Diag{"", {}, "the plan's mesh \"" + plan.mesh + "\" has " + std::to_string(dm.world()) +
                            " rank(s), world is " + std::to_string(plan.world)};
  if (stats) {
    bool has_collectives = false;
    for (const PlanRank& r : plan.ranks)
      for (const PlanStep& st : r.steps) has_collectives = has_collectives || st.op == "wait";
    stats->device = "host CPU";
    stats->gpus = 0;
    stats->collectives = has_collectives ? "Gloo" : "none";
  }
  return dm;
}

Result<std::vector<Tensor>> run_host_rank(const Plan& plan, const std::shared_ptr<const HostKernels>& kernels,
                                          Comm& comm, const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                          GpuRunStats* stats, std::mutex& mu) {
  if (opts.trace) opts.trace->add_rank(comm.rank());
  Result<std::unique_ptr<RankExec>> r = RankExec::create_host(plan, kernels, comm.rank(), opts);
  if (!r) return r.error();
  return run_and_collect(**r, comm, inputs, stats, mu);
}

}  // namespace

Result<std::vector<std::vector<Tensor>>> run_plan_on_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels,
                                                          const std::vector<std::vector<Tensor>>& inputs,
                                                          const GpuRunOptions& opts, GpuRunStats* stats) {
  if (static_cast<int>(inputs.size()) != plan.world)
    return Diag{"", {}, "inputs for " + std::to_string(inputs.size()) + " rank(s), the plan's world is " +
                            std::to_string(plan.world)};
  Result<DeviceMesh> mesh = host_setup(plan, opts, stats);
  if (!mesh) return mesh.error();
  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(plan.world));
  std::mutex mu;
  std::optional<Diag> failed = on_rank_threads(*mesh, opts.timeout, [&](Comm& comm) -> std::optional<Diag> {
    Result<std::vector<Tensor>> out =
        run_host_rank(plan, kernels, comm, inputs[static_cast<size_t>(comm.rank())], opts, stats, mu);
    if (!out) return out.error();
    outputs[static_cast<size_t>(comm.rank())] = std::move(out).value();
    return std::nullopt;
  });
  if (failed) return *failed;
  return outputs;
}

Result<std::vector<Tensor>> run_rank_on_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels, Comm& comm,
                                             const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                             GpuRunStats* stats) {
  if (comm.rank() < 0 || comm.rank() >= plan.world)
    return Diag{"", {}, "rank " + std::to_string(comm.rank()) + " is not in the plan (world " +
                            std::to_string(plan.world) + ")"};
  Result<DeviceMesh> mesh = host_setup(plan, opts, stats);
  if (!mesh) return mesh.error();
  std::mutex mu;
  return run_host_rank(plan, kernels, comm, inputs, opts, stats, mu);
}

}  // namespace sf
