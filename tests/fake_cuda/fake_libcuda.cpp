// A stand-in for libcuda.so.1 that runs no kernels (tests/fake_cuda/README.md).
//
// runtime/gpu/cuda_driver.cpp dlopen()s $SHARDFUSE_LIBCUDA and asks its
// cuGetProcAddress_v2 for every entry point in SF_CUDA_ENTRY_POINTS; this library
// answers with the functions of fake_cuda_api.cpp and fake_cuda_launch.cpp (this
// file holds the checks and execution they share, the table and the test hooks;
// fake_cuda_state.h the state). "Device" memory is host memory, so copies and
// memsets really happen; a launch checks what a GPU would reject (dimensions,
// shared memory, its pointer arguments) and is logged, but no kernel code runs.
//
// The checks are the driver's own where they catch runtime bugs a CPU-only CI
// would otherwise miss: a call without a current context, a stale handle after a
// context reset, an unsafe call (cuMemAlloc, a synchronous copy) inside a stream
// capture, an argument pointing outside every allocation, the sticky error after
// a fault that only a primary-context reset clears.
#include "tests/fake_cuda/fake_cuda_state.h"

namespace fake {

// Never destroyed: at exit the runtime's static destructors may still call in, and
// LeakSanitizer sees the allocations as reachable from here.
State& state() {
  static State* s = new State;
  return *s;
}

thread_local uintptr_t tls_ctx = 0;  // the calling thread's current context

CUresult fail(CUresult r, const char* call, const std::string& why) {
  log_line(std::string("error ") + call + " " + error_name(r) + (why.empty() ? "" : " (" + why + ")"));
  return r;
}

// --- error names ------------------------------------------------------------------------


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
      // The performance directives between the list and the body.
      if (close != std::string::npos) {
        const size_t body = ptx.find('{', close);
        const std::string head = ptx.substr(close, body == std::string::npos ? std::string::npos : body - close);
        if (size_t c = head.find(".reqnctapercluster"); c != std::string::npos)
          e.cluster = std::max(1, std::atoi(head.c_str() + c + 18));
      }
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
               (n.cluster > 1 ? " cluster=" + std::to_string(n.cluster) : std::string()) + " stream=" + hex(n.stream) +
               suffix);
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
