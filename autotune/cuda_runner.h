// The CUDA Runner: times one built PTX candidate on the device for the autotuner,
// behind the same Runner interface as the host Runner (autotune/builder.h) and
// with the same measure() (autotune/measure.h): warm-up by time, a cache flush
// before every timed repetition, the median with quantiles and outliers. Only the
// clock differs: each repetition is bracketed by a pair of CUDA events.
//
// Per candidate:
//   1. the PTX is linked by the driver's JIT (cuda::Module::load_ptx); a PTX the
//      JIT rejects is a Diag carrying the JIT's error log;
//   2. one launch, synchronised, so that a fault shows before any timing; then
//      three launches, each timed with events, estimate one launch;
//   3. a kernel estimated under CudaRunnerOptions::graph_below_us (10 us) is timed
//      in CUDA-graph mode: N back-to-back launches captured in one graph, the graph
//      timed, the time divided by N. A single launch that short is dominated by
//      the launch's own overhead and the events' ~0.5 us resolution. The flush is
//      then once per graph, not once per launch (docs/autotuning.md);
//   4. measure() with hooks: `restore` zeroes the outputs when the launch asks for
//      it (split-K adds into them), `flush` overwrites a 256 MiB buffer with
//      cuMemsetD32Async (more than an H100's 50 MiB or an H200's 60 MiB of L2),
//      `run` records start, launches (or replays the graph), records end and waits.
// A failed launch or a fault inside the kernel is a Diag (the tuner marks the
// config invalid with it). A fault is sticky, so the runner then resets the
// device's primary context (cuda::Context::reset) and allocates its buffers again
// for the next candidate, and tuning goes on.
//
// The context is the process's primary context: a reset also invalidates what
// other code made in it. The tuner measures alone, so nothing else is affected.
// No LLVM here: the PTX builder (codegen/kernels/tune.cpp) fills PtxArtifact.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autotune/builder.h"
#include "autotune/tuner.h"
#include "runtime/core/tensor.h"
#include "runtime/gpu/cublas.h"
#include "runtime/gpu/cuda.h"
#include "runtime/gpu/gemm.h"
#include "runtime/plan/plan.h"

namespace sf {

// One argument of the kernel ABI (docs/kernels.md): its storage dtype and element
// count, which size its device buffer.
struct KernelArgSpec {
  DType dtype = DType::F32;
  int64_t elements = 0;
  int64_t bytes() const { return elements * dtype_size(dtype); }
  bool operator==(const KernelArgSpec&) const = default;
};

// What the PTX builder makes of one candidate config and the CUDA Runner times.
struct PtxArtifact final : Artifact {
  std::string config;  // the config text it was built from (for the record: tune --emit-candidates)
  std::string ptx;    // the whole module
  std::string entry;  // its .entry
  cuda::LaunchDims launch;
  bool zero_outputs = false;  // zero the outputs before each launch (split-K adds into them)
  // Bytes of scratch passed last (after the tensor maps), zeroed when allocated (the
  // kernel leaves it zero): a split-K kernel's workspace (LaunchShape::workspace_bytes);
  // 0: none.
  int64_t workspace_bytes = 0;
  // A persistent walk (LaunchShape::persistent): launched with at most the blocks the
  // device holds at once (cuda::resident_grid), as exec launches it.
  bool persistent = false;
  // The kernel's arguments in ABI order; when set, the runner checks that its
  // buffers match them.
  std::vector<KernelArgSpec> inputs, outputs;
  // TMA tensor maps over inputs (plan.h's PlanTensorMap), encoded over the runner's
  // input buffers and passed after the outputs.
  std::vector<PlanTensorMap> tensor_maps;
};

// An extern candidate (autotune/tuner.h): a library GEMM (runtime/gpu/gemm.h) on the
// runner's own arguments, timed exactly as a kernel is (the same probe, estimate,
// CUDA-graph mode, flush and events), through cuBLASLt or cuBLAS (runtime/gpu/cublas.h)
// with a kGemmWorkspaceBytes workspace. Its library must be there, else the run is a
// Diag saying why.
//
// With an `epilogue` it is the split candidate ("extern=cublaslt+epilogue",
// codegen/kernels/extern_gemm.h): the library writes the bare product into output
// `c`, or, when c is kGemmProduct, into a buffer the runner keeps for it; then the
// epilogue kernel (a PtxArtifact, JIT-linked like a candidate) reads it and writes
// the outputs the group computes after the matmul. A run is the call and the launch,
// back to back on one stream, timed by one pair of events (and captured together
// in graph mode).
struct GemmArtifact final : Artifact {
  GemmDesc desc;
  int a = -1, b = -1, bias = -1;  // indices among the kernel's inputs (bias: -1 without one)
  int c = 0;                      // index among its outputs, or kGemmProduct (with an epilogue)
  std::shared_ptr<const PtxArtifact> epilogue;
  // The epilogue kernel's arguments: per input, an index among the runner's inputs or
  // kGemmProduct (the GEMM's C); per output, an index among the runner's outputs.
  // Their sizes must be the epilogue's own `inputs` and `outputs` specs.
  std::vector<int> epilogue_in, epilogue_out;
};

// The cuBLAS and cuBLASLt this process opens (runtime/gpu/cublas.h): their versions, or
// why they cannot be opened.
GemmLibraries local_gemm_libraries();

struct CudaRunnerOptions {
  int device = 0;
  // The L2 flush buffer. BenchOptions::flush_bytes > 0 overrides it per run.
  int64_t flush_bytes = int64_t{256} << 20;
  // Kernels whose estimate is below this are timed in CUDA-graph mode; 0: never.
  double graph_below_us = 10;
  // A graph holds enough launches to run about this long (clamped to
  // [2, max_graph_launches]): 200 us puts the events' 0.5 us resolution at 0.25%.
  double graph_target_us = 200;
  int max_graph_launches = 500;
};

// What the last run() did, for tests and progress output.
struct CudaRunInfo {
  bool graph_mode = false;
  int launches_per_timing = 1;  // N in graph mode
  double estimate_us = 0;       // from the three single timed launches
  int flushes = 0;              // flush-buffer memsets issued
  int timed_runs = 0;           // event-timed runs, warm-up included
  int zeroings = 0;             // output zeroings issued
  bool recovered = false;       // the context was reset after this candidate
};

class CudaRunner final : public Runner {
 public:
  // A runner on device o.device with these input values (copied to the device once;
  // seeded random values, as the host runner's) and outputs of these sizes.
  // "no CUDA device: ..." without a driver or a GPU.
  static Result<std::unique_ptr<CudaRunner>> create(std::vector<Tensor> inputs, std::vector<KernelArgSpec> outputs,
                                                    CudaRunnerOptions o = {});
  ~CudaRunner() override;

  // Times a PtxArtifact or a GemmArtifact. A Diag when it cannot: another artifact,
  // arguments that differ from this runner's, the JIT's log, the library missing or
  // refusing the GEMM, a launch error or a fault. After a fault the context is
  // reset; where the driver keeps the fault through the reset (driver 580 on an
  // H200 did), CUDA cannot be used again in this process: lost() turns true and
  // every later run fails at once, saying so (measure the rest in a new process,
  // as tune --measure does).
  Result<Measurement> run(const Artifact& a, const BenchOptions& opts) override;

  const CudaRunInfo& last_run() const { return info_; }
  const cuda::DeviceInfo& device() const { return ctx_->info(); }
  // How many times a fault made this runner reset the context.
  int recoveries() const { return recoveries_; }
  // A fault left CUDA unusable in this process (the reset after it failed).
  bool lost() const { return lost_; }

 private:
  CudaRunner() = default;
  Result<void> ensure_ready(int64_t flush_bytes);
  // Releases every handle made in the context (stream, events, buffers, cuBLAS).
  void drop_handles();
  // The GEMM prepared on this runner's context and arguments (its handle and
  // workspace made on first use, again after a reset).
  Result<cublas::GemmCall> prepare_gemm(const GemmArtifact& g);
  // The device pointers a split candidate's epilogue kernel is launched with, each
  // checked against its spec; the product buffer allocated when it needs one.
  Result<std::vector<CUdeviceptr>> epilogue_args(const GemmArtifact& g);
  // After a failure: if the context no longer works (a sticky fault), reset it and
  // drop every handle made in it. Returns a note for the Diag, "" when nothing was done.
  std::string recover();

  std::shared_ptr<cuda::Context> ctx_;
  CudaRunnerOptions opts_;
  std::vector<Tensor> host_inputs_;
  std::vector<KernelArgSpec> input_specs_, output_specs_;
  // Handles in the context's current generation (ready_ tells).
  bool ready_ = false;
  uint64_t generation_ = 0;
  cuda::Stream stream_;
  cuda::Event start_, end_;
  std::vector<cuda::Buffer> inputs_, outputs_;
  cuda::Buffer flush_;
  std::optional<cublas::Handle> blas_;
  cuda::Buffer gemm_workspace_;
  cuda::Buffer gemm_product_;  // a split candidate's product, when it is no output
  uint32_t flush_value_ = 0;
  CudaRunInfo info_;
  int recoveries_ = 0;
  bool lost_ = false;
};

// Seeded random values for an argument spec (floats uniform in [-1, 1) rounded to
// the dtype, integers in [0, 8), bools fair): what benchmarks and tests feed kernels
// when they have no graph to take random_inputs() from.
Tensor random_tensor(DType dtype, const Shape& shape, uint64_t seed);

}  // namespace sf
