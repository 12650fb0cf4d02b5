// Runs fused kernels as generated host code (the `--device cpu` path): each
// kernel's group goes through its kind's emitter for the host and the ORC JIT,
// once per distinct kernel (ranks with the same local shapes share it), and is
// called with its operands' buffers. A kernel whose emitter cannot handle it runs
// on the reference evaluator instead, and is counted, so a run never fails for a
// missing emitter and says how much ran as generated code.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "codegen/kernels/emitter.h"
#include "codegen/dist/kernel_runner.h"

namespace sf {

class HostKernelRunner final : public KernelRunner {
 public:
  // `choose` (optional) picks each kernel's config (the autotuner's choice);
  // otherwise every kernel uses `config`.
  using Chooser = std::function<KernelConfig(const LocalKernel&)>;
  static Result<std::unique_ptr<HostKernelRunner>> create(KernelConfig config = {}, Chooser choose = {},
                                                          Precision precision = Precision::Fused);
  ~HostKernelRunner() override;

  Result<std::vector<Tensor>> run(const LocalKernel& k, const std::vector<const Tensor*>& inputs) const override;

  struct Stats {
    int compiled = 0;     // distinct kernels JIT-compiled
    int generated = 0;    // kernel launches that ran generated code
    int fallbacks = 0;    // launches that ran on the reference evaluator
    std::map<std::string, std::string> fallback_reasons;  // kernel name -> why
  };
  Stats stats() const;

 private:
  HostKernelRunner(KernelConfig config, Chooser choose, Precision precision);
  using Entry = void (*)(void** args);
  struct Compiled {
    Entry fn = nullptr;     // null: no generated code, see reason
    std::string reason;
  };
  const Compiled& compile(const LocalKernel& k) const;

  KernelConfig config_;
  Chooser choose_;
  Precision precision_;
  std::unique_ptr<llvmb::HostJit> jit_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Compiled> cache_;  // key: kind + group text
  mutable Stats stats_;
};

// For RankPipelineOptions::can_emit: whether the kernel's emitter accepts it for
// `target` (emits the module and drops it; no compilation).
std::function<bool(const LocalKernel&)> emit_checker(const llvmb::Target& target, KernelConfig config = {});


}  // namespace sf
