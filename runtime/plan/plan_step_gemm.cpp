// The Plan's gemm step (docs/plan.md): a fused matmul whose tuned winner is a library
// GEMM, run through cuBLASLt or cuBLAS (runtime/gpu/cublas.h, opened with dlopen) on the
// rank's compute stream, in step order with the kernels around it.
#include <map>

#include "runtime/gpu/cublas.h"
#include "runtime/plan/plan_cuda.h"
#include "runtime/plan/plan_exec.h"

namespace sf {

struct RankExec::GemmSteps {
  cublas::Handle handle;
  std::map<size_t, cublas::GemmCall> calls;  // by step
  cuda::Buffer workspace;                    // cuBLASLt's, kGemmWorkspaceBytes, shared by the rank's calls
};

void RankExec::GemmStepsDeleter::operator()(GemmSteps* g) const { delete g; }

Result<void> RankExec::prepare_gemm_steps() {
  if (!cuda_) return {};  // the host device refuses gemm steps, naming the first
  std::vector<size_t> steps;
  bool lt = false;
  for (size_t i = 0; i < rank_->steps.size(); ++i)
    if (rank_->steps[i].op == "gemm") {
      steps.push_back(i);
      lt = lt || rank_->steps[i].gemm.desc.library == GemmLibrary::CublasLt;
    }
  if (steps.empty()) return {};
  // The library is opened once per process; without it every gemm step fails here,
  // named, before any input is uploaded.
  Result<cublas::Handle> h = cublas::Handle::create(cuda_->context());
  if (!h) return Diag{"", {}, plan_step_name(*rank_, steps[0]) + ": " + h.error().message};
  std::unique_ptr<GemmSteps, GemmStepsDeleter> g(new GemmSteps{std::move(h).value(), {}, {}});
  if (lt) {
    Result<cuda::Buffer> w = cuda::Buffer::allocate(cuda_->context(), kGemmWorkspaceBytes);
    if (!w) return Diag{"", {}, plan_step_name(*rank_, steps[0]) + ": the cuBLASLt workspace: " + w.error().message};
    g->workspace = std::move(w).value();
  }
  for (size_t i : steps) {
    const GemmDesc& d = rank_->steps[i].gemm.desc;
    Result<cublas::GemmCall> c = g->handle.prepare(d, d.library == GemmLibrary::CublasLt ? kGemmWorkspaceBytes : 0);
    if (!c) return Diag{"", {}, plan_step_name(*rank_, i) + ": " + c.error().message};
    g->calls.emplace(i, std::move(c).value());
  }
  gemms_ = std::move(g);
  return {};
}

Result<void> RankExec::gemm_step(size_t i) {
  const PlanStep& s = rank_->steps[i];
  if (!cuda_ || !gemms_ || !gemms_->calls.count(i)) return Diag{"", {}, "the gemm step was not prepared"};
  const cublas::GemmCall& call = gemms_->calls.at(i);
  auto ptr = [&](int b) { return addr(b); };
  const GemmDesc& d = s.gemm.desc;
  ++library_calls_;
  return timed("gemm " + s.gemm.name,
               {{"step", i},
                {"kind", "gemm"},
                {"library", std::string(gemm_library_name(d.library))},
                {"flops", gemm_flops(d)}},
               [&] {
                 return call.enqueue(cuda_->stream(), ptr(s.in.at(0)), ptr(s.in.at(1)), s.in.size() > 2 ? ptr(s.in[2]) : 0,
                                           ptr(s.out.at(0)), gemms_->workspace.ptr());
               });
}

}  // namespace sf
