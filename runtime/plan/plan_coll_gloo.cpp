// The host-staged collective backend (runtime/plan/plan_collectives.h): a start copies
// its operand to the host and queues it on the rank's Gloo comm thread (Comm); its
// wait takes the result and copies it into the output buffer. Traced as one event
// on the comm track from issue to wait, and the wait on the compute track.
#include "runtime/plan/plan_collectives.h"
#include "runtime/plan/plan_exec.h"

namespace sf {

Result<void> GlooCollectives::start(size_t step) {
  const PlanStep& s = x_.rank_->steps[step];
  const double t0 = x_.opts_.trace ? x_.now_us() : 0;
  // The operand, once the kernels before it have written it, to the host.
  Result<Tensor> x = x_.download(s.in.at(0));
  if (!x) return x.error();
  std::optional<int> dim = x_.mesh_.find(s.mesh_dim);
  if (!dim) return Diag{"", {}, "mesh dim \"" + s.mesh_dim + "\" is not in the plan's mesh \"" + x_.plan_->mesh + "\""};
  ReduceOp op = ReduceOp::Sum;
  if (!s.reduce_op.empty()) {
    std::optional<ReduceOp> r = parse_reduce_op(s.reduce_op);
    if (!r) return Diag{"", {}, "unknown reduce_op \"" + s.reduce_op + "\""};
    op = *r;
  }
  std::optional<CollectiveKind> kind = s.collective();
  if (!kind) return Diag{"", {}, "unknown step op \"" + s.op + "\""};
  if (pending_.count(s.handle))
    return Diag{"", {}, "handle " + std::to_string(s.handle) + " is started again before its wait"};
  switch (*kind) {
    case CollectiveKind::AllGather:
      pending_.emplace(s.handle, comm_.all_gather(*dim, std::move(x).value(), s.dim, s.sizes));
      break;
    case CollectiveKind::ReduceScatter:
      pending_.emplace(s.handle, comm_.reduce_scatter(*dim, std::move(x).value(), s.dim, s.sizes, op));
      break;
    case CollectiveKind::AllReduce: pending_.emplace(s.handle, comm_.all_reduce(*dim, std::move(x).value(), op)); break;
    case CollectiveKind::AllToAll:
      pending_.emplace(s.handle, comm_.all_to_all(*dim, std::move(x).value(), s.dim, s.sizes, s.dim2, s.sizes2));
      break;
  }
  ++started_;
  if (x_.opts_.trace) issued_[s.handle] = {t0, s.op + " " + x_.rank_->buffers[static_cast<size_t>(s.in.at(0))].name};
  return {};
}

Result<void> GlooCollectives::wait(size_t step) {
  const PlanStep& s = x_.rank_->steps[step];
  const double t0 = x_.opts_.trace ? x_.now_us() : 0;
  auto it = pending_.find(s.handle);
  if (it == pending_.end()) return Diag{"", {}, "wait for handle " + std::to_string(s.handle) + " with no start"};
  Result<Tensor> t = it->second.wait();
  pending_.erase(it);
  if (!t) return t.error();
  SF_TRY(x_.upload(s.out.at(0), *t));
  if (x_.opts_.trace) {
    const double t1 = x_.now_us();
    const auto& [at, name] = issued_[s.handle];
    x_.opts_.trace->add(x_.rank_->rank, Stream::Comm, name + " (host-staged)", at, t1 - at,
                        {{"step", step}, {"bytes", x_.bytes(s.out.at(0))}}, "collective");
    x_.opts_.trace->add(x_.rank_->rank, Stream::Compute,
                        "wait " + x_.rank_->buffers[static_cast<size_t>(s.out.at(0))].name, t0, t1 - t0,
                        {{"step", step}}, "wait");
  }
  return {};
}

}  // namespace sf
