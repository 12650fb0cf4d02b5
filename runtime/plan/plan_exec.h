// Runs a Plan: the one executor, for the host CPU and for GPUs (RankExec over a
// PlanDevice, runtime/plan/plan_device.h). Every buffer of a rank lives in the device's
// memory, kernel steps launch the kernel on the rank's compute stream (the Plan's PTX
// with its grid/block/shared memory on a GPU, its host code on the CPU), gemm steps
// call cuBLASLt or cuBLAS on that stream (GPU only, runtime/plan/plan_step_gemm.cpp), and
// slices and concats are strided copies. Collective start and wait steps go to the
// rank's collective backend (runtime/plan/plan_collectives.h): host-staged through
// Gloo (any device; always on the CPU), NCCL on a comm stream (a GPU per rank), or
// the copy stand-in that times NCCL's stream ordering on one GPU.
// No LLVM: a Plan compiled on another machine runs here.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/comm/comm.h"
#include "runtime/gpu/cuda.h"
#include "runtime/comm/nccl.h"
#include "runtime/plan/plan.h"
#include "runtime/plan/plan_collectives.h"
#include "runtime/plan/plan_device.h"
#include "runtime/io/trace.h"

namespace sf {

// A Plan with its kernels' PTX text.
struct PlanSource {
  Plan plan;
  std::map<std::string, std::string> ptx;  // PlanKernel::ptx_file -> PTX text
  std::string dir;                         // where it was read from ("" when built in memory)
};

// Reads and checks a Plan directory, naming the file and what is wrong: plan.json
// missing or malformed (its line:col), another version, a kernel's .ptx missing,
// empty, or without the kernel's .entry.
Result<PlanSource> read_plan_dir(const std::string& dir);

enum class GpuCollectives : uint8_t {
  Host,  // staged through the host and the CPU backend (Gloo)
  Nccl,  // NCCL on a comm stream per rank; every rank on its own GPU
  // A device-to-device copy of each collective's bus bytes on the comm stream
  // (CopyStandinCollectives): times the interleaving on any number of GPUs, one
  // included; the outputs are not the collectives' results.
  CopyStandin,
};

struct GpuRunOptions {
  int device = 0;
  // Rank r runs on GPU device + r % gpus (run_plan_on_gpu).
  int gpus = 1;
  GpuCollectives collectives = GpuCollectives::Host;
  // With Nccl: the communicators' options (max_ctas: the SMs NCCL's kernels may
  // take from ours). Their timeout is `timeout`.
  nccl::Options nccl;
  // Capture each rank's kernel sequence between collectives as a CUDA Graph once
  // and replay it (launch overhead matters for the examples' small kernels).
  bool cuda_graph = false;
  std::chrono::milliseconds timeout{60000};  // per collective
  // When set: every kernel (or, with cuda_graph, every graph launch) becomes an
  // event timed by CUDA events on the rank's compute thread, and every collective
  // an event on its comm thread: timed by CUDA events on the comm stream with
  // NCCL, from its issue to its wait (wall time) when host-staged.
  // Microseconds since trace_origin.
  TraceWriter* trace = nullptr;
  std::chrono::steady_clock::time_point trace_origin = std::chrono::steady_clock::now();
  // Test hook, called before every step of every rank with the rank's Comm (every
  // step then runs on its own, outside any CUDA graph); a Diag or an exception ends
  // the rank there. A hook may block to stall its rank, until comm->aborted().
  std::function<Result<void>(int rank, size_t step, const Comm* comm)> before_step;
};

// A Plan's kernels loaded on a GPU, shared by its ranks.
class GpuPlan {
 public:
  static Result<std::shared_ptr<GpuPlan>> load(std::shared_ptr<cuda::Context> ctx, const PlanSource& src);
  const Plan& plan() const { return src_.plan; }
  const Mesh& mesh() const { return mesh_; }  // plan().mesh, parsed once
  cuda::Context& context() const { return *ctx_; }
  // The function of kernel `id` and its launch.
  struct Loaded {
    CUfunction fn{};
    cuda::LaunchDims dims;
    bool zero_outputs = false;
    int64_t workspace_bytes = 0;
  };
  const Loaded& kernel(const std::string& id) const { return kernels_.at(id); }

 private:
  std::shared_ptr<cuda::Context> ctx_;
  PlanSource src_;
  Mesh mesh_;
  std::vector<cuda::Module> modules_;
  std::map<std::string, Loaded> kernels_;
};

class CudaPlanDevice;  // runtime/plan/plan_cuda.h
class HostKernels;     // runtime/plan/plan_host.h

// One rank of a Plan on a device (runtime/plan/plan_device.h): its buffers allocated
// once, its steps run in order. The step logic is the same on every device; the
// GPU adds NCCL on a comm stream, CUDA graphs and library GEMM steps.
class RankExec {
 public:
  // On a GPU: the Plan's PTX loaded there (GpuPlan).
  static Result<std::unique_ptr<RankExec>> create_cuda(std::shared_ptr<GpuPlan> plan, int rank,
                                                       const GpuRunOptions& opts);
  // On the host CPU: the Plan's host kernels (runtime/plan/plan_host.h). opts.cuda_graph
  // and NCCL are GPU-only and refused.
  static Result<std::unique_ptr<RankExec>> create_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels,
                                                       int rank, const GpuRunOptions& opts);
  ~RankExec();

  const PlanRank& rank() const { return *rank_; }

  // From now on the Plan's collectives go through NCCL (GPU only): comms[d] is this
  // rank's communicator along mesh dim d, on this rank's device. Makes the comm
  // stream and an event pair per collective (NcclCollectives).
  Result<void> use_nccl(std::vector<std::unique_ptr<nccl::NcclComm>> comms);
  bool uses_nccl() const { return dynamic_cast<const NcclCollectives*>(coll_.get()) != nullptr; }
  // A stand-in for NCCL on one GPU (GPU only): every collective becomes one
  // device-to-device copy on the comm stream of its bus bytes (the payload times
  // nccl-tests' bus factor for the mesh dim's size: what each rank's busiest link
  // carries in a ring), ordered by the same events as NCCL's. It times how the
  // comm stream interleaves with the kernels without the other ranks; the copies
  // move memory, not data between ranks, so the results are not the collectives'.
  Result<void> use_copy_standin();
  bool uses_copy_standin() const { return dynamic_cast<const CopyStandinCollectives*>(coll_.get()) != nullptr; }

  // Copies one host tensor per graph param (local shapes) into the input buffers.
  Result<void> upload_inputs(const std::vector<Tensor>& inputs);
  // Runs every step in order and waits for the device. `comm` runs the collectives
  // (GlooCollectives) unless use_nccl() or use_copy_standin() was called (null is
  // fine then, or for a plan with none); it is also how an abort reaches the rank.
  // `before_step` (tests) is called before each step and may throw or return a Diag.
  Result<void> run(Comm* comm);
  // Enqueues the whole program on the stream without waiting (benchmarks time it
  // with events); only for a rank whose steps are all kernels and library GEMMs.
  Result<void> enqueue();
  // The output buffers, copied to the host.
  Result<std::vector<Tensor>> download_outputs();

  // GPU only (null on the host): the CUDA device, its compute and comm streams.
  CudaPlanDevice* cuda() const { return cuda_; }
  cuda::Stream& stream();
  cuda::Stream& comm_stream();
  int64_t launches() const { return launches_; }
  int64_t library_calls() const { return library_calls_; }  // gemm steps run
  // Collectives enqueued on the comm stream (NCCL calls or stand-in copies).
  int64_t nccl_ops() const { return coll_ ? coll_->started() : 0; }
  int64_t graph_launches() const { return graph_launches_; }

 private:
  RankExec() = default;
  static Result<std::unique_ptr<RankExec>> create(const Plan& plan, std::unique_ptr<PlanDevice> dev, int rank,
                                                  const GpuRunOptions& opts, std::shared_ptr<GpuPlan> gpu_plan,
                                                  CudaPlanDevice* cuda);
  PlanDevice::Addr addr(int buffer) const { return buffers_[static_cast<size_t>(buffer)]; }
  size_t bytes(int buffer) const;
  Result<void> run_steps(Comm* comm);
  Result<void> run_segment(size_t begin, size_t end);
  // Whether step i runs on the compute stream (kernels, partialize, and slices
  // and concats a strided copy can do).
  bool on_device(size_t i) const;
  // Runs `enqueue` between two marks of `track` when tracing (an event of that track).
  Result<void> timed(const std::string& name, nlohmann::json args,
                     const std::function<Result<void>()>& enqueue, Stream track = Stream::Compute);
  Result<void> host_slice(const PlanStep& s);
  double now_us() const;
  // One file per step kind (as XLA's thunks): runtime/plan/plan_step_kernel.cpp,
  // plan_step_copy.cpp (slice, concat, partialize), plan_step_gemm.cpp; collectives
  // in their backend's file (runtime/plan/plan_collectives.h).
  Result<void> launch_step(size_t i);
  Result<void> copy_step(size_t i);
  // gemm steps (runtime/plan/plan_step_gemm.cpp): the library opened and every step's call
  // prepared when the rank is created, so a missing library or a GEMM it refuses is
  // an error naming the step before anything runs; then each call is enqueued on
  // the compute stream. They are never captured into CUDA graphs (--cuda-graph):
  // a graph segment ends before one, and the call runs between two graph launches.
  // On the host a gemm step is an error naming it (the Plan was tuned on a GPU).
  Result<void> prepare_gemm_steps();
  Result<void> gemm_step(size_t i);
  Result<void> local_step(size_t i);
  Result<Tensor> download(int buffer);
  Result<void> upload(int buffer, const Tensor& t);

  const Plan* plan_ = nullptr;
  Mesh mesh_;  // plan_->mesh, parsed once
  std::shared_ptr<GpuPlan> gpu_plan_;  // GPU: kept alive for the device
  const PlanRank* rank_ = nullptr;
  GpuRunOptions opts_;
  std::unique_ptr<PlanDevice> dev_;
  CudaPlanDevice* cuda_ = nullptr;  // dev_, when it is a GPU
  std::vector<PlanDevice::Addr> buffers_;
  std::map<std::string, const PlanKernel*> kernels_;  // by id
  struct Captured {
    cuda::Graph graph;
    int64_t kernels = 0;  // launches it replays
  };
  std::map<size_t, Captured> graphs_;  // per device segment, by its first step
  int64_t launches_ = 0, graph_launches_ = 0, library_calls_ = 0;
  struct GemmSteps;  // runtime/plan/plan_step_gemm.cpp: the cuBLAS handle, the prepared calls, the workspace
  struct GemmStepsDeleter {
    void operator()(GemmSteps* g) const;
  };
  std::unique_ptr<GemmSteps, GemmStepsDeleter> gemms_;
  struct MarkedEvent {
    std::string name;
    nlohmann::json args;
    int start = 0, end = 0;  // PlanDevice marks
    Stream track = Stream::Compute;
  };
  // The comm-stream backend (NCCL or the stand-in) when one was chosen; else each
  // run stages the collectives through the host over its Comm.
  std::unique_ptr<CollectiveBackend> coll_;
  friend class GlooCollectives;
  friend class CommStreamCollectives;
  friend class NcclCollectives;
  friend class CopyStandinCollectives;
  std::vector<MarkedEvent> marked_;
  int ref_mark_ = -1;
  double ref_us_ = 0;
};

// "rank 1, step 4 (kernel k3_matmul_add)", "rank 0, step 2 (gemm k0_matmul_add_relu
// via cublaslt)": how errors name a step.
std::string plan_step_name(const PlanRank& r, size_t i);

// Why PTX compiled for `arch` ("sm_90a", "sm_80") cannot run on `dev`, or nullopt
// if it can: sm_XY runs on compute capability X.Y and later (the driver JITs it);
// an arch-specific sm_XYa only on X.Y itself.
std::optional<std::string> arch_mismatch(const std::string& arch, const cuda::DeviceInfo& dev);

struct GpuRunStats {
  std::string device;          // the GPU's name (GPU `device` of the options)
  int gpus = 1;                // how many GPUs the ranks ran on
  std::string collectives;     // "NCCL 2.28.9 on a comm stream", "host-staged (Gloo)", "none"
  int64_t nccl_ops = 0;        // collectives enqueued through NCCL, every rank
  int64_t launches = 0;        // kernel launches, every rank (inside graphs too)
  int64_t library_gemms = 0;   // gemm steps run through cuBLASLt / cuBLAS, every rank
  int64_t graph_launches = 0;  // CUDA graph launches, every rank
};

// Runs every rank of the plan as a thread of this process, rank r on GPU
// opts.device + r % opts.gpus, meeting through an in-process rendezvous (Gloo)
// for host-staged collectives and for exchanging NCCL's unique ids. NCCL needs a
// GPU per rank (opts.gpus >= world). inputs[r]: rank r's local tensor per graph
// param. Returns each rank's local outputs, or the first failure (naming the
// rank and step); the others are aborted or time out.
Result<std::vector<std::vector<Tensor>>> run_plan_on_gpu(const PlanSource& src,
                                                         const std::vector<std::vector<Tensor>>& inputs,
                                                         const GpuRunOptions& opts = {},
                                                         GpuRunStats* stats = nullptr);

// One rank of a multi-process run (one process per GPU): rank comm.rank() on GPU
// opts.device + rank % opts.gpus (opts.gpus: the GPUs this machine has), its peers
// other processes meeting through `comm` (runtime/comm/agree.h's connect_rank). Its
// local outputs.
Result<std::vector<Tensor>> run_rank_on_gpu(const PlanSource& src, Comm& comm, const std::vector<Tensor>& inputs,
                                            const GpuRunOptions& opts = {}, GpuRunStats* stats = nullptr);

// The same on the host CPU: every rank a thread of this process running the Plan's
// host code (runtime/plan/plan_host.h) through the executor above, collectives through
// Gloo. opts.cuda_graph and NCCL are refused. stats->device is "host CPU".
Result<std::vector<std::vector<Tensor>>> run_plan_on_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels,
                                                          const std::vector<std::vector<Tensor>>& inputs,
                                                          const GpuRunOptions& opts = {},
                                                          GpuRunStats* stats = nullptr);
// One rank of a multi-process run on the host CPU.
Result<std::vector<Tensor>> run_rank_on_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels, Comm& comm,
                                             const std::vector<Tensor>& inputs, const GpuRunOptions& opts = {},
                                             GpuRunStats* stats = nullptr);

}  // namespace sf
