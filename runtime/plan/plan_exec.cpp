#include "runtime/plan/plan_exec.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/core/device_mesh.h"
#include "runtime/core/file_io.h"
#include "runtime/core/host_collectives.h"
#include "runtime/core/shard.h"
#include "runtime/comm/agree.h"
#include "runtime/plan/plan_cuda.h"
#include "runtime/plan/plan_host.h"
#include "runtime/plan/plan_steps.h"
#include "runtime/plan/plan_verify.h"

namespace sf {

namespace {

using plan_steps::is_device_step;
using plan_steps::slice_block_2d;

}  // namespace

std::string plan_step_name(const PlanRank& r, size_t i) {
  const PlanStep& s = r.steps[i];
  std::string what = s.kernel.empty() ? "" : " " + s.kernel;
  if (s.op == "gemm") what = " " + s.gemm.name + " via " + std::string(gemm_library_name(s.gemm.desc.library));
  return "rank " + std::to_string(r.rank) + ", step " + std::to_string(i) + " (" + s.op + what + ")";
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
  Result<Mesh> mesh = parse_plan_mesh(p.mesh, "plan.json");
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
  SF_TRY(r->prepare_gemm_steps());
  SF_TRY(r->dev_->prepare(*r->rank_, r->buffers_));
  return r;
}

RankExec::~RankExec() {
  // Nothing may still use the buffers when they go back to the allocator. A
  // collective whose peer is gone would keep the comm stream busy forever: wait
  // for it under the timeout, which aborts the communicator (and so ends its
  // kernels) when it passes.
  if (coll_) coll_->quiesce();
  if (dev_) (void)dev_->synchronize();
}

Result<void> RankExec::use_nccl(std::vector<std::unique_ptr<nccl::NcclComm>> comms) {
  const std::string who = "rank " + std::to_string(rank_->rank) + ": ";
  if (!cuda_) return Diag{"", {}, who + "NCCL needs --device cuda"};
  if (coll_) return Diag{"", {}, who + "the collectives already go through " + coll_->name()};
  Result<std::unique_ptr<NcclCollectives>> c = NcclCollectives::create(*this, std::move(comms));
  if (!c) return c.error();
  coll_ = std::move(c).value();
  return {};
}

Result<void> RankExec::use_copy_standin() {
  const std::string who = "rank " + std::to_string(rank_->rank) + ": ";
  if (!cuda_) return Diag{"", {}, who + "the copy stand-in needs --device cuda"};
  if (coll_) return Diag{"", {}, who + "the collectives already go through " + coll_->name()};
  Result<std::unique_ptr<CopyStandinCollectives>> c = CopyStandinCollectives::create(*this);
  if (!c) return c.error();
  coll_ = std::move(c).value();
  return {};
}

cuda::Stream& RankExec::stream() { return cuda_->stream(); }
cuda::Stream& RankExec::comm_stream() { return cuda_->comm_stream(); }

size_t RankExec::bytes(int buffer) const {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  return static_cast<size_t>(numel(b.shape) * dtype_size(b.dtype));
}

Result<void> RankExec::upload(int buffer, const Tensor& t) {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  if (t.dtype() != b.dtype || t.shape() != b.shape)
    return Diag{"", {}, "buffer " + b.name + " is " + TensorType{b.dtype, b.shape}.str() + ", got " + t.type().str()};
  if (Result<void> e = dev_->upload(addr(buffer), t.data(), t.nbytes()); !e.ok())
    return with_context(b.name + ": ", e.error());
  return {};
}

Result<Tensor> RankExec::download(int buffer) {
  const PlanBuffer& b = rank_->buffers[static_cast<size_t>(buffer)];
  Tensor t(b.dtype, b.shape);
  if (Result<void> e = dev_->download(t.data(), addr(buffer), t.nbytes()); !e.ok())
    return with_context(b.name + ": ", e.error());
  return t;
}

Result<void> RankExec::upload_inputs(const std::vector<Tensor>& inputs) {
  if (cuda_)
    SF_TRY(cuda_->context().make_current());
  if (inputs.size() != rank_->inputs.size())
    return Diag{"", {}, "rank " + std::to_string(rank_->rank) + ": " + std::to_string(inputs.size()) +
                            " inputs for " + std::to_string(rank_->inputs.size()) + " params"};
  for (size_t i = 0; i < inputs.size(); ++i)
    if (Result<void> e = upload(rank_->inputs[i], inputs[i]); !e.ok())
      return Diag{"", {}, "rank " + std::to_string(rank_->rank) + ", input " + std::to_string(i) + ": " +
                              e.error().message};
  return {};
}

Result<std::vector<Tensor>> RankExec::download_outputs() {
  if (cuda_)
    SF_TRY(cuda_->context().make_current());
  std::vector<Tensor> out;
  for (int b : rank_->outputs) {
    Result<Tensor> t = download(b);
    if (!t) return t.error();
    out.push_back(std::move(t).value());
  }
  return out;
}

Result<void> RankExec::local_step(size_t i) {
  const PlanStep& s = rank_->steps[i];
  if (s.op == "kernel") return launch_step(i);
  return copy_step(i);
}

bool RankExec::on_device(size_t i) const {
  const PlanStep& s = rank_->steps[i];
  if (is_device_step(s) || s.op == "concat") return true;
  if (s.op != "slice") return false;
  const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
  return slice_block_2d(ib.shape, ob.shape, s.offset, static_cast<size_t>(dtype_size(ob.dtype))).has_value();
}

Result<void> RankExec::timed(const std::string& name, nlohmann::json args,
                             const std::function<Result<void>()>& enqueue, Stream track) {
  if (!opts_.trace) return enqueue();
  Result<int> a = dev_->mark(track);
  if (!a) return a.error();
  SF_TRY(enqueue());
  Result<int> b = dev_->mark(track);
  if (!b) return b.error();
  marked_.push_back({name, std::move(args), *a, *b, track});
  return {};
}

Result<void> RankExec::run_segment(size_t begin, size_t end) {
  const bool per_kernel = opts_.trace && !opts_.cuda_graph;
  auto body = [&]() -> Result<void> {
    for (size_t i = begin; i < end; ++i) {
      const PlanStep& st = rank_->steps[i];
      Result<void> e;
      if (per_kernel && st.op == "kernel") {
        const PlanKernel& k = *kernels_.at(st.kernel);
        e = timed(st.kernel,
                  {{"step", i}, {"kind", "kernel"}, {"flops", k.flops}, {"bytes", k.bytes_read + k.bytes_written}},
                  [&] { return local_step(i); });
      } else {
        e = local_step(i);
      }
      if (!e.ok()) return with_context(plan_step_name(*rank_, i) + ": ", e.error());
    }
    return {};
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

Result<void> RankExec::enqueue() {
  if (cuda_)
    SF_TRY(cuda_->context().make_current());
  const size_t n = rank_->steps.size();
  for (size_t i = 0; i < n; ++i)
    if (!on_device(i) && rank_->steps[i].op != "gemm")
      return Diag{"", {}, plan_step_name(*rank_, i) + ": enqueue() runs only kernels and library GEMMs; this step needs the host"};
  // Device segments between gemm steps, as run_steps() splits them.
  for (size_t i = 0; i < n;) {
    if (rank_->steps[i].op == "gemm") {
      if (Result<void> e = gemm_step(i); !e.ok()) return with_context(plan_step_name(*rank_, i) + ": ", e.error());
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && on_device(j)) ++j;
    SF_TRY(run_segment(i, j));
    i = j;
  }
  return {};
}

double RankExec::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - opts_.trace_origin).count();
}

Result<void> RankExec::run(Comm* comm) {
  if (cuda_)
    SF_TRY(cuda_->context().make_current());
  SF_TRY(run_steps(comm));
  // The comm stream first, under the timeout: a peer that never joins a
  // collective aborts the communicator here instead of hanging the sync.
  if (coll_) SF_TRY(coll_->finish());
  SF_TRY(dev_->synchronize());
  if (!opts_.trace) return {};
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
  return {};
}

Result<void> RankExec::run_steps(Comm* comm) {
  if (opts_.trace) {
    SF_TRY(dev_->synchronize());
    Result<int> ref = dev_->mark(Stream::Compute);
    if (!ref) return ref.error();
    ref_mark_ = *ref;
    SF_TRY(dev_->synchronize());
    ref_us_ = now_us();
  }
  // Without a comm-stream backend, this run stages its collectives through the host.
  std::unique_ptr<GlooCollectives> host;
  if (!coll_ && comm) host = std::make_unique<GlooCollectives>(*this, *comm);
  CollectiveBackend* coll = coll_ ? coll_.get() : host.get();
  const std::vector<PlanStep>& steps = rank_->steps;
  size_t i = 0;
  while (i < steps.size()) {
    if (comm && comm->aborted()) {
      Diag d{"", {}, plan_step_name(*rank_, i) + ": aborted because another rank failed"};
      d.from_peer = true;
      return d;
    }
    if (opts_.before_step) {
      Result<void> stop;
      try {
        stop = opts_.before_step(rank_->rank, i, comm);
      } catch (const std::exception& ex) {
        stop = Diag{"", {}, ex.what()};
      }
      if (!stop.ok()) return with_context(plan_step_name(*rank_, i) + ": ", stop.error());
    }
    if (on_device(i)) {
      // With a test hook every step is its own segment, so the hook sees each.
      size_t j = i + 1;
      while (!opts_.before_step && j < steps.size() && on_device(j)) ++j;
      SF_TRY(run_segment(i, j));
      i = j;
      continue;
    }
    const PlanStep& s = steps[i];
    Result<void> e;
    if (s.op == "slice") {
      e = host_slice(s);
    } else if (s.op == "gemm") {
      e = gemm_step(i);
    } else if (!coll) {
      e = Diag{"", {}, "a collective, but no comm backend was given"};
    } else {
      e = s.op == "wait" ? coll->wait(i) : coll->start(i);
    }
    if (!e.ok()) return with_context(plan_step_name(*rank_, i) + ": ", e.error());
    ++i;
  }
  return {};
}

}  // namespace sf
