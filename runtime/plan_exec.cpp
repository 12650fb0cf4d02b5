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
    l.flops = k.flops;
    l.bytes = k.bytes_read + k.bytes_written;
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
  if (auto e = r->prepare_gemm_steps()) return *e;
  if (auto e = r->encode_tensor_maps()) return *e;
  return r;
}

std::optional<Diag> GpuRank::encode_tensor_maps() {
  const Plan& p = plan_->plan();
  for (size_t i = 0; i < rank_->steps.size(); ++i) {
    const PlanStep& s = rank_->steps[i];
    if (s.op != "kernel") continue;
    auto k = std::find_if(p.kernels.begin(), p.kernels.end(), [&](const PlanKernel& pk) { return pk.id == s.kernel; });
    if (k == p.kernels.end() || k->tensor_maps.empty()) continue;
    std::vector<cuda::Buffer> maps;
    for (const PlanTensorMap& m : k->tensor_maps) {
      const int b = s.in[static_cast<size_t>(m.input)];  // verify_plan checked the index
      Result<cuda::Buffer> map = cuda::encode_tensor_map(plan_->context(), m, buffers_[static_cast<size_t>(b)].ptr());
      if (!map) return with_context(plan_step_name(*rank_, i) + ": ", map.error());
      maps.push_back(std::move(map).value());
    }
    tensor_maps_.emplace(&s, std::move(maps));
  }
  return std::nullopt;
}

GpuRank::~GpuRank() {
  // Nothing may still use the buffers when they go back to the allocator. A
  // collective whose peer is gone would keep the comm stream busy forever: wait
  // for it under the timeout, which aborts the communicator (and so ends its
  // kernels) when it passes.
  if (!nccl_.empty() && !plan_->context().make_current())
    for (auto& c : nccl_)
      if (!c->aborted()) (void)c->wait_with_timeout(comm_stream_.get());
  if (comm_stream_.get()) (void)comm_stream_.synchronize();
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
  if (auto m = tensor_maps_.find(&s); m != tensor_maps_.end())
    for (const cuda::Buffer& map : m->second) args.push_back(map.ptr());
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
    const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
    const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
    std::optional<Block2D> b = slice_block_2d(ib.shape, ob.shape, s.offset, static_cast<size_t>(dtype_size(ob.dtype)));
    if (!b) return host_slice(s);
    const cuda::Buffer& in = buffers_[static_cast<size_t>(s.in.at(0))];
    const cuda::Buffer& out = buffers_[static_cast<size_t>(s.out.at(0))];
    return cuda::copy_2d(plan_->context(), out.ptr(), b->dst_pitch, in.ptr() + b->src_offset, b->src_pitch, b->width,
                         b->height, stream_);
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
    const cuda::Buffer& out = buffers_[static_cast<size_t>(s.out.at(0))];
    size_t at = 0;
    for (int b : s.in) {
      const size_t width = static_cast<size_t>(rank_->buffers[static_cast<size_t>(b)].shape[d]) * inner;
      if (auto e = cuda::copy_2d(plan_->context(), out.ptr() + at, static_cast<size_t>(ob.shape[d]) * inner,
                                 buffers_[static_cast<size_t>(b)].ptr(), width, width, rows, stream_))
        return e;
      at += width;
    }
    return std::nullopt;
  }
  return Diag{"", {}, "not a local step"};
}

std::optional<Diag> GpuRank::host_slice(const PlanStep& s) {
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

bool GpuRank::on_device(size_t i) const {
  const PlanStep& s = rank_->steps[i];
  if (is_device_step(s) || s.op == "concat") return true;
  if (s.op != "slice") return false;
  const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
  return slice_block_2d(ib.shape, ob.shape, s.offset, static_cast<size_t>(dtype_size(ob.dtype))).has_value();
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

std::optional<Diag> GpuRank::timed(const std::string& name, nlohmann::json args,
                                   const std::function<std::optional<Diag>()>& enqueue) {
  return timed(name, std::move(args), enqueue, stream_, Stream::Compute);
}

std::optional<Diag> GpuRank::timed(const std::string& name, nlohmann::json args,
                                   const std::function<std::optional<Diag>()>& enqueue, const cuda::Stream& on,
                                   Stream track) {
  if (!opts_.trace) return enqueue();
  Result<cuda::Event> a = cuda::Event::create(plan_->context()), b = cuda::Event::create(plan_->context());
  if (!a) return a.error();
  if (!b) return b.error();
  if (auto e = a->record(on)) return e;
  if (auto e = enqueue()) return e;
  if (auto e = b->record(on)) return e;
  device_events_.push_back({name, std::move(args), std::move(a).value(), std::move(b).value(), track});
  return std::nullopt;
}

std::optional<Diag> GpuRank::run_segment(size_t begin, size_t end) {
  const bool per_kernel = opts_.trace && !opts_.cuda_graph;
  auto body = [&]() -> std::optional<Diag> {
    for (size_t i = begin; i < end; ++i) {
      const PlanStep& st = rank_->steps[i];
      std::optional<Diag> e;
      if (per_kernel && st.op == "kernel") {
        const GpuPlan::Loaded& k = plan_->kernel(st.kernel);
        e = timed(st.kernel, {{"step", i}, {"kind", "kernel"}, {"flops", k.flops}, {"bytes", k.bytes}},
                  [&] { return local_step(st); });
      } else {
        e = local_step(st);
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

double GpuRank::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - opts_.trace_origin).count();
}

std::optional<Diag> GpuRank::run(Comm* comm) {
  if (auto e = plan_->context().make_current()) return e;
  if (auto e = run_steps(comm)) return e;
  // The comm stream first, under the timeout: a peer that never joins a
  // collective aborts the communicator here instead of hanging the sync.
  for (auto& c : nccl_)
    if (auto e = c->wait_with_timeout(comm_stream_.get())) return e;
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
    opts_.trace->add(rank_->rank, d.track, d.name, ref_us_ + *from * 1e3, *dur * 1e3, std::move(d.args),
                     d.track == Stream::Comm ? "collective" : "kernel");
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
    if (on_device(i)) {
      size_t j = i;
      while (j < steps.size() && on_device(j)) ++j;
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
                           {{"step", i}, {"bytes", buffers_[static_cast<size_t>(s.out.at(0))].bytes()}}, "collective");
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

// One rank on its GPU: buffers, NCCL communicators if the setup says so, the run,
// the outputs.
Result<std::vector<Tensor>> run_one_rank(const std::shared_ptr<GpuPlan>& loaded, const RunSetup& rs, int device,
                                         Comm& comm, const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                         GpuRunStats* stats, std::mutex& mu) {
  const int r = comm.rank();
  if (opts.trace) opts.trace->add_rank(r);
  Result<std::unique_ptr<GpuRank>> gr = GpuRank::create(loaded, r, opts);
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
  if (auto e = (*gr)->upload_inputs(inputs)) return *e;
  if (auto e = (*gr)->run(&comm)) return *e;
  if (stats) {
    std::lock_guard<std::mutex> lock(mu);
    stats->launches += (*gr)->launches();
    stats->library_gemms += (*gr)->library_calls();
    stats->graph_launches += (*gr)->graph_launches();
    stats->nccl_ops += (*gr)->nccl_ops();
  }
  return (*gr)->download_outputs();
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

}  // namespace sf
