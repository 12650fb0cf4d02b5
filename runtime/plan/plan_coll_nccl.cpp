// The NCCL collective backend (runtime/plan/plan_collectives.h): each start step's
// collective enqueued on the rank's comm stream through the rank's communicator of its
// mesh dim (the ordering is CommStreamCollectives'); uneven shards and gathers along
// inner dims are packed and unpacked with strided copies on the comm stream around
// the NCCL call.
#include <algorithm>

#include "runtime/core/collective.h"
#include "runtime/plan/plan_collectives.h"
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

// The scratch bytes (per slot) NcclCollectives::enqueue_collective packs and unpacks
// through for collective `s` over n members, from `in` to `out`: allocated before
// the first collective is enqueued (NcclCollectives::create), since allocating (and above all freeing, which
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

Result<std::unique_ptr<NcclCollectives>> NcclCollectives::create(RankExec& rank,
                                                                 std::vector<std::unique_ptr<nccl::NcclComm>> comms) {
  const std::string who = "rank " + std::to_string(rank.rank_->rank) + ": ";
  if (static_cast<int>(comms.size()) != static_cast<int>(rank.mesh_.dims.size()))
    return Diag{"", {}, who + std::to_string(comms.size()) + " NCCL communicator(s) for a mesh of " +
                            std::to_string(static_cast<int>(rank.mesh_.dims.size())) + " dim(s)"};
  std::unique_ptr<NcclCollectives> c(new NcclCollectives(rank));
  c->comms_ = std::move(comms);
  SF_TRY(c->pair_ops());
  const PlanRank& r = *rank.rank_;
  for (auto& [i, op] : c->ops_) {
    const PlanStep& s = r.steps[i];
    std::optional<int> dim = rank.mesh_.find(s.mesh_dim);
    if (!dim || *dim >= static_cast<int>(c->comms_.size())) continue;  // reported when the step runs
    const std::vector<size_t> need = scratch_bytes(s, r.buffers[static_cast<size_t>(s.in.at(0))],
                                                   r.buffers[static_cast<size_t>(op.out)],
                                                   c->comms_[static_cast<size_t>(*dim)]->size());
    for (size_t slot = 0; slot < need.size(); ++slot)
      if (need[slot] > 0)
        if (Result<CUdeviceptr> p = c->scratch(op, slot, need[slot]); !p)
          return Diag{"", {}, plan_step_name(r, i) + ": scratch space: " + p.error().message};
  }
  return c;
}

Result<void> NcclCollectives::finish() {
  for (auto& c : comms_) SF_TRY(c->wait_with_timeout(x_.cuda_->comm_stream().get()));
  return {};
}

void NcclCollectives::quiesce() {
  // A collective whose peer is gone would keep the comm stream busy forever: wait
  // for it under the timeout, which aborts the communicator (and so ends its
  // kernels) when it passes.
  if (!x_.cuda_->context().make_current().ok()) return;
  for (auto& c : comms_)
    if (!c->aborted()) (void)c->wait_with_timeout(x_.cuda_->comm_stream().get());
}

Result<void> NcclCollectives::enqueue(size_t step, Op& op, size_t& bytes, std::string& via) {
  const PlanStep& s = x_.rank_->steps[step];
  via = "nccl";
  bytes = x_.bytes(op.out);
  std::optional<int> dim = x_.mesh_.find(s.mesh_dim);
  if (!dim || *dim >= static_cast<int>(comms_.size()))
    return Diag{"", {}, "mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" + x_.plan_->mesh + "\""};
  return enqueue_collective(s, op, *comms_[static_cast<size_t>(*dim)]);
}

Result<void> NcclCollectives::enqueue_collective(const PlanStep& s, Op& op, nccl::NcclComm& c) {
  const cuda::Context& ctx = x_.cuda_->context();
  const PlanBuffer& ib = x_.rank_->buffers[static_cast<size_t>(s.in.at(0))];
  const PlanBuffer& ob = x_.rank_->buffers[static_cast<size_t>(op.out)];
  const CUdeviceptr in = x_.addr(s.in.at(0));
  const CUdeviceptr out = x_.addr(op.out);
  const DType dt = ib.dtype;
  const size_t es = static_cast<size_t>(dtype_size(dt));
  const int n = c.size();
  const CUstream cs = x_.cuda_->comm_stream().get();
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
    return cuda::copy_2d(ctx, dst, dst_pitch, src, src_pitch, width, height, x_.cuda_->comm_stream());
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

}  // namespace sf
