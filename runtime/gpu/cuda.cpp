#include "runtime/gpu/cuda.h"

#include <utility>

namespace sf::cuda {

Result<void> check(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return {};
  Result<const Driver*> d = driver();
  std::string why = d ? (*d)->error(r) : "CUresult " + std::to_string(static_cast<int>(r));
  return Diag{"", {}, what + ": " + why};
}

bool is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT: return true;
    default: return false;
  }
}

namespace {

// A handle from before a context reset (or none at all) must not reach the driver:
// its value may belong to a new object by now.
Result<void> usable(const Context* ctx, uint64_t generation, const char* what) {
  if (!ctx) return Diag{"", {}, std::string(what) + ": no such object (default-constructed or moved from)"};
  if (ctx->generation() != generation)
    return Diag{"", {}, std::string(what) + ": the object was made before the context was reset"};
  return {};
}

}  // namespace

// --- Context ------------------------------------------------------------------------

Result<std::shared_ptr<Context>> Context::primary(int ordinal) {
  static std::mutex mu;
  static std::map<int, std::shared_ptr<Context>> contexts;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = contexts.find(ordinal); it != contexts.end()) return it->second;
  Result<const Driver*> d = driver();
  if (!d) return d.error();
  Result<DeviceInfo> info = device_info(ordinal);
  if (!info) return info.error();
  std::shared_ptr<Context> c(new Context());
  c->drv_ = *d;
  c->info_ = *info;
  SF_TRY(check(c->drv_->DeviceGet(&c->dev_, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")"));
  SF_TRY(check(c->drv_->DevicePrimaryCtxRetain(&c->ctx_, c->dev_), "cuDevicePrimaryCtxRetain"));
  c->alloc_ = std::make_unique<DeviceAllocator>(*c);
  SF_TRY(c->make_current());
  contexts.emplace(ordinal, c);
  return c;
}

Context::~Context() {
  if (!drv_) return;
  alloc_.reset();
  drv_->DevicePrimaryCtxRelease(dev_);
}

Result<void> Context::make_current() const { return check(drv_->CtxSetCurrent(ctx_), "cuCtxSetCurrent"); }

Result<void> Context::synchronize() const {
  SF_TRY(make_current());
  return check(drv_->CtxSynchronize(), "cuCtxSynchronize");
}

Result<void> Context::reset() {
  // Every block belonged to the old context; freeing them there would fail.
  alloc_->abandon();
  drv_->DevicePrimaryCtxRelease(dev_);
  SF_TRY(check(drv_->DevicePrimaryCtxReset(dev_), "cuDevicePrimaryCtxReset"));
  ++generation_;
  SF_TRY(check(drv_->DevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain"));
  return make_current();
}

// --- DeviceAllocator -------------------------------------------------------------------

size_t DeviceAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

DeviceAllocator::~DeviceAllocator() {
  // Live blocks belong to their owners' lifetimes; at process end the driver
  // frees what is left with the context.
  empty_cache();
}

Result<CUdeviceptr> DeviceAllocator::allocate(size_t bytes) {
  const size_t size = round_size(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = free_.find(size); it != free_.end()) {
      CUdeviceptr p = it->second;
      free_.erase(it);
      live_.emplace(p, size);
      ++stats_.cache_hits;
      stats_.bytes_cached -= static_cast<int64_t>(size);
      stats_.bytes_in_use += static_cast<int64_t>(size);
      return p;
    }
  }
  SF_TRY(ctx_.make_current());
  CUdeviceptr p = 0;
  CUresult r = ctx_.drv().MemAlloc(&p, size);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    // Give the cached blocks back to the driver and try once more.
    empty_cache();
    r = ctx_.drv().MemAlloc(&p, size);
  }
  SF_TRY(check(r, "cuMemAlloc(" + std::to_string(size) + " B)"));
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace(p, size);
  ++stats_.driver_allocs;
  stats_.bytes_in_use += static_cast<int64_t>(size);
  return p;
}

void DeviceAllocator::release(CUdeviceptr p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // from a context that was reset since
  free_.emplace(it->second, p);
  stats_.bytes_in_use -= static_cast<int64_t>(it->second);
  stats_.bytes_cached += static_cast<int64_t>(it->second);
  live_.erase(it);
}

void DeviceAllocator::empty_cache() {
  std::multimap<size_t, CUdeviceptr> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    stats_.bytes_cached = 0;
  }
  if (blocks.empty() || !ctx_.make_current().ok()) return;
  for (const auto& [size, p] : blocks) ctx_.drv().MemFree(p);
}

void DeviceAllocator::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  free_.clear();
  live_.clear();
  stats_.bytes_cached = stats_.bytes_in_use = 0;
}

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// --- Buffer --------------------------------------------------------------------------

Result<Buffer> Buffer::allocate(Context& ctx, size_t bytes) {
  Result<CUdeviceptr> p = ctx.allocator().allocate(bytes);
  if (!p) return p.error();
  Buffer b;
  b.ctx_ = &ctx;
  b.generation_ = ctx.generation();
  b.ptr_ = *p;
  b.bytes_ = bytes;
  return b;
}

Buffer::~Buffer() {
  if (ctx_ && ptr_ && ctx_->generation() == generation_) ctx_->allocator().release(ptr_);
}

Buffer::Buffer(Buffer&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), generation_(o.generation_), ptr_(std::exchange(o.ptr_, 0)),
      bytes_(std::exchange(o.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Buffer old(std::move(*this));
    ctx_ = std::exchange(o.ctx_, nullptr);
    generation_ = o.generation_;
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// --- Stream and Event ------------------------------------------------------------------

Result<Stream> Stream::create(const Context& ctx) {
  SF_TRY(ctx.make_current());
  Stream s;
  SF_TRY(check(ctx.drv().StreamCreate(&s.s_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  s.ctx_ = &ctx;
  s.generation_ = ctx.generation();
  return s;
}

Stream::~Stream() {
  if (ctx_ && s_ && ctx_->generation() == generation_) ctx_->drv().StreamDestroy(s_);
}

Stream::Stream(Stream&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), generation_(o.generation_), s_(std::exchange(o.s_, nullptr)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream old(std::move(*this));
    ctx_ = std::exchange(o.ctx_, nullptr);
    generation_ = o.generation_;
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

Result<void> Stream::synchronize() const {
  SF_TRY(usable(ctx_, generation_, "cuStreamSynchronize"));
  SF_TRY(ctx_->make_current());
  return check(ctx_->drv().StreamSynchronize(s_), "cuStreamSynchronize");
}

Result<Event> Event::create(const Context& ctx, bool timing) {
  SF_TRY(ctx.make_current());
  Event ev;
  SF_TRY(check(ctx.drv().EventCreate(&ev.e_, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
               "cuEventCreate"));
  ev.ctx_ = &ctx;
  ev.generation_ = ctx.generation();
  return ev;
}

Event::~Event() {
  if (ctx_ && e_ && ctx_->generation() == generation_) ctx_->drv().EventDestroy(e_);
}

Event::Event(Event&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), generation_(o.generation_), e_(std::exchange(o.e_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event old(std::move(*this));
    ctx_ = std::exchange(o.ctx_, nullptr);
    generation_ = o.generation_;
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

Result<void> Event::record(const Stream& s) const {
  SF_TRY(usable(ctx_, generation_, "cuEventRecord"));
  SF_TRY(usable(s.ctx_, s.generation_, "cuEventRecord (stream)"));
  return check(ctx_->drv().EventRecord(e_, s.get()), "cuEventRecord");
}

Result<void> Event::synchronize() const {
  SF_TRY(usable(ctx_, generation_, "cuEventSynchronize"));
  return check(ctx_->drv().EventSynchronize(e_), "cuEventSynchronize"); }

Result<float> Event::elapsed_ms(const Event& start, const Event& end) {
  SF_TRY(usable(start.ctx_, start.generation_, "cuEventElapsedTime"));
  SF_TRY(usable(end.ctx_, end.generation_, "cuEventElapsedTime"));
  float ms = 0;
  SF_TRY(check(start.ctx_->drv().EventElapsedTime(&ms, start.e_, end.e_), "cuEventElapsedTime"));
  return ms;
}

// --- Module --------------------------------------------------------------------------

Result<Module> Module::load_ptx(const Context& ctx, const std::string& ptx, const std::string& name) {
  SF_TRY(ctx.make_current());
  const Driver& d = ctx.drv();
  // The JIT writes its messages into these; the error log is what a user needs
  // when the driver rejects PTX that ptxas accepted (an older driver, say).
  std::string error_log(16384, '\0'), info_log(16384, '\0');
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                         CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE};
  void* vals[] = {error_log.data(), reinterpret_cast<void*>(error_log.size()), info_log.data(),
                  reinterpret_cast<void*>(info_log.size()), reinterpret_cast<void*>(uintptr_t{1})};
  auto trimmed = [](const std::string& s) {
    std::string t = s.substr(0, s.find('\0'));
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    return t;
  };
  CUlinkState link{};
  SF_TRY(check(d.LinkCreate(5, opts, vals, &link), name + ": cuLinkCreate"));
  auto fail = [&](CUresult r, const std::string& call) {
    std::string log = trimmed(error_log);
    d.LinkDestroy(link);
    return Diag{"", {}, name + ": the driver's JIT rejected the PTX (" + call + ": " + d.error(r) + ")" +
                            (log.empty() ? std::string() : ":\n" + log)};
  };
  // cuLinkAddData reads a NUL-terminated PTX.
  std::string text = ptx;
  if (CUresult r = d.LinkAddData(link, CU_JIT_INPUT_PTX, text.data(), text.size() + 1, name.c_str(), 0, nullptr,
                                 nullptr);
      r != CUDA_SUCCESS)
    return fail(r, "cuLinkAddData");
  void* cubin = nullptr;
  size_t cubin_size = 0;
  if (CUresult r = d.LinkComplete(link, &cubin, &cubin_size); r != CUDA_SUCCESS) return fail(r, "cuLinkComplete");
  Module m;
  CUresult r = d.ModuleLoadData(&m.m_, cubin);  // before LinkDestroy, which frees the cubin
  d.LinkDestroy(link);
  SF_TRY(check(r, name + ": cuModuleLoadData"));
  m.ctx_ = &ctx;
  m.generation_ = ctx.generation();
  m.name_ = name;
  m.info_log_ = trimmed(info_log);
  return m;
}

Module::~Module() {
  if (ctx_ && m_ && ctx_->generation() == generation_) ctx_->drv().ModuleUnload(m_);
}

Module::Module(Module&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), generation_(o.generation_), m_(std::exchange(o.m_, nullptr)),
      name_(std::move(o.name_)), info_log_(std::move(o.info_log_)) {}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    Module old(std::move(*this));
    ctx_ = std::exchange(o.ctx_, nullptr);
    generation_ = o.generation_;
    m_ = std::exchange(o.m_, nullptr);
    name_ = std::move(o.name_);
    info_log_ = std::move(o.info_log_);
  }
  return *this;
}

Result<CUfunction> Module::function(const std::string& entry) const {
  SF_TRY(usable(ctx_, generation_, "cuModuleGetFunction"));
  CUfunction f{};
  SF_TRY(check(ctx_->drv().ModuleGetFunction(&f, m_, entry.c_str()),
               name_ + ": cuModuleGetFunction(\"" + entry + "\")"));
  return f;
}

// --- launch --------------------------------------------------------------------------

Result<void> copy_2d(const Context& ctx, CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src, size_t src_pitch,
                     size_t width, size_t height, const Stream& s) {
  SF_TRY(usable(s.ctx_, s.generation_, "cuMemcpy2DAsync (stream)"));
  if (width == 0 || height == 0) return {};
  const Driver& dr = ctx.drv();
  if (height == 1) return check(dr.MemcpyDtoDAsync(dst, src, width, s.get()), "cuMemcpyDtoDAsync");
  // cuMemcpy2D takes pitches up to CU_DEVICE_ATTRIBUTE_MAX_PITCH (2^31 - 1 on
  // current GPUs).
  constexpr size_t kMaxPitch = 0x7fffffff;
  if (dst_pitch > kMaxPitch || src_pitch > kMaxPitch) {
    for (size_t row = 0; row < height; ++row)
      SF_TRY(check(dr.MemcpyDtoDAsync(dst + row * dst_pitch, src + row * src_pitch, width, s.get()),
                   "cuMemcpyDtoDAsync"));
    return {};
  }
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = src;
  c.srcPitch = src_pitch;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dst;
  c.dstPitch = dst_pitch;
  c.WidthInBytes = width;
  c.Height = height;
  return check(dr.Memcpy2DAsync(&c, s.get()), "cuMemcpy2DAsync");
}

Result<Buffer> encode_tensor_map(Context& ctx, const PlanTensorMap& t, CUdeviceptr base) {
  const Driver& d = ctx.drv();
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  switch (t.dtype) {
    case DType::BF16: type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; break;
    case DType::F16: type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; break;
    case DType::F32: type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32; break;
    default: return Diag{"", {}, "tensor map: no TMA data type for " + std::string(dtype_name(t.dtype))};
  }
  constexpr int kRank = kPlanTensorMapRank;
  if (t.rank < 1 || t.rank > kRank)
    return Diag{"", {}, "tensor map: rank " + std::to_string(t.rank) + " is outside 1.." + std::to_string(kRank)};
  const cuuint32_t elem_strides[kRank] = {1, 1, 1, 1, 1};
  cuuint64_t dims[kRank], strides[kRank - 1];
  cuuint32_t box[kRank];
  for (int i = 0; i < kRank; ++i) {
    dims[i] = static_cast<cuuint64_t>(t.dims[static_cast<size_t>(i)]);
    box[i] = static_cast<cuuint32_t>(t.box[static_cast<size_t>(i)]);
  }
  for (int i = 0; i + 1 < kRank; ++i) strides[i] = static_cast<cuuint64_t>(t.strides[static_cast<size_t>(i)]);
  CUtensorMap map{};
  SF_TRY(check(d.TensorMapEncodeTiled(&map, type, static_cast<cuuint32_t>(t.rank), reinterpret_cast<void*>(base), dims,
                                      strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
               "cuTensorMapEncodeTiled"));
  Result<Buffer> buf = Buffer::allocate(ctx, sizeof map);
  if (!buf) return buf.error();
  SF_TRY(check(d.MemcpyHtoD(buf->ptr(), &map, sizeof map), "cuMemcpyHtoD (tensor map)"));
  return buf;
}

Result<void> wait_event(const Context& ctx, const Stream& s, const Event& e) {
  SF_TRY(usable(s.ctx_, s.generation_, "cuStreamWaitEvent (stream)"));
  return check(ctx.drv().StreamWaitEvent(s.get(), e.get(), 0), "cuStreamWaitEvent");
}

namespace {
// Dynamic shared memory above the default 48 KiB must be opted into per function.
Result<void> opt_in_shared(const Driver& dr, CUfunction f, const LaunchDims& d) {
  constexpr int kDefaultShared = 48 * 1024;
  if (d.shared_bytes > kDefaultShared)
    SF_TRY(check(dr.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, d.shared_bytes),
                 "cuFuncSetAttribute(max dynamic shared " + std::to_string(d.shared_bytes) + " B)"));
  return {};
}
}  // namespace

Result<int> max_active_blocks(const Context& ctx, CUfunction f, const LaunchDims& d) {
  const Driver& dr = ctx.drv();
  SF_TRY(opt_in_shared(dr, f, d));
  int n = 0;
  const int threads = static_cast<int>(d.block[0] * d.block[1] * d.block[2]);
  SF_TRY(check(dr.OccupancyMaxActiveBlocksPerMultiprocessor(&n, f, threads, static_cast<size_t>(d.shared_bytes)),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor"));
  return n;
}

Result<LaunchDims> resident_grid(const Context& ctx, CUfunction f, const LaunchDims& d) {
  Result<int> per_sm = max_active_blocks(ctx, f, d);
  if (!per_sm) return per_sm.error();
  LaunchDims out = d;
  int64_t resident = int64_t{ctx.info().sms} * *per_sm;
  if (d.cluster > 1) {
    // The clusters the device holds at once (after max_active_blocks' opt-in to the
    // kernel's shared memory); the cluster shape is the kernel's own.
    CUlaunchConfig cfg{};
    cfg.gridDimX = static_cast<unsigned>(d.grid[0]);
    cfg.gridDimY = static_cast<unsigned>(d.grid[1]);
    cfg.gridDimZ = static_cast<unsigned>(d.grid[2]);
    cfg.blockDimX = static_cast<unsigned>(d.block[0]);
    cfg.blockDimY = static_cast<unsigned>(d.block[1]);
    cfg.blockDimZ = static_cast<unsigned>(d.block[2]);
    cfg.sharedMemBytes = static_cast<unsigned>(d.shared_bytes);
    int clusters = 0;
    SF_TRY(check(ctx.drv().OccupancyMaxActiveClusters(&clusters, f, &cfg), "cuOccupancyMaxActiveClusters"));
    resident = std::min(resident / d.cluster, int64_t{clusters}) * d.cluster;
  }
  if (resident > 0) out.grid[0] = std::min(out.grid[0], resident);
  return out;
}

Result<void> launch(const Context& ctx, CUfunction f, const LaunchDims& d, const std::vector<CUdeviceptr>& args,
                    const Stream& s) {
  SF_TRY(usable(s.ctx_, s.generation_, "cuLaunchKernel (stream)"));
  const Driver& dr = ctx.drv();
  for (int i = 0; i < 3; ++i)
    if (d.grid[i] < 1 || d.grid[i] > (i == 0 ? int64_t{0x7fffffff} : int64_t{65535}) || d.block[i] < 1)
      return Diag{"", {}, "launch: grid " + std::to_string(d.grid[0]) + "x" + std::to_string(d.grid[1]) + "x" +
                              std::to_string(d.grid[2]) + " or block " + std::to_string(d.block[0]) + "x" +
                              std::to_string(d.block[1]) + "x" + std::to_string(d.block[2]) + " is out of range"};
  if (d.cluster > 1 && d.grid[0] % d.cluster != 0)
    return Diag{"", {}, "launch: grid " + std::to_string(d.grid[0]) + " is not whole clusters of " + std::to_string(d.cluster) +
                            " blocks"};
  SF_TRY(opt_in_shared(dr, f, d));
  // kernelParams: a pointer to each argument's value.
  std::vector<CUdeviceptr> values = args;
  std::vector<void*> params;
  params.reserve(values.size());
  for (CUdeviceptr& v : values) params.push_back(&v);
  return check(dr.LaunchKernel(f, static_cast<unsigned>(d.grid[0]), static_cast<unsigned>(d.grid[1]),
                               static_cast<unsigned>(d.grid[2]), static_cast<unsigned>(d.block[0]),
                               static_cast<unsigned>(d.block[1]), static_cast<unsigned>(d.block[2]),
                               static_cast<unsigned>(d.shared_bytes), s.get(), params.data(), nullptr),
               "cuLaunchKernel");
}

// --- Graph ---------------------------------------------------------------------------

Result<Graph> Graph::capture(const Context& ctx, const Stream& s, const std::function<Result<void>()>& body) {
  const Driver& d = ctx.drv();
  SF_TRY(check(d.StreamBeginCapture(s.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture"));
  Result<void> err = body();
  CUgraph g{};
  CUresult end = d.StreamEndCapture(s.get(), &g);  // always end, or the stream stays in capture mode
  if (!err.ok()) {
    if (g) d.GraphDestroy(g);
    return err.error();
  }
  SF_TRY(check(end, "cuStreamEndCapture"));
  Graph out;
  out.ctx_ = &ctx;
  out.generation_ = ctx.generation();
  out.g_ = g;
  SF_TRY(check(d.GraphInstantiateWithFlags(&out.exec_, g, 0), "cuGraphInstantiateWithFlags"));
  return out;
}

Graph::~Graph() {
  if (!ctx_ || ctx_->generation() != generation_) return;
  if (exec_) ctx_->drv().GraphExecDestroy(exec_);
  if (g_) ctx_->drv().GraphDestroy(g_);
}

Graph::Graph(Graph&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), generation_(o.generation_), g_(std::exchange(o.g_, nullptr)),
      exec_(std::exchange(o.exec_, nullptr)) {}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    Graph old(std::move(*this));
    ctx_ = std::exchange(o.ctx_, nullptr);
    generation_ = o.generation_;
    g_ = std::exchange(o.g_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

Result<void> Graph::launch(const Stream& s) const {
  SF_TRY(usable(ctx_, generation_, "cuGraphLaunch"));
  SF_TRY(usable(s.ctx_, s.generation_, "cuGraphLaunch (stream)"));
  return check(ctx_->drv().GraphLaunch(exec_, s.get()), "cuGraphLaunch");
}

}  // namespace sf::cuda
