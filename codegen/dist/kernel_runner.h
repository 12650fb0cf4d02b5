// How the lockstep simulator (codegen/dist/lockstep.h) runs a fused kernel step of a
// LocalProgram: the reference runner evaluates the kernel's group with the reference
// evaluator; codegen/kernels' HostKernelRunner plugs in generated host code, so the
// tests that check emitters op by op can run whole programs. (The Plan executor,
// runtime/plan/plan_exec.h, runs Plans, not LocalPrograms.)
#pragma once

#include <vector>

#include "codegen/dist/local_program.h"

namespace sf {

class KernelRunner {
 public:
  virtual ~KernelRunner() = default;
  // One tensor per output of k.group, from one per input. Must be thread-safe:
  // every rank thread calls it.
  virtual Result<std::vector<Tensor>> run(const LocalKernel& k, const std::vector<const Tensor*>& inputs) const = 0;
};

const KernelRunner& reference_kernel_runner();

}  // namespace sf
