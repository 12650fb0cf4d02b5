// The Plan's kernel step (runtime/plan/plan_exec.h): the step's buffers, inputs then
// outputs, handed to the device, which launches the kernel (a PTX function on a GPU,
// the kernel's host code on the CPU) and zeroes the outputs first where it asks.
#include "runtime/plan/plan_exec.h"

namespace sf {

Result<void> RankExec::launch_step(size_t i) {
  const PlanStep& s = rank_->steps[i];
  std::vector<PlanDevice::Mem> args;
  for (int b : s.in) args.push_back({addr(b), bytes(b)});
  for (int b : s.out) args.push_back({addr(b), bytes(b)});
  ++launches_;
  return dev_->launch(i, s, args, s.in.size());
}

}  // namespace sf
