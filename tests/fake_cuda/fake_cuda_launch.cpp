// The fake driver's entry points for JIT linking, modules, tensor maps, launches and
// CUDA graphs (tests/fake_cuda/README.md); fake_libcuda.cpp's table hands them to the
// runtime through cuGetProcAddress_v2.
#include "tests/fake_cuda/fake_cuda_state.h"

namespace fake {

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
  s.funcs[id] = FuncRec{m.dev, it->first, e->name, e->params, 0, e->cluster};
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

// The clusters of the function's shape (its .reqnctapercluster; a config without
// launch attributes, as ours) all SMs hold at once, blocks counted as above; a grid
// that is not whole clusters is refused, as the driver refuses to launch it.
CUresult OccupancyMaxActiveClusters(int* n, CUfunction h, const CUlaunchConfig* config) {
  int per_sm = 0;
  if (!n || !config) return fail(CUDA_ERROR_INVALID_VALUE, "cuOccupancyMaxActiveClusters");
  if (config->numAttrs != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuOccupancyMaxActiveClusters", "the fake takes no attributes");
  const int threads = static_cast<int>(config->blockDimX * config->blockDimY * config->blockDimZ);
  if (CUresult r = OccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, h, threads, config->sharedMemBytes); r != CUDA_SUCCESS)
    return r;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const int cluster = s.funcs.at(id_of(h)).cluster;
  if (config->gridDimX % static_cast<unsigned>(cluster) != 0)
    return fail(CUDA_ERROR_INVALID_CLUSTER_SIZE, "cuOccupancyMaxActiveClusters", "grid not whole clusters");
  *n = kSms * per_sm / cluster;
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
  uint64_t dims[5] = {};
  uint64_t strides[4] = {};
  uint32_t box[5] = {};
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
  for (cuuint32_t i = 0; i < rank; ++i) {
    f.dims[i] = dims[i];
    f.box[i] = box[i];
    if (i + 1 < rank) f.strides[i] = strides[i];
  }
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &f, sizeof f);
  std::string line = "tensormap rank=" + std::to_string(rank) + " dims=";
  for (cuuint32_t i = 0; i < rank; ++i) line += (i ? "," : "") + std::to_string(dims[i]);
  line += " box=";
  for (cuuint32_t i = 0; i < rank; ++i) line += (i ? "," : "") + std::to_string(box[i]);
  line += " at=" + hex(f.address);  // the buffer it is over, as "alloc" logged it
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
  n.cluster = f.cluster;
  n.grid[0] = gx, n.grid[1] = gy, n.grid[2] = gz;
  n.block[0] = bx, n.block[1] = by, n.block[2] = bz;
  n.shared = shared;
  n.stream = id_of(sh);
  if (!gx || !gy || !gz || !bx || !by || !bz) return invalid("a zero grid or block dimension");
  if (gx > 2147483647u || gy > 65535 || gz > 65535) return invalid("grid " + dims(n.grid) + " beyond the device's limits");
  if (gx % static_cast<unsigned>(f.cluster) != 0)
    return invalid("grid " + dims(n.grid) + " is not whole clusters of " + std::to_string(f.cluster) + " (.reqnctapercluster)");
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

}  // namespace fake
