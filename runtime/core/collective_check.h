// The shape rules of one collective call and of two members' calls meeting, in one
// place for both checkers that need them: the stage verifier on per-rank programs
// (codegen/fusion/verify_programs.h) and the Plan verifier on plan.json
// (runtime/plan/plan_verify.h). The rules are runtime/comm/comm.h's (what Comm and NCCL do).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/core/collective.h"
#include "runtime/core/mesh.h"
#include "runtime/core/diag.h"
#include "runtime/core/tensor.h"

namespace sf {

// One member's call of a collective: what it passes, and where it sits in its group.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::AllReduce;
  ReduceOp op = ReduceOp::Sum;
  int dim = 0, dim2 = 0;
  std::vector<int64_t> sizes, sizes2;
  TensorType in;
  int member = 0;   // this rank's position in the group
  int members = 1;  // the group's size
};

// The type the call gives this member (what its wait receives), or why its fields
// do not fit its operand: dims out of range, sizes not one per member, negative, or
// not cutting the operand (all_gather: sizes[member] is the operand's extent along
// dim; reduce_scatter and all_to_all: the sizes sum to it).
Result<TensorType> collective_result(const CollectiveCall& c);

// Why the calls of members a and b of one group, the k-th each makes on it, cannot
// meet (another op, reduction, dim or sizes; shapes that differ where they must be
// equal; an all_to_all chunk a sends b that is not the chunk b expects from a), or
// nullopt. Both calls must have passed collective_result.
std::optional<std::string> collective_mismatch(const CollectiveCall& a, const CollectiveCall& b);

}  // namespace sf
