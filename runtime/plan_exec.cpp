#include "runtime/plan_exec.h"

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

std::string step_name(const PlanRank& r, size_t i) {
  const PlanStep& s = r.steps[i];
  return "rank " + std::to_string(r.rank) + ", step " + std::to_string(i) + " (" + s.op +
         (s.kernel.empty() ? "" : " " + s.kernel) + ")";
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

std::vector<int64_t> prefix_sums(const std::vector<int64_t>& v) {
  std::vector<int64_t> p(v.size() + 1, 0);
  for (size_t i = 0; i < v.size(); ++i) p[i + 1] = p[i] + v[i];
  return p;
}

// Whether an all_to_all's chunks along `dim` of `shape` (`sizes`) must go through
// scratch: a chunk is contiguous in the buffer when nothing lies outside `dim`
// (outer == 1), or when it is the whole buffer. The latter is a ring shift of a
// decomposed collective matmul (one chunk, all of the shard, to one member), which
// would otherwise pay two full copies of the shard on the comm stream per step.
bool all_to_all_packs(const Shape& shape, int dim, const std::vector<int64_t>& sizes) {
  if (dim < 0 || dim >= static_cast<int>(shape.size()) || prod(shape, 0, static_cast<size_t>(dim)) <= 1) return false;
  const int64_t extent = shape[static_cast<size_t>(dim)];
  return std::any_of(sizes.begin(), sizes.end(), [&](int64_t x) { return x > 0 && x < extent; });
}

// The scratch bytes (per slot) GpuRank::enqueue_collective packs and unpacks
// through for collective `s` over n members, from `in` to `out`: allocated before
// the first collective is enqueued, since allocating (and above all freeing, which
// the allocator does when memory runs short) while NCCL kernels wait for peers can
// stall them.
std::vector<size_t> scratch_bytes(const PlanStep& s, const PlanBuffer& in, const PlanBuffer& out, int n) {
  const size_t es = static_cast<size_t>(dtype_size(in.dtype));
  auto outer = [](const Shape& sh, int dim) { return dim < 0 ? 1 : prod(sh, 0, static_cast<size_t>(dim)); };
  if (s.op == "all_gather" && outer(out.shape, s.dim) > 1) return {static_cast<size_t>(numel(out.shape)) * es};
  if (s.op == "reduce_scatter" && !s.sizes.empty() && s.dim >= 0 && s.dim < static_cast<int>(in.shape.size())) {
    const int64_t most = *std::max_element(s.sizes.begin(), s.sizes.end());
    const bool even = std::all_of(s.sizes.begin(), s.sizes.end(), [&](int64_t x) { return x == most; });
    const size_t block = static_cast<size_t>(outer(in.shape, s.dim) * most *
                                             prod(in.shape, static_cast<size_t>(s.dim) + 1, in.shape.size())) * es;
    if (even && outer(in.shape, s.dim) == 1) return {};  // straight from the input into the output
    if (even) return {static_cast<size_t>(n) * block};  // packed, reduced into the output
    return {static_cast<size_t>(n) * block, block};     // packed and padded, reduced, trimmed
  }
  if (s.op == "all_to_all")
    return {all_to_all_packs(in.shape, s.dim, s.sizes) ? static_cast<size_t>(numel(in.shape)) * es : 0,
            all_to_all_packs(out.shape, s.dim2, s.sizes2) ? static_cast<size_t>(numel(out.shape)) * es : 0};
  return {};
}

}  // namespace

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
  return r;
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

std::optional<Diag> GpuRank::use_nccl(std::vector<std::unique_ptr<nccl::NcclComm>> comms) {
  const std::string who = "rank " + std::to_string(rank_->rank) + ": ";
  if (static_cast<int>(comms.size()) != static_cast<int>(plan_->mesh().dims.size()))
    return Diag{"", {}, who + std::to_string(comms.size()) + " NCCL communicator(s) for a mesh of " +
                            std::to_string(static_cast<int>(plan_->mesh().dims.size())) + " dim(s)"};
  cuda::Context& ctx = plan_->context();
  if (auto e = ctx.make_current()) return e;
  std::map<int, size_t> open;  // handle -> its start step
  std::map<size_t, NcclOp> ops;
  std::map<size_t, size_t> start_of;
  for (size_t i = 0; i < rank_->steps.size(); ++i) {
    const PlanStep& s = rank_->steps[i];
    if (s.op == "all_reduce" || s.op == "all_gather" || s.op == "reduce_scatter" || s.op == "all_to_all") {
      if (open.count(s.handle)) return Diag{"", {}, step_name(*rank_, i) + ": handle " + std::to_string(s.handle) +
                                                        " is started again before its wait"};
      open[s.handle] = i;
      Result<cuda::Event> ready = cuda::Event::create(ctx, false), done = cuda::Event::create(ctx, false);
      if (!ready) return ready.error();
      if (!done) return done.error();
      NcclOp op;
      op.ready = std::move(ready).value();
      op.done = std::move(done).value();
      ops.emplace(i, std::move(op));
    } else if (s.op == "wait") {
      auto it = open.find(s.handle);
      if (it == open.end())
        return Diag{"", {}, step_name(*rank_, i) + ": wait for handle " + std::to_string(s.handle) + " with no start"};
      NcclOp& op = ops.at(it->second);
      op.wait = i;
      op.out = s.out.at(0);
      start_of[i] = it->second;
      open.erase(it);
    }
  }
  if (!open.empty())
    return Diag{"", {}, step_name(*rank_, open.begin()->second) + ": started but never waited for"};
  Result<cuda::Stream> cs = cuda::Stream::create(ctx);
  if (!cs) return cs.error();
  comm_stream_ = std::move(cs).value();
  nccl_ops_ = std::move(ops);
  for (auto& [i, op] : nccl_ops_) {
    const PlanStep& s = rank_->steps[i];
    std::optional<int> dim = plan_->mesh().find(s.mesh_dim);
    if (!dim || *dim >= static_cast<int>(comms.size())) continue;  // reported when the step runs
    const std::vector<size_t> need =
        scratch_bytes(s, rank_->buffers[static_cast<size_t>(s.in.at(0))], rank_->buffers[static_cast<size_t>(op.out)],
                      comms[static_cast<size_t>(*dim)]->size());
    for (size_t slot = 0; slot < need.size(); ++slot)
      if (need[slot] > 0)
        if (Result<CUdeviceptr> p = scratch(op, slot, need[slot]); !p)
          return Diag{"", {}, step_name(*rank_, i) + ": scratch space: " + p.error().message};
  }
  start_of_ = std::move(start_of);
  nccl_ = std::move(comms);
  return std::nullopt;
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

// --- collectives through NCCL ------------------------------------------------------------

Result<CUdeviceptr> GpuRank::scratch(NcclOp& op, size_t slot, size_t bytes) {
  // Allocated by use_nccl() (scratch_bytes()) and kept: it is only touched on the
  // comm stream, in stream order, so every run reuses it safely. Growing it here is
  // a fallback that scratch_bytes() makes unneeded.
  if (op.scratch.size() <= slot) op.scratch.resize(slot + 1);
  cuda::Buffer& b = op.scratch[slot];
  if (b.bytes() < bytes) {
    Result<cuda::Buffer> nb = cuda::Buffer::allocate(plan_->context(), bytes);
    if (!nb) return nb.error();
    // Zeroed once, so padding that an uneven reduce-scatter reduces but nobody
    // keeps holds numbers, not whatever the allocation held.
    const cuda::Driver& d = plan_->context().drv();
    if (auto e = cuda::check(d.MemsetD8Async(nb->ptr(), 0, bytes, comm_stream_.get()), "cuMemsetD8Async (scratch)"))
      return *e;
    b = std::move(nb).value();
  }
  return b.ptr();
}

std::optional<Diag> GpuRank::enqueue_collective(const PlanStep& s, NcclOp& op, nccl::NcclComm& c) {
  const cuda::Context& ctx = plan_->context();
  const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(op.out)];
  const CUdeviceptr in = buffers_[static_cast<size_t>(s.in.at(0))].ptr();
  const CUdeviceptr out = buffers_[static_cast<size_t>(op.out)].ptr();
  const DType dt = ib.dtype;
  const size_t es = static_cast<size_t>(dtype_size(dt));
  const int n = c.size();
  const CUstream cs = comm_stream_.get();
  if (ob.dtype != dt) return Diag{"", {}, "the collective's input and output dtypes differ"};
  ReduceOp rop = ReduceOp::Sum;
  if (!s.reduce_op.empty()) {
    std::optional<ReduceOp> r = parse_reduce_op(s.reduce_op);
    if (!r) return Diag{"", {}, "unknown reduce_op \"" + s.reduce_op + "\""};
    rop = *r;
  }
  auto sizes_fit = [&](const std::vector<int64_t>& sizes, const std::vector<int64_t>& shape, int dim,
                       const char* what) -> std::optional<Diag> {
    if (static_cast<int>(sizes.size()) != n || dim < 0 || dim >= static_cast<int>(shape.size()) ||
        prefix_sums(sizes).back() != shape[static_cast<size_t>(dim)])
      return Diag{"", {}, std::string(what) + ": the sizes do not cut dim " + std::to_string(dim) + " of " +
                              TensorType{dt, shape}.str() + " into " + std::to_string(n) + " parts"};
    return std::nullopt;
  };
  auto copy = [&](CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src, size_t src_pitch, size_t width, size_t height) {
    return cuda::copy_2d(ctx, dst, dst_pitch, src, src_pitch, width, height, comm_stream_);
  };

  if (s.op == "all_reduce") {
    if (numel(ib.shape) != numel(ob.shape)) return Diag{"", {}, "all_reduce: input and output sizes differ"};
    return c.all_reduce(in, out, static_cast<size_t>(numel(ib.shape)), dt, rop, cs);
  }
  if (s.op == "all_gather") {
    if (auto e = sizes_fit(s.sizes, ob.shape, s.dim, "all_gather")) return e;
    const size_t d = static_cast<size_t>(s.dim);
    const int64_t outer = prod(ob.shape, 0, d), inner = prod(ob.shape, d + 1, ob.shape.size());
    const std::vector<int64_t> at = prefix_sums(s.sizes);
    if (at.back() * outer * inner == 0) return std::nullopt;
    const bool even = std::all_of(s.sizes.begin(), s.sizes.end(), [&](int64_t x) { return x == s.sizes[0]; });
    // Block k (member k's shard, [outer, sizes[k] * inner]) lands contiguous at
    // element outer * at[k] * inner: straight in the output when outer == 1
    // (gathering along the outermost non-unit dim), else in scratch first.
    CUdeviceptr land = out;
    if (outer > 1) {
      Result<CUdeviceptr> t = scratch(op, 0, static_cast<size_t>(numel(ob.shape)) * es);
      if (!t) return t.error();
      land = *t;
    }
    if (even) {
      if (auto e = c.all_gather(in, land, static_cast<size_t>(numel(ib.shape)), dt, cs)) return e;
    } else {
      std::vector<nccl::NcclComm::Transfer> sends, recvs;
      for (int k = 0; k < n; ++k) {
        sends.push_back({k, in, static_cast<size_t>(numel(ib.shape))});
        recvs.push_back({k, land + static_cast<CUdeviceptr>(outer * at[static_cast<size_t>(k)] * inner) * es,
                         static_cast<size_t>(outer * s.sizes[static_cast<size_t>(k)] * inner)});
      }
      if (auto e = c.send_recv(sends, recvs, dt, cs)) return e;
    }
    if (outer == 1) return std::nullopt;
    for (int k = 0; k < n; ++k) {
      const size_t width = static_cast<size_t>(s.sizes[static_cast<size_t>(k)] * inner) * es;
      if (auto e = copy(out + static_cast<size_t>(at[static_cast<size_t>(k)] * inner) * es,
                        static_cast<size_t>(at.back() * inner) * es,
                        land + static_cast<size_t>(outer * at[static_cast<size_t>(k)] * inner) * es, width, width,
                        static_cast<size_t>(outer)))
        return e;
    }
    return std::nullopt;
  }
  if (s.op == "reduce_scatter") {
    if (auto e = sizes_fit(s.sizes, ib.shape, s.dim, "reduce_scatter")) return e;
    const size_t d = static_cast<size_t>(s.dim);
    const int64_t outer = prod(ib.shape, 0, d), inner = prod(ib.shape, d + 1, ib.shape.size());
    const std::vector<int64_t> at = prefix_sums(s.sizes);
    const int64_t most = *std::max_element(s.sizes.begin(), s.sizes.end());
    const bool even = std::all_of(s.sizes.begin(), s.sizes.end(), [&](int64_t x) { return x == most; });
    const size_t block = static_cast<size_t>(outer * most * inner);  // elements per member, padded
    if (block == 0) return std::nullopt;
    if (even && outer == 1) return c.reduce_scatter(in, out, block, dt, rop, cs);
    // Member k's part ([outer, sizes[k] * inner] of the input's columns) packed
    // contiguous into block k of scratch; NCCL reduces block by block.
    Result<CUdeviceptr> packed = scratch(op, 0, static_cast<size_t>(n) * block * es);
    if (!packed) return packed.error();
    for (int k = 0; k < n; ++k) {
      const size_t width = static_cast<size_t>(s.sizes[static_cast<size_t>(k)] * inner) * es;
      if (auto e = copy(*packed + static_cast<size_t>(k) * block * es, width,
                        in + static_cast<size_t>(at[static_cast<size_t>(k)] * inner) * es,
                        static_cast<size_t>(at.back() * inner) * es, width, static_cast<size_t>(outer)))
        return e;
    }
    if (even) return c.reduce_scatter(*packed, out, block, dt, rop, cs);
    Result<CUdeviceptr> mine = scratch(op, 1, block * es);
    if (!mine) return mine.error();
    if (auto e = c.reduce_scatter(*packed, *mine, block, dt, rop, cs)) return e;
    // This member's part is the first numel(out) elements of its padded block.
    const size_t bytes = static_cast<size_t>(numel(ob.shape)) * es;
    return copy(out, bytes, *mine, bytes, bytes, 1);
  }
  if (s.op == "all_to_all") {
    if (auto e = sizes_fit(s.sizes, ib.shape, s.dim, "all_to_all (split)")) return e;
    if (auto e = sizes_fit(s.sizes2, ob.shape, s.dim2, "all_to_all (concat)")) return e;
    const size_t d1 = static_cast<size_t>(s.dim), d2 = static_cast<size_t>(s.dim2);
    const int64_t outer1 = prod(ib.shape, 0, d1), inner1 = prod(ib.shape, d1 + 1, ib.shape.size());
    const int64_t outer2 = prod(ob.shape, 0, d2), inner2 = prod(ob.shape, d2 + 1, ob.shape.size());
    const std::vector<int64_t> sat = prefix_sums(s.sizes), rat = prefix_sums(s.sizes2);
    // Chunk k goes out contiguous: straight from the input when it already is (see
    // all_to_all_packs), else packed into scratch first; what comes in lands likewise.
    const bool pack_send = all_to_all_packs(ib.shape, s.dim, s.sizes);
    const bool unpack_recv = all_to_all_packs(ob.shape, s.dim2, s.sizes2);
    CUdeviceptr send_base = in, recv_base = out;
    if (pack_send) {
      Result<CUdeviceptr> t = scratch(op, 0, static_cast<size_t>(numel(ib.shape)) * es);
      if (!t) return t.error();
      send_base = *t;
      for (int k = 0; k < n; ++k) {
        const size_t width = static_cast<size_t>(s.sizes[static_cast<size_t>(k)] * inner1) * es;
        if (auto e = copy(send_base + static_cast<size_t>(outer1 * sat[static_cast<size_t>(k)] * inner1) * es, width,
                          in + static_cast<size_t>(sat[static_cast<size_t>(k)] * inner1) * es,
                          static_cast<size_t>(sat.back() * inner1) * es, width, static_cast<size_t>(outer1)))
          return e;
      }
    }
    if (unpack_recv) {
      Result<CUdeviceptr> t = scratch(op, 1, static_cast<size_t>(numel(ob.shape)) * es);
      if (!t) return t.error();
      recv_base = *t;
    }
    std::vector<nccl::NcclComm::Transfer> sends, recvs;
    for (int k = 0; k < n; ++k) {
      const size_t ks = static_cast<size_t>(k);
      sends.push_back({k, send_base + static_cast<size_t>(outer1 * sat[ks] * inner1) * es,
                       static_cast<size_t>(outer1 * s.sizes[ks] * inner1)});
      recvs.push_back({k, recv_base + static_cast<size_t>(outer2 * rat[ks] * inner2) * es,
                       static_cast<size_t>(outer2 * s.sizes2[ks] * inner2)});
    }
    if (auto e = c.send_recv(sends, recvs, dt, cs)) return e;
    if (!unpack_recv) return std::nullopt;
    for (int k = 0; k < n; ++k) {
      const size_t width = static_cast<size_t>(s.sizes2[static_cast<size_t>(k)] * inner2) * es;
      if (auto e = copy(out + static_cast<size_t>(rat[static_cast<size_t>(k)] * inner2) * es,
                        static_cast<size_t>(rat.back() * inner2) * es,
                        recv_base + static_cast<size_t>(outer2 * rat[static_cast<size_t>(k)] * inner2) * es, width,
                        width, static_cast<size_t>(outer2)))
        return e;
    }
    return std::nullopt;
  }
  return Diag{"", {}, "unknown step op \"" + s.op + "\""};
}

std::optional<Diag> GpuRank::nccl_start(size_t i) {
  const PlanStep& s = rank_->steps[i];
  auto it = nccl_ops_.find(i);
  if (it == nccl_ops_.end()) return Diag{"", {}, "not a collective start"};
  NcclOp& op = it->second;
  std::optional<int> dim = plan_->mesh().find(s.mesh_dim);
  if (!dim || *dim >= static_cast<int>(nccl_.size()))
    return Diag{"", {}, "mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" + plan_->plan().mesh + "\""};
  nccl::NcclComm& c = *nccl_[static_cast<size_t>(*dim)];
  const cuda::Context& ctx = plan_->context();
  // The comm stream starts once the compute stream has written the operand.
  if (auto e = op.ready.record(stream_)) return e;
  if (auto e = cuda::wait_event(ctx, comm_stream_, op.ready)) return e;
  const std::string name = s.op + " " + rank_->buffers[static_cast<size_t>(s.in.at(0))].name;
  if (auto e = timed(name, {{"step", i}, {"bytes", buffers_[static_cast<size_t>(op.out)].bytes()}, {"via", "nccl"},
                            {"mesh_dim", s.mesh_dim}},
                     [&] { return enqueue_collective(s, op, c); }, comm_stream_, Stream::Comm))
    return e;
  ++nccl_ops_run_;
  return op.done.record(comm_stream_);
}

std::optional<Diag> GpuRank::nccl_wait(size_t i) {
  auto it = start_of_.find(i);
  if (it == start_of_.end()) return Diag{"", {}, "a wait with no start"};
  // Only the compute stream waits, on the device; the host goes on enqueueing.
  return cuda::wait_event(plan_->context(), stream_, nccl_ops_.at(it->second).done);
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
      if (e) return with_context(step_name(*rank_, i) + ": ", *e);
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
    if (!on_device(i))
      return Diag{"", {}, step_name(*rank_, i) + ": enqueue() runs only kernels; this step needs the host"};
  return run_segment(0, rank_->steps.size());
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
    if (e) return with_context(step_name(*rank_, i) + ": ", *e);
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
