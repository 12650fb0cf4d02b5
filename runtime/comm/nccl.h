// NCCL, opened at run time: dlopen("libnccl.so.2") and dlsym of the entry points
// we call, with the toolkit's <nccl.h> used for types only. No link-time NCCL, no
// LLVM: one binary runs with or without NCCL and a GPU and says which is missing
// (docs/collectives.md).
//
// On top of the loader:
//   - NcclComm, one NCCL communicator of one rank (RAII), made from a unique id that
//     member 0 creates and every member reads through a Gloo Comm (runtime/comm/comm.h),
//     or split from a parent per mesh dim (ncclCommSplit: color = the group's
//     index, key = the position in it);
//   - ncclConfig_t options: maxCTAs/minCTAs (NCCL's kernels take SMs our kernels
//     want) and nonblocking mode (so creating a communicator and enqueueing on it
//     can time out rather than block);
//   - collectives enqueued on a CUstream, and wait_with_timeout(), which polls the
//     stream and ncclCommGetAsyncError and calls ncclCommAbort on an error or a
//     timeout, so a lost peer ends every rank with a Diag, never a hang;
//   - nccl-tests' size conventions and bus factors (algbw, busbw), shared with
//     bench/bench_collectives.cpp.
//
// Errors are values, as in runtime/comm/comm.h: a Diag (empty `file`) that names the
// rank, the collective and the group:
//   rank 1: all_reduce of 4194304 B (f32, sum) over group 0 (ranks 0 1) timed out after 2 s; the NCCL communicator was aborted
// Without NCCL the loader's Diag starts "NCCL not available: "; without a GPU,
// making a communicator gives cuda::driver()'s "no CUDA device: ..." (NCCL itself
// loads without a GPU: its CUDA runtime is linked in statically and needs
// libcuda.so.1 only when a communicator is made).
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/device_mesh.h"
#include "runtime/core/collective.h"
#include "runtime/core/diag.h"
#include "runtime/core/dtype.h"
#include "runtime/core/mesh.h"
#include "runtime/gpu/cuda.h"

namespace sf {
class Comm;
}

namespace sf::nccl {

// --- the library ------------------------------------------------------------------

// Every entry point we use: X(member, NCCL name); the member's type is <nccl.h>'s
// declaration of that name. ncclCommSplit is the newest (NCCL 2.18).
#define SF_NCCL_ENTRY_POINTS(X)                  \
  X(GetVersion, ncclGetVersion)                  \
  X(GetUniqueId, ncclGetUniqueId)                \
  X(CommInitRankConfig, ncclCommInitRankConfig)  \
  X(CommInitRank, ncclCommInitRank)              \
  X(CommSplit, ncclCommSplit)                    \
  X(CommFinalize, ncclCommFinalize)              \
  X(CommDestroy, ncclCommDestroy)                \
  X(CommAbort, ncclCommAbort)                    \
  X(CommGetAsyncError, ncclCommGetAsyncError)    \
  X(GetErrorString, ncclGetErrorString)          \
  X(GetLastError, ncclGetLastError)              \
  X(AllReduce, ncclAllReduce)                    \
  X(AllGather, ncclAllGather)                    \
  X(ReduceScatter, ncclReduceScatter)            \
  X(Send, ncclSend)                              \
  X(Recv, ncclRecv)                              \
  X(GroupStart, ncclGroupStart)                  \
  X(GroupEnd, ncclGroupEnd)

struct Library {
#define SF_NCCL_MEMBER(member, name) decltype(&::name) member = nullptr;
  SF_NCCL_ENTRY_POINTS(SF_NCCL_MEMBER)
#undef SF_NCCL_MEMBER

  std::string file;  // what was opened: "libnccl.so.2", a path
  int version = 0;   // ncclGetVersion: 22809 for 2.28.9

  // "2.28.9".
  std::string version_str() const;
  // "ncclUnhandledCudaError (unhandled cuda error ...): <ncclGetLastError(comm)>".
  std::string error(ncclResult_t r, ncclComm_t comm = nullptr) const;
};

// The library, opened once per process: $SHARDFUSE_LIBNCCL when set (and nothing
// else then), otherwise libnccl.so.2 on the loader's path, $CUDA_HOME/lib64 and
// /usr/local/cuda/lib64. A Diag "NCCL not available: <reason>" when none opens, an
// entry point is missing, or the library is older than 2.18.
Result<const Library*> library();
// Opens `file` now, uncached (tests; a diagnostic of a given file). The handle is
// never closed: NCCL keeps threads and static state.
Result<std::shared_ptr<const Library>> open_library(const std::string& file);

// Our dtype as NCCL's; a Diag for dtypes NCCL cannot reduce like the host oracle
// (runtime/core/host_collectives.h): bool is carried as uint8, so only max and
// min (any, all) agree; a bool sum (saturating) or avg does not.
Result<ncclDataType_t> data_type(DType t);
Result<ncclRedOp_t> reduce_op(ReduceOp op, DType t);

// --- sizes and bandwidths (nccl-tests' conventions) ---------------------------------

// The collective kind is runtime/core/collective.h's CollectiveKind (kAllCollectives,
// collective_name).

// busbw = algbw * bus_factor (runtime/core/collective.h, shared with the timeline
// model), so busbw is comparable with the link bandwidth whatever n is.

// The buffers of one collective of nccl-tests' "size" `bytes` over n ranks, and
// the size actually run (counts are whole elements and, where the buffer is cut in
// n blocks, a multiple of n elements, at least one per rank):
//   all_reduce      send = recv = size
//   all_gather      send = size / n, recv = size        (size is the gathered output)
//   reduce_scatter  send = size,     recv = size / n    (size is the input)
//   all_to_all      send = recv = size                  (n blocks of size / n)
struct CollectiveSize {
  int64_t send_count = 0;  // elements in each rank's send buffer
  int64_t recv_count = 0;  // elements in each rank's receive buffer
  int64_t bytes = 0;       // nccl-tests' size of what runs: what algbw divides
};
CollectiveSize collective_size(CollectiveKind c, int64_t bytes, int elem_bytes, int n);

// algbw = size / time, in GB/s (1e9 B/s, as nccl-tests); busbw = algbw * bus factor.
double algbw_GBps(int64_t bytes, double seconds);
double busbw_GBps(CollectiveKind c, int n, int64_t bytes, double seconds);

// --- communicators -------------------------------------------------------------------

struct Options {
  // ncclConfig_t.maxCTAs: the most CTAs NCCL's kernels may use (one CTA per
  // channel, each resident on an SM for the whole collective). NCCL picks the
  // channel count from the topology, tens of CTAs on an NVLink node, and an SM
  // running one is an SM our overlapped kernels do not get; 0 leaves NCCL's
  // default (or NCCL_MAX_CTAS from the environment).
  int max_ctas = 0;
  // ncclConfig_t.minCTAs; 0 leaves NCCL's default. Must not exceed max_ctas when
  // both are set.
  int min_ctas = 0;
  // ncclConfig_t.blocking = 0: creating, splitting and enqueueing return at once
  // (ncclInProgress) and we poll ncclCommGetAsyncError under `timeout`, so a
  // member that never joins ends in a Diag instead of a hang. In blocking mode
  // only wait_with_timeout() is bounded.
  bool nonblocking = true;
  // How long creating a communicator, one enqueue, or one wait_with_timeout() may
  // take before the communicator is aborted.
  std::chrono::milliseconds timeout{60000};
  // ncclConfig_t.commName, for NCCL's own logs (NCCL_DEBUG=INFO); "" leaves it unset.
  std::string name;
};

// The ncclConfig_t these options give (NCCL_CONFIG_INITIALIZER, then the fields
// that are set). `opts.name` must outlive the config.
ncclConfig_t make_config(const Options& opts);
// A Diag when the options are inconsistent (negative counts, min > max, timeout <= 0).
Result<void> check_options(const Options& opts);

// Who a communicator joins, for messages and for the member index.
struct Group {
  int index = 0;            // the mesh dim (the `group` of runtime/comm/comm.h)
  std::vector<int> ranks;   // global ranks, in member order
  int rank = 0;             // this rank (global); one of `ranks`
  int member() const;       // rank's position in ranks, -1 if absent
  std::string str() const;  // "group 0 (ranks 0 1 2 3)", as runtime/comm/comm.h says it
};

// ncclCommSplit's arguments for `rank`'s group along mesh dim `dim`: color = the
// group's index in mesh.groups(dim), key = rank's position in it.
struct SplitKey {
  int color = 0;
  int key = 0;
};
SplitKey mesh_split_key(const DeviceMesh& mesh, int rank, int dim);

// One rank's NCCL communicator on one GPU. Use it from one thread at a time (each
// rank thread owns its own); every call first makes the device's primary context
// current on the calling thread, which is also the device NCCL's CUDA runtime uses.
class NcclComm {
 public:
  // Every member calls this at the same time (threads or processes) with the same
  // id (from ncclGetUniqueId on one of them) and group. Blocks until every member
  // joined; a Diag on an error, or after opts.timeout in nonblocking mode (the
  // communicator is then aborted).
  static Result<std::unique_ptr<NcclComm>> init(const ncclUniqueId& id, const Group& group, int device,
                                                const Options& opts = {});
  // The communicator of `gloo`'s group `group` (a mesh dim), on CUDA device
  // `device`. Every member of that group calls it; they first all_gather, over
  // Gloo, whether each has NCCL and the device, and member 0's unique id, so either
  // every member goes on to ncclCommInitRankConfig or every member returns a Diag
  // (naming the first member that could not join): nobody waits for a member that
  // is not coming.
  static Result<std::unique_ptr<NcclComm>> create(Comm& gloo, int group, int device, const Options& opts = {});

  // Destroys the communicator: ncclCommFinalize (polled, within the timeout) and
  // ncclCommDestroy, or ncclCommAbort if collectives were enqueued but not waited
  // for, if the communicator failed, or if finalizing times out. Never blocks
  // past the timeout.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // A communicator over the members of this one that pass the same color, ordered
  // by key (ncclCommSplit). Every member of this communicator calls it at the same
  // time. `group` names the new one for messages (its ranks in key order, this
  // rank, the mesh dim); `opts` defaults to this communicator's.
  Result<std::unique_ptr<NcclComm>> split(int color, int key, const Group& group, const Options* opts = nullptr);

  // Collectives enqueued on `stream` (a stream of this device's primary context);
  // counts in elements of `dtype`; pointers are device memory. Each returns once
  // enqueued; wait_with_timeout(stream) waits for the device. On an error the
  // communicator is aborted and every later call fails quoting it.
  Result<void> all_reduce(CUdeviceptr send, CUdeviceptr recv, size_t count, DType dtype, ReduceOp op,
                          CUstream stream);
  // recv holds size() * send_count elements, member k's at k * send_count.
  Result<void> all_gather(CUdeviceptr send, CUdeviceptr recv, size_t send_count, DType dtype, CUstream stream);
  // send holds size() * recv_count elements; this member keeps block member().
  Result<void> reduce_scatter(CUdeviceptr send, CUdeviceptr recv, size_t recv_count, DType dtype, ReduceOp op,
                              CUstream stream);
  // Block k (of `count` elements) of send goes to member k; the block from member k
  // lands at recv + k * count. ncclSend/ncclRecv pairs in one NCCL group, which
  // every NCCL since 2.7 has (ncclAlltoAll only recent ones).
  Result<void> all_to_all(CUdeviceptr send, CUdeviceptr recv, size_t count, DType dtype, CUstream stream);
  // Point-to-point transfers in one NCCL group (ncclGroupStart, ncclSend/ncclRecv,
  // ncclGroupEnd): each send to member m pairs with m's receive from this member,
  // in call order, with the same count. A member may be this one. Zero counts are
  // skipped (both sides compute the same count, so both skip). What uneven
  // all-gathers, reduce-scatters and all-to-alls are built from.
  struct Transfer {
    int member = 0;       // the peer's position in the group
    CUdeviceptr ptr = 0;  // device memory
    size_t count = 0;     // elements
  };
  Result<void> send_recv(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs, DType dtype,
                         CUstream stream);

  // Waits until everything enqueued on `stream` finished, polling cuStreamQuery and
  // ncclCommGetAsyncError. On an NCCL or CUDA error, or after `timeout` (default:
  // the options'), aborts the communicator (ncclCommAbort, which also stops its
  // kernels) and returns a Diag naming this rank, the oldest collective not known
  // to have finished, and the group.
  Result<void> wait_with_timeout(CUstream stream);
  Result<void> wait_with_timeout(CUstream stream, std::chrono::milliseconds timeout);

  // Aborts the communicator now (ncclCommAbort); later calls fail quoting `why`.
  // Call it from the thread that uses this communicator: NcclComm takes no locks.
  void abort(const std::string& why);
  // Why the communicator was aborted, if it was.
  const std::optional<std::string>& aborted() const { return aborted_; }

  int rank() const { return group_.rank; }
  int member() const { return group_.member(); }
  int size() const { return static_cast<int>(group_.ranks.size()); }
  int device() const { return ctx_->info().ordinal; }
  const Group& group() const { return group_; }
  const Options& options() const { return opts_; }
  ncclComm_t get() const { return comm_; }

 private:
  NcclComm() = default;
  std::string who() const;  // "rank 1: "
  Result<void> usable(const std::string& what);
  Result<void> settle(ncclResult_t r, const std::string& what,
                      std::chrono::steady_clock::time_point deadline, const std::string& timeout_hint = "");
  Result<void> enqueued(ncclResult_t r, std::string what);
  // Aborts the communicator and says why. `from_peer`: NCCL answered
  // ncclRemoteError, i.e. another member failed or aborted first.
  Diag fail(const std::string& what, const std::string& how, bool from_peer = false);
  Result<void> grouped(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs, DType dtype,
                       CUstream stream, std::string what);

  const Library* lib_ = nullptr;
  std::shared_ptr<cuda::Context> ctx_;
  ncclComm_t comm_ = nullptr;
  Group group_;
  Options opts_;
  std::optional<std::string> aborted_;
  bool aborted_by_peer_ = false;  // aborted_ came from a peer's failure (ncclRemoteError)
  std::vector<std::string> pending_;  // collectives enqueued since the last completed wait
};

// One communicator per mesh dim, split from `world` (whose member k must be rank
// k of the mesh), in mesh-dim order: element d is this rank's group along dim d.
// Every rank of the world calls it at the same time with the same mesh.
Result<std::vector<std::unique_ptr<NcclComm>>> split_mesh(NcclComm& world, const DeviceMesh& mesh,
                                                          const Options* opts = nullptr);

}  // namespace sf::nccl
