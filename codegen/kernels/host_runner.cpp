#include "codegen/kernels/host_runner.h"

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <functional>

#include "codegen/ir/printer.h"

namespace sf {


std::function<bool(const LocalKernel&)> emit_checker(const llvmb::Target& target, KernelConfig config) {
  return [target, config](const LocalKernel& k) {
    return emitter_for(k.kind).emit(KernelSpec{"sf_check", k.kind, k.group}, config, target).ok();
  };
}

HostKernelRunner::HostKernelRunner(KernelConfig config, Chooser choose, Precision precision)
    : config_(config), choose_(std::move(choose)), precision_(precision) {}
HostKernelRunner::~HostKernelRunner() = default;

Result<std::unique_ptr<HostKernelRunner>> HostKernelRunner::create(KernelConfig config, Chooser choose,
                                                                  Precision precision) {
  Result<std::unique_ptr<llvmb::HostJit>> jit = llvmb::HostJit::create();
  if (!jit.ok()) return jit.error();
  std::unique_ptr<HostKernelRunner> r(new HostKernelRunner(config, std::move(choose), precision));
  r->jit_ = std::move(jit).value();
  return r;
}

const HostKernelRunner::Compiled& HostKernelRunner::compile(const LocalKernel& k) const {
  // The group's text names its ops, shapes and dtypes: equal text, equal kernel. It
  // also decides the tuning key, so the config is chosen once per distinct group, on
  // a miss, not on every launch.
  std::string key = kernel_key(k);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  const KernelConfig cfg = choose_ ? choose_(k) : config_;
  Compiled c;
  {
    KernelSpec spec;
    spec.kind = k.kind;
    spec.group = k.group;
    spec.precision = precision_;
    char hash[32];
    std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(key));
    spec.entry = "sf_" + k.name + "_" + hash;
    Result<EmittedKernel> e = emitter_for(k.kind).emit(spec, cfg, llvmb::Target::host());
    if (!e.ok()) {
      c.reason = e.error().message;
    } else {
      Result<void*> fn = jit_->add(std::move(e->module), std::move(e->context), e->entry);
      if (!fn.ok()) c.reason = fn.error().message;
      else c.fn = reinterpret_cast<Entry>(*fn);
    }
  }
  if (c.fn) ++stats_.compiled;
  return cache_.emplace(key, std::move(c)).first->second;
}

Result<std::vector<Tensor>> HostKernelRunner::run(const LocalKernel& k, const std::vector<const Tensor*>& inputs) const {
  Entry fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Compiled& c = compile(k);
    fn = c.fn;
    if (fn) {
      ++stats_.generated;
    } else {
      ++stats_.fallbacks;
      stats_.fallback_reasons.emplace(k.name, c.reason);
    }
  }
  if (!fn) return reference_kernel_runner().run(k, inputs);
  std::vector<Tensor> out;
  for (const Output& o : k.group.outputs()) {
    const TensorType& t = k.group.node(o.value).type;
    out.emplace_back(t.dtype, t.shape);
  }
  std::vector<void*> args;
  for (const Tensor* t : inputs) args.push_back(const_cast<std::byte*>(t->data()));
  for (Tensor& t : out) args.push_back(t.data());
  fn(args.data());
  return out;
}

HostKernelRunner::Stats HostKernelRunner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace sf
