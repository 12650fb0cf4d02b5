// Internal to the Gloo backend of runtime/comm/comm.h: what its files share, and no
// interface of its own. runtime/comm/comm_rendezvous.cpp: the rendezvous and the store a
// group connects through; runtime/comm/comm_wire.cpp: packing chunks along a dim and
// reducing in the wire types; runtime/comm/comm.cpp: Comm::Impl's comm thread, its
// transfers and header exchange, and Comm's public methods;
// runtime/comm/comm_collectives.cpp: the collectives themselves. Only these files
// include it.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/collective.h"
#include "runtime/comm/comm.h"

namespace sf {

namespace detail {
struct OpState;  // a Work's completion (comm.cpp)
}

namespace comm_detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Gloo's messages start with "[/build/.../pair.cc:589] " or "[enforce fail at ...] ";
// the source position means nothing to a user of shardfuse.
inline std::string clean_gloo_message(std::string m) {
  if (!m.empty() && m[0] == '[') {
    size_t end = m.find("] ");
    if (end != std::string::npos) m = m.substr(end + 2);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

// FNV-1a over 64-bit words: a group's rank list in store keys, a collective's
// arguments in its header.
struct Fnv {
  uint64_t h = 14695981039346656037ull;  // the FNV-1a 64 offset basis
  Fnv& add(int64_t x) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(x) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
    return *this;
  }
  template <class V>
  Fnv& add_all(const V& v) {
    add(static_cast<int64_t>(v.size()));
    for (auto x : v) add(static_cast<int64_t>(x));
    return *this;
  }
};

// ---------------------------------------------------------------------------------
// Rendezvous (runtime/comm/comm_rendezvous.cpp)
// ---------------------------------------------------------------------------------

// What a Comm does when its Rendezvous is aborted (defined with Comm::Impl).
void comm_on_abort(Comm::Impl* impl, const std::string& why);

class RendezvousImpl final : public Rendezvous {
 public:
  // dir empty: in-process (HashStore); else a FileStore in dir.
  explicit RendezvousImpl(std::string dir);

  std::string str() const override { return dir_.empty() ? "in-process" : "directory " + dir_; }

  std::optional<std::string> aborted() const override;

  // Records the reason (the first wins; for a directory, the first of any
  // process, left in DIR/sf-abort) and tells every Comm registered here.
  void abort(const std::string& why);

  // The first failure a rank meeting here reported (a collective that timed out,
  // arguments that disagree), so that a rank whose peer gave up first can say why
  // rather than just "connection reset". Waits up to `patience` for one.
  std::optional<std::string> first_failure(milliseconds patience);

  void record_failure(const std::string& msg);

  // The n-th Comm::create of `rank` here gets n: every rank creates its Comms in
  // the same order, so the n-th ones meet under the same keys, and a second Comm
  // on the same rendezvous does not read the first one's addresses.
  int next_generation(int rank);

  void add(Comm::Impl* c);
  void remove(Comm::Impl* c);

  gloo::rendezvous::Store* store() { return store_.get(); }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }
  bool is_file() const { return !dir_.empty(); }

 private:
  const std::string dir_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::string error_;  // why the store could not be made

  mutable std::mutex m_;
  std::condition_variable failure_cv_;
  std::optional<std::string> why_;
  std::optional<std::string> failure_;
  std::map<int, int> generation_;
  std::vector<Comm::Impl*> comms_;
};

// The shared store seen under one group's key prefix. Its waits take `timeout`
// (whatever Gloo passes) and give up on an abort of the rendezvous, but only while
// a key is missing: HashStore and FileStore waits cannot be interrupted, so they
// are taken in 100 ms slices, and an abort is looked at after a slice found the
// keys absent. A member that has published its key may already be waiting for us
// in Gloo's pair connect, which nothing interrupts; leaving connectFullMesh half
// way while its keys are there would strand it (it waited 5 x 30 s in the
// executor's abort test before this rule). A member whose key is missing has not
// started connecting this group, so nobody waits on a connection to it.
class GroupStore final : public gloo::rendezvous::Store {
 public:
  GroupStore(RendezvousImpl& rv, std::string prefix, milliseconds timeout)
      : rv_(rv), inner_(*rv.store()), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;

  std::vector<char> get(const std::string& key) override;

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  // Waits for each key in turn until `deadline`: the index of the first one still
  // missing then, or nullopt when all are there. Throws as wait() does on an abort.
  std::optional<size_t> first_missing(const std::vector<std::string>& keys, Clock::time_point deadline);

  void wait(const std::vector<std::string>& keys, const milliseconds& /*gloo's, shortened: see create*/) override;

 private:
  RendezvousImpl& rv_;
  gloo::rendezvous::Store& inner_;
  std::string prefix_;
  milliseconds timeout_;
};

// ---------------------------------------------------------------------------------
// The wire (runtime/comm/comm_wire.cpp)
// ---------------------------------------------------------------------------------

// A C-order buffer of `shape` with elements of `esize` bytes seen as
// [outer, extent(dim), inner].
struct DimView {
  int64_t outer = 1;
  int64_t extent = 0;
  int64_t inner_bytes = 0;
};

DimView view_at(const Shape& s, int dim, int64_t esize);

// `src` cut along `dim` into chunks of the given extents, each chunk in C order,
// one after the other (what a member sends: chunk k to member k).
std::vector<std::byte> pack_split(const std::byte* src, const Shape& s, int64_t esize, int dim,
                                  const std::vector<int64_t>& extents);

// The inverse: chunks one after the other in `src` (chunk k has extent extents[k]
// along dim, the other dims of `s`), concatenated along dim into `dst` of shape s.
void unpack_concat(const std::byte* src, const std::vector<int64_t>& extents, std::byte* dst, const Shape& s,
                   int64_t esize, int dim);

// Reductions on the wire types: floats travel as double, integers and bool as
// int64. acc = acc (op) x, elementwise; loads and stores through memcpy.
using Reducer = std::function<void(std::byte* acc, const std::byte* x, size_t n)>;

Reducer reducer(ReduceOp op, bool floats);

// `n` elements of dtype `t` at `src` in the wire type (8 bytes an element):
// double for floats, int64 for integers and bool.
void to_wire(const std::byte* src, DType t, int64_t n, std::byte* dst);

// Back from the wire type, rounding once; avg divides by `members` first:
// floats in double, integers and bool in int64 truncating toward zero (as
// runtime/core/host_collectives.h's oracle does; for bool: true only if every
// member is).
Tensor from_wire(const std::byte* w, DType t, const Shape& s, ReduceOp op, int64_t members);

// ---------------------------------------------------------------------------------
// Ops (runtime/comm/comm.cpp, runtime/comm/comm_collectives.cpp)
// ---------------------------------------------------------------------------------

struct Op {
  CollectiveKind kind = CollectiveKind::AllReduce;
  int group = 0;
  Tensor local;
  int dim = 0;                  // all_gather, reduce_scatter; all_to_all: split_dim
  int dim2 = 0;                 // all_to_all: concat_dim
  std::vector<int64_t> sizes;   // all_to_all: send_sizes
  std::vector<int64_t> sizes2;  // all_to_all: recv_sizes
  ReduceOp reduce = ReduceOp::Sum;
  std::shared_ptr<detail::OpState> st;
  // Set when this rank's own arguments were wrong: the Work already holds the Diag,
  // and the comm thread, in issue order, breaks the group so that the peers fail
  // at once, quoting it, instead of waiting out their timeout.
  std::optional<std::string> invalid;
};

struct Group {
  int index = 0;
  std::vector<int> ranks;
  int me = 0;                                     // this rank's position
  std::shared_ptr<gloo::rendezvous::Context> ctx;  // null for a group of one
  uint64_t seq = 0;                               // collectives run on it so far
  std::optional<std::string> broken;              // set once one failed
};

struct Header;  // what a collective sends every peer first (comm.cpp)

// One point-to-point transfer of a phase: `bytes` at `offset` of the phase's
// send or receive buffer, to or from group position `peer`.
struct Transfer {
  int peer = 0;
  size_t offset = 0;
  size_t bytes = 0;
};

}  // namespace comm_detail

// ---------------------------------------------------------------------------------
// Comm::Impl: its comm thread, transfers and header exchange are in
// runtime/comm/comm.cpp, the collectives in runtime/comm/comm_collectives.cpp.
// ---------------------------------------------------------------------------------

struct Comm::Impl {
  using Group = comm_detail::Group;
  using Header = comm_detail::Header;
  using Op = comm_detail::Op;
  using Transfer = comm_detail::Transfer;

  std::shared_ptr<comm_detail::RendezvousImpl> rv;
  int rank = 0;
  int world = 1;
  CommOptions opts;
  std::shared_ptr<gloo::transport::Device> device;
  std::vector<Group> groups;  // fixed once the Comm is registered with rv

  std::mutex m;  // guards everything below
  std::condition_variable cv;
  std::deque<Op> queue;
  std::shared_ptr<detail::OpState> running;
  std::vector<gloo::transport::UnboundBuffer*> inflight;  // buffers the comm thread may wait on
  std::optional<std::string> aborted;
  bool stopping = false;
  std::thread thread;

  std::string label(CollectiveKind k, int g) const;

  // Called by the rendezvous (its lock held, ours not).
  void on_abort(const std::string& why);

  static void close_connections(Group& g);

  Work issue(Op op);
  void loop();
  std::optional<std::string> abort_reason();
  Result<Tensor> run(Op& op);

  // ---- validation: everything that can be checked without the peers -----------

  static std::optional<std::string> check_dim(int& dim, const Tensor& t, const char* what);
  static std::optional<std::string> check_sizes(const std::vector<int64_t>& s, const Group& g, const char* what);
  std::optional<std::string> validate(Op& op) const;

  // ---- transfers (comm thread; comm.cpp) ------------------------------------------

  // Keeps the phase's buffers where on_abort can reach them while they live.
  struct Tracked;

  static uint64_t slot_of(uint64_t seq, int phase);

  // Posts every receive and send of one phase, then waits for all of them. A
  // wait ends when its transfer is done, after opts.timeout (Gloo throws and
  // resets the group's connections), or when on_abort interrupts it.
  void exchange(Group& g, uint64_t seq, int phase, std::byte* send, size_t send_size, const std::vector<Transfer>& sends,
                std::byte* recv, size_t recv_size, const std::vector<Transfer>& recvs);

  // Phase 0: every member tells every peer what it is about to do and how many
  // bytes it will send it in phase 1; a disagreement ends the collective here.
  // `fingerprint` hashes the arguments the members must share; bytes_to[p] is
  // what this member sends p, and bytes_from[p] what it expects from p.
  void agree(Group& g, uint64_t seq, const Op& op, uint64_t fingerprint, const std::vector<size_t>& bytes_to,
             const std::vector<size_t>& bytes_from);

  // The local tensor and dims of `op`, as the header carries them.
  static void fill_local(Header& h, const Op& op);
  // "all_gather on f32[4, 3] along dim 0" from a header (ours or a peer's).
  static std::string describe_local(const Header& h);
  static std::string describe(const Op& op);

  // Member k's chunk (chunk_bytes[k] bytes, one after the other in `buf`) ends up
  // on every member; this member's is in place already. (comm_collectives.cpp)
  void gather_chunks(Group& g, uint64_t seq, int phase, std::byte* buf, size_t size, const std::vector<size_t>& chunk_bytes);

  // `packed` holds chunk k for member k one after the other (counts[k] elements
  // of dtype t, as the tensor stores them). Every member sends each peer its chunk
  // and gets every member's contribution to its own, which it widens to the wire
  // type and reduces in member order; returns that, in the wire type. Only the
  // tensor's own bytes travel: the contributions are the members' raw values.
  // (comm_collectives.cpp)
  std::vector<std::byte> reduce_chunks(Group& g, uint64_t seq, int phase, std::byte* packed, size_t packed_size,
                                       const std::vector<size_t>& counts, DType t, ReduceOp op);

  // The last step of connecting a group: every member sends every peer the hash of
  // the group's ranks and waits for theirs. connectFullMesh returns once this
  // side of each pair is connected, while a peer's event loop may still be
  // accepting; resetting the connection then (an abort right after create) makes
  // Gloo's loop thread fail an assertion (getpeername: ENOTCONN) and terminate
  // the process. A message from every peer proves both ends are established.
  void hello(Group& g);
  static constexpr int kHelloPhase = 15;  // collectives use phases 0 to 2

  // ---- the collectives (comm thread; comm_collectives.cpp) -------------------------

  Result<Tensor> identity(Op& op);
  Tensor execute(Op& op, Group& g, uint64_t seq);
  Tensor all_gather(Op& op, Group& g, uint64_t seq);
  Tensor reduce_scatter(Op& op, Group& g, uint64_t seq);
  // A reduce-scatter over an even split of the flat elements, then an all-gather
  // of the reduced chunks, rounded to the dtype: each element is reduced once, by
  // one member, in member order, so every member ends with the same bits.
  Tensor all_reduce(Op& op, Group& g, uint64_t seq);
  Tensor all_to_all(Op& op, Group& g, uint64_t seq);
};

}  // namespace sf
