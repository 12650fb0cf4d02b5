// The reduction emitter's entry points: emit_reduction, reduction_info, suggest_reduction_config.
#include "codegen/kernels/reduction.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/reduction_internal.h"

namespace sf {

using namespace reduction_detail;

namespace {

Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& check_target,
                           const llvmb::Target& target, bool gpu, bool simulate) {
  if (spec.kind != KernelKind::Reduction)
    return diag("kernel '" + spec.entry + "' is a " + std::string(kernel_kind_name(spec.kind)) + " kernel, not a reduction");
  Result<Plan> plan = make_plan(spec, config, check_target);
  if (!plan) return plan.error();
  if (!gpu)
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return diag(*e);
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  Result<void> built = gpu ? build_nvptx(spec, config, *plan, target, *k.module, simulate)
                           : build_host(spec, config, *plan, target, *k.module);
  if (!built) return built.error();
  if (auto err = llvmb::verify(*k.module))  // an emitter bug, not a user error: say so
    return diag("internal: the emitted module does not verify: " + *err);
  if (gpu) k.launch = launch_of(*plan, config);
  return k;
}

}  // namespace

Result<EmittedKernel> emit_reduction(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target) {
  const bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  return emit(spec, config, target, target, gpu, /*simulate=*/false);
}

Result<EmittedKernel> emit_reduction_block_on_host(const KernelSpec& spec, const KernelConfig& config) {
  // Checked as for sm_90a: the same limits apply to the kernel being simulated.
  return emit(spec, config, llvmb::Target::nvptx("sm_90a"), llvmb::Target::host(), /*gpu=*/true, /*simulate=*/true);
}

namespace {
class ReductionEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_reduction(spec, config, target);
  }
};
}  // namespace

const Emitter& reduction_emitter() {
  static const ReductionEmitter e;
  return e;
}

namespace {
// The SMs the suggestion fills with split rows: an H100's or H200's 132 (an A100's 108
// are filled too).
constexpr int64_t kSuggestSms = 132;
// Elements a thread folds in a share, at least: the share's loads in flight, against
// the fixed cost of storing, counting and taking the partials.
constexpr int64_t kMinShare = 64;
}  // namespace

Result<KernelConfig> suggest_reduction_config(const KernelSpec& spec, KernelConfig base) {
  base.threads_per_row = 256;
  base.rows_per_block = 1;
  base.split_reduction = 1;
  Result<Plan> p = make_plan(spec, base, llvmb::Target::host());
  if (!p) return p.error();
  auto pow2_at_least = [](int64_t v) {
    int64_t r = 1;
    while (r < v) r *= 2;
    return r;
  };
  const bool inner_reduced = !p->rdims.empty() && p->rdims.back() == static_cast<int>(p->x.size()) - 1;
  const int64_t n = std::max<int64_t>(p->n, 1);
  int64_t tpr = inner_reduced ? (n <= 32 ? pow2_at_least(n) : pow2_at_least((n + 7) / 8)) : pow2_at_least((n + 63) / 64);
  tpr = std::clamp<int64_t>(tpr, 1, 256);
  // Fill the block with rows, but not with more rows than there are. Both factors
  // are powers of two, so a block above 32 threads is whole warps.
  int64_t rpb = std::min<int64_t>(256 / tpr, pow2_at_least(std::max<int64_t>(p->rows, 1)));
  if (p->inner_kept && rpb < 32 && tpr > 1) {
    // An outer reduction whose rows are long: a warp's lanes on 32 neighbouring rows
    // (128 bytes of f32 at each element index; Plan::outer), up to 32 threads a row in
    // blocks of up to 1024 threads, about 64 elements a thread. Rows of 512 or fewer
    // elements already had 32 rows or more a block.
    rpb = std::min<int64_t>(32, pow2_at_least(std::max<int64_t>(p->rows, 1)));
    tpr = std::clamp<int64_t>(pow2_at_least((n + 63) / 64), 1, 1024 / rpb);
  }
  base.threads_per_row = static_cast<int>(tpr);
  base.rows_per_block = static_cast<int>(std::max<int64_t>(rpb, 1));
  // Few row blocks over long rows (a whole-tensor sum, a bias gradient of a narrow
  // layer): each row split over blocks until the launch has a block for every SM,
  // keeping at least kMinShare elements a thread, where the group allows it (one
  // pass, outputs per row; Plan::split).
  const int64_t blocks = (p->rows + rpb - 1) / std::max<int64_t>(rpb, 1);
  if (p->passes.size() == 1 && p->x_outputs.empty() && blocks > 0 && blocks < kSuggestSms) {
    int64_t split = 1;
    while (split * 2 <= 65535 && blocks * split < kSuggestSms && n / (2 * split * tpr) >= kMinShare) split *= 2;
    base.split_reduction = static_cast<int>(split);
  }
  return base;
}

Result<ReductionInfo> reduction_info(const KernelSpec& spec, const KernelConfig& config) {
  Result<Plan> p = make_plan(spec, config, llvmb::Target::host());
  if (!p) return p.error();
  ReductionInfo r;
  r.x = p->x;
  r.reduced_dims = p->rdims;
  r.rows = p->rows;
  r.row_elems = p->n;
  r.passes = static_cast<int>(p->passes.size());
  r.x_outputs = static_cast<int>(p->x_outputs.size());
  r.row_outputs = static_cast<int>(p->row_outputs.size());
  r.launch = launch_of(*p, config);
  r.static_shared_bytes = p->smem_bytes;
  r.persistent = p->persistent;
  r.vector = p->vector;
  r.elems_per_thread = p->persistent ? p->slots * p->vector : 0;
  r.split = p->split;
  r.inner_kept = p->inner_kept;
  r.outer = p->outer;
  // The lanes of a warp that read neighbouring elements at one step.
  const int64_t warp = std::min<int64_t>(block_threads(config), 32);
  if (!p->inner_kept) r.adjacent_lanes = static_cast<int>(std::min<int64_t>(config.threads_per_row, warp));
  else if (p->outer || config.threads_per_row == 1)
    r.adjacent_lanes = static_cast<int>(std::min<int64_t>(config.rows_per_block, warp));
  return r;
}

}  // namespace sf
