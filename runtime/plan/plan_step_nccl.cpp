// A Plan's collectives through NCCL (runtime/plan/plan_exec.h): each start step enqueued
// on the rank's comm stream after an event recorded on the compute stream, each
// wait step making the compute stream wait for an event recorded after it; uneven
// shards and gathers along inner dims are packed and unpacked with strided copies
// on the comm stream around the NCCL call.
#include <algorithm>

#include "runtime/core/collective.h"
#include "runtime/plan/plan_cuda.h"
#include "runtime/plan/plan_exec.h"

namespace sf {

namespace {

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= v[i];
  return p;
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

// The scratch bytes (per slot) RankExec::enqueue_collective packs and unpacks
// through for collective `s` over n members, from `in` to `out`: allocated before
// the first collective is enqueued, since allocating (and above all freeing, which
// the allocator does when memory runs short) while NCCL kernels wait for peers can
// stall them.
std::vector<size_t> scratch_bytes(const PlanStep& s, const PlanBuffer& in, const PlanBuffer& out, int n) {
  const size_t es = static_cast<size_t>(dtype_size(in.dtype));
  auto outer = [](const Shape& sh, int dim) { return dim < 0 ? 1 : prod(sh, 0, static_cast<size_t>(dim)); };
  if (s.collective() == CollectiveKind::AllGather && outer(out.shape, s.dim) > 1) return {static_cast<size_t>(numel(out.shape)) * es};
  if (s.collective() == CollectiveKind::ReduceScatter && !s.sizes.empty() && s.dim >= 0 && s.dim < static_cast<int>(in.shape.size())) {
    const int64_t most = *std::max_element(s.sizes.begin(), s.sizes.end());
    const bool even = std::all_of(s.sizes.begin(), s.sizes.end(), [&](int64_t x) { return x == most; });
    const size_t block = static_cast<size_t>(outer(in.shape, s.dim) * most *
                                             prod(in.shape, static_cast<size_t>(s.dim) + 1, in.shape.size())) * es;
    if (even && outer(in.shape, s.dim) == 1) return {};  // straight from the input into the output
    if (even) return {static_cast<size_t>(n) * block};  // packed, reduced into the output
    return {static_cast<size_t>(n) * block, block};     // packed and padded, reduced, trimmed
  }
  if (s.collective() == CollectiveKind::AllToAll)
    return {all_to_all_packs(in.shape, s.dim, s.sizes) ? static_cast<size_t>(numel(in.shape)) * es : 0,
            all_to_all_packs(out.shape, s.dim2, s.sizes2) ? static_cast<size_t>(numel(out.shape)) * es : 0};
  return {};
}

}  // namespace

Result<void> RankExec::pair_comm_stream_ops() {
  SF_TRY(cuda_->context().make_current());
  std::map<int, size_t> open;  // handle -> its start step
  std::map<size_t, NcclOp> ops;
  std::map<size_t, size_t> start_of;
  for (size_t i = 0; i < rank_->steps.size(); ++i) {
    const PlanStep& s = rank_->steps[i];
    if (s.collective()) {
      if (open.count(s.handle)) return Diag{"", {}, plan_step_name(*rank_, i) + ": handle " + std::to_string(s.handle) +
                                                        " is started again before its wait"};
      open[s.handle] = i;
      Result<cuda::Event> ready = cuda::Event::create(cuda_->context(), false),
                          done = cuda::Event::create(cuda_->context(), false);
      if (!ready) return ready.error();
      if (!done) return done.error();
      NcclOp op;
      op.ready = std::move(ready).value();
      op.done = std::move(done).value();
      ops.emplace(i, std::move(op));
    } else if (s.op == "wait") {
      auto it = open.find(s.handle);
      if (it == open.end())
        return Diag{"", {}, plan_step_name(*rank_, i) + ": wait for handle " + std::to_string(s.handle) + " with no start"};
      NcclOp& op = ops.at(it->second);
      op.wait = i;
      op.out = s.out.at(0);
      start_of[i] = it->second;
      open.erase(it);
    }
  }
  if (!open.empty())
    return Diag{"", {}, plan_step_name(*rank_, open.begin()->second) + ": started but never waited for"};
  SF_TRY(cuda_->make_comm_stream());
  nccl_ops_ = std::move(ops);
  start_of_ = std::move(start_of);
  return {};
}

Result<void> RankExec::use_nccl(std::vector<std::unique_ptr<nccl::NcclComm>> comms) {
  const std::string who = "rank " + std::to_string(rank_->rank) + ": ";
  if (!cuda_) return Diag{"", {}, who + "NCCL needs --device cuda"};
  if (standin_) return Diag{"", {}, who + "the collectives already go through the copy stand-in"};
  if (static_cast<int>(comms.size()) != static_cast<int>(mesh_.dims.size()))
    return Diag{"", {}, who + std::to_string(comms.size()) + " NCCL communicator(s) for a mesh of " +
                            std::to_string(static_cast<int>(mesh_.dims.size())) + " dim(s)"};
  SF_TRY(pair_comm_stream_ops());
  for (auto& [i, op] : nccl_ops_) {
    const PlanStep& s = rank_->steps[i];
    std::optional<int> dim = mesh_.find(s.mesh_dim);
    if (!dim || *dim >= static_cast<int>(comms.size())) continue;  // reported when the step runs
    const std::vector<size_t> need =
        scratch_bytes(s, rank_->buffers[static_cast<size_t>(s.in.at(0))], rank_->buffers[static_cast<size_t>(op.out)],
                      comms[static_cast<size_t>(*dim)]->size());
    for (size_t slot = 0; slot < need.size(); ++slot)
      if (need[slot] > 0)
        if (Result<CUdeviceptr> p = scratch(op, slot, need[slot]); !p)
          return Diag{"", {}, plan_step_name(*rank_, i) + ": scratch space: " + p.error().message};
  }
  nccl_ = std::move(comms);
  return {};
}

// --- the copy stand-in ---------------------------------------------------------------------

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

Result<void> RankExec::use_copy_standin() {
  const std::string who = "rank " + std::to_string(rank_->rank) + ": ";
  if (!cuda_) return Diag{"", {}, who + "the copy stand-in needs --device cuda"};
  if (!nccl_.empty()) return Diag{"", {}, who + "the collectives already go through NCCL"};
  SF_TRY(pair_comm_stream_ops());
  for (auto& [i, op] : nccl_ops_) {
    const PlanStep& s = rank_->steps[i];
    std::optional<int> dim = mesh_.find(s.mesh_dim);
    if (!dim) return Diag{"", {}, plan_step_name(*rank_, i) + ": mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" +
                                      plan_->mesh + "\""};
    const size_t bytes = standin_bytes(s, rank_->buffers[static_cast<size_t>(s.in.at(0))],
                                       rank_->buffers[static_cast<size_t>(op.out)],
                                       static_cast<int>(mesh_.dims[static_cast<size_t>(*dim)].size));
    // Two buffers of their own: the copy reads and writes as much as a ring's
    // sends and receives, and touches none of the Plan's buffers.
    for (size_t slot = 0; slot < 2 && bytes > 0; ++slot)
      if (Result<CUdeviceptr> p = scratch(op, slot, bytes); !p)
        return Diag{"", {}, plan_step_name(*rank_, i) + ": stand-in space: " + p.error().message};
  }
  standin_ = true;
  return {};
}

// --- collectives through NCCL ------------------------------------------------------------

Result<CUdeviceptr> RankExec::scratch(NcclOp& op, size_t slot, size_t bytes) {
  // Allocated by use_nccl() (scratch_bytes()) and kept: it is only touched on the
  // comm stream, in stream order, so every run reuses it safely. Growing it here is
  // a fallback that scratch_bytes() makes unneeded.
  if (op.scratch.size() <= slot) op.scratch.resize(slot + 1);
  cuda::Buffer& b = op.scratch[slot];
  if (b.bytes() < bytes) {
    Result<cuda::Buffer> nb = cuda::Buffer::allocate(cuda_->context(), bytes);
    if (!nb) return nb.error();
    // Zeroed once, so padding that an uneven reduce-scatter reduces but nobody
    // keeps holds numbers, not whatever the allocation held.
    const cuda::Driver& d = cuda_->context().drv();
    SF_TRY(cuda::check(d.MemsetD8Async(nb->ptr(), 0, bytes, cuda_->comm_stream().get()), "cuMemsetD8Async (scratch)"));
    b = std::move(nb).value();
  }
  return b.ptr();
}

Result<void> RankExec::enqueue_collective(const PlanStep& s, NcclOp& op, nccl::NcclComm& c) {
  const cuda::Context& ctx = cuda_->context();
  const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(op.out)];
  const CUdeviceptr in = addr(s.in.at(0));
  const CUdeviceptr out = addr(op.out);
  const DType dt = ib.dtype;
  const size_t es = static_cast<size_t>(dtype_size(dt));
  const int n = c.size();
  const CUstream cs = cuda_->comm_stream().get();
  if (ob.dtype != dt) return Diag{"", {}, "the collective's input and output dtypes differ"};
  ReduceOp rop = ReduceOp::Sum;
  if (!s.reduce_op.empty()) {
    std::optional<ReduceOp> r = parse_reduce_op(s.reduce_op);
    if (!r) return Diag{"", {}, "unknown reduce_op \"" + s.reduce_op + "\""};
    rop = *r;
  }
  auto sizes_fit = [&](const std::vector<int64_t>& sizes, const std::vector<int64_t>& shape, int dim,
                       const char* what) -> Result<void> {
    if (static_cast<int>(sizes.size()) != n || dim < 0 || dim >= static_cast<int>(shape.size()) ||
        prefix_sums(sizes).back() != shape[static_cast<size_t>(dim)])
      return Diag{"", {}, std::string(what) + ": the sizes do not cut dim " + std::to_string(dim) + " of " +
                              TensorType{dt, shape}.str() + " into " + std::to_string(n) + " parts"};
    return {};
  };
  auto copy = [&](CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src, size_t src_pitch, size_t width, size_t height) {
    return cuda::copy_2d(ctx, dst, dst_pitch, src, src_pitch, width, height, cuda_->comm_stream());
  };

  if (s.collective() == CollectiveKind::AllReduce) {
    if (numel(ib.shape) != numel(ob.shape)) return Diag{"", {}, "all_reduce: input and output sizes differ"};
    return c.all_reduce(in, out, static_cast<size_t>(numel(ib.shape)), dt, rop, cs);
  }
  if (s.collective() == CollectiveKind::AllGather) {
    SF_TRY(sizes_fit(s.sizes, ob.shape, s.dim, "all_gather"));
    const size_t d = static_cast<size_t>(s.dim);
    const int64_t outer = prod(ob.shape, 0, d), inner = prod(ob.shape, d + 1, ob.shape.size());
    const std::vector<int64_t> at = prefix_sums(s.sizes);
    if (at.back() * outer * inner == 0) return {};
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
      SF_TRY(c.all_gather(in, land, static_cast<size_t>(numel(ib.shape)), dt, cs));
    } else {
      std::vector<nccl::NcclComm::Transfer> sends, recvs;
      for (int k = 0; k < n; ++k) {
        sends.push_back({k, in, static_cast<size_t>(numel(ib.shape))});
        recvs.push_back({k, land + static_cast<CUdeviceptr>(outer * at[static_cast<size_t>(k)] * inner) * es,
                         static_cast<size_t>(outer * s.sizes[static_cast<size_t>(k)] * inner)});
      }
      SF_TRY(c.send_recv(sends, recvs, dt, cs));
    }
    if (outer == 1) return {};
    for (int k = 0; k < n; ++k) {
      const size_t width = static_cast<size_t>(s.sizes[static_cast<size_t>(k)] * inner) * es;
      SF_TRY(copy(out + static_cast<size_t>(at[static_cast<size_t>(k)] * inner) * es,
                  static_cast<size_t>(at.back() * inner) * es,
                  land + static_cast<size_t>(outer * at[static_cast<size_t>(k)] * inner) * es, width, width,
                  static_cast<size_t>(outer)));
    }
    return {};
  }
  if (s.collective() == CollectiveKind::ReduceScatter) {
    SF_TRY(sizes_fit(s.sizes, ib.shape, s.dim, "reduce_scatter"));
    const size_t d = static_cast<size_t>(s.dim);
    const int64_t outer = prod(ib.shape, 0, d), inner = prod(ib.shape, d + 1, ib.shape.size());
    const std::vector<int64_t> at = prefix_sums(s.sizes);
    const int64_t most = *std::max_element(s.sizes.begin(), s.sizes.end());
    const bool even = std::all_of(s.sizes.begin(), s.sizes.end(), [&](int64_t x) { return x == most; });
    const size_t block = static_cast<size_t>(outer * most * inner);  // elements per member, padded
    if (block == 0) return {};
    if (even && outer == 1) return c.reduce_scatter(in, out, block, dt, rop, cs);
    // Member k's part ([outer, sizes[k] * inner] of the input's columns) packed
    // contiguous into block k of scratch; NCCL reduces block by block.
    Result<CUdeviceptr> packed = scratch(op, 0, static_cast<size_t>(n) * block * es);
    if (!packed) return packed.error();
    for (int k = 0; k < n; ++k) {
      const size_t width = static_cast<size_t>(s.sizes[static_cast<size_t>(k)] * inner) * es;
      SF_TRY(copy(*packed + static_cast<size_t>(k) * block * es, width,
                  in + static_cast<size_t>(at[static_cast<size_t>(k)] * inner) * es,
                  static_cast<size_t>(at.back() * inner) * es, width, static_cast<size_t>(outer)));
    }
    if (even) return c.reduce_scatter(*packed, out, block, dt, rop, cs);
    Result<CUdeviceptr> mine = scratch(op, 1, block * es);
    if (!mine) return mine.error();
    SF_TRY(c.reduce_scatter(*packed, *mine, block, dt, rop, cs));
    // This member's part is the first numel(out) elements of its padded block.
    const size_t bytes = static_cast<size_t>(numel(ob.shape)) * es;
    return copy(out, bytes, *mine, bytes, bytes, 1);
  }
  if (s.collective() == CollectiveKind::AllToAll) {
    SF_TRY(sizes_fit(s.sizes, ib.shape, s.dim, "all_to_all (split)"));
    SF_TRY(sizes_fit(s.sizes2, ob.shape, s.dim2, "all_to_all (concat)"));
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
        SF_TRY(copy(send_base + static_cast<size_t>(outer1 * sat[static_cast<size_t>(k)] * inner1) * es, width,
                    in + static_cast<size_t>(sat[static_cast<size_t>(k)] * inner1) * es,
                    static_cast<size_t>(sat.back() * inner1) * es, width, static_cast<size_t>(outer1)));
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
    SF_TRY(c.send_recv(sends, recvs, dt, cs));
    if (!unpack_recv) return {};
    for (int k = 0; k < n; ++k) {
      const size_t width = static_cast<size_t>(s.sizes2[static_cast<size_t>(k)] * inner2) * es;
      SF_TRY(copy(out + static_cast<size_t>(rat[static_cast<size_t>(k)] * inner2) * es,
                  static_cast<size_t>(rat.back() * inner2) * es,
                  recv_base + static_cast<size_t>(outer2 * rat[static_cast<size_t>(k)] * inner2) * es, width,
                  width, static_cast<size_t>(outer2)));
    }
    return {};
  }
  return Diag{"", {}, "unknown step op \"" + s.op + "\""};
}

Result<void> RankExec::nccl_start(size_t i) {
  const PlanStep& s = rank_->steps[i];
  auto it = nccl_ops_.find(i);
  if (it == nccl_ops_.end()) return Diag{"", {}, "not a collective start"};
  NcclOp& op = it->second;
  const cuda::Context& ctx = cuda_->context();
  nccl::NcclComm* c = nullptr;
  if (!standin_) {
    std::optional<int> dim = mesh_.find(s.mesh_dim);
    if (!dim || *dim >= static_cast<int>(nccl_.size()))
      return Diag{"", {}, "mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" + plan_->mesh + "\""};
    c = nccl_[static_cast<size_t>(*dim)].get();
  }
  // The comm stream starts once the compute stream has written the operand.
  SF_TRY(op.ready.record(cuda_->stream()));
  SF_TRY(cuda::wait_event(ctx, cuda_->comm_stream(), op.ready));
  const std::string name = s.op + " " + rank_->buffers[static_cast<size_t>(s.in.at(0))].name;
  // The stand-in: one copy between its two scratch buffers (use_copy_standin).
  const size_t standin_bytes = standin_ && op.scratch.size() == 2 ? op.scratch[0].bytes() : 0;
  auto enqueue = [&]() -> Result<void> {
    if (c) return enqueue_collective(s, op, *c);
    if (standin_bytes == 0) return {};
    return cuda::check(ctx.drv().MemcpyDtoDAsync(op.scratch[1].ptr(), op.scratch[0].ptr(), standin_bytes,
                                                 cuda_->comm_stream().get()),
                       "cuMemcpyDtoDAsync (collective stand-in)");
  };
  const nlohmann::json args = {{"step", i},
                               {"bytes", c ? bytes(op.out) : standin_bytes},
                               {"via", c ? "nccl" : "d2d copy stand-in"},
                               {"mesh_dim", s.mesh_dim}};
  SF_TRY(timed(name, args, enqueue, Stream::Comm));
  ++nccl_ops_run_;
  return op.done.record(cuda_->comm_stream());
}

Result<void> RankExec::nccl_wait(size_t i) {
  auto it = start_of_.find(i);
  if (it == start_of_.end()) return Diag{"", {}, "a wait with no start"};
  // Only the compute stream waits, on the device; the host goes on enqueueing.
  return cuda::wait_event(cuda_->context(), cuda_->stream(), nccl_ops_.at(it->second).done);
}

}  // namespace sf
