// Where one rank of a Plan runs. The Plan executor (runtime/plan/plan_exec.h's RankExec)
// owns the step logic (buffers, kernel and library steps, slices, concats,
// partialize, collectives, their order and the trace); a PlanDevice gives it memory,
// an in-order compute stream, kernel launches, copies and timing marks. Two devices
// implement it, so the GPU's step logic is the one the CPU tests run:
//   - a CUDA GPU (runtime/plan/plan_cuda.h): PTX modules, cuMemcpy, CUDA events;
//   - the host CPU (runtime/plan/plan_host.h): the Plan's host kernels (a shared object
//     or JIT-compiled code), plain memory, every operation done when it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/diag.h"
#include "runtime/plan/plan.h"
#include "runtime/io/trace.h"

namespace sf {

class PlanDevice {
 public:
  // A buffer's address on the device: a CUdeviceptr, or a host pointer.
  using Addr = uint64_t;
  struct Mem {
    Addr addr = 0;
    size_t bytes = 0;
  };

  virtual ~PlanDevice() = default;
  // "cuda" or "cpu": what error messages and stats call it.
  virtual std::string kind() const = 0;

  // `bytes` of device memory (contents undefined), kept until the device is gone.
  virtual Result<Addr> allocate(size_t bytes) = 0;
  // Called once the rank's buffers are allocated (buffers[i]: Plan buffer i), before
  // any step runs: the device checks that it can run every kernel step of `rank`
  // (naming the step when not) and prepares per-step state (TMA tensor maps).
  virtual Result<void> prepare(const PlanRank& rank, const std::vector<Addr>& buffers) = 0;

  // Copies between host memory and a buffer; they return when done, after every
  // operation enqueued before them.
  virtual Result<void> upload(Addr dst, const void* src, size_t bytes) = 0;
  virtual Result<void> download(void* dst, Addr src, size_t bytes) = 0;

  // Enqueued on the compute stream, in order.
  virtual Result<void> zero(Addr dst, size_t bytes) = 0;
  // `height` rows of `width` bytes, `src_pitch` and `dst_pitch` bytes apart.
  virtual Result<void> copy_2d(Addr dst, size_t dst_pitch, Addr src, size_t src_pitch, size_t width,
                               size_t height) = 0;
  // Kernel step `step` (s.op == "kernel"): s.kernel on `args`, the step's input
  // buffers then its outputs (the first `inputs` are inputs). The device zeroes the
  // outputs first when its kernel asks for it (split-K adds into them).
  virtual Result<void> launch(size_t step, const PlanStep& s, const std::vector<Mem>& args,
                              size_t inputs) = 0;
  // Waits for everything enqueued.
  virtual Result<void> synchronize() = 0;

  // Trace timing: a mark recorded in `stream`'s order (a CUDA event, or the time
  // now on the host), and the microseconds between two marks once both are done.
  virtual Result<int> mark(Stream stream) = 0;
  virtual Result<double> elapsed_us(int from, int to) = 0;
};

}  // namespace sf
