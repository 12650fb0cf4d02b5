// The fake driver's entry points for initialisation, devices, contexts, memory,
// streams and events (tests/fake_cuda/README.md); fake_libcuda.cpp's table hands
// them to the runtime through cuGetProcAddress_v2.
#include "tests/fake_cuda/fake_cuda_state.h"

namespace fake {

// --- initialisation, devices, errors ------------------------------------------------------

CUresult Init(unsigned int flags) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!s.initialized) {
    s.devices.assign(static_cast<size_t>(std::min(env_int("FAKE_CUDA_DEVICES", 1), 64LL)), Device{});
    s.budget = static_cast<size_t>(env_int("FAKE_CUDA_MEM_BYTES", static_cast<long long>(kDefaultBudget)));
    s.async_errors = env_int("FAKE_CUDA_ASYNC_ERRORS", 0) != 0;
    s.sticky_for_process = env_int("FAKE_CUDA_STICKY_FOR_PROCESS", 0) != 0;
    s.initialized = true;
  }
  return CUDA_SUCCESS;
}

CUresult DriverGetVersion(int* v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult DeviceGetCount(int* n) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = static_cast<int>(s.devices.size());
  return CUDA_SUCCESS;
}

CUresult DeviceGet(CUdevice* d, int ordinal) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult DeviceGetName(char* name, int len, CUdevice d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", kDeviceName);
  return CUDA_SUCCESS;
}

// An H100 SXM's values (cudaGetDeviceProperties on one, CUDA 12/13); 0 for the rest.
int attribute(CUdevice_attribute a, CUdevice d) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return kDefaultShared;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;  // kHz
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return kSms;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x18 + d;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;  // kHz
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 50 << 20;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return static_cast<int>(kSharedPerSm);
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return kMaxSharedOptin;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: return 32505856;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: return 134213632;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: return 1;
    default: return 0;
  }
}

CUresult DeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_DEVICE;
  *v = attribute(a, d);
  return CUDA_SUCCESS;
}

CUresult DeviceTotalMem(size_t* bytes, CUdevice d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kTotalMem;
  return CUDA_SUCCESS;
}

CUresult GetErrorName(CUresult r, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(r);
  *s = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult GetErrorString(CUresult r, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(r);
  *s = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// --- contexts -----------------------------------------------------------------------------

CUresult DevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_DEVICE;
  Device& dev = s.devices[static_cast<size_t>(d)];
  if (s.sticky_for_process && dev.sticky != CUDA_SUCCESS) return dev.sticky;
  ++dev.refs;
  dev.active = true;
  *c = handle<CUcontext>(kCtxBase + 16 * static_cast<uintptr_t>(d));
  return CUDA_SUCCESS;
}

CUresult DevicePrimaryCtxRelease(CUdevice d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_DEVICE;
  Device& dev = s.devices[static_cast<size_t>(d)];
  if (dev.refs == 0) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease", "not retained");
  // The last release destroys the context and everything in it.
  if (--dev.refs == 0) {
    dev.active = false;
    destroy_context_resources(s, d);
    log_line("release");
  }
  return CUDA_SUCCESS;
}

CUresult DevicePrimaryCtxReset(CUdevice d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_DEVICE;
  Device& dev = s.devices[static_cast<size_t>(d)];
  // Destroys the context's resources now; retains stay counted (the context is
  // created again on the next retain or use).
  destroy_context_resources(s, d);
  dev.active = dev.refs > 0;
  ++s.resets;
  log_line("reset");
  return CUDA_SUCCESS;
}

CUresult CtxSetCurrent(CUcontext c) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  const uintptr_t h = reinterpret_cast<uintptr_t>(c);
  if (h != 0) {
    if (h < kCtxBase || (h - kCtxBase) % 16 || !valid_device(s, ctx_device(h)))
      return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent");
    const Device& dev = s.devices[static_cast<size_t>(ctx_device(h))];
    // Binding a faulted context succeeds; the calls made in it then fail.
    if (!dev.active) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "the primary context is not retained");
  }
  tls_ctx = h;
  return CUDA_SUCCESS;
}

CUresult CtxSynchronize() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return r;
  if (prohibited_by_capture(s)) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuCtxSynchronize");
  return CUDA_SUCCESS;
}

// --- memory -------------------------------------------------------------------------------

CUresult MemGetInfo(size_t* free_bytes, size_t* total) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return r;
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  const size_t used = s.devices[static_cast<size_t>(dev)].used;
  *free_bytes = used < s.budget ? s.budget - used : 0;
  *total = kTotalMem;
  return CUDA_SUCCESS;
}

CUresult MemAlloc(CUdeviceptr* p, size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuMemAlloc");
  if (!p || bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc");
  if (prohibited_by_capture(s)) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemAlloc");
  ++s.mem_alloc_calls;
  Device& d = s.devices[static_cast<size_t>(dev)];
  const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  if (size < bytes || size > s.budget - std::min(d.used, s.budget))
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc",
                std::to_string(bytes) + " B requested, " + std::to_string(s.budget - std::min(d.used, s.budget)) +
                    " B free");
  void* mem = nullptr;
  if (auto reuse = s.pool.find(size); reuse != s.pool.end()) {
    // The most recently freed block of this size (multimap keeps insertion order
    // within a key).
    auto last = s.pool.upper_bound(size);
    --last;
    mem = last->second;
    s.pool.erase(last);
  } else {
    mem = std::aligned_alloc(kAlign, size);
  }
  if (!mem) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "host allocation failed");
  // Fresh device memory reads as zeros here (a GPU's holds whatever was there).
  std::memset(mem, 0, size);
  const auto addr = reinterpret_cast<uintptr_t>(mem);
  s.allocs[addr] = Allocation{dev, size};
  d.used += size;
  *p = static_cast<CUdeviceptr>(addr);
  log_line("alloc " + std::to_string(bytes) + " " + hex(addr));
  return CUDA_SUCCESS;
}

CUresult MemFree(CUdeviceptr p) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuMemFree");
  if (p == 0) return CUDA_SUCCESS;
  if (prohibited_by_capture(s)) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemFree");
  auto it = s.allocs.find(static_cast<uintptr_t>(p));
  if (it == s.allocs.end() || it->second.dev != dev)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree", hex(p) + " is not an allocation's base");
  ++s.mem_free_calls;
  s.devices[static_cast<size_t>(dev)].used -= it->second.bytes;
  s.pool.emplace(it->second.bytes, reinterpret_cast<void*>(it->first));
  s.allocs.erase(it);
  log_line("free " + hex(p));
  return CUDA_SUCCESS;
}

Node copy_node(Node::Kind k, CUdeviceptr dst, CUdeviceptr src, void* host_dst, const void* host_src, size_t n) {
  Node x;
  x.kind = k;
  x.dst = dst;
  x.src = src;
  x.host_dst = host_dst;
  x.host_src = host_src;
  x.bytes = n;
  return x;
}

CUresult MemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  return memop(copy_node(Node::kHtoD, dst, 0, nullptr, src, n), CU_STREAM_LEGACY, true, "cuMemcpyHtoD");
}
CUresult MemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  return memop(copy_node(Node::kDtoH, 0, src, dst, nullptr, n), CU_STREAM_LEGACY, true, "cuMemcpyDtoH");
}
CUresult MemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
  return memop(copy_node(Node::kHtoD, dst, 0, nullptr, src, n), h, false, "cuMemcpyHtoDAsync");
}
CUresult MemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream h) {
  return memop(copy_node(Node::kDtoH, 0, src, dst, nullptr, n), h, false, "cuMemcpyDtoHAsync");
}
CUresult MemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  return memop(copy_node(Node::kDtoD, dst, src, nullptr, nullptr, n), h, false, "cuMemcpyDtoDAsync");
}
CUresult MemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream h) {
  Node x = copy_node(Node::kMemset8, dst, 0, nullptr, nullptr, n);
  x.value = v;
  return memop(std::move(x), h, false, "cuMemsetD8Async");
}
CUresult MemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream h) {
  if (n > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
  Node x = copy_node(Node::kMemset32, dst, 0, nullptr, nullptr, n * 4);
  x.value = v;
  return memop(std::move(x), h, false, "cuMemsetD32Async");
}
// Device to device only (what the runtime uses): rows of WidthInBytes, Height of
// them, each side's pitch apart, from the X/Y offsets.
CUresult Memcpy2DAsync(const CUDA_MEMCPY2D* c, CUstream h) {
  if (!c) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpy2DAsync", "null descriptor");
  if (c->srcMemoryType != CU_MEMORYTYPE_DEVICE || c->dstMemoryType != CU_MEMORYTYPE_DEVICE)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpy2DAsync", "the fake copies device to device only");
  if (c->Height > 1 && (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes))
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpy2DAsync", "a pitch narrower than a row");
  Node x = copy_node(Node::kCopy2D, c->dstDevice + c->dstXInBytes + c->dstY * c->dstPitch,
                     c->srcDevice + c->srcXInBytes + c->srcY * c->srcPitch, nullptr, nullptr, c->WidthInBytes);
  x.height = c->Height;
  x.src_pitch = c->srcPitch;
  x.dst_pitch = c->dstPitch;
  if (x.bytes == 0 || x.height == 0) return CUDA_SUCCESS;
  return memop(std::move(x), h, false, "cuMemcpy2DAsync");
}

// --- streams and events ---------------------------------------------------------------------

CUresult StreamCreate(CUstream* out, unsigned int flags) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuStreamCreate");
  if (!out || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t id = s.next_id += 16;
  s.streams[id] = StreamRec{dev, flags, {}};
  *out = handle<CUstream>(id);
  return CUDA_SUCCESS;
}

CUresult StreamDestroy(CUstream h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.streams.find(id_of(h));
  if (it == s.streams.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  if (it->second.cap.graph) s.graphs.erase(it->second.cap.graph);
  s.streams.erase(it);
  return CUDA_SUCCESS;
}

CUresult StreamSynchronize(CUstream h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool bad = false;
  StreamRec* st = find_stream(s, h, &bad);
  if (bad) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize");
  int dev = 0;
  if (st) {
    if (CUresult r = need_dev(s, st->dev); r != CUDA_SUCCESS) return r;
  } else if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) {
    return r;
  }
  if (is_capturing(st)) {
    st->cap.invalidated = true;
    return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize", "the stream is capturing");
  }
  if (!st && prohibited_by_capture(s)) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize");
  return CUDA_SUCCESS;
}

// Work runs at once, so an existing stream has always finished.
CUresult StreamQuery(CUstream h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool bad = false;
  StreamRec* st = find_stream(s, h, &bad);
  if (bad) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamQuery");
  int dev = 0;
  if (st) {
    if (CUresult r = need_dev(s, st->dev); r != CUDA_SUCCESS) return r;
  } else if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) {
    return r;
  }
  return CUDA_SUCCESS;
}

CUresult StreamWaitEvent(CUstream h, CUevent e, unsigned int) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool bad = false;
  StreamRec* st = find_stream(s, h, &bad);
  auto ev = s.events.find(id_of(e));
  if (bad || ev == s.events.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent");
  if (CUresult r = need_dev(s, ev->second.dev); r != CUDA_SUCCESS) return r;
  if (st && st->dev != ev->second.dev) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent", "another device");
  log_line("streamwait " + hex(id_of(h)) + " " + hex(ev->first));
  return CUDA_SUCCESS;  // work runs at once, so every wait is already satisfied
}

CUresult EventCreate(CUevent* out, unsigned int flags) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuEventCreate");
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t id = s.next_id += 16;
  EventRec e;
  e.dev = dev;
  e.flags = flags;
  s.events[id] = e;
  *out = handle<CUevent>(id);
  return CUDA_SUCCESS;
}

CUresult EventDestroy(CUevent h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.events.find(id_of(h));
  if (it == s.events.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  s.events.erase(it);
  return CUDA_SUCCESS;
}

CUresult EventRecord(CUevent h, CUstream sh) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.events.find(id_of(h));
  bool bad = false;
  StreamRec* st = find_stream(s, sh, &bad);
  if (it == s.events.end() || bad) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  if (!st && implicit_with_capture(s, sh)) return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "cuEventRecord");
  if (is_capturing(st)) {
    Node n;
    n.kind = Node::kEventRecord;
    n.event = it->first;
    s.graphs[st->cap.graph].nodes.push_back(n);
    it->second.captured = true;
    return CUDA_SUCCESS;
  }
  it->second.recorded = true;
  it->second.captured = false;
  it->second.time_ns = s.clock_ns;
  log_line("record " + hex(it->first) + " " + hex(id_of(sh)));
  return CUDA_SUCCESS;
}

CUresult EventSynchronize(CUevent h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.events.find(id_of(h));
  if (it == s.events.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  if (it->second.captured) return fail(CUDA_ERROR_CAPTURED_EVENT, "cuEventSynchronize");
  return CUDA_SUCCESS;
}

CUresult EventElapsedTime(float* ms, CUevent a, CUevent b) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto ia = s.events.find(id_of(a)), ib = s.events.find(id_of(b));
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if (ia == s.events.end() || ib == s.events.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime");
  if (CUresult r = need_dev(s, ia->second.dev); r != CUDA_SUCCESS) return r;
  if (ia->second.captured || ib->second.captured) return fail(CUDA_ERROR_CAPTURED_EVENT, "cuEventElapsedTime");
  // As the driver: both recorded, both with timing.
  if (!ia->second.recorded || !ib->second.recorded || (ia->second.flags & CU_EVENT_DISABLE_TIMING) ||
      (ib->second.flags & CU_EVENT_DISABLE_TIMING))
    return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime", "an event is unrecorded or has no timing");
  *ms = static_cast<float>(static_cast<double>(ib->second.time_ns - ia->second.time_ns) / 1e6);
  return CUDA_SUCCESS;
}

}  // namespace fake
