// A stand-in for libcuda.so.1 that runs no kernels (tests/fake_cuda/README.md).
//
// runtime/gpu/cuda_driver.cpp dlopen()s $SHARDFUSE_LIBCUDA and asks its
// cuGetProcAddress_v2 for every entry point in SF_CUDA_ENTRY_POINTS; this library
// answers with the functions below. "Device" memory is host memory, so copies and
// memsets really happen; a launch checks what a GPU would reject (dimensions,
// shared memory, its pointer arguments) and is logged, but no kernel code runs.
//
// The checks are the driver's own where they catch runtime bugs a CPU-only CI
// would otherwise miss: a call without a current context, a stale handle after a
// context reset, an unsafe call (cuMemAlloc, a synchronous copy) inside a stream
// capture, an argument pointing outside every allocation, the sticky error after
// a fault that only a primary-context reset clears.
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
namespace {

constexpr int kDriverVersion = 13000;
constexpr const char* kDeviceName = "shardfuse fake GPU";
constexpr size_t kTotalMem = size_t{80} << 30;  // 80 GiB, as an H100 SXM reports
constexpr size_t kDefaultBudget = size_t{1} << 30;
constexpr size_t kAlign = 256;                      // cuMemAlloc's guaranteed alignment
constexpr int64_t kLaunchNs = 10'000;               // each executed launch takes 10 us of fake time
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

// Never destroyed: at exit the runtime's static destructors may still call in, and
// LeakSanitizer sees the allocations as reachable from here.
State& state() {
  static State* s = new State;
  return *s;
}

thread_local uintptr_t tls_ctx = 0;  // the calling thread's current context

const char* kCubinMagic = "SF-FAKE-CUBIN\n";

const char* error_name(CUresult r);

CUresult fail(CUresult r, const char* call, const std::string& why = "") {
  log_line(std::string("error ") + call + " " + error_name(r) + (why.empty() ? "" : " (" + why + ")"));
  return r;
}

// --- error names ------------------------------------------------------------------------

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

// The driver's own names and strings for the codes this fake returns and those a
// caller is likely to print.
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* find_error(CUresult r) {
  for (const ErrorText& e : kErrors)
    if (e.code == r) return &e;
  return nullptr;
}

const char* error_name(CUresult r) {
  const ErrorText* e = find_error(r);
  return e ? e->name : "CUDA_ERROR_UNKNOWN";
}

// --- environment --------------------------------------------------------------------------

long long env_int(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  return end && *end == '\0' && x >= 0 ? x : fallback;
}

// --- checks shared by the entry points --------------------------------------------------

bool valid_device(const State& s, CUdevice d) { return d >= 0 && d < static_cast<int>(s.devices.size()); }

int ctx_device(uintptr_t ctx) { return static_cast<int>((ctx - kCtxBase) / 16); }

// A call that needs the calling thread's current context (allocating, creating a
// resource, launching): its device, or why not.
CUresult need_ctx(State& s, int* dev) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!tls_ctx) return CUDA_ERROR_INVALID_CONTEXT;
  int d = ctx_device(tls_ctx);
  if (!valid_device(s, d) || !s.devices[static_cast<size_t>(d)].active) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = s.devices[static_cast<size_t>(d)].sticky; r != CUDA_SUCCESS) return r;
  *dev = d;
  return CUDA_SUCCESS;
}

// A call on a resource of device `dev`: the sticky error, if any.
CUresult need_dev(State& s, int dev) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return s.devices[static_cast<size_t>(dev)].sticky;
}

// The stream `h`, or null for the legacy/per-thread default streams; *bad when
// the handle names nothing.
StreamRec* find_stream(State& s, CUstream h, bool* bad) {
  *bad = false;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return nullptr;
  auto it = s.streams.find(id_of(h));
  if (it == s.streams.end()) {
    *bad = true;
    return nullptr;
  }
  return &it->second;
}

bool is_capturing(const StreamRec* st) { return st && st->cap.graph; }

// Potentially unsafe calls (cuMemAlloc, cuMemFree, synchronous copies,
// cuCtxSynchronize) are prohibited while a global-mode capture is under way
// anywhere, or a thread-local one on this thread; the call fails and the
// capture is invalidated, as on a real driver.
bool prohibited_by_capture(State& s) {
  bool hit = false;
  for (auto& [id, st] : s.streams) {
    Capture& c = st.cap;
    if (!c.graph) continue;
    if (c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
        (c.mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && c.owner == std::this_thread::get_id())) {
      c.invalidated = true;
      hit = true;
    }
  }
  return hit;
}

// Work on the legacy default stream while a blocking stream is capturing would
// make the capture depend on it implicitly.
bool implicit_with_capture(State& s, CUstream h) {
  if (h != nullptr && h != CU_STREAM_LEGACY) return false;
  bool hit = false;
  for (auto& [id, st] : s.streams)
    if (st.cap.graph && !(st.flags & CU_STREAM_NON_BLOCKING)) {
      st.cap.invalidated = true;
      hit = true;
    }
  return hit;
}

// The allocation holding [p, p + n), or null.
const Allocation* find_range(const State& s, int dev, CUdeviceptr p, size_t n) {
  auto it = s.allocs.upper_bound(static_cast<uintptr_t>(p));
  if (it == s.allocs.begin()) return nullptr;
  --it;
  const uintptr_t base = it->first;
  if (it->second.dev != dev) return nullptr;
  if (p < base || p - base > it->second.bytes || n > it->second.bytes - (p - base)) return nullptr;
  if (n == 0 && p - base == it->second.bytes) return nullptr;  // one past the end is not inside
  return &it->second;
}

// Frees everything device `dev`'s context owned: its primary context went away.
void destroy_context_resources(State& s, int dev) {
  for (auto it = s.allocs.begin(); it != s.allocs.end();) {
    if (it->second.dev == dev) {
      s.pool.emplace(it->second.bytes, reinterpret_cast<void*>(it->first));
      it = s.allocs.erase(it);
    } else {
      ++it;
    }
  }
  auto drop = [dev](auto& m) { std::erase_if(m, [dev](const auto& kv) { return kv.second.dev == dev; }); };
  drop(s.streams);
  drop(s.events);
  drop(s.modules);
  drop(s.funcs);
  drop(s.links);
  drop(s.graphs);
  drop(s.execs);
  Device& d = s.devices[static_cast<size_t>(dev)];
  d.used = 0;
  if (!s.sticky_for_process) d.sticky = CUDA_SUCCESS;
}

// --- PTX ------------------------------------------------------------------------------------

int line_of(const std::string& text, size_t pos) {
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.';
}

// Every `.entry name(.param ..., ...)` and its number of parameters.
std::vector<EntryInfo> parse_entries(const std::string& ptx) {
  std::vector<EntryInfo> out;
  for (size_t pos = ptx.find(".entry"); pos != std::string::npos; pos = ptx.find(".entry", pos + 6)) {
    if (pos > 0 && ident_char(ptx[pos - 1])) continue;
    size_t i = pos + 6;
    if (i >= ptx.size() || !std::isspace(static_cast<unsigned char>(ptx[i]))) continue;
    while (i < ptx.size() && std::isspace(static_cast<unsigned char>(ptx[i]))) ++i;
    size_t b = i;
    while (i < ptx.size() && ident_char(ptx[i])) ++i;
    EntryInfo e;
    e.name = ptx.substr(b, i - b);
    if (e.name.empty()) continue;
    while (i < ptx.size() && std::isspace(static_cast<unsigned char>(ptx[i]))) ++i;
    if (i < ptx.size() && ptx[i] == '(') {
      size_t close = ptx.find(')', i);
      std::string list = ptx.substr(i + 1, close == std::string::npos ? std::string::npos : close - i - 1);
      for (size_t p = list.find(".param"); p != std::string::npos; p = list.find(".param", p + 6)) ++e.params;
    }
    out.push_back(e);
  }
  return out;
}

// What the JIT says about a PTX text: CUDA_SUCCESS, or the error and its log line.
CUresult jit_check(const std::string& ptx, std::string* log) {
  if (size_t p = ptx.find("FAKE_JIT_ERROR"); p != std::string::npos) {
    *log = "ptxas application ptx input, line " + std::to_string(line_of(ptx, p)) +
           "; error   : fake JIT error at FAKE_JIT_ERROR";
    return CUDA_ERROR_INVALID_PTX;
  }
  if (ptx.find(".version") == std::string::npos) {
    *log = "ptxas application ptx input, line 1; fatal   : Missing .version directive at start of file";
    return CUDA_ERROR_INVALID_PTX;
  }
  // The device is compute capability 9.0: PTX for a newer target does not load.
  if (size_t p = ptx.find(".target"); p != std::string::npos) {
    size_t sm = ptx.find("sm_", p);
    if (sm != std::string::npos && sm < ptx.find('\n', p)) {
      int arch = std::atoi(ptx.c_str() + sm + 3);
      if (arch > 90) {
        *log = "ptxas application ptx input, line " + std::to_string(line_of(ptx, p)) +
               "; error   : SM version specified by .target is higher than default SM version assumed";
        return CUDA_ERROR_INVALID_PTX;
      }
    }
  }
  return CUDA_SUCCESS;
}

// Reads the JIT log options; true when they are well formed.
bool read_jit_options(unsigned n, const CUjit_option* opts, void** vals, JitLog* error, JitLog* info) {
  if (n && (!opts || !vals)) return false;
  for (unsigned i = 0; i < n; ++i) {
    switch (opts[i]) {
      case CU_JIT_ERROR_LOG_BUFFER: error->buf = static_cast<char*>(vals[i]); break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        error->cap = static_cast<size_t>(reinterpret_cast<uintptr_t>(vals[i]));
        error->size_slot = &vals[i];
        break;
      case CU_JIT_INFO_LOG_BUFFER: info->buf = static_cast<char*>(vals[i]); break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        info->cap = static_cast<size_t>(reinterpret_cast<uintptr_t>(vals[i]));
        info->size_slot = &vals[i];
        break;
      default: break;
    }
  }
  return true;
}

// Appends a line to a JIT log and copies what fits (with its NUL) to the caller.
void jit_write(JitLog& log, const std::string& line) {
  if (!log.text.empty()) log.text += '\n';
  log.text += line;
  if (!log.buf || log.cap == 0) return;
  const size_t n = std::min(log.text.size(), log.cap - 1);
  std::memcpy(log.buf, log.text.data(), n);
  log.buf[n] = '\0';
  if (log.size_slot) *log.size_slot = reinterpret_cast<void*>(static_cast<uintptr_t>(n + 1));
}

// --- execution of launches and memory operations ---------------------------------------

std::string dims(const unsigned v[3]) {
  return std::to_string(v[0]) + "," + std::to_string(v[1]) + "," + std::to_string(v[2]);
}

// Sets the sticky fault; returns what the faulting call returns.
// The bytes an operation touches from its start: a 2-D copy's rows with the pitch
// between them, or `bytes`.
size_t span(const Node& n, size_t pitch) {
  if (n.kind != Node::kCopy2D) return n.bytes;
  return n.height == 0 ? 0 : (n.height - 1) * pitch + n.bytes;
}
bool reads_device(const Node& n) {
  return n.kind == Node::kDtoH || n.kind == Node::kDtoD || n.kind == Node::kCopy2D;
}

CUresult fault(State& s, int dev, const char* call, const std::string& why) {
  s.devices[static_cast<size_t>(dev)].sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
  fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, why);
  return s.async_errors ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
}

// What a GPU would do with an enqueued node: a memory operation happens, a launch
// checks its pointers and advances the clock. `call` names the driver call that
// reports a fault.
CUresult execute(State& s, int dev, const Node& n, bool from_graph, const char* call) {
  const std::string suffix = from_graph ? " graph" : "";
  switch (n.kind) {
    case Node::kLaunch: {
      if (n.entry.find("fault") != std::string::npos)
        return fault(s, dev, call, "entry " + n.entry + " faults by its name");
      for (size_t i = 0; i < n.args.size(); ++i)
        if (!find_range(s, dev, n.args[i], 0))
          return fault(s, dev, call,
                       n.entry + " argument " + std::to_string(i) + " = " + hex(n.args[i]) + " is in no allocation");
      s.clock_ns += kLaunchNs;
      ++s.launches;
      s.last_args = n.args;
      log_line("launch " + n.entry + " grid=" + dims(n.grid) + " block=" + dims(n.block) +
               " shared=" + std::to_string(n.shared) + " args=" + std::to_string(n.args.size()) +
               " stream=" + hex(n.stream) + suffix);
      return CUDA_SUCCESS;
    }
    case Node::kMemset8:
    case Node::kMemset32:
    case Node::kHtoD:
    case Node::kDtoH:
    case Node::kDtoD:
    case Node::kCopy2D: break;
    case Node::kEventRecord: {
      auto it = s.events.find(n.event);
      if (it != s.events.end()) {
        it->second.recorded = true;
        it->second.captured = false;
        it->second.time_ns = s.clock_ns;
      }
      return CUDA_SUCCESS;
    }
  }
  // Memory operations were checked when enqueued; in a replayed graph the memory
  // may have been freed since, which on a GPU is a fault.
  auto need = [&](CUdeviceptr p, size_t pitch) -> bool { return find_range(s, dev, p, span(n, pitch)) != nullptr; };
  const bool dst_dev = n.kind != Node::kDtoH, src_dev = reads_device(n);
  if ((dst_dev && !need(n.dst, n.dst_pitch)) || (src_dev && !need(n.src, n.src_pitch)))
    return fault(s, dev, call, "a replayed copy or memset touches freed memory");
  switch (n.kind) {
    case Node::kMemset8:
      std::memset(reinterpret_cast<void*>(n.dst), static_cast<int>(n.value & 0xff), n.bytes);
      log_line("memset8 " + hex(n.dst) + " " + std::to_string(n.value & 0xff) + " " + std::to_string(n.bytes) + suffix);
      break;
    case Node::kMemset32: {
      auto* p = reinterpret_cast<uint32_t*>(n.dst);
      std::fill(p, p + n.bytes / 4, static_cast<uint32_t>(n.value));
      log_line("memset32 " + hex(n.dst) + " " + hex(n.value) + " " + std::to_string(n.bytes) + suffix);
      break;
    }
    case Node::kHtoD:
      std::memcpy(reinterpret_cast<void*>(n.dst), n.host_src, n.bytes);
      log_line("htod " + std::to_string(n.bytes) + suffix);
      break;
    case Node::kDtoH:
      std::memcpy(n.host_dst, reinterpret_cast<const void*>(n.src), n.bytes);
      log_line("dtoh " + std::to_string(n.bytes) + suffix);
      break;
    case Node::kDtoD:
      std::memmove(reinterpret_cast<void*>(n.dst), reinterpret_cast<const void*>(n.src), n.bytes);
      log_line("dtod " + std::to_string(n.bytes) + suffix);
      break;
    case Node::kCopy2D:
      for (size_t row = 0; row < n.height; ++row)
        std::memmove(reinterpret_cast<void*>(n.dst + row * n.dst_pitch),
                     reinterpret_cast<const void*>(n.src + row * n.src_pitch), n.bytes);
      log_line("copy2d " + std::to_string(n.bytes) + "x" + std::to_string(n.height) + " stream=" + hex(n.stream) +
               suffix);
      break;
    default: break;
  }
  return CUDA_SUCCESS;
}

// Enqueues a memory operation on stream `h`: checks it, then records it into the
// stream's capture or performs it now.
CUresult memop(Node n, CUstream h, bool sync, const char* call) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, call);
  bool bad = false;
  StreamRec* st = find_stream(s, h, &bad);
  if (bad || (st && st->dev != dev)) return fail(CUDA_ERROR_INVALID_HANDLE, call, "stream");
  if (sync && prohibited_by_capture(s)) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call);
  if (!st && implicit_with_capture(s, h)) return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, call);
  auto bad_value = [&](const std::string& why) {
    if (is_capturing(st)) st->cap.invalidated = true;
    return fail(CUDA_ERROR_INVALID_VALUE, call, why);
  };
  const bool dst_dev = n.kind != Node::kDtoH, src_dev = reads_device(n);
  if (dst_dev && !find_range(s, dev, n.dst, span(n, n.dst_pitch)))
    return bad_value(hex(n.dst) + " + " + std::to_string(span(n, n.dst_pitch)) + " B is not inside one allocation");
  if (src_dev && !find_range(s, dev, n.src, span(n, n.src_pitch)))
    return bad_value(hex(n.src) + " + " + std::to_string(span(n, n.src_pitch)) + " B is not inside one allocation");
  n.stream = id_of(h);
  if ((n.kind == Node::kHtoD && !n.host_src && n.bytes) || (n.kind == Node::kDtoH && !n.host_dst && n.bytes))
    return bad_value("null host pointer");
  if (n.kind == Node::kMemset32 && n.dst % 4) return bad_value("memset32 destination is not 4-byte aligned");
  if (is_capturing(st)) {
    s.graphs[st->cap.graph].nodes.push_back(std::move(n));
    return CUDA_SUCCESS;
  }
  return execute(s, dev, n, false, call);
}

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
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
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

// --- JIT linking and modules ----------------------------------------------------------------

CUresult LinkCreate(unsigned int n, CUjit_option* opts, void** vals, CUlinkState* out) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuLinkCreate");
  LinkRec l;
  l.dev = dev;
  if (!out || !read_jit_options(n, opts, vals, &l.error, &l.info)) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t id = s.next_id += 16;
  s.links[id] = std::move(l);
  *out = handle<CUlinkState>(id);
  return CUDA_SUCCESS;
}

CUresult LinkAddData(CUlinkState h, CUjitInputType type, void* data, size_t size, const char*, unsigned int n,
                     CUjit_option* opts, void** vals) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.links.find(id_of(h));
  if (it == s.links.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLinkAddData");
  LinkRec& l = it->second;
  if (CUresult r = need_dev(s, l.dev); r != CUDA_SUCCESS) return r;
  if (type != CU_JIT_INPUT_PTX) return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLinkAddData", "the fake links PTX only");
  if (!data || size == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkAddData");
  // Options given here apply to this input; their logs get this input's messages.
  JitLog add_error, add_info;
  if (!read_jit_options(n, opts, vals, &add_error, &add_info)) return CUDA_ERROR_INVALID_VALUE;
  const auto* text = static_cast<const char*>(data);
  const std::string ptx(text, strnlen(text, size));
  log_line("link " + std::to_string(ptx.size()));
  std::string msg;
  if (CUresult r = jit_check(ptx, &msg); r != CUDA_SUCCESS) {
    jit_write(l.error, msg);
    jit_write(add_error, msg);
    return fail(r, "cuLinkAddData", msg);
  }
  for (const EntryInfo& e : parse_entries(ptx)) {
    const std::string line = "ptxas info    : Compiling entry function '" + e.name + "' for 'sm_90a'";
    jit_write(l.info, line);
    jit_write(add_info, line);
  }
  l.ptx += ptx;
  l.ptx += '\n';
  ++l.inputs;
  return CUDA_SUCCESS;
}

CUresult LinkComplete(CUlinkState h, void** cubin, size_t* size) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.links.find(id_of(h));
  if (it == s.links.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLinkComplete");
  LinkRec& l = it->second;
  if (CUresult r = need_dev(s, l.dev); r != CUDA_SUCCESS) return r;
  if (!cubin || !size) return CUDA_ERROR_INVALID_VALUE;
  if (l.inputs == 0) {
    jit_write(l.error, "nvlink error   : no input files");
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkComplete", "no inputs");
  }
  // The "cubin" lives until cuLinkDestroy, as the driver's does.
  l.cubin = std::string(kCubinMagic) + l.ptx;
  *cubin = l.cubin.data();
  *size = l.cubin.size() + 1;
  return CUDA_SUCCESS;
}

CUresult LinkDestroy(CUlinkState h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.links.find(id_of(h));
  if (it == s.links.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLinkDestroy");
  s.links.erase(it);
  return CUDA_SUCCESS;
}

CUresult ModuleLoadData(CUmodule* out, const void* image) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuModuleLoadData");
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  const auto* text = static_cast<const char*>(image);
  std::string ptx;
  const size_t magic = std::strlen(kCubinMagic);
  if (std::strncmp(text, kCubinMagic, magic) == 0) {
    ptx = text + magic;  // from cuLinkComplete, already checked
  } else if (std::strncmp(text, "\x7f" "ELF", 4) == 0) {
    return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "the fake loads PTX and its own link output, not cubins");
  } else {
    ptx = text;  // a PTX image is JIT-compiled on load
    std::string msg;
    if (CUresult r = jit_check(ptx, &msg); r != CUDA_SUCCESS) return fail(r, "cuModuleLoadData", msg);
  }
  ModuleRec m;
  m.dev = dev;
  m.entries = parse_entries(ptx);
  const uint64_t id = s.next_id += 16;
  log_line("module " + std::to_string(m.entries.size()) + " entries");
  s.modules[id] = std::move(m);
  *out = handle<CUmodule>(id);
  return CUDA_SUCCESS;
}

CUresult ModuleUnload(CUmodule h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.modules.find(id_of(h));
  if (it == s.modules.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  for (const auto& [name, f] : it->second.funcs) s.funcs.erase(f);
  s.modules.erase(it);
  return CUDA_SUCCESS;
}

CUresult ModuleGetFunction(CUfunction* out, CUmodule h, const char* name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.modules.find(id_of(h));
  if (it == s.modules.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction");
  ModuleRec& m = it->second;
  if (CUresult r = need_dev(s, m.dev); r != CUDA_SUCCESS) return r;
  if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
  if (auto f = m.funcs.find(name); f != m.funcs.end()) {
    *out = handle<CUfunction>(f->second);
    return CUDA_SUCCESS;
  }
  auto e = std::find_if(m.entries.begin(), m.entries.end(), [&](const EntryInfo& x) { return x.name == name; });
  if (e == m.entries.end()) return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction", name);
  const uint64_t id = s.next_id += 16;
  s.funcs[id] = FuncRec{m.dev, it->first, e->name, e->params, 0};
  m.funcs[e->name] = id;
  *out = handle<CUfunction>(id);
  return CUDA_SUCCESS;
}

CUresult FuncSetAttribute(CUfunction h, CUfunction_attribute a, int v) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.funcs.find(id_of(h));
  if (it == s.funcs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuFuncSetAttribute");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (v < 0 || v > kMaxSharedOptin)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute", "max dynamic shared " + std::to_string(v) + " B");
    it->second.max_dyn_shared = v;
  }
  return CUDA_SUCCESS;
}

// An SM's limits as the fake models them: 2048 threads, 32 blocks, and its shared
// memory with 1 KiB reserved a block (it knows no registers).
CUresult OccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction h, int block, size_t dyn_shared) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.funcs.find(id_of(h));
  if (it == s.funcs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  if (!n || block <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  const size_t allowed = std::max<size_t>(kDefaultShared, static_cast<size_t>(it->second.max_dyn_shared));
  if (dyn_shared > allowed) {
    *n = 0;
    return CUDA_SUCCESS;
  }
  const size_t by_shared = kSharedPerSm / (dyn_shared + 1024);
  *n = static_cast<int>(std::min<size_t>({32, static_cast<size_t>(2048 / block), by_shared}));
  return CUDA_SUCCESS;
}

// --- launches and graphs --------------------------------------------------------------------

// The driver's documented limits on a tiled tensor map (CUDA Driver API,
// cuTensorMapEncodeTiled), CUDA_ERROR_INVALID_VALUE otherwise; no context needed.
// The map (opaque on a GPU) holds what a test can read back: FakeTensorMap.
struct FakeTensorMap {
  uint64_t magic = 0x66616b65746d6170;  // "faketmap"
  uint64_t address = 0;
  uint32_t type = 0, rank = 0, swizzle = 0, pad = 0;
  uint64_t dims[3] = {};
  uint64_t strides[2] = {};
  uint32_t box[3] = {};
};
static_assert(sizeof(FakeTensorMap) <= sizeof(CUtensorMap));

CUresult TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                              const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                              const cuuint32_t* elem_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  const char* call = "cuTensorMapEncodeTiled";
  if (!map || !address || !dims || !box || !elem_strides || (rank > 1 && !strides)) return fail(CUDA_ERROR_INVALID_VALUE, call, "null");
  if (rank < 1 || rank > 5) return fail(CUDA_ERROR_INVALID_VALUE, call, "rank");
  if (reinterpret_cast<uintptr_t>(address) % 16 != 0) return fail(CUDA_ERROR_INVALID_VALUE, call, "globalAddress not 16-byte aligned");
  int64_t elem = 0;
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: elem = 2; break;
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: elem = 4; break;
    default: return fail(CUDA_ERROR_INVALID_VALUE, call, "data type");
  }
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (uint64_t{1} << 32)) return fail(CUDA_ERROR_INVALID_VALUE, call, "globalDim");
    if (box[i] == 0 || box[i] > 256) return fail(CUDA_ERROR_INVALID_VALUE, call, "boxDim");
    if (elem_strides[i] == 0 || elem_strides[i] > 8) return fail(CUDA_ERROR_INVALID_VALUE, call, "elementStrides");
  }
  for (cuuint32_t i = 0; i + 1 < rank; ++i)
    if (strides[i] % 16 != 0 || strides[i] >= (uint64_t{1} << 40)) return fail(CUDA_ERROR_INVALID_VALUE, call, "globalStrides");
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return fail(CUDA_ERROR_INVALID_VALUE, call, "interleave");
  if (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box[0] * elem > 128)
    return fail(CUDA_ERROR_INVALID_VALUE, call, "the 128-byte swizzle's inner box is wider than 128 bytes");
  FakeTensorMap f;
  f.address = reinterpret_cast<uint64_t>(address);
  f.type = static_cast<uint32_t>(type);
  f.rank = rank;
  f.swizzle = static_cast<uint32_t>(swizzle);
  for (cuuint32_t i = 0; i < rank && i < 3; ++i) {
    f.dims[i] = dims[i];
    f.box[i] = box[i];
    if (i + 1 < rank && i < 2) f.strides[i] = strides[i];
  }
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &f, sizeof f);
  std::string line = "tensormap rank=" + std::to_string(rank) + " dims=";
  for (cuuint32_t i = 0; i < rank; ++i) line += (i ? "," : "") + std::to_string(dims[i]);
  line += " box=";
  for (cuuint32_t i = 0; i < rank; ++i) line += (i ? "," : "") + std::to_string(box[i]);
  log_line(line);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.tensor_maps;
  return CUDA_SUCCESS;
}

CUresult LaunchKernel(CUfunction h, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned shared, CUstream sh, void** params, void** extra) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int dev = 0;
  if (CUresult r = need_ctx(s, &dev); r != CUDA_SUCCESS) return fail(r, "cuLaunchKernel");
  auto it = s.funcs.find(id_of(h));
  if (it == s.funcs.end() || it->second.dev != dev) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel", "function");
  const FuncRec& f = it->second;
  bool bad = false;
  StreamRec* st = find_stream(s, sh, &bad);
  if (bad || (st && st->dev != dev)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel", "stream");
  if (!st && implicit_with_capture(s, sh)) return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "cuLaunchKernel");
  auto invalid = [&](const std::string& why) {
    if (is_capturing(st)) st->cap.invalidated = true;
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel", f.entry + ": " + why);
  };
  Node n;
  n.kind = Node::kLaunch;
  n.func = it->first;
  n.entry = f.entry;
  n.grid[0] = gx, n.grid[1] = gy, n.grid[2] = gz;
  n.block[0] = bx, n.block[1] = by, n.block[2] = bz;
  n.shared = shared;
  n.stream = id_of(sh);
  if (!gx || !gy || !gz || !bx || !by || !bz) return invalid("a zero grid or block dimension");
  if (gx > 2147483647u || gy > 65535 || gz > 65535) return invalid("grid " + dims(n.grid) + " beyond the device's limits");
  if (bx > 1024 || by > 1024 || bz > 64 || uint64_t{bx} * by * bz > 1024)
    return invalid("block " + dims(n.block) + " beyond 1024 threads");
  const unsigned limit = std::max<unsigned>(kDefaultShared, static_cast<unsigned>(f.max_dyn_shared));
  if (shared > limit)
    return invalid(std::to_string(shared) + " B of dynamic shared memory, " + std::to_string(limit) +
                   " B allowed (cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) raises it)");
  if (extra) return invalid("the fake takes kernelParams, not extra");
  if (f.params > 0 && !params) return invalid("null kernelParams for " + std::to_string(f.params) + " parameters");
  // Every parameter of our kernels is a device pointer (runtime/gpu/cuda.h's launch ABI).
  for (int i = 0; i < f.params; ++i) n.args.push_back(*static_cast<const CUdeviceptr*>(params[i]));
  if (is_capturing(st)) {
    s.graphs[st->cap.graph].nodes.push_back(std::move(n));
    return CUDA_SUCCESS;
  }
  return execute(s, dev, n, false, "cuLaunchKernel");
}

CUresult StreamBeginCapture(CUstream h, CUstreamCaptureMode mode) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool bad = false;
  StreamRec* st = find_stream(s, h, &bad);
  if (bad) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamBeginCapture");
  if (!st) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamBeginCapture", "the default stream");
  if (CUresult r = need_dev(s, st->dev); r != CUDA_SUCCESS) return r;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  if (st->cap.graph) return fail(CUDA_ERROR_ILLEGAL_STATE, "cuStreamBeginCapture", "already capturing");
  const uint64_t id = s.next_id += 16;
  s.graphs[id] = GraphRec{st->dev, {}};
  st->cap = Capture{id, mode, std::this_thread::get_id(), false};
  log_line("capture begin");
  return CUDA_SUCCESS;
}

CUresult StreamEndCapture(CUstream h, CUgraph* out) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool bad = false;
  StreamRec* st = find_stream(s, h, &bad);
  if (bad) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamEndCapture");
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = nullptr;
  if (!is_capturing(st)) return fail(CUDA_ERROR_ILLEGAL_STATE, "cuStreamEndCapture", "not capturing");
  Capture& c = st->cap;
  if (c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.owner != std::this_thread::get_id())
    return fail(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "cuStreamEndCapture");
  const uint64_t g = c.graph;
  const bool invalidated = c.invalidated;
  c = Capture{};
  if (invalidated) {
    s.graphs.erase(g);
    log_line("capture end invalidated");
    return fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "cuStreamEndCapture");
  }
  log_line("capture end nodes=" + std::to_string(s.graphs[g].nodes.size()));
  *out = handle<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult GraphInstantiateWithFlags(CUgraphExec* out, CUgraph g, unsigned long long) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.graphs.find(id_of(g));
  if (it == s.graphs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphInstantiateWithFlags");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& [id, st] : s.streams)
    if (st.cap.graph == it->first)
      return fail(CUDA_ERROR_ILLEGAL_STATE, "cuGraphInstantiateWithFlags", "the graph is still being captured");
  const uint64_t id = s.next_id += 16;
  s.execs[id] = it->second;  // an executable graph is a snapshot
  *out = handle<CUgraphExec>(id);
  return CUDA_SUCCESS;
}

CUresult GraphLaunch(CUgraphExec h, CUstream sh) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.execs.find(id_of(h));
  bool bad = false;
  StreamRec* st = find_stream(s, sh, &bad);
  if (it == s.execs.end() || bad) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch");
  const int dev = it->second.dev;
  if (CUresult r = need_dev(s, dev); r != CUDA_SUCCESS) return r;
  if (st && st->dev != dev) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch", "stream of another device");
  if (!st && implicit_with_capture(s, sh)) return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "cuGraphLaunch");
  if (is_capturing(st)) {  // a graph launched into a capture becomes part of it
    auto& nodes = s.graphs[st->cap.graph].nodes;
    nodes.insert(nodes.end(), it->second.nodes.begin(), it->second.nodes.end());
    return CUDA_SUCCESS;
  }
  log_line("graph launch nodes=" + std::to_string(it->second.nodes.size()));
  for (Node n : it->second.nodes) {
    if (n.kind == Node::kLaunch && !s.funcs.count(n.func))
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch", "the module of " + n.entry + " was unloaded");
    n.stream = id_of(sh);
    if (CUresult r = execute(s, dev, n, true, "cuGraphLaunch"); r != CUDA_SUCCESS) return r;
    if (s.devices[static_cast<size_t>(dev)].sticky != CUDA_SUCCESS) break;  // asynchronous fault mode
  }
  return CUDA_SUCCESS;
}

CUresult GraphExecDestroy(CUgraphExec h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.execs.find(id_of(h));
  if (it == s.execs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphExecDestroy");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  s.execs.erase(it);
  return CUDA_SUCCESS;
}

CUresult GraphDestroy(CUgraph h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.graphs.find(id_of(h));
  if (it == s.graphs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphDestroy");
  if (CUresult r = need_dev(s, it->second.dev); r != CUDA_SUCCESS) return r;
  s.graphs.erase(it);
  return CUDA_SUCCESS;
}

// --- the entry point table ------------------------------------------------------------------

struct Entry {
  const char* name;
  void* fn;
};

// One row per SF_CUDA_ENTRY_POINTS entry, so the table cannot fall out of step with
// the runtime; the static_cast checks each function against cuda.h's declaration.
#define FAKE_CUDA_ROW(member, name) {#name, reinterpret_cast<void*>(static_cast<decltype(&::name)>(&member))},
const Entry kEntries[] = {SF_CUDA_ENTRY_POINTS(FAKE_CUDA_ROW)};
#undef FAKE_CUDA_ROW

}  // namespace
}  // namespace fake

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t,
                                         CUdriverProcAddressQueryResult* status) {
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  for (const fake::Entry& e : fake::kEntries) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    if (cudaVersion < 12000) {  // the runtime asks at its headers' version; anything older is a mix-up
      if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = e.fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

// --- hooks for tests (not part of the driver API) --------------------------------------------
// A test reaches these with dlopen($SHARDFUSE_LIBCUDA, RTLD_NOW | RTLD_NOLOAD) and dlsym.

// A counter of the fake's state, or -1 for an unknown name: "allocs" and
// "alloc_bytes" (live), "streams", "events", "modules", "links", "graphs",
// "graph_execs" (live handles), "launches" (executed, replays included), "tensor_maps" (encoded),
// "mem_alloc_calls", "mem_free_calls", "resets", "ctx_refs" (device 0's
// primary-context retain count), "clock_ns" (the fake clock), "sticky"
// (device 0's sticky CUresult), "last_args" (the number of arguments of the last
// executed launch) and "last_arg:<i>" (its i-th pointer); "range:<ptr>:<bytes>"
// (decimal) is 1 when those bytes lie inside one live allocation, else 0 (the fake
// cuBLAS checks what a GEMM reads and writes with it).
FAKE_EXPORT long long fake_cuda_stat(const char* name) {
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string n = name ? name : "";
  if (n == "allocs") return static_cast<long long>(s.allocs.size());
  if (n == "alloc_bytes") {
    long long b = 0;
    for (const auto& [p, a] : s.allocs) b += static_cast<long long>(a.bytes);
    return b;
  }
  if (n == "streams") return static_cast<long long>(s.streams.size());
  if (n == "events") return static_cast<long long>(s.events.size());
  if (n == "modules") return static_cast<long long>(s.modules.size());
  if (n == "links") return static_cast<long long>(s.links.size());
  if (n == "graphs") return static_cast<long long>(s.graphs.size());
  if (n == "graph_execs") return static_cast<long long>(s.execs.size());
  if (n == "launches") return s.launches;
  if (n == "tensor_maps") return s.tensor_maps;
  if (n == "mem_alloc_calls") return s.mem_alloc_calls;
  if (n == "mem_free_calls") return s.mem_free_calls;
  if (n == "resets") return s.resets;
  if (n == "clock_ns") return s.clock_ns;
  if (n == "ctx_refs") return s.devices.empty() ? 0 : s.devices[0].refs;
  if (n == "sticky") return s.devices.empty() ? 0 : static_cast<long long>(s.devices[0].sticky);
  if (n == "last_args") return static_cast<long long>(s.last_args.size());
  if (n.rfind("range:", 0) == 0) {
    char* end = nullptr;
    const unsigned long long p = std::strtoull(n.c_str() + 6, &end, 10);
    const unsigned long long bytes = end && *end == ':' ? std::strtoull(end + 1, nullptr, 10) : 0;
    for (size_t d = 0; d < s.devices.size(); ++d)
      if (fake::find_range(s, static_cast<int>(d), static_cast<CUdeviceptr>(p), static_cast<size_t>(bytes))) return 1;
    return 0;
  }
  if (n.rfind("last_arg:", 0) == 0) {
    const size_t i = std::strtoull(n.c_str() + 9, nullptr, 10);
    return i < s.last_args.size() ? static_cast<long long>(s.last_args[i]) : -1;
  }
  return -1;
}

// Changes a setting at run time; 0 on success, -1 for an unknown name:
// "mem_bytes" (the per-device allocation budget, $FAKE_CUDA_MEM_BYTES),
// "async_errors" (0/1, $FAKE_CUDA_ASYNC_ERRORS), "sticky_for_process" (0/1: a
// fault survives a context reset, as on a real driver) and "advance_clock_ns" (moves the
// fake clock on by the value, as work another library did: the fake cuBLAS's GEMMs).
FAKE_EXPORT int fake_cuda_set(const char* name, long long value) {
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string n = name ? name : "";
  if (n == "mem_bytes" && value >= 0) {
    s.budget = static_cast<size_t>(value);
    return 0;
  }
  if (n == "async_errors") {
    s.async_errors = value != 0;
    return 0;
  }
  if (n == "sticky_for_process") {
    s.sticky_for_process = value != 0;
    return 0;
  }
  if (n == "advance_clock_ns" && value >= 0) {
    s.clock_ns += value;
    return 0;
  }
  return -1;
}
