// The Plan's collective steps staged through the host (runtime/plan/plan_exec.h): a start
// copies its operand to the host and hands it to the CPU backend (Comm, Gloo) on the
// rank's comm thread; its wait takes the result and copies it into the output
// buffer. With NCCL on a GPU, runtime/plan/plan_step_nccl.cpp runs them instead.
#include "runtime/plan/plan_exec.h"

namespace sf {

Result<void> RankExec::collective(const PlanStep& s, Comm& comm, std::map<int, Work>& pending) {
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
  return {};
}

}  // namespace sf
