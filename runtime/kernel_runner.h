// How an executor runs a fused kernel step. The runtime does not depend on LLVM,
// so code generation plugs its compiled kernels in through this interface; the
// reference runner evaluates the kernel's group with the reference evaluator and
// is both the fallback and the oracle for generated kernels.
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
