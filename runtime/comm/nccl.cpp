#include "runtime/comm/nccl.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>

#include "runtime/comm/comm.h"

namespace sf::nccl {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Diag diag(std::string message) { return Diag{"", {}, std::move(message)}; }
Diag not_available(const std::string& why) { return diag("NCCL not available: " + why); }

// ncclCommSplit, the newest entry point we call, came with 2.18.0.
constexpr int kMinVersion = 21800;

std::string version_of(int code) {
  // NCCL_VERSION(): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z since 2.9.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

std::string duration_str(milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : " ") + std::to_string(r);
  return s;
}

// Opens `file` and resolves every entry point; `why` collects what failed.
Result<Library> load(const std::string& file) {
  // RTLD_LOCAL: NCCL's symbols (and its static CUDA runtime's) stay out of the
  // global namespace.
  void* h = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    return not_available("cannot load " + file + " (" + (e ? e : "unknown error") + ")");
  }
  Library lib;
  lib.file = file;
  std::string missing;
  auto resolve = [&](const char* name, auto& fn) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
    if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
#define SF_NCCL_RESOLVE(member, name) resolve(#name, lib.member);
  SF_NCCL_ENTRY_POINTS(SF_NCCL_RESOLVE)
#undef SF_NCCL_RESOLVE
  if (!missing.empty())
    return not_available(file + " lacks " + missing + " (we need NCCL " + version_of(kMinVersion) + " or newer)");
  if (ncclResult_t r = lib.GetVersion(&lib.version); r != ncclSuccess)
    return not_available(file + ": ncclGetVersion failed: " + lib.error(r));
  if (lib.version < kMinVersion)
    return not_available(file + " is NCCL " + lib.version_str() + "; we need " + version_of(kMinVersion) +
                         " or newer");
  return lib;
}

Result<const Library*> load_once() {
  static Library lib;
  if (const char* env = std::getenv("SHARDFUSE_LIBNCCL"); env && *env) {
    Result<Library> l = load(env);
    if (!l) return diag(l.error().message + " ($SHARDFUSE_LIBNCCL)");
    lib = std::move(l).value();
    return &lib;
  }
  std::vector<std::string> files = {"libnccl.so.2"};
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) files.push_back(std::string(home) + "/lib64/libnccl.so.2");
  files.push_back("/usr/local/cuda/lib64/libnccl.so.2");
  std::string why;
  for (const std::string& f : files) {
    Result<Library> l = load(f);
    if (l) {
      lib = std::move(l).value();
      return &lib;
    }
    why += (why.empty() ? "" : "; ") + l.error().message.substr(std::string("NCCL not available: ").size());
  }
  return not_available(why);
}

// Polls in short sleeps after a brief spin: a collective of a few microseconds is
// seen at once, and a long wait does not take a core from the rank threads.
class Backoff {
 public:
  void pause() {
    if (++n_ < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  int n_ = 0;
};

std::string describe(CollectiveKind c, size_t count, DType dt, std::optional<ReduceOp> op) {
  std::string s = std::string(collective_name(c)) + " of " + std::to_string(count * static_cast<size_t>(dtype_size(dt))) +
                  " B (" + std::string(dtype_name(dt));
  if (op) s += ", " + std::string(reduce_op_name(*op));
  return s + ")";
}

void* ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

}  // namespace

// --- the library ------------------------------------------------------------------

std::string Library::version_str() const { return version_of(version); }

std::string Library::error(ncclResult_t r, ncclComm_t comm) const {
  std::string name;
  switch (r) {
    case ncclSuccess: name = "ncclSuccess"; break;
    case ncclUnhandledCudaError: name = "ncclUnhandledCudaError"; break;
    case ncclSystemError: name = "ncclSystemError"; break;
    case ncclInternalError: name = "ncclInternalError"; break;
    case ncclInvalidArgument: name = "ncclInvalidArgument"; break;
    case ncclInvalidUsage: name = "ncclInvalidUsage"; break;
    case ncclRemoteError: name = "ncclRemoteError"; break;
    case ncclInProgress: name = "ncclInProgress"; break;
    default: name = "ncclResult_t " + std::to_string(static_cast<int>(r)); break;
  }
  if (GetErrorString)
    if (const char* s = GetErrorString(r); s && *s) name += std::string(" (") + s + ")";
  if (GetLastError && r != ncclSuccess && r != ncclInProgress)
    if (const char* s = GetLastError(comm); s && *s) name += std::string(": ") + s;
  return name;
}

Result<const Library*> library() {
  // Opened once; the answer (a library or why there is none) does not change.
  static const Result<const Library*> lib = load_once();
  return lib;
}

Result<std::shared_ptr<const Library>> open_library(const std::string& file) {
  Result<Library> l = load(file);
  if (!l) return l.error();
  return std::make_shared<const Library>(std::move(l).value());
}

Result<ncclDataType_t> data_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::Bool: return ncclUint8;
  }
  return diag("NCCL: no such dtype");
}

Result<ncclRedOp_t> reduce_op(ReduceOp op, DType t) {
  if (t == DType::Bool && (op == ReduceOp::Sum || op == ReduceOp::Avg))
    return diag("NCCL: a bool " + std::string(reduce_op_name(op)) +
                " does not saturate to true as the host definition does; reduce bool with max (any) or min (all)");
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return ncclAvg;
  }
  return diag("NCCL: no such reduce op");
}

// --- sizes and bandwidths ---------------------------------------------------------------

CollectiveSize collective_size(CollectiveKind c, int64_t bytes, int elem_bytes, int n) {
  n = std::max(n, 1);
  const int64_t count = std::max<int64_t>(bytes / std::max(elem_bytes, 1), 1);
  const int64_t block = std::max<int64_t>(count / n, 1);  // per-rank block of the n-way cut
  CollectiveSize s;
  switch (c) {
    case CollectiveKind::AllReduce: s.send_count = s.recv_count = count; break;
    case CollectiveKind::AllGather: s.send_count = block, s.recv_count = block * n; break;
    case CollectiveKind::ReduceScatter: s.send_count = block * n, s.recv_count = block; break;
    case CollectiveKind::AllToAll: s.send_count = s.recv_count = block * n; break;
  }
  s.bytes = (c == CollectiveKind::AllReduce ? count : block * n) * elem_bytes;
  return s;
}

double algbw_GBps(int64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }

double busbw_GBps(CollectiveKind c, int n, int64_t bytes, double seconds) {
  return algbw_GBps(bytes, seconds) * bus_factor(c, n);
}

// --- options ------------------------------------------------------------------------

ncclConfig_t make_config(const Options& opts) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = opts.nonblocking ? 0 : 1;
  if (opts.max_ctas > 0) cfg.maxCTAs = opts.max_ctas;
  if (opts.min_ctas > 0) cfg.minCTAs = opts.min_ctas;
  if (!opts.name.empty()) cfg.commName = opts.name.c_str();
  return cfg;
}

Result<void> check_options(const Options& opts) {
  if (opts.max_ctas < 0 || opts.min_ctas < 0) return diag("NCCL options: CTA counts must be >= 0 (0 = NCCL's default)");
  if (opts.max_ctas > 0 && opts.min_ctas > opts.max_ctas)
    return diag("NCCL options: min_ctas " + std::to_string(opts.min_ctas) + " exceeds max_ctas " +
                std::to_string(opts.max_ctas));
  if (opts.timeout.count() <= 0) return diag("NCCL options: the timeout must be positive");
  return {};
}

int Group::member() const {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

std::string Group::str() const { return "group " + std::to_string(index) + " (ranks " + ranks_str(ranks) + ")"; }

SplitKey mesh_split_key(const DeviceMesh& mesh, int rank, int dim) {
  const std::vector<std::vector<int>> groups = mesh.groups(dim);
  for (size_t i = 0; i < groups.size(); ++i) {
    auto it = std::find(groups[i].begin(), groups[i].end(), rank);
    if (it != groups[i].end()) return {static_cast<int>(i), static_cast<int>(it - groups[i].begin())};
  }
  return {NCCL_SPLIT_NOCOLOR, 0};
}

// --- NcclComm -------------------------------------------------------------------------

std::string NcclComm::who() const { return "rank " + std::to_string(group_.rank) + ": "; }

Diag NcclComm::fail(const std::string& what, const std::string& how, bool from_peer) {
  std::string msg = who() + what + " over " + group_.str() + " " + how;
  if (comm_) {
    // Stops NCCL's kernels and proxy threads; the peers see ncclRemoteError or
    // time out themselves, so every rank ends.
    lib_->CommAbort(comm_);
    comm_ = nullptr;
    msg += "; the NCCL communicator was aborted";
  }
  if (!aborted_) {
    aborted_ = msg;
    aborted_by_peer_ = from_peer;
  }
  pending_.clear();
  Diag d = diag(msg);
  d.from_peer = from_peer;
  return d;
}

Result<void> NcclComm::usable(const std::string& what) {
  if (aborted_) {
    Diag d = diag(who() + what + " over " + group_.str() + ": the communicator was aborted: " + *aborted_);
    d.from_peer = aborted_by_peer_;
    return d;
  }
  if (Result<void> e = ctx_->make_current(); !e.ok()) return diag(who() + what + ": " + e.error().message);
  return {};
}

// After a call that may answer ncclInProgress (nonblocking mode): polls until the
// communicator settles, fails, or the deadline passes.
Result<void> NcclComm::settle(ncclResult_t r, const std::string& what, Clock::time_point deadline,
                              const std::string& timeout_hint) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) return fail(what, "timed out after " + duration_str(opts_.timeout) + timeout_hint);
    backoff.pause();
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t q = lib_->CommGetAsyncError(comm_, &state); q != ncclSuccess)
      return fail(what, "failed: ncclCommGetAsyncError: " + lib_->error(q, comm_));
    r = state;
  }
  if (r != ncclSuccess) return fail(what, "failed: " + lib_->error(r, comm_), r == ncclRemoteError);
  return {};
}

Result<void> NcclComm::enqueued(ncclResult_t r, std::string what) {
  SF_TRY(settle(r, what, Clock::now() + opts_.timeout));
  pending_.push_back(std::move(what));
  return {};
}

Result<std::unique_ptr<NcclComm>> NcclComm::init(const ncclUniqueId& id, const Group& group, int device,
                                                  const Options& opts) {
  const std::string who = "rank " + std::to_string(group.rank) + ": ";
  const std::string what = "creating the NCCL communicator over " + group.str();
  if (group.member() < 0) return diag(who + what + ": this rank is not a member");
  if (Result<void> e = check_options(opts); !e.ok()) return diag(who + what + ": " + e.error().message);
  Result<const Library*> lib = library();
  if (!lib) return diag(who + what + ": " + lib.error().message);
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(device);
  if (!ctx) return diag(who + what + " on CUDA device " + std::to_string(device) + ": " + ctx.error().message);
  if (Result<void> e = (*ctx)->make_current(); !e.ok()) return diag(who + what + ": " + e.error().message);

  std::unique_ptr<NcclComm> c(new NcclComm());
  c->lib_ = *lib;
  c->ctx_ = *ctx;
  c->group_ = group;
  c->opts_ = opts;
  ncclConfig_t cfg = make_config(c->opts_);
  const auto deadline = Clock::now() + opts.timeout;
  // A stand-in driver (tests/fake_cuda) serves our runtime only: NCCL's CUDA
  // runtime, linked into libnccl, opens the system's libcuda.so.1 whatever
  // $SHARDFUSE_LIBCUDA says.
  auto hint = [](Diag d) {
    if (const char* env = std::getenv("SHARDFUSE_LIBCUDA"); env && *env)
      d.message += std::string(" (note: NCCL does not use $SHARDFUSE_LIBCUDA=") + env + "; it opens libcuda.so.1)";
    return d;
  };
  ncclResult_t r = c->lib_->CommInitRankConfig(&c->comm_, c->size(), id, c->member(), &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    // A failed init may or may not have made a handle; abort frees what it made.
    return hint(c->fail("creating the NCCL communicator", "failed: " + c->lib_->error(r, c->comm_)));
  if (Result<void> e = c->settle(r, "creating the NCCL communicator", deadline, " (not every member joined)"); !e.ok())
    return hint(e.error());
  return c;
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(Comm& gloo, int group, int device, const Options& opts) {
  const std::string who = "rank " + std::to_string(gloo.rank()) + ": ";
  if (group < 0 || group >= gloo.num_groups())
    return diag(who + "NCCL communicator: no group " + std::to_string(group) + " (the Gloo Comm has " +
                std::to_string(gloo.num_groups()) + ")");
  Group g{group, gloo.group(group), gloo.rank()};
  const std::string what = "creating the NCCL communicator over " + g.str();
  const int n = static_cast<int>(g.ranks.size());

  // Whether this rank can join, checked before anyone enters ncclCommInitRank,
  // which would wait for a member that is not coming until the timeout.
  ncclUniqueId id{};
  Result<void> cannot = check_options(opts);
  Result<const Library*> lib = library();
  if (cannot.ok() && !lib) cannot = lib.error();
  if (cannot.ok())
    if (Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(device); !ctx)
      cannot = diag("CUDA device " + std::to_string(device) + ": " + ctx.error().message);
  if (cannot.ok() && g.member() == 0)
    if (ncclResult_t r = (*lib)->GetUniqueId(&id); r != ncclSuccess)
      cannot = diag("ncclGetUniqueId failed: " + (*lib)->error(r));

  // One Gloo all_gather carries every member's readiness and member 0's id:
  // [ready, 32 words of id] per member, as i32 (a tensor dtype Gloo carries as is).
  constexpr int64_t kWords = 1 + NCCL_UNIQUE_ID_BYTES / 4;
  static_assert(NCCL_UNIQUE_ID_BYTES % 4 == 0);
  Tensor mine(DType::I32, {kWords});
  mine.set_int(0, cannot.ok() ? 1 : 0);
  if (g.member() == 0) std::memcpy(mine.data() + 4, id.internal, NCCL_UNIQUE_ID_BYTES);
  Result<Tensor> all = gloo.all_gather(group, std::move(mine), 0, std::vector<int64_t>(static_cast<size_t>(n), kWords)).wait();
  if (!all) return diag(who + what + ": exchanging the unique id through Gloo failed: " + all.error().message);
  if (!cannot.ok()) return diag(who + what + ": " + cannot.error().message);
  for (int k = 0; k < n; ++k)
    if (all->get_int(k * kWords) == 0)
      return diag(who + what + ": rank " + std::to_string(g.ranks[static_cast<size_t>(k)]) +
                  " cannot join (no NCCL or no CUDA device there; its own error says which)");
  std::memcpy(id.internal, all->data() + 4, NCCL_UNIQUE_ID_BYTES);
  return init(id, g, device, opts);
}

NcclComm::~NcclComm() {
  if (!comm_) return;
  if (!ctx_->make_current().ok()) {
    lib_->CommAbort(comm_);
    return;
  }
  if (!pending_.empty()) {
    // Collectives that were never waited for may still be waiting for peers;
    // finalizing would wait with them.
    lib_->CommAbort(comm_);
    return;
  }
  const auto deadline = Clock::now() + opts_.timeout;
  ncclResult_t r = lib_->CommFinalize(comm_);
  Backoff backoff;
  while (r == ncclInProgress && Clock::now() < deadline) {
    backoff.pause();
    ncclResult_t state = ncclSuccess;
    if (lib_->CommGetAsyncError(comm_, &state) != ncclSuccess) break;
    r = state;
  }
  if (r == ncclSuccess) {
    lib_->CommDestroy(comm_);
  } else {
    lib_->CommAbort(comm_);
  }
}

Result<std::unique_ptr<NcclComm>> NcclComm::split(int color, int key, const Group& group, const Options* opts) {
  const std::string what = "splitting the NCCL communicator into " + group.str();
  SF_TRY(usable(what));
  if (group.member() < 0) return diag(who() + what + ": this rank is not a member");
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->lib_ = lib_;
  c->ctx_ = ctx_;
  c->group_ = group;
  c->opts_ = opts ? *opts : opts_;
  if (Result<void> e = check_options(c->opts_); !e.ok()) return diag(who() + what + ": " + e.error().message);
  ncclConfig_t cfg = make_config(c->opts_);
  const auto deadline = Clock::now() + c->opts_.timeout;
  ncclResult_t r = lib_->CommSplit(comm_, color, key, &c->comm_, &cfg);
  // In nonblocking mode both the parent and the child may be in progress.
  SF_TRY(settle(r, what, deadline));
  if (!c->comm_) return diag(who() + what + ": ncclCommSplit gave no communicator (color " + std::to_string(color) + ")");
  if (Result<void> e =
          c->settle(ncclInProgress, "creating the NCCL communicator", deadline, " (not every member split)");
      !e.ok()) {
    // Members stuck in the split would hang the parent's next collective: abort it
    // too, quoting why.
    abort(e.error().message);
    return e.error();
  }
  return c;
}

Result<void> NcclComm::all_reduce(CUdeviceptr send, CUdeviceptr recv, size_t count, DType dtype, ReduceOp op,
                                  CUstream stream) {
  std::string what = describe(CollectiveKind::AllReduce, count, dtype, op);
  SF_TRY(usable(what));
  Result<ncclDataType_t> dt = data_type(dtype);
  Result<ncclRedOp_t> rop = reduce_op(op, dtype);
  if (!dt) return diag(who() + what + ": " + dt.error().message);
  if (!rop) return diag(who() + what + ": " + rop.error().message);
  return enqueued(lib_->AllReduce(ptr(send), ptr(recv), count, *dt, *rop, comm_, stream), std::move(what));
}

Result<void> NcclComm::all_gather(CUdeviceptr send, CUdeviceptr recv, size_t send_count, DType dtype,
                                  CUstream stream) {
  std::string what = describe(CollectiveKind::AllGather, send_count * static_cast<size_t>(size()), dtype, std::nullopt);
  SF_TRY(usable(what));
  Result<ncclDataType_t> dt = data_type(dtype);
  if (!dt) return diag(who() + what + ": " + dt.error().message);
  return enqueued(lib_->AllGather(ptr(send), ptr(recv), send_count, *dt, comm_, stream), std::move(what));
}

Result<void> NcclComm::reduce_scatter(CUdeviceptr send, CUdeviceptr recv, size_t recv_count, DType dtype,
                                      ReduceOp op, CUstream stream) {
  std::string what = describe(CollectiveKind::ReduceScatter, recv_count * static_cast<size_t>(size()), dtype, op);
  SF_TRY(usable(what));
  Result<ncclDataType_t> dt = data_type(dtype);
  Result<ncclRedOp_t> rop = reduce_op(op, dtype);
  if (!dt) return diag(who() + what + ": " + dt.error().message);
  if (!rop) return diag(who() + what + ": " + rop.error().message);
  return enqueued(lib_->ReduceScatter(ptr(send), ptr(recv), recv_count, *dt, *rop, comm_, stream), std::move(what));
}

Result<void> NcclComm::all_to_all(CUdeviceptr send, CUdeviceptr recv, size_t count, DType dtype,
                                  CUstream stream) {
  const size_t block = count * static_cast<size_t>(dtype_size(dtype));
  std::vector<Transfer> sends, recvs;
  for (int k = 0; k < size(); ++k) {
    sends.push_back({k, send + static_cast<CUdeviceptr>(k) * block, count});
    recvs.push_back({k, recv + static_cast<CUdeviceptr>(k) * block, count});
  }
  std::string what = describe(CollectiveKind::AllToAll, count * static_cast<size_t>(size()), dtype, std::nullopt);
  return grouped(sends, recvs, dtype, stream, std::move(what));
}

Result<void> NcclComm::send_recv(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                                 DType dtype, CUstream stream) {
  size_t total = 0;
  for (const Transfer& t : sends) total += t.count;
  std::string what = "send/recv of " + std::to_string(total * static_cast<size_t>(dtype_size(dtype))) + " B (" +
                     std::string(dtype_name(dtype)) + ", " + std::to_string(sends.size()) + " sends, " +
                     std::to_string(recvs.size()) + " receives)";
  return grouped(sends, recvs, dtype, stream, std::move(what));
}

Result<void> NcclComm::grouped(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                               DType dtype, CUstream stream, std::string what) {
  SF_TRY(usable(what));
  Result<ncclDataType_t> dt = data_type(dtype);
  if (!dt) return diag(who() + what + ": " + dt.error().message);
  for (const auto* list : {&sends, &recvs})
    for (const Transfer& t : *list)
      if (t.member < 0 || t.member >= size())
        return diag(who() + what + ": member " + std::to_string(t.member) + " is not in " + group_.str());
  ncclResult_t r = lib_->GroupStart();
  for (size_t i = 0; i < sends.size() && r == ncclSuccess; ++i)
    if (sends[i].count) r = lib_->Send(ptr(sends[i].ptr), sends[i].count, *dt, sends[i].member, comm_, stream);
  for (size_t i = 0; i < recvs.size() && r == ncclSuccess; ++i)
    if (recvs[i].count) r = lib_->Recv(ptr(recvs[i].ptr), recvs[i].count, *dt, recvs[i].member, comm_, stream);
  // The group must be closed even after a failed call inside it.
  ncclResult_t end = lib_->GroupEnd();
  if (r == ncclSuccess) r = end;
  return enqueued(r, std::move(what));
}

Result<void> NcclComm::wait_with_timeout(CUstream stream) { return wait_with_timeout(stream, opts_.timeout); }

Result<void> NcclComm::wait_with_timeout(CUstream stream, milliseconds timeout) {
  const std::string what = pending_.empty() ? std::string("waiting for the stream") : pending_.front();
  SF_TRY(usable(what));
  auto more = [&] {
    return pending_.size() > 1 ? " (" + std::to_string(pending_.size() - 1) + " more collective" +
                                     (pending_.size() > 2 ? "s" : "") + " pending)"
                               : std::string();
  };
  const auto deadline = Clock::now() + timeout;
  Backoff backoff;
  for (;;) {
    CUresult q = ctx_->drv().StreamQuery(stream);
    if (q == CUDA_SUCCESS) {
      pending_.clear();
      return {};
    }
    if (q != CUDA_ERROR_NOT_READY) return fail(what, "failed on the device: " + ctx_->drv().error(q) + more());
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = lib_->CommGetAsyncError(comm_, &state); r != ncclSuccess)
      return fail(what, "failed: ncclCommGetAsyncError: " + lib_->error(r, comm_) + more());
    if (state != ncclSuccess && state != ncclInProgress)
      return fail(what, "failed: " + lib_->error(state, comm_) + more(), state == ncclRemoteError);
    if (Clock::now() > deadline) return fail(what, "timed out after " + duration_str(timeout) + more());
    backoff.pause();
  }
}

void NcclComm::abort(const std::string& why) {
  if (comm_) {
    lib_->CommAbort(comm_);
    comm_ = nullptr;
  }
  if (!aborted_) aborted_ = why;
  pending_.clear();
}

Result<std::vector<std::unique_ptr<NcclComm>>> split_mesh(NcclComm& world, const DeviceMesh& mesh,
                                                          const Options* opts) {
  const std::string who = "rank " + std::to_string(world.rank()) + ": ";
  if (world.size() != mesh.world())
    return diag(who + "splitting per mesh dim: the communicator has " + std::to_string(world.size()) +
                " members, the mesh " + std::to_string(mesh.world()) + " ranks");
  for (int k = 0; k < world.size(); ++k)
    if (world.group().ranks[static_cast<size_t>(k)] != k)
      return diag(who + "splitting per mesh dim: member k of " + world.group().str() + " must be rank k");
  std::vector<std::unique_ptr<NcclComm>> out;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const SplitKey sk = mesh_split_key(mesh, world.rank(), d);
    Group g{d, mesh.group(world.rank(), d), world.rank()};
    Result<std::unique_ptr<NcclComm>> c = world.split(sk.color, sk.key, g, opts);
    if (!c) return c.error();
    out.push_back(std::move(c).value());
  }
  return out;
}

}  // namespace sf::nccl
