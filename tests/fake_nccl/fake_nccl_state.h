// The fake NCCL's state and internals, shared by fake_libnccl.cpp (the state machine:
// members, groups, collectives, point-to-point) and fake_nccl_api.cpp (the exported
// NCCL entry points). Everything here is hidden in the library (CXX_VISIBILITY_PRESET).
#pragma once

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace fake {

using Clock = std::chrono::steady_clock;

constexpr int kVersion = 22809;                // 2.28.9: the toolkit header's NCCL_VERSION_CODE
constexpr char kIdMagic[16] = "sf-fake-nccl";  // the first bytes of every unique id we make
constexpr int kDefaultTimeoutMs = 60000;       // $FAKE_NCCL_TIMEOUT_MS: blocking calls give up then
constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's magic
constexpr uint64_t kHandleBase = 0xCC10000;    // ncclComm_t handles: ids, never reused
constexpr uint64_t kGroupStep = 16;

static_assert(NCCL_VERSION_CODE == kVersion, "the fake reports the toolkit's NCCL version; update kVersion");

// One operation as its members see it: a collective (shared by every member) or one
// member's group of sends and receives.
struct Op {
  bool done = false;                  // executed
  ncclResult_t result = ncclSuccess;  // anything else: failed (and never executed)
  std::string why;
  int remaining = 0;                  // p2p: transfers not yet matched with the peer's
  bool settled() const { return done || result != ncclSuccess; }
};

enum class Kind { AllReduce, AllGather, ReduceScatter, Split };

// One member's posting of a collective.
struct Part {
  bool posted = false;
  Kind kind = Kind::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int color = 0, key = 0;  // split
  uint64_t child = 0;      // split: the new handle, 0 for NCCL_SPLIT_NOCOLOR
};

// The k-th collective of a communicator, until every member posted it.
struct Coll {
  std::vector<Part> parts;
  int posted = 0;
  std::shared_ptr<Op> op = std::make_shared<Op>();
};

// One send or receive waiting for its peer's counterpart.
struct Xfer {
  std::shared_ptr<Op> op;
  void* buf = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int src = 0, dst = 0;
};

// The members that met by one unique id (or one color of a split): NCCL's
// communicator, of which each member holds a handle.
struct Group {
  uint64_t id = 0;  // for logs and messages
  int n = 0;
  std::vector<uint64_t> handles;  // by member; 0 until it joined
  int joined = 0;
  bool complete = false;
  bool aborted = false;
  std::string abort_why;
  std::map<int64_t, Coll> colls;  // by sequence number, until every member posted
  // Unmatched sends and receives by (src, dst), in call order: the i-th send from
  // s to d pairs with d's i-th receive from s, as in NCCL.
  std::vector<std::deque<Xfer>> sends, recvs;
};

struct Member {
  std::shared_ptr<Group> group;  // null for a split's child until the split executes
  int index = -1;
  bool nonblocking = false;
  bool finalized = false;
  int64_t next_seq = 0;                           // the sequence number of its next collective
  std::vector<std::shared_ptr<Op>> outstanding;   // nonblocking operations not yet seen settled
  std::shared_ptr<Op> forming;                    // a split's child: the parent's split
  ncclResult_t sticky = ncclSuccess;              // a failed operation leaves the member in error
  std::string sticky_why;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;  // notified on every change a waiter may wait for
  std::map<std::string, std::shared_ptr<Group>> by_id;
  std::map<uint64_t, std::shared_ptr<Member>> comms;  // live handles
  uint64_t next_handle = kHandleBase;
  uint64_t next_group = 0xC0;
  uint64_t unique_ids = 0;
  long long ops = 0;
  long long max_ctas = -1, min_ctas = -1;
};

// An open ncclGroupStart on this thread: the p2p calls made inside it.
struct Pending {
  bool send = true;
  uint64_t comm = 0;
  void* buf = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int peer = 0;
  uint64_t stream = 0;
};

struct TypeInfo {
  const char* name = nullptr;  // nullptr: not a type we know
  size_t bytes = 0;
  bool reducible = false;
};

// ncclCommSplit's outputs and the child's config.
struct SplitArgs {
  ncclComm_t* newcomm = nullptr;
  const ncclConfig_t* config = nullptr;
};

extern thread_local std::string tls_error;
extern thread_local int tls_depth;
extern thread_local std::vector<Pending> tls_group;
extern thread_local ncclResult_t tls_group_error;
extern thread_local std::string tls_group_why;

const char* kind_name(Kind k);
State& state();
const char* result_name(ncclResult_t r);
ncclResult_t fail(ncclResult_t r, const char* call, const std::string& why);
int timeout_ms();
TypeInfo type_info(ncclDataType_t t);
const char* op_name(ncclRedOp_t op);
double load_float(const std::byte* p, ncclDataType_t t);
void store_float(std::byte* p, ncclDataType_t t, double v);
void reduce_float(const std::vector<const std::byte*>& ins, std::byte* out, size_t count, ncclDataType_t t,
                  ncclRedOp_t op);
void reduce_int(const std::vector<const std::byte*>& ins, std::byte* out, size_t count, ncclRedOp_t op);
void reduce(const std::vector<const std::byte*>& ins, std::byte* out, size_t count, ncclDataType_t t, ncclRedOp_t op);
std::string members_str(const std::vector<int>& ms);
std::string who(const Member& m);
std::shared_ptr<Member> find(State& s, ncclComm_t comm, const char* call, ncclResult_t* r);
void fail_op(State& s, Group& g, const std::shared_ptr<Op>& op, ncclResult_t r, const std::string& why);
void abort_group(State& s, Group& g, const std::string& why);
ncclResult_t ready(const Member& m, const char* call);
ncclResult_t finish(State& s, std::unique_lock<std::mutex>& lock, Member& m, Group& g, const std::shared_ptr<Op>& op,
                    const char* call, const std::function<std::string()>& missing);
std::string disagreement(const Group& g, int64_t seq, const Coll& c, int me);
void form_children(State& s, const Coll& c);
void execute(State& s, Coll& c);
ncclResult_t collective(const char* call, ncclComm_t comm, Part part, uint64_t stream, const SplitArgs* split = nullptr);
void match(State& s, Group& g, const Xfer& snd, const Xfer& rcv);
void post(State& s, Group& g, Xfer x, bool send);
std::string pending_str(const Group& g, const std::shared_ptr<Op>& op);
ncclResult_t end_group(std::vector<Pending> calls);
ncclResult_t p2p(bool send, const char* call, void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                 cudaStream_t stream);
ncclResult_t init(const char* call, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                  const ncclConfig_t* config);
bool busy(const Member& m);

}  // namespace fake
