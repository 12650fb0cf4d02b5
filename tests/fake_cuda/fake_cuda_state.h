// The fake driver's state and internals, shared by fake_libcuda.cpp (error names,
// checks, PTX, the execution of launches and memory operations, the entry point
// table and the test hooks), fake_cuda_api.cpp (initialisation, devices, contexts,
// memory, streams and events) and fake_cuda_launch.cpp (JIT linking, modules,
// tensor maps, launches and graphs). Everything here is hidden in the library
// (CXX_VISIBILITY_PRESET); only cuGetProcAddress_v2 and the fake_cuda_* hooks are
// exported.
#pragma once

#include <cuda.h>
#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "tests/fake_cuda/fake_log.h"
#include "runtime/gpu/cuda_driver.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace fake {


constexpr int kDriverVersion = 13000;
constexpr const char* kDeviceName = "shardfuse fake GPU";
constexpr size_t kTotalMem = size_t{80} << 30;  // 80 GiB, as an H100 SXM reports
constexpr size_t kDefaultBudget = size_t{1} << 30;
constexpr size_t kAlign = 256;                      // cuMemAlloc's guaranteed alignment
constexpr int64_t kLaunchNs = 10'000;               // each executed launch takes 10 us of fake time
constexpr int kSms = 132;                           // the fake device's SMs (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
constexpr int kDefaultShared = 48 * 1024;           // dynamic shared memory without opt-in
constexpr int kMaxSharedOptin = 232448;             // 227 KiB: sm_90's per-block opt-in limit
constexpr size_t kSharedPerSm = 233472;             // 228 KiB an SM
constexpr uintptr_t kCtxBase = 0xC7000;             // context handles: kCtxBase + 16 * ordinal

// --- state ------------------------------------------------------------------------------

struct Device {
  int refs = 0;        // primary context retain count
  bool active = false; // the primary context exists
  CUresult sticky = CUDA_SUCCESS;
  size_t used = 0;     // bytes allocated
};

struct Allocation {
  int dev = 0;
  size_t bytes = 0;  // rounded up to kAlign
};

struct Capture {
  uint64_t graph = 0;  // the CUgraph being recorded; 0 when not capturing
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id owner;
  bool invalidated = false;
};

struct StreamRec {
  int dev = 0;
  unsigned flags = 0;
  Capture cap;
};

struct EventRec {
  int dev = 0;
  unsigned flags = 0;
  bool recorded = false;
  bool captured = false;  // last recorded into a capture
  int64_t time_ns = 0;
};

struct EntryInfo {
  std::string name;
  int params = 0;
  int cluster = 1;  // `.reqnctapercluster x, ..` in its header: blocks per cluster along x
};

struct ModuleRec {
  int dev = 0;
  std::vector<EntryInfo> entries;
  std::map<std::string, uint64_t> funcs;  // handles handed out, by entry name
};

struct FuncRec {
  int dev = 0;
  uint64_t module = 0;
  std::string entry;
  int params = 0;
  int max_dyn_shared = 0;
  int cluster = 1;
};

// One JIT log option pair: the caller's buffer, its capacity and the slot the
// driver writes the filled size back into.
struct JitLog {
  char* buf = nullptr;
  size_t cap = 0;
  void** size_slot = nullptr;
  std::string text;  // accumulated for the life of the link state
};

struct LinkRec {
  int dev = 0;
  JitLog error, info;
  std::string ptx;
  std::string cubin;  // kCubinMagic + the PTX, NUL-terminated: what cuModuleLoadData accepts
  int inputs = 0;
};

struct Node {
  enum Kind { kLaunch, kMemset8, kMemset32, kHtoD, kDtoH, kDtoD, kCopy2D, kEventRecord } kind = kLaunch;
  uint64_t stream = 0;  // the stream it was enqueued on (a graph's launch stream when replayed); 0: legacy
  // kLaunch
  uint64_t func = 0;
  std::string entry;
  int cluster = 1;  // the function's blocks per cluster
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  unsigned shared = 0;
  std::vector<CUdeviceptr> args;
  // memory operations
  CUdeviceptr dst = 0, src = 0;
  void* host_dst = nullptr;
  const void* host_src = nullptr;
  size_t bytes = 0;
  unsigned value = 0;
  // kCopy2D: `height` rows of `bytes` bytes, rows `src_pitch` and `dst_pitch` apart
  size_t height = 0, src_pitch = 0, dst_pitch = 0;
  // kEventRecord
  uint64_t event = 0;
};

struct GraphRec {
  int dev = 0;
  std::vector<Node> nodes;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  bool async_errors = false;  // a fault surfaces at the next call instead of the launch
  // A fault outlives a context reset, and retaining the context again returns it:
  // what driver 580 did on an H200 (bench/results/gpu-check-h200-2026-11-26-run1.log).
  bool sticky_for_process = false;
  size_t budget = kDefaultBudget;
  std::vector<Device> devices;
  std::map<uintptr_t, Allocation> allocs;  // base address -> allocation
  // Freed blocks by size, handed out again last-in first-out: a driver reuses
  // addresses too, so a stale pointer kept past its free (or past a context
  // reset) meets a new allocation deterministically, as it would on a GPU.
  std::multimap<size_t, void*> pool;
  std::map<uint64_t, StreamRec> streams;
  std::map<uint64_t, EventRec> events;
  std::map<uint64_t, ModuleRec> modules;
  std::map<uint64_t, FuncRec> funcs;
  std::map<uint64_t, LinkRec> links;
  std::map<uint64_t, GraphRec> graphs;
  std::map<uint64_t, GraphRec> execs;
  uint64_t next_id = 0x10000;  // handles are ids, never reused, so a stale one is always caught
  int64_t clock_ns = 0;
  int64_t launches = 0, mem_alloc_calls = 0, mem_free_calls = 0, resets = 0;
  int64_t tensor_maps = 0;             // cuTensorMapEncodeTiled calls that succeeded
  std::vector<CUdeviceptr> last_args;  // of the last executed launch
};

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

extern thread_local uintptr_t tls_ctx;  // the calling thread's current context
inline const char* kCubinMagic = "SF-FAKE-CUBIN\n";

State& state();
CUresult fail(CUresult r, const char* call, const std::string& why = "");
const ErrorText* find_error(CUresult r);
const char* error_name(CUresult r);
long long env_int(const char* name, long long fallback);
bool valid_device(const State& s, CUdevice d);

int ctx_device(uintptr_t ctx);

// A call that needs the calling thread's current context (allocating, creating a
// resource, launching): its device, or why not.
CUresult need_ctx(State& s, int* dev);
CUresult need_dev(State& s, int dev);
StreamRec* find_stream(State& s, CUstream h, bool* bad);
bool is_capturing(const StreamRec* st);

// Potentially unsafe calls (cuMemAlloc, cuMemFree, synchronous copies,
// cuCtxSynchronize) are prohibited while a global-mode capture is under way
// anywhere, or a thread-local one on this thread; the call fails and the
// capture is invalidated, as on a real driver.
bool prohibited_by_capture(State& s);
bool implicit_with_capture(State& s, CUstream h);
const Allocation* find_range(const State& s, int dev, CUdeviceptr p, size_t n);
void destroy_context_resources(State& s, int dev);
int line_of(const std::string& text, size_t pos);
bool ident_char(char c);
std::vector<EntryInfo> parse_entries(const std::string& ptx);
CUresult jit_check(const std::string& ptx, std::string* log);
bool read_jit_options(unsigned n, const CUjit_option* opts, void** vals, JitLog* error, JitLog* info);
void jit_write(JitLog& log, const std::string& line);
std::string dims(const unsigned v[3]);
size_t span(const Node& n, size_t pitch);
bool reads_device(const Node& n);
CUresult fault(State& s, int dev, const char* call, const std::string& why);
CUresult execute(State& s, int dev, const Node& n, bool from_graph, const char* call);
CUresult memop(Node n, CUstream h, bool sync, const char* call);
CUresult Init(unsigned int flags);
CUresult DriverGetVersion(int* v);
CUresult DeviceGetCount(int* n);
CUresult DeviceGet(CUdevice* d, int ordinal);
CUresult DeviceGetName(char* name, int len, CUdevice d);
int attribute(CUdevice_attribute a, CUdevice d);
CUresult DeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d);
CUresult DeviceTotalMem(size_t* bytes, CUdevice d);
CUresult GetErrorName(CUresult r, const char** s);
CUresult GetErrorString(CUresult r, const char** s);
CUresult DevicePrimaryCtxRetain(CUcontext* c, CUdevice d);
CUresult DevicePrimaryCtxRelease(CUdevice d);
CUresult DevicePrimaryCtxReset(CUdevice d);
CUresult CtxSetCurrent(CUcontext c);
CUresult CtxSynchronize();
CUresult MemGetInfo(size_t* free_bytes, size_t* total);
CUresult MemAlloc(CUdeviceptr* p, size_t bytes);
CUresult MemFree(CUdeviceptr p);
Node copy_node(Node::Kind k, CUdeviceptr dst, CUdeviceptr src, void* host_dst, const void* host_src, size_t n);
CUresult MemcpyHtoD(CUdeviceptr dst, const void* src, size_t n);
CUresult MemcpyDtoH(void* dst, CUdeviceptr src, size_t n);
CUresult MemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream h);
CUresult MemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream h);
CUresult MemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h);
CUresult MemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream h);
CUresult MemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream h);
CUresult Memcpy2DAsync(const CUDA_MEMCPY2D* c, CUstream h);
CUresult StreamCreate(CUstream* out, unsigned int flags);
CUresult StreamDestroy(CUstream h);
CUresult StreamSynchronize(CUstream h);
CUresult StreamQuery(CUstream h);
CUresult StreamWaitEvent(CUstream h, CUevent e, unsigned int);
CUresult EventCreate(CUevent* out, unsigned int flags);
CUresult EventDestroy(CUevent h);
CUresult EventRecord(CUevent h, CUstream sh);
CUresult EventSynchronize(CUevent h);
CUresult EventElapsedTime(float* ms, CUevent a, CUevent b);
CUresult LinkCreate(unsigned int n, CUjit_option* opts, void** vals, CUlinkState* out);
CUresult LinkAddData(CUlinkState h, CUjitInputType type, void* data, size_t size, const char*, unsigned int n,
                     CUjit_option* opts, void** vals);
CUresult LinkComplete(CUlinkState h, void** cubin, size_t* size);
CUresult LinkDestroy(CUlinkState h);
CUresult ModuleLoadData(CUmodule* out, const void* image);
CUresult ModuleUnload(CUmodule h);
CUresult ModuleGetFunction(CUfunction* out, CUmodule h, const char* name);
CUresult FuncSetAttribute(CUfunction h, CUfunction_attribute a, int v);
CUresult OccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction h, int block, size_t dyn_shared);
CUresult OccupancyMaxActiveClusters(int* n, CUfunction h, const CUlaunchConfig* config);
CUresult TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                              const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                              const cuuint32_t* elem_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
CUresult LaunchKernel(CUfunction h, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned shared, CUstream sh, void** params, void** extra);
CUresult StreamBeginCapture(CUstream h, CUstreamCaptureMode mode);
CUresult StreamEndCapture(CUstream h, CUgraph* out);
CUresult GraphInstantiateWithFlags(CUgraphExec* out, CUgraph g, unsigned long long);
CUresult GraphLaunch(CUgraphExec h, CUstream sh);
CUresult GraphExecDestroy(CUgraphExec h);
CUresult GraphDestroy(CUgraph h);

}  // namespace fake
