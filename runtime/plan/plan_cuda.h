// A Plan rank's device on a CUDA GPU (runtime/plan/plan_device.h): buffers from the
// context's caching allocator, a non-blocking compute stream (and a comm stream
// once NCCL is used), kernels from the Plan's PTX (GpuPlan) launched with their
// grid, block and shared memory, TMA tensor maps encoded per kernel step, CUDA
// events as trace marks.
#pragma once

#include <map>
#include <memory>

#include "runtime/gpu/cuda.h"
#include "runtime/plan/plan_device.h"
#include "runtime/plan/plan_exec.h"

namespace sf {

class CudaPlanDevice final : public PlanDevice {
 public:
  static Result<std::unique_ptr<CudaPlanDevice>> create(std::shared_ptr<GpuPlan> plan);
  ~CudaPlanDevice() override;

  std::string kind() const override { return "cuda"; }
  Result<Addr> allocate(size_t bytes) override;
  Result<void> prepare(const PlanRank& rank, const std::vector<Addr>& buffers) override;
  Result<void> upload(Addr dst, const void* src, size_t bytes) override;
  Result<void> download(void* dst, Addr src, size_t bytes) override;
  Result<void> zero(Addr dst, size_t bytes) override;
  Result<void> copy_2d(Addr dst, size_t dst_pitch, Addr src, size_t src_pitch, size_t width,
                       size_t height) override;
  Result<void> launch(size_t step, const PlanStep& s, const std::vector<Mem>& args, size_t inputs) override;
  Result<void> synchronize() override;
  Result<int> mark(Stream stream) override;
  Result<double> elapsed_us(int from, int to) override;

  cuda::Context& context() const { return plan_->context(); }
  const GpuPlan& plan() const { return *plan_; }
  cuda::Stream& stream() { return stream_; }
  // The comm stream NCCL's collectives run on; made by make_comm_stream().
  cuda::Stream& comm_stream() { return comm_stream_; }
  Result<void> make_comm_stream();

 private:
  CudaPlanDevice() = default;
  std::shared_ptr<GpuPlan> plan_;
  cuda::Stream stream_, comm_stream_;
  std::vector<cuda::Buffer> buffers_;                         // what allocate() gave
  std::map<size_t, std::vector<cuda::Buffer>> tensor_maps_;  // per kernel step
  // The kernels' workspace (PlanKernel::workspace_bytes), one for the rank: every
  // kernel runs on `stream_`, one after the other, and leaves it zero; sized and
  // zeroed in prepare().
  cuda::Buffer workspace_;
  std::vector<cuda::Event> marks_;
};

}  // namespace sf
