// The comm-stream collective backends' shared part (runtime/plan/plan_collectives.h):
// every start step paired with its wait, an event pair each, scratch space, and the
// ordering: a start is enqueued on the comm stream after an event recorded on the
// compute stream (its operand is written), a wait makes the compute stream wait for
// an event recorded after it. And the copy stand-in, which puts one device-to-device
// copy of the collective's bus bytes where NCCL's call would be.
#include <algorithm>

#include "runtime/core/collective.h"
#include "runtime/plan/plan_collectives.h"
#include "runtime/plan/plan_cuda.h"
#include "runtime/plan/plan_exec.h"

namespace sf {

Result<void> CommStreamCollectives::pair_ops() {
  CudaPlanDevice& dev = *x_.cuda_;
  SF_TRY(dev.context().make_current());
  const PlanRank& rank = *x_.rank_;
  std::map<int, size_t> open;  // handle -> its start step
  std::map<size_t, Op> ops;
  std::map<size_t, size_t> start_of;
  for (size_t i = 0; i < rank.steps.size(); ++i) {
    const PlanStep& s = rank.steps[i];
    if (s.collective()) {
      if (open.count(s.handle))
        return Diag{"", {}, plan_step_name(rank, i) + ": handle " + std::to_string(s.handle) +
                                " is started again before its wait"};
      open[s.handle] = i;
      Result<cuda::Event> ready = cuda::Event::create(dev.context(), false),
                          done = cuda::Event::create(dev.context(), false);
      if (!ready) return ready.error();
      if (!done) return done.error();
      Op op;
      op.ready = std::move(ready).value();
      op.done = std::move(done).value();
      ops.emplace(i, std::move(op));
    } else if (s.op == "wait") {
      auto it = open.find(s.handle);
      if (it == open.end())
        return Diag{"", {}, plan_step_name(rank, i) + ": wait for handle " + std::to_string(s.handle) + " with no start"};
      Op& op = ops.at(it->second);
      op.wait = i;
      op.out = s.out.at(0);
      start_of[i] = it->second;
      open.erase(it);
    }
  }
  if (!open.empty()) return Diag{"", {}, plan_step_name(rank, open.begin()->second) + ": started but never waited for"};
  SF_TRY(dev.make_comm_stream());
  ops_ = std::move(ops);
  start_of_ = std::move(start_of);
  return {};
}

Result<CUdeviceptr> CommStreamCollectives::scratch(Op& op, size_t slot, size_t bytes) {
  // Allocated when the backend is made and kept: it is only touched on the comm
  // stream, in stream order, so every run reuses it safely. Growing it here is a
  // fallback that the backends' sizing up front makes unneeded.
  CudaPlanDevice& dev = *x_.cuda_;
  if (op.scratch.size() <= slot) op.scratch.resize(slot + 1);
  cuda::Buffer& b = op.scratch[slot];
  if (b.bytes() < bytes) {
    Result<cuda::Buffer> nb = cuda::Buffer::allocate(dev.context(), bytes);
    if (!nb) return nb.error();
    // Zeroed once, so padding that an uneven reduce-scatter reduces but nobody
    // keeps holds numbers, not whatever the allocation held.
    const cuda::Driver& d = dev.context().drv();
    SF_TRY(cuda::check(d.MemsetD8Async(nb->ptr(), 0, bytes, dev.comm_stream().get()), "cuMemsetD8Async (scratch)"));
    b = std::move(nb).value();
  }
  return b.ptr();
}

Result<void> CommStreamCollectives::start(size_t step) {
  const PlanStep& s = x_.rank_->steps[step];
  auto it = ops_.find(step);
  if (it == ops_.end()) return Diag{"", {}, "not a collective start"};
  Op& op = it->second;
  CudaPlanDevice& dev = *x_.cuda_;
  // The comm stream starts once the compute stream has written the operand.
  SF_TRY(op.ready.record(dev.stream()));
  SF_TRY(cuda::wait_event(dev.context(), dev.comm_stream(), op.ready));
  const std::string name = s.op + " " + x_.rank_->buffers[static_cast<size_t>(s.in.at(0))].name;
  size_t bytes = 0;
  std::string via;
  if (!x_.opts_.trace) {
    SF_TRY(enqueue(step, op, bytes, via));
  } else {
    // The event's arguments are known once enqueue() has said what it moved.
    Result<int> a = x_.dev_->mark(Stream::Comm);
    if (!a) return a.error();
    SF_TRY(enqueue(step, op, bytes, via));
    Result<int> b = x_.dev_->mark(Stream::Comm);
    if (!b) return b.error();
    x_.marked_.push_back(
        {name, {{"step", step}, {"bytes", bytes}, {"via", via}, {"mesh_dim", s.mesh_dim}}, *a, *b, Stream::Comm});
  }
  ++started_;
  return op.done.record(dev.comm_stream());
}

Result<void> CommStreamCollectives::wait(size_t step) {
  auto it = start_of_.find(step);
  if (it == start_of_.end()) return Diag{"", {}, "a wait with no start"};
  // Only the compute stream waits, on the device; the host goes on enqueueing.
  CudaPlanDevice& dev = *x_.cuda_;
  return cuda::wait_event(dev.context(), dev.stream(), ops_.at(it->second).done);
}

// --- the copy stand-in -----------------------------------------------------------------

namespace {

// The bytes a stand-in copy moves for collective `s` over `n` members: the larger
// of its input and output times the bus factor (nccl-tests' bus bytes), at least one
// element when anything moves.
size_t standin_bytes(const PlanStep& s, const PlanBuffer& in, const PlanBuffer& out, int n) {
  const size_t es = static_cast<size_t>(dtype_size(in.dtype));
  const double payload = static_cast<double>(std::max(numel(in.shape), numel(out.shape))) * static_cast<double>(es);
  const double bus = payload * bus_factor(*s.collective(), n);
  return bus <= 0 ? 0 : std::max(es, static_cast<size_t>(bus));
}

}  // namespace

Result<std::unique_ptr<CopyStandinCollectives>> CopyStandinCollectives::create(RankExec& rank) {
  std::unique_ptr<CopyStandinCollectives> c(new CopyStandinCollectives(rank));
  SF_TRY(c->pair_ops());
  const PlanRank& r = *rank.rank_;
  for (auto& [i, op] : c->ops_) {
    const PlanStep& s = r.steps[i];
    std::optional<int> dim = rank.mesh_.find(s.mesh_dim);
    if (!dim)
      return Diag{"", {}, plan_step_name(r, i) + ": mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" +
                              rank.plan_->mesh + "\""};
    const size_t bytes = standin_bytes(s, r.buffers[static_cast<size_t>(s.in.at(0))],
                                       r.buffers[static_cast<size_t>(op.out)],
                                       static_cast<int>(rank.mesh_.dims[static_cast<size_t>(*dim)].size));
    // Two buffers of their own: the copy reads and writes as much as a ring's
    // sends and receives, and touches none of the Plan's buffers.
    for (size_t slot = 0; slot < 2 && bytes > 0; ++slot)
      if (Result<CUdeviceptr> p = c->scratch(op, slot, bytes); !p)
        return Diag{"", {}, plan_step_name(r, i) + ": stand-in space: " + p.error().message};
  }
  return c;
}

Result<void> CopyStandinCollectives::enqueue(size_t, Op& op, size_t& bytes, std::string& via) {
  via = "d2d copy stand-in";
  bytes = op.scratch.size() == 2 ? op.scratch[0].bytes() : 0;
  if (bytes == 0) return {};
  CudaPlanDevice& dev = *x_.cuda_;
  return cuda::check(dev.context().drv().MemcpyDtoDAsync(op.scratch[1].ptr(), op.scratch[0].ptr(), bytes,
                                                          dev.comm_stream().get()),
                     "cuMemcpyDtoDAsync (collective stand-in)");
}

}  // namespace sf
