// The fake NCCL's exported entry points (tests/fake_nccl/README.md): each checks its
// arguments and hands the work to the state machine of fake_libnccl.cpp, through
// fake_nccl_state.h.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>

#include "tests/fake_cuda/fake_log.h"
#include "tests/fake_nccl/fake_nccl_state.h"
#include "runtime/comm/nccl.h"

// --- the NCCL API ---------------------------------------------------------------------------

FAKE_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fake::fail(ncclInvalidArgument, "ncclGetVersion", "ncclGetVersion: version is NULL");
  *version = fake::kVersion;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fake::fail(ncclInvalidArgument, "ncclGetUniqueId", "ncclGetUniqueId: uniqueId is NULL");
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  // magic (16 B), a counter (8 B), the pid (4 B): unique in the process, and an id
  // from another process is recognised as such.
  std::memset(uniqueId->internal, 0, NCCL_UNIQUE_ID_BYTES);
  std::memcpy(uniqueId->internal, fake::kIdMagic, sizeof fake::kIdMagic);
  const uint64_t n = ++s.unique_ids;
  std::memcpy(uniqueId->internal + 16, &n, sizeof n);
  const int pid = ::getpid();
  std::memcpy(uniqueId->internal + 24, &pid, sizeof pid);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                ncclConfig_t* config) {
  return fake::init("ncclCommInitRankConfig", comm, nranks, commId, rank, config);
}

FAKE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return fake::init("ncclCommInitRank", comm, nranks, commId, rank, nullptr);
}

FAKE_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* call = "ncclCommSplit";
  if (!newcomm) return fake::fail(ncclInvalidArgument, call, "ncclCommSplit: newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fake::fail(ncclInvalidArgument, call, "ncclCommSplit: color " + std::to_string(color) + " (must be >= 0 or NCCL_SPLIT_NOCOLOR)");
  if (config && config->magic != fake::kConfigMagic)
    return fake::fail(ncclInvalidArgument, call, "ncclCommSplit: the config was not set from NCCL_CONFIG_INITIALIZER");
  *newcomm = nullptr;
  fake::Part p;
  p.kind = fake::Kind::Split;
  p.color = color;
  p.key = key;
  const fake::SplitArgs args{newcomm, config};
  return fake::collective(call, comm, p, 0, &args);
}

FAKE_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  ncclResult_t r = ncclSuccess;
  std::shared_ptr<fake::Member> m = fake::find(s, comm, "ncclCommFinalize", &r);
  if (!m) return r;
  m->finalized = true;
  // Nothing is in flight once every operation executed; a nonblocking member's
  // finalize waits (ncclInProgress) for its outstanding ones, as NCCL's flushes them.
  return m->nonblocking && fake::busy(*m) ? ncclInProgress : ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;  // as NCCL
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  ncclResult_t r = ncclSuccess;
  std::shared_ptr<fake::Member> m = fake::find(s, comm, "ncclCommDestroy", &r);
  if (!m) return r;
  if (m->group && fake::busy(*m))
    fake::abort_group(s, *m->group,
                      "member " + std::to_string(m->index) + " destroyed its communicator with operations pending");
  s.comms.erase(fake::id_of(comm));
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;  // as NCCL
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  ncclResult_t r = ncclSuccess;
  std::shared_ptr<fake::Member> m = fake::find(s, comm, "ncclCommAbort", &r);
  if (!m) return r;
  fake::log_line("nccl abort " + fake::who(*m));
  if (m->group) fake::abort_group(s, *m->group, "member " + std::to_string(m->index) + " called ncclCommAbort");
  s.comms.erase(fake::id_of(comm));
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const char* call = "ncclCommGetAsyncError";
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  ncclResult_t r = ncclSuccess;
  std::shared_ptr<fake::Member> m = fake::find(s, comm, call, &r);
  if (!m) return r;
  if (!asyncError) return fake::fail(ncclInvalidArgument, call, "ncclCommGetAsyncError: asyncError is NULL");
  fake::Member& me = *m;
  for (const auto& op : me.outstanding)
    if (op->result != ncclSuccess && me.sticky == ncclSuccess) me.sticky = op->result, me.sticky_why = op->why;
  std::erase_if(me.outstanding, [](const auto& op) { return op->settled(); });
  // The member's own failure first: an abort that followed it (a runtime aborts on
  // an error) must not hide why.
  if (me.sticky != ncclSuccess) {
    fake::tls_error = me.sticky_why;
    *asyncError = me.sticky;
  } else if (me.group && me.group->aborted) {
    fake::tls_error = "the communicator was aborted: " + me.group->abort_why;
    *asyncError = ncclRemoteError;
  } else if (!me.group) {
    const bool failed = me.forming && me.forming->result != ncclSuccess;
    if (failed) fake::tls_error = me.forming->why;
    *asyncError = failed ? me.forming->result : ncclInProgress;
  } else {
    *asyncError = !me.group->complete || !me.outstanding.empty() ? ncclInProgress : ncclSuccess;
  }
  return ncclSuccess;
}

FAKE_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  // NCCL 2.28's texts.
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

FAKE_EXPORT const char* ncclGetLastError(ncclComm_t) { return fake::tls_error.c_str(); }

FAKE_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  fake::Part p;
  p.kind = fake::Kind::AllReduce;
  p.send = sendbuff, p.recv = recvbuff, p.count = count, p.type = datatype, p.op = op;
  return fake::collective("ncclAllReduce", comm, p, fake::id_of(stream));
}

FAKE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                       ncclComm_t comm, cudaStream_t stream) {
  fake::Part p;
  p.kind = fake::Kind::AllGather;
  p.send = sendbuff, p.recv = recvbuff, p.count = sendcount, p.type = datatype;
  return fake::collective("ncclAllGather", comm, p, fake::id_of(stream));
}

FAKE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  fake::Part p;
  p.kind = fake::Kind::ReduceScatter;
  p.send = sendbuff, p.recv = recvbuff, p.count = recvcount, p.type = datatype, p.op = op;
  return fake::collective("ncclReduceScatter", comm, p, fake::id_of(stream));
}

FAKE_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  // The buffer is only read; Xfer keeps one pointer type for both directions.
  return fake::p2p(true, "ncclSend", const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

FAKE_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                  cudaStream_t stream) {
  return fake::p2p(false, "ncclRecv", recvbuff, count, datatype, peer, comm, stream);
}

FAKE_EXPORT ncclResult_t ncclGroupStart() {
  if (fake::tls_depth++ == 0) {
    fake::tls_group.clear();
    fake::tls_group_error = ncclSuccess;
    fake::tls_group_why.clear();
  }
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclGroupEnd() {
  if (fake::tls_depth == 0)
    return fake::fail(ncclInvalidUsage, "ncclGroupEnd", "ncclGroupEnd without ncclGroupStart");
  if (--fake::tls_depth > 0) return ncclSuccess;
  std::vector<fake::Pending> calls = std::move(fake::tls_group);
  fake::tls_group.clear();
  if (fake::tls_group_error != ncclSuccess) {
    // A call inside the group failed: NCCL drops the whole group and says so again.
    const ncclResult_t r = fake::tls_group_error;
    fake::tls_group_error = ncclSuccess;
    return fake::fail(r, "ncclGroupEnd", "ncclGroupEnd: a call inside the group failed: " + fake::tls_group_why);
  }
  if (calls.empty()) return ncclSuccess;
  return fake::end_group(std::move(calls));
}

namespace fake {
namespace {
// Every entry point the runtime resolves, so a missing definition is an undefined
// symbol (see the top of the file); fake_nccl_stat("entry_points") counts them.
#define FAKE_NCCL_ROW(member, name) reinterpret_cast<void*>(static_cast<decltype(&::name)>(&::name)),
void* const kEntries[] = {SF_NCCL_ENTRY_POINTS(FAKE_NCCL_ROW)};
#undef FAKE_NCCL_ROW
}  // namespace
}  // namespace fake

// --- hooks for tests (not part of the NCCL API) -----------------------------------------------
// A test reaches this with dlopen($SHARDFUSE_LIBNCCL, RTLD_NOW | RTLD_NOLOAD) and dlsym.

// A counter of the fake's state, or -1 for an unknown name: "comms" (live handles),
// "ops" (executed collectives and splits, one per communicator-wide operation, plus
// completed p2p groups, one per member's group), "max_ctas" and "min_ctas" (of the
// last communicator created with a config; -1 when the config left them unset),
// "entry_points" (how many of SF_NCCL_ENTRY_POINTS the library defines).
FAKE_EXPORT long long fake_nccl_stat(const char* name) {
  fake::State& s = fake::state();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string n = name ? name : "";
  if (n == "comms") return static_cast<long long>(s.comms.size());
  if (n == "ops") return s.ops;
  if (n == "max_ctas") return s.max_ctas;
  if (n == "min_ctas") return s.min_ctas;
  if (n == "entry_points")
    return static_cast<long long>(std::count_if(std::begin(fake::kEntries), std::end(fake::kEntries), [](void* p) { return p != nullptr; }));
  return -1;
}
