#include "runtime/plan/plan_host.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/plan/plan_verify.h"

namespace sf {

namespace {

namespace fs = std::filesystem;

// The most a host object may weigh (the largest bench Plan's is a few MiB).
constexpr uintmax_t kMaxHostObjectBytes = uintmax_t{256} << 20;

bool is_symbol(const std::string& s) {
  if (s.empty() || s.size() > 256 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

// Whether `file` (dladdr's name for where a symbol lives) is the object `handle`
// opened.
bool own_object(void* handle, const char* file) {
  struct link_map* lm = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name) return false;
  return std::strcmp(lm->l_name, file) == 0;
}

}  // namespace

Result<std::shared_ptr<const HostKernels>> load_host_kernels(const PlanSource& src) {
  const Plan& p = src.plan;
  const std::string json_path = (fs::path(src.dir) / "plan.json").string();
  if (p.host_object.empty())
    return Diag{json_path, {}, "the Plan has no host code (no \"host_object\": compiled with --no-host): compile "
                               "it again without --no-host to run it with --device cpu"};
  if (p.host_object.find('/') != std::string::npos || p.host_object == "." || p.host_object == "..")
    return Diag{json_path, {}, "\"host_object\": \"" + p.host_object + "\" must be a file name inside the Plan directory"};
  const fs::path path = fs::absolute(fs::path(src.dir) / p.host_object);
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) return Diag{path.string(), {}, "missing: plan.json names it as the kernels' host code"};
  if (!fs::is_regular_file(st)) return Diag{path.string(), {}, "not a regular file"};
  if (fs::file_size(path, ec) > kMaxHostObjectBytes)
    return Diag{path.string(), {}, "larger than " + std::to_string(kMaxHostObjectBytes >> 20) + " MiB"};
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    return Diag{path.string(), {}, std::string("cannot load it: ") + (why ? why : "dlopen failed")};
  }
  auto k = std::make_shared<HostKernels>();
  k->owner = std::shared_ptr<void>(handle, [](void* h) { ::dlclose(h); });
  k->origin = path.string();
  for (const PlanKernel& pk : p.kernels) {
    if (pk.host_symbol.empty()) {
      k->missing.emplace(pk.id, "the host emitter could not build it when the Plan was compiled");
      continue;
    }
    // Kernels are named sf_<...> by `compile`; anything else (libc's `system`, which
    // dlsym would find among the object's dependencies) is refused.
    if (!is_symbol(pk.host_symbol) || pk.host_symbol.rfind("sf_", 0) != 0)
      return Diag{json_path, {}, "kernel " + pk.id + ": host symbol \"" + pk.host_symbol + "\" is not a kernel's (sf_...)"};
    ::dlerror();
    void* fn = ::dlsym(handle, pk.host_symbol.c_str());
    // The symbol must be defined by this object, not by a library it loads.
    Dl_info info{};
    if (!fn || !::dladdr(fn, &info) || !info.dli_fname || !own_object(handle, info.dli_fname))
      return Diag{path.string(), {}, "has no symbol " + pk.host_symbol + ", kernel " + pk.id + "'s host code"};
    HostKernel hk;
    hk.fn = [entry = reinterpret_cast<HostKernel::Entry>(fn)](void** args) -> Result<void> {
      entry(args);
      return {};
    };
    hk.zero_outputs = pk.host_zero_outputs;
    k->by_id.emplace(pk.id, hk);
  }
  return std::shared_ptr<const HostKernels>(std::move(k));
}

HostPlanDevice::HostPlanDevice(std::shared_ptr<const HostKernels> kernels) : kernels_(std::move(kernels)) {}

HostPlanDevice::~HostPlanDevice() {
  for (void* m : memory_) std::free(m);
}

Result<PlanDevice::Addr> HostPlanDevice::allocate(size_t bytes) {
  // 64-byte aligned (a cache line, the widest vector), and never null.
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* m = std::aligned_alloc(64, rounded);
  if (!m) return Diag{"", {}, "out of host memory for " + std::to_string(bytes) + " bytes"};
  memory_.push_back(m);
  return reinterpret_cast<Addr>(m);
}

Result<void> HostPlanDevice::prepare(const PlanRank& rank, const std::vector<Addr>&) {
  for (size_t i = 0; i < rank.steps.size(); ++i) {
    const PlanStep& s = rank.steps[i];
    if (s.op == "gemm")
      return Diag{"", {}, plan_step_name(rank, i) + ": a library GEMM step needs --device cuda (the Plan was tuned "
                                                    "on a GPU whose winner for this matmul is cuBLAS)"};
    if (s.op != "kernel" || kernels_->by_id.count(s.kernel)) continue;
    auto why = kernels_->missing.find(s.kernel);
    return Diag{"", {}, plan_step_name(rank, i) + ": no host code for kernel " + s.kernel +
                            (why != kernels_->missing.end() ? " (" + why->second + ")" : std::string())};
  }
  return {};
}

Result<void> HostPlanDevice::upload(Addr dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return {};
}

Result<void> HostPlanDevice::download(void* dst, Addr src, size_t bytes) {
  if (bytes) std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return {};
}

Result<void> HostPlanDevice::zero(Addr dst, size_t bytes) {
  if (bytes) std::memset(reinterpret_cast<void*>(dst), 0, bytes);
  return {};
}

Result<void> HostPlanDevice::copy_2d(Addr dst, size_t dst_pitch, Addr src, size_t src_pitch, size_t width,
                                     size_t height) {
  for (size_t row = 0; row < height; ++row)
    std::memmove(reinterpret_cast<void*>(dst + row * dst_pitch), reinterpret_cast<const void*>(src + row * src_pitch),
                 width);
  return {};
}

Result<void> HostPlanDevice::launch(size_t, const PlanStep& s, const std::vector<Mem>& args, size_t inputs) {
  const HostKernel& k = kernels_->by_id.at(s.kernel);  // prepare() checked it is there
  if (k.zero_outputs)
    for (size_t o = inputs; o < args.size(); ++o) (void)zero(args[o].addr, args[o].bytes);
  std::vector<void*> ptrs;
  for (const Mem& m : args) ptrs.push_back(reinterpret_cast<void*>(m.addr));
  return k.fn(ptrs.data());
}

Result<int> HostPlanDevice::mark(Stream) {
  marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(marks_.size()) - 1;
}

Result<double> HostPlanDevice::elapsed_us(int from, int to) {
  return std::chrono::duration<double, std::micro>(marks_.at(static_cast<size_t>(to)) -
                                                   marks_.at(static_cast<size_t>(from)))
      .count();
}

}  // namespace sf
