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

#include "runtime/core/diag.h"

namespace sf::cuda {

// Every entry point we use: X(member, driver name). The name is resolved at the
// headers' CUDA version; the member's type is cuda.h's declaration for that name
// (cuda.h maps cuMemAlloc to cuMemAlloc_v2 and so on, and so does the driver).
#define SF_CUDA_ENTRY_POINTS(X)                                        \
  X(Init, cuInit)                                                      \
  X(DriverGetVersion, cuDriverGetVersion)                              \
  X(DeviceGetCount, cuDeviceGetCount)                                  \
  X(DeviceGet, cuDeviceGet)                                            \
  X(DeviceGetName, cuDeviceGetName)                                    \
  X(DeviceGetAttribute, cuDeviceGetAttribute)                          \
  X(DeviceTotalMem, cuDeviceTotalMem)                                  \
  X(GetErrorName, cuGetErrorName)                                      \
  X(GetErrorString, cuGetErrorString)                                  \
  X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)                  \
  X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease)                \
  X(DevicePrimaryCtxReset, cuDevicePrimaryCtxReset)                    \
  X(CtxSetCurrent, cuCtxSetCurrent)                                    \
  X(CtxSynchronize, cuCtxSynchronize)                                  \
  X(MemGetInfo, cuMemGetInfo)                                          \
  X(MemAlloc, cuMemAlloc)                                              \
  X(MemFree, cuMemFree)                                                \
  X(MemcpyHtoD, cuMemcpyHtoD)                                          \
  X(MemcpyDtoH, cuMemcpyDtoH)                                          \
  X(MemcpyHtoDAsync, cuMemcpyHtoDAsync)                                \
  X(MemcpyDtoHAsync, cuMemcpyDtoHAsync)                                \
  X(MemcpyDtoDAsync, cuMemcpyDtoDAsync)                                \
  X(MemsetD8Async, cuMemsetD8Async)                                    \
  X(MemsetD32Async, cuMemsetD32Async)                                  \
  X(Memcpy2DAsync, cuMemcpy2DAsync)                                    \
  X(StreamCreate, cuStreamCreate)                                      \
  X(StreamDestroy, cuStreamDestroy)                                    \
  X(StreamSynchronize, cuStreamSynchronize)                            \
  X(StreamQuery, cuStreamQuery)                                        \
  X(StreamWaitEvent, cuStreamWaitEvent)                                \
  X(EventCreate, cuEventCreate)                                        \
  X(EventDestroy, cuEventDestroy)                                      \
  X(EventRecord, cuEventRecord)                                        \
  X(EventSynchronize, cuEventSynchronize)                              \
  X(EventElapsedTime, cuEventElapsedTime)                              \
  X(LinkCreate, cuLinkCreate)                                          \
  X(LinkAddData, cuLinkAddData)                                        \
  X(LinkComplete, cuLinkComplete)                                      \
  X(LinkDestroy, cuLinkDestroy)                                        \
  X(ModuleLoadData, cuModuleLoadData)                                  \
  X(ModuleUnload, cuModuleUnload)                                      \
  X(ModuleGetFunction, cuModuleGetFunction)                            \
  X(FuncSetAttribute, cuFuncSetAttribute)                              \
  X(OccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(OccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters)          \
  X(LaunchKernel, cuLaunchKernel)                                      \
  X(TensorMapEncodeTiled, cuTensorMapEncodeTiled)                      \
  X(StreamBeginCapture, cuStreamBeginCapture)                          \
  X(StreamEndCapture, cuStreamEndCapture)                              \
  X(GraphInstantiateWithFlags, cuGraphInstantiateWithFlags)            \
  X(GraphLaunch, cuGraphLaunch)                                        \
  X(GraphExecDestroy, cuGraphExecDestroy)                              \
  X(GraphDestroy, cuGraphDestroy)

struct Driver {
#define SF_CUDA_MEMBER(member, name) decltype(&::name) member = nullptr;
  SF_CUDA_ENTRY_POINTS(SF_CUDA_MEMBER)
#undef SF_CUDA_MEMBER

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

// How many GPUs the driver sees (a Diag as driver() gives when there is none).
Result<int> device_count();

// Device `ordinal`'s name, compute capability and SM count.
Result<DeviceInfo> device_info(int ordinal = 0);

}  // namespace sf::cuda
