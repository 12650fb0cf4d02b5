// Runs a Plan on a GPU: every buffer of a rank lives in device memory, kernel
// steps launch the Plan's PTX with its grid/block/shared memory on the rank's
// compute stream, and collectives go through the CPU backend (Comm, Gloo): the
// operand is copied to the host, reduced or gathered there, and copied back.
// Ranks are threads sharing one device for now (NCCL comes with the overlap work).
// No LLVM: a Plan compiled on another machine runs here.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/ir/tensor.h"
#include "runtime/comm.h"
#include "runtime/cuda.h"
#include "runtime/plan.h"
#include "runtime/trace.h"

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

struct GpuRunOptions {
  int device = 0;
  // Capture each rank's kernel sequence between collectives as a CUDA Graph once
  // and replay it (launch overhead matters for the examples' small kernels).
  bool cuda_graph = false;
  std::chrono::milliseconds timeout{60000};  // per collective
  // When set: every kernel (or, with cuda_graph, every graph launch) becomes an
  // event timed by CUDA events on the rank's compute thread, and every collective
  // an event on its comm thread from its issue to its wait (host-staged, wall time).
  // Microseconds since trace_origin.
  TraceWriter* trace = nullptr;
  std::chrono::steady_clock::time_point trace_origin = std::chrono::steady_clock::now();
};

// A Plan's kernels loaded on a device, shared by its ranks.
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
  };
  const Loaded& kernel(const std::string& id) const { return kernels_.at(id); }

 private:
  std::shared_ptr<cuda::Context> ctx_;
  PlanSource src_;
  Mesh mesh_;
  std::vector<cuda::Module> modules_;
  std::map<std::string, Loaded> kernels_;
};

// One rank of a Plan on the device: its buffers allocated once, its stream.
class GpuRank {
 public:
  static Result<std::unique_ptr<GpuRank>> create(std::shared_ptr<GpuPlan> plan, int rank, const GpuRunOptions& opts);
  ~GpuRank();

  // Copies one host tensor per graph param (local shapes) into the input buffers.
  std::optional<Diag> upload_inputs(const std::vector<Tensor>& inputs);
  // Runs every step in order and waits for the device. `comm` runs the collectives
  // (null is fine for a plan that has none).
  std::optional<Diag> run(Comm* comm);
  // Enqueues the whole program on the stream without waiting (benchmarks time it
  // with events); only for a rank whose steps are all kernels.
  std::optional<Diag> enqueue();
  // The output buffers, copied to the host.
  Result<std::vector<Tensor>> download_outputs();

  cuda::Stream& stream() { return stream_; }
  int64_t launches() const { return launches_; }
  int64_t graph_launches() const { return graph_launches_; }

 private:
  GpuRank() = default;
  std::optional<Diag> run_steps(Comm* comm);
  std::optional<Diag> run_segment(size_t begin, size_t end);
  // Enqueues, between two CUDA events when tracing.
  std::optional<Diag> timed(const std::string& name, nlohmann::json args,
                            const std::function<std::optional<Diag>()>& enqueue);
  double now_us() const;
  std::optional<Diag> launch_step(const PlanStep& s);
  std::optional<Diag> local_step(const PlanStep& s);
  std::optional<Diag> collective(const PlanStep& s, Comm& comm, std::map<int, Work>& pending);
  Result<Tensor> download(int buffer);
  std::optional<Diag> upload(int buffer, const Tensor& t);

  std::shared_ptr<GpuPlan> plan_;
  const PlanRank* rank_ = nullptr;
  GpuRunOptions opts_;
  cuda::Stream stream_;
  std::vector<cuda::Buffer> buffers_;
  struct Captured {
    cuda::Graph graph;
    int64_t kernels = 0;  // launches it replays
  };
  std::map<size_t, Captured> graphs_;  // per device segment, by its first step
  int64_t launches_ = 0, graph_launches_ = 0;
  struct DeviceEvent {
    std::string name;
    nlohmann::json args;
    cuda::Event start, end;
  };
  std::vector<DeviceEvent> device_events_;
  std::unique_ptr<cuda::Event> ref_event_;
  double ref_us_ = 0;
};

// Why PTX compiled for `arch` ("sm_90a", "sm_80") cannot run on `dev`, or nullopt
// if it can: sm_XY runs on compute capability X.Y and later (the driver JITs it);
// an arch-specific sm_XYa only on X.Y itself.
std::optional<std::string> arch_mismatch(const std::string& arch, const cuda::DeviceInfo& dev);

struct GpuRunStats {
  std::string device;          // the GPU's name
  int64_t launches = 0;        // kernel launches, every rank (inside graphs too)
  int64_t graph_launches = 0;  // CUDA graph launches, every rank
};

// Runs every rank of the plan as a thread of this process on device
// opts.device, meeting through an in-process rendezvous for the collectives.
// inputs[r]: rank r's local tensor per graph param. Returns each rank's local
// outputs, or the first failure (naming the rank and step); the others are aborted.
Result<std::vector<std::vector<Tensor>>> run_plan_on_gpu(const PlanSource& src,
                                                         const std::vector<std::vector<Tensor>>& inputs,
                                                         const GpuRunOptions& opts = {},
                                                         GpuRunStats* stats = nullptr);

}  // namespace sf
