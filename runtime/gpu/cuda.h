// The pieces of the CUDA driver API the runtime uses, as small owning types over
// runtime/gpu/cuda_driver.h: a device's primary context, a caching device allocator,
// streams, events, PTX modules linked through cuLink* (the JIT's log surfaced in
// the error), kernel launches and CUDA Graph capture. No LLVM, no link-time libcuda.
//
// Errors are Diags naming the call and the driver's error ("cuMemAlloc(1048576 B):
// CUDA_ERROR_OUT_OF_MEMORY (out of memory)"). A fault inside a kernel (an illegal
// address, a trap) is sticky: every later call in the context fails until the
// context is reset (Context::reset), which frees everything allocated in it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/diag.h"
#include "runtime/core/dtype.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/plan/plan.h"

namespace sf::cuda {

// Success on CUDA_SUCCESS, else a Diag "<what>: <driver error>".
Result<void> check(CUresult r, const std::string& what);
// Whether `r` leaves the context unusable (a fault in a kernel), so that only a
// reset brings it back.
bool is_sticky(CUresult r);

class DeviceAllocator;

// A device's primary context (the one the CUDA runtime and PyTorch share),
// retained for the life of the process. Every thread that calls the driver must
// make it current first (make_current is cheap when it already is).
class Context {
 public:
  // The context of device `ordinal`, created on first use; later calls return the
  // same one. "no CUDA device: ..." when there is no driver or GPU.
  static Result<std::shared_ptr<Context>> primary(int ordinal = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Driver& drv() const { return *drv_; }
  const DeviceInfo& info() const { return info_; }
  CUdevice device() const { return dev_; }
  Result<void> make_current() const;
  Result<void> synchronize() const;

  // After a sticky error: drops every cached allocation, resets the primary
  // context and retains it again. Modules, streams, events and buffers made
  // before are dead (generation() tells them apart); make new ones.
  Result<void> reset();
  uint64_t generation() const { return generation_; }

  DeviceAllocator& allocator() { return *alloc_; }

 private:
  Context() = default;
  const Driver* drv_ = nullptr;
  CUdevice dev_{};
  CUcontext ctx_{};
  DeviceInfo info_;
  uint64_t generation_ = 0;
  std::unique_ptr<DeviceAllocator> alloc_;
};

// A caching allocator, as PyTorch's CUDA caching allocator does it in spirit:
// freed blocks are kept in per-size free lists and handed out again without
// cuMemAlloc/cuMemFree (which synchronise the device). Sizes round up to 512 B
// below 1 MiB and to 2 MiB above, and a request takes a cached block of exactly
// its rounded size. Blocks are not tied to streams: free a block only once the
// work using it has finished (the runtime synchronises its streams first).
// Thread-safe.
class DeviceAllocator {
 public:
  explicit DeviceAllocator(const Context& ctx) : ctx_(ctx) {}
  ~DeviceAllocator();
  // A Diag when the device is out of memory even after the cache is released.
  Result<CUdeviceptr> allocate(size_t bytes);
  void release(CUdeviceptr p);
  // Frees every cached (not in use) block to the driver.
  void empty_cache();
  // Forgets every block without freeing it (the context was reset under them).
  void abandon();

  struct Stats {
    int64_t driver_allocs = 0;   // cuMemAlloc calls
    int64_t cache_hits = 0;      // allocations served from the cache
    int64_t bytes_in_use = 0;    // rounded sizes of live blocks
    int64_t bytes_cached = 0;    // rounded sizes of free cached blocks
  };
  Stats stats() const;
  static size_t round_size(size_t bytes);

 private:
  const Context& ctx_;
  mutable std::mutex mu_;
  std::multimap<size_t, CUdeviceptr> free_;  // rounded size -> block
  std::map<CUdeviceptr, size_t> live_;
  Stats stats_;
};

// A device buffer from the context's allocator, returned to it on destruction.
class Buffer {
 public:
  Buffer() = default;
  static Result<Buffer> allocate(Context& ctx, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Grid, block and dynamic shared memory of one launch (a PlanKernel's).
struct LaunchDims {
  std::array<int64_t, 3> grid{1, 1, 1};
  std::array<int, 3> block{1, 1, 1};
  int shared_bytes = 0;
  // Blocks per thread-block cluster along x, set in the kernel's PTX
  // (`.reqnctapercluster`), so that a plain launch forms the clusters; grid[0] must be
  // a multiple of it. 1: no clusters.
  int cluster = 1;
};

class Event;

class Stream {
  friend class Event;
  friend class Graph;
  friend Result<void> launch(const Context&, CUfunction, const LaunchDims&, const std::vector<CUdeviceptr>&,
                             const Stream&);
  friend Result<void> copy_2d(const Context&, CUdeviceptr, size_t, CUdeviceptr, size_t, size_t, size_t,
                              const Stream&);
  friend Result<void> wait_event(const Context&, const Stream&, const Event&);

 public:
  static Result<Stream> create(const Context& ctx);  // non-blocking
  Stream() = default;
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  CUstream get() const { return s_; }
  Result<void> synchronize() const;

 private:
  const Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  CUstream s_{};
};

class Event {
 public:
  static Result<Event> create(const Context& ctx, bool timing = true);
  Event() = default;
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  CUevent get() const { return e_; }
  Result<void> record(const Stream& s) const;
  Result<void> synchronize() const;
  // Milliseconds between two recorded, completed events.
  static Result<float> elapsed_ms(const Event& start, const Event& end);

 private:
  const Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  CUevent e_{};
};

// A PTX module linked by the driver's JIT (cuLinkCreate, cuLinkAddData,
// cuLinkComplete). `name` (a file, a kernel id) prefixes its messages; a PTX the
// JIT rejects gives a Diag carrying the JIT's error log.
class Module {
 public:
  static Result<Module> load_ptx(const Context& ctx, const std::string& ptx, const std::string& name);
  Module() = default;
  ~Module();
  Module(Module&& o) noexcept;
  Module& operator=(Module&& o) noexcept;
  // The entry's function handle; a Diag naming the module if it has no such entry.
  Result<CUfunction> function(const std::string& entry) const;
  const std::string& info_log() const { return info_log_; }

 private:
  const Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  CUmodule m_{};
  std::string name_;
  std::string info_log_;
};

// Launches f with our kernel ABI: one device pointer per argument, in order
// (inputs, then outputs). Dynamic shared memory above 48 KiB is opted into first.
Result<void> launch(const Context& ctx, CUfunction f, const LaunchDims& d, const std::vector<CUdeviceptr>& args,
                    const Stream& s);

// How many blocks of f, launched as `d`, one SM holds at once
// (cuOccupancyMaxActiveBlocksPerMultiprocessor, after the same opt-in to dynamic
// shared memory above 48 KiB as launch): 0 when not even one fits.
Result<int> max_active_blocks(const Context& ctx, CUfunction f, const LaunchDims& d);

// The launch of a persistent kernel (LaunchShape::persistent: it strides its work by
// the launch's width, so any width computes everything): `d` with grid.x at most the
// blocks this device holds at once (its SMs x max_active_blocks), so that a part with
// fewer SMs than the compiler assumed runs no second, short wave. A kernel in clusters
// (d.cluster > 1) keeps whole clusters, at most the clusters the device holds at once
// (cuOccupancyMaxActiveClusters: a cluster's blocks share a GPC, so fewer may fit than
// the SMs alone would say).
Result<LaunchDims> resident_grid(const Context& ctx, CUfunction f, const LaunchDims& d);

// A TMA tensor map (cuTensorMapEncodeTiled) over the tensor at `base`, in a 128-byte
// device allocation whose address the kernel takes as an argument: `t.rank` (1..3)
// dims of elements of `t.dtype`, innermost first, rank-1 byte strides, a box of
// `t.box` elements (plan.h); 128-byte swizzle, element strides 1, no interleave,
// 256-byte L2 promotion, out-of-bounds elements read as zero. f32 is copied as raw
// f32 bits (TF32 kernels read them as such). A Diag names the driver's refusal.
Result<Buffer> encode_tensor_map(Context& ctx, const PlanTensorMap& t, CUdeviceptr base);

// Copies `height` rows of `width` bytes from device memory at src (rows
// src_pitch bytes apart) to dst (rows dst_pitch apart) on `s`: cuMemcpy2DAsync,
// one row at a time (cuMemcpyDtoDAsync) where a pitch is beyond what the driver
// takes. A strided block of a row-major tensor (a slice along one dim, a part of
// a concat) is one such copy. Nothing happens for an empty block.
Result<void> copy_2d(const Context& ctx, CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src, size_t src_pitch,
                     size_t width, size_t height, const Stream& s);

// Work enqueued on `s` after this waits for what `e` last recorded
// (cuStreamWaitEvent): the edge between a compute and a comm stream.
Result<void> wait_event(const Context& ctx, const Stream& s, const Event& e);

// A stream's work captured once as a CUDA Graph and replayed with one launch.
class Graph {
 public:
  // Runs body() with `s` in capture mode and instantiates what it enqueued.
  // Thread-local mode: while body() runs, this thread may not call cuMemAlloc,
  // cuMemFree or synchronous copies (take buffers from the cache or allocate them
  // first); other threads (other ranks) may keep using the device.
  static Result<Graph> capture(const Context& ctx, const Stream& s, const std::function<Result<void>()>& body);
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Result<void> launch(const Stream& s) const;

 private:
  const Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  CUgraph g_{};
  CUgraphExec exec_{};
};

}  // namespace sf::cuda
