// The emitter registry: one Emitter per KernelKind (STYLE.md #5).
// EmittedKernel owns a context and a module by unique_ptr; emitter.h only forward-
// declares them, so every file that destroys one includes their definitions.
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/emitter.h"

#include "codegen/kernels/along.h"
#include "codegen/kernels/attention.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/gather.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/kernels/reduction.h"

namespace sf {

namespace {

// KernelKind::Gather is a kernel of its own for one op that fusion does not merge:
// an embedding (gather.h) or an op along one dim (along.h: cumsum, argmax, argmin).
class GatherEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return is_along_group(spec) ? emit_along(spec, config, target) : emit_gather(spec, config, target);
  }
};

class PointwiseEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_pointwise(spec, config, target);
  }
};

}  // namespace

const Emitter& emitter_for(KernelKind k) {
  static const PointwiseEmitter pointwise;
  switch (k) {
    case KernelKind::Pointwise: return pointwise;
    case KernelKind::Reduction: return reduction_emitter();
    case KernelKind::Matmul: return matmul_emitter();
    case KernelKind::Attention: return attention_emitter();
    case KernelKind::Gather: {
      static const GatherEmitter gather;
      return gather;
    }
  }
  return pointwise;  // unreachable: the switch lists every kind (-Werror=switch)
}

}  // namespace sf
