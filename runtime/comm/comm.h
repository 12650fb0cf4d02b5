// CPU collectives for the per-rank programs: all-gather, reduce-scatter, all-reduce
// and all-to-all over the groups of a device mesh, on Gloo's rendezvous and TCP
// transport (DESIGN.md: "Gloo on machines without a GPU"). Ranks are threads of one
// process (an in-process rendezvous) or separate processes (a rendezvous
// directory). docs/comm.md says what the backend does and why; Gloo stays out of
// this header.
//
// The model is NCCL's: every rank owns one Comm; a collective is issued
// asynchronously onto the rank's comm thread, which runs them in issue order (like
// one NCCL stream), and returns a Work whose wait() gives the result. All ranks of
// a group must issue the same collectives on it in the same order with agreeing
// arguments (sizes, dims, dtype), as NCCL requires; unlike NCCL, members that
// disagree get a Diag naming the difference rather than a hang (each collective
// opens with a small header exchange).
//
// Errors are values: every failure is a Diag (empty `file`) whose message names
// the rank, the op, the group (mesh dim index and its ranks) and, for timeouts,
// the timeout:
//   rank 2: all_gather over group 0 (ranks 0 1 2 3) timed out after 2 s
// Nothing here throws or crashes, and no wait on a lost peer outlasts the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/diag.h"
#include "runtime/core/mesh.h"
#include "runtime/core/tensor.h"

namespace sf {

struct CommOptions {
  // How long connecting a group or one step of a collective may wait for a peer
  // (Gloo's context timeout, and the rendezvous wait). torch.distributed's default
  // for Gloo is 30 min; a minute suits test-sized runs and still lets a lost rank
  // surface as an error rather than a hang.
  std::chrono::milliseconds timeout{60000};
  // When set, connecting (every group of Comm::create) must be done by then instead
  // of within `timeout` from the call: the CLI sets its start plus --timeout, so that
  // set-up (parsing, lowering, compiling) and connecting share one budget.
  std::optional<std::chrono::steady_clock::time_point> connect_deadline;
  // The address this rank's sockets listen on. Loopback is what the in-process and
  // one-machine file rendezvous need; set it to a routable address of this host
  // for processes on several machines (they meet through a shared directory).
  std::string hostname = "127.0.0.1";
};

// Where ranks meet to exchange their addresses, and the abort flag they share.
//   in_process(): one object shared by every rank thread of a process (a Gloo
//     HashStore). abort() on any Comm of it reaches every Comm of it at once.
//     Use one per run: it keeps the abort and the first failure it saw.
//   file(dir):    one object per process (or per thread), all pointing at the same
//     directory on a file system they share (a Gloo FileStore). Use a fresh, empty
//     directory per run: keys left by an earlier run would be read as this run's.
//     abort() writes DIR/sf-abort; other processes learn of it when their sockets
//     to the aborting rank close (docs/comm.md).
class Rendezvous {
 public:
  static std::shared_ptr<Rendezvous> in_process();
  static std::shared_ptr<Rendezvous> file(const std::string& dir);

  virtual ~Rendezvous() = default;
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // "in-process" or "directory DIR", for messages.
  virtual std::string str() const = 0;
  // The reason given to the first abort() of a rank that met here, if any.
  virtual std::optional<std::string> aborted() const = 0;

 protected:
  Rendezvous() = default;
};

namespace detail {
struct OpState;
}

// A collective in flight (torch.distributed's Work, NCCL's event on the comm stream).
class Work {
 public:
  Work() = default;  // no collective: wait() returns a Diag

  // Blocks until the collective finished, failed, timed out or its Comm was
  // aborted, and returns the result (moved out: a second wait() is a Diag).
  Result<Tensor> wait();
  // Whether wait() would return at once.
  bool ready() const;

 private:
  explicit Work(std::shared_ptr<detail::OpState> st) : st_(std::move(st)) {}
  std::shared_ptr<detail::OpState> st_;
  friend class Comm;
};

class Comm {
 public:
  // groups[i]: the global ranks of this rank's group along mesh dim i, ordered
  // (position k = coordinate k, as DeviceMesh::group(rank, i) gives them). Connects
  // one Gloo context per group of two or more ranks, through a store prefix unique
  // to (this rank's n-th Comm on `rv`, mesh dim, group), and blocks until every one
  // is connected. A Diag if an argument is wrong, the rendezvous was aborted, or
  // connecting fails or times out (opts.timeout per wait on a peer).
  static Result<std::unique_ptr<Comm>> create(std::shared_ptr<Rendezvous> rv, int rank, int world,
                                              const std::vector<std::vector<int>>& groups,
                                              CommOptions opts = {});
  // Fails every collective not yet started, lets the running one finish (it
  // returns within the timeout, at once after an abort) and joins the comm thread.
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const;
  int world() const;
  // The reason of the first abort() on this Comm's rendezvous (this rank's or a
  // peer's that reached it), if any.
  std::optional<std::string> aborted() const;
  int num_groups() const;
  const std::vector<int>& group(int i) const;

  // Every op below is queued to this rank's comm thread and returns at once;
  // `local` is moved in (pass a copy to keep it). Results have local's dtype. An
  // argument that does not fit (group index, dim, sizes) gives a Work whose wait()
  // returns the Diag at once; the group is then unusable, and its peers' pending
  // collectives fail at once quoting the Diag. A group of one rank is the identity
  // and never touches Gloo.

  // Concatenates every member's tensor along tensor dim `dim` in group order;
  // member k's extent along dim is sizes[k] (uneven and zero extents are legal:
  // torch.chunk shards), every other dim equal.
  Work all_gather(int group, Tensor local, int dim, std::vector<int64_t> sizes);
  // Reduces every member's `local` (same shape) elementwise with `op`, then keeps
  // this member's chunk along `dim`: member k's chunk has extent sizes[k] (they sum
  // to local.shape()[dim]). Bit for bit the chunk all_reduce would give (both
  // reduce in member order), with the same dtype rules.
  Work reduce_scatter(int group, Tensor local, int dim, std::vector<int64_t> sizes, ReduceOp op);
  // Every member gets the elementwise reduction of every member's `local`, the
  // same bits on every member. Floats (f32, f16, bf16) reduce in double, in member
  // order, and round once to the dtype; i32 and i64 in int64, exactly (a sum wraps
  // like two's complement; an i32 result wraps like a C cast); bool as 0/1 in
  // int64 (sum saturates to true, max = any, min = all). avg is the sum divided by
  // the group size: for floats in double, rounded once; for integers and bool in
  // int64, truncated toward zero (so a bool avg is true only if every member is).
  // max and min propagate NaN, as torch.maximum does. These are the definitions
  // of runtime/core/host_collectives.h, the host oracle.
  Work all_reduce(int group, Tensor local, ReduceOp op);
  // Splits `local` along split_dim into chunks of extents send_sizes[k] (chunk k
  // goes to member k) and concatenates the chunks received along concat_dim in
  // member order. The chunk from member k has extent recv_sizes[k] along
  // concat_dim; its other dims are local's, with split_dim at this member's
  // send_sizes entry. So the result is local's shape with split_dim =
  // send_sizes[me], then concat_dim = sum(recv_sizes): DTensor's S(concat_dim) ->
  // S(split_dim) when every member passes torch.chunk's extents. With split_dim ==
  // concat_dim it is all_to_all_single with split sizes (recv_sizes may then
  // differ between members; what k sends m must be what m expects from k).
  Work all_to_all(int group, Tensor local, int split_dim, std::vector<int64_t> send_sizes,
                  int concat_dim, std::vector<int64_t> recv_sizes);

  // Makes every pending and later wait() of every rank sharing this Rendezvous
  // (in-process) return a Diag quoting `why` at once, and breaks their comm
  // threads out of Gloo. The first abort's reason wins. Used when one rank fails.
  void abort(const std::string& why);

  struct Impl;

 private:
  explicit Comm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Most ranks one process runs as threads (`run`, `exec`, `run --device cuda`
// without --rank). Every pair of ranks in a group holds a TCP connection, and as
// threads both of its ends are in this process: a 1-D mesh of n ranks needs
// n(n-1) descriptors (4032 at 64), and connecting and closing them grows as n^2
// (64 ranks: about 2 s on 2 cores). Larger worlds run as one process per rank
// (--rank/--rendezvous), where each process holds n-1 ends per group.
inline constexpr int kMaxThreadRanks = 64;

// Makes sure this process may open the descriptors `ranks_here` ranks of `mesh`
// need (every group's connections, both ends when several of its ranks are here,
// and a few per rank besides): raises the soft RLIMIT_NOFILE toward the hard
// limit as needed. Why not (more than kMaxThreadRanks ranks here, or more
// descriptors than the hard limit allows), or nullopt. Without this, Gloo
// failing to open a socket left the ranks waiting on each other past any timeout.
std::optional<std::string> reserve_rank_descriptors(const Mesh& mesh, int ranks_here);

// Destroys every Comm, all at once. Gloo's teardown waits one tick of the
// device's event loop (up to 10 ms) per connection, so destroying the n Comms of
// an in-process run one after another took n^2 ticks (24 s for 48 ranks); in
// parallel it takes n.
void destroy_comms(std::vector<std::unique_ptr<Comm>>& comms);

}  // namespace sf
