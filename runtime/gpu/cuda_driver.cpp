#include "runtime/gpu/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace sf::cuda {

namespace {

Diag no_device(const std::string& why) { return Diag{"", {}, "no CUDA device: " + why}; }

Result<const Driver*> load() {
  static Driver d;
  const char* env = std::getenv("SHARDFUSE_LIBCUDA");
  const std::string lib = env && *env ? env : "libcuda.so.1";
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace.
  void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    return no_device("cannot load the CUDA driver library " + lib + " (" + (e ? e : "unknown error") +
                     "); is the NVIDIA driver installed?");
  }
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(::dlsym(h, "cuGetProcAddress_v2"));
  if (!get_proc)
    return no_device(lib + " has no cuGetProcAddress_v2: the driver is older than CUDA 12 (we need " +
                     std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION % 1000 / 10) + ")");
  bool ok = true;
  std::string missing;
  auto resolve = [&](const char* name, auto& fn) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status{};
    if (get_proc(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !p) {
      ok = false;
      missing += std::string(missing.empty() ? "" : ", ") + name;
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define SF_CUDA_RESOLVE(member, name) resolve(#name, d.member);
  SF_CUDA_ENTRY_POINTS(SF_CUDA_RESOLVE)
#undef SF_CUDA_RESOLVE
  if (!ok) return no_device(lib + " lacks " + missing + " at CUDA version " + std::to_string(CUDA_VERSION));
  if (CUresult r = d.Init(0); r != CUDA_SUCCESS) return no_device("cuInit failed: " + d.error(r));
  int n = 0;
  if (CUresult r = d.DeviceGetCount(&n); r != CUDA_SUCCESS) return no_device("cuDeviceGetCount failed: " + d.error(r));
  if (n == 0) return no_device("the driver sees no GPU");
  return &d;
}

}  // namespace

std::string Driver::error(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (GetErrorName) GetErrorName(r, &name);
  if (GetErrorString) GetErrorString(r, &text);
  std::string s = name ? name : "CUresult " + std::to_string(static_cast<int>(r));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

Result<const Driver*> driver() {
  // Loaded once; the answer (a driver or why there is none) does not change.
  static const Result<const Driver*> d = load();
  return d;
}

std::string DeviceInfo::arch() const {
  std::string a = "sm_" + std::to_string(cc_major) + std::to_string(cc_minor);
  return cc_major == 9 && cc_minor == 0 ? a + "a" : a;
}

Result<int> device_count() {
  Result<const Driver*> d = driver();
  if (!d) return d.error();
  int n = 0;
  if (CUresult r = (*d)->DeviceGetCount(&n); r != CUDA_SUCCESS)
    return Diag{"", {}, "no CUDA device: cuDeviceGetCount: " + (*d)->error(r)};
  return n;
}

Result<DeviceInfo> device_info(int ordinal) {
  Result<const Driver*> d = driver();
  if (!d) return d.error();
  const Driver& dr = **d;
  CUdevice dev{};
  if (CUresult r = dr.DeviceGet(&dev, ordinal); r != CUDA_SUCCESS)
    return Diag{"", {}, "CUDA device " + std::to_string(ordinal) + ": " + dr.error(r)};
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  dr.DeviceGetName(name, sizeof name, dev);
  info.name = name;
  dr.DeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  dr.DeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  dr.DeviceGetAttribute(&info.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  dr.DriverGetVersion(&info.driver_version);
  return info;
}

}  // namespace sf::cuda
