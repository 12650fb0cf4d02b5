// A Plan rank's device on the host CPU (runtime/plan/plan_device.h): buffers in host
// memory, every operation done when it returns, kernels from the Plan's host code:
//   - `exec --device cpu`: the shared object `shardfuse compile` writes into the Plan
//     directory (Plan::host_object, one symbol per kernel), opened with dlopen, so
//     a machine without LLVM runs it;
//   - `run`: the same kernels JIT-compiled in this process (codegen/kernels'
//     host_plan_kernels).
// Either way the steps run through the executor the GPU uses (RankExec).
//
// A host object is code: `exec` runs what the Plan directory holds, as it runs its
// PTX on a GPU. Run Plans you trust, as you would a binary.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/plan/plan_device.h"
#include "runtime/plan/plan_exec.h"

namespace sf {

struct HostKernel {
  using Entry = void (*)(void** args);  // a generated kernel: args are the step's inputs, then its outputs
  // Runs the kernel on those args: a generated entry, or (run --kernels reference,
  // and kernels the host emitter cannot build) the reference evaluator on the
  // kernel's group.
  std::function<Result<void>(void** args)> fn;
  bool zero_outputs = false;
  bool generated = true;  // false: the reference evaluator
};

// The host code of a Plan's kernels, by PlanKernel id, and what keeps it loaded.
class HostKernels {
 public:
  std::map<std::string, HostKernel> by_id;
  std::map<std::string, std::string> missing;  // kernel id -> why it has no host code
  std::shared_ptr<void> owner;                 // the dlopen handle, or the JIT
  std::string origin;                          // where the code came from, for messages
};

// Opens a Plan directory's host object (Plan::host_object) and finds every kernel's
// symbol in it. The Diag names the file and what is wrong: no host object (a Plan
// compiled with --no-host), not a regular file, one that
// dlopen refuses (its message), a symbol it lacks.
Result<std::shared_ptr<const HostKernels>> load_host_kernels(const PlanSource& src);

class HostPlanDevice final : public PlanDevice {
 public:
  explicit HostPlanDevice(std::shared_ptr<const HostKernels> kernels);
  ~HostPlanDevice() override;

  std::string kind() const override { return "cpu"; }
  Result<Addr> allocate(size_t bytes) override;
  Result<void> prepare(const PlanRank& rank, const std::vector<Addr>& buffers) override;
  Result<void> upload(Addr dst, const void* src, size_t bytes) override;
  Result<void> download(void* dst, Addr src, size_t bytes) override;
  Result<void> zero(Addr dst, size_t bytes) override;
  Result<void> copy_2d(Addr dst, size_t dst_pitch, Addr src, size_t src_pitch, size_t width,
                       size_t height) override;
  Result<void> launch(size_t step, const PlanStep& s, const std::vector<Mem>& args, size_t inputs) override;
  Result<void> synchronize() override { return {}; }
  Result<int> mark(Stream stream) override;
  Result<double> elapsed_us(int from, int to) override;

 private:
  std::shared_ptr<const HostKernels> kernels_;
  std::vector<void*> memory_;  // what allocate() gave, freed with the device
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace sf
