// The CUDA driver API, opened at run time: dlopen("libcuda.so.1") and
// cuGetProcAddress for every entry point, so one binary runs with or without a
// GPU and says clearly when there is none. No link-time libcuda, no LLVM.
//
// Entry points are resolved by their base names at the CUDA version of the
// headers we build against (CUDA_VERSION), as the CUDA runtime itself does, so
// the `_v2`/`_v3` renames in cuda.h never reach dlsym.
#pragma once

#include <cuda.h>

#include <string>

#include "codegen/ir/diag.h"

namespace sf::cuda {

struct Driver {
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuDriverGetVersion) DriverGetVersion = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetName) DeviceGetName = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;

  // "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
  std::string error(CUresult r) const;
};

// The driver, loaded and initialised once per process: libcuda.so.1 (or the file
// $SHARDFUSE_LIBCUDA names), every entry point, cuInit(0), and at least one
// device. Otherwise a Diag whose message starts "no CUDA device: " and says why
// (no driver library, an entry point missing, cuInit's error, zero devices).
Result<const Driver*> driver();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;           // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  int driver_version = 0;     // 13000 for CUDA 13.0
  std::string arch() const;   // "sm_90a" for compute capability 9.0 (the arch-specific
                              // features our kernels use), "sm_80" for 8.0
};

// Device `ordinal`'s name, compute capability and SM count.
Result<DeviceInfo> device_info(int ordinal = 0);

}  // namespace sf::cuda
