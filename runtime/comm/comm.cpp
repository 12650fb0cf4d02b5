// The CPU collective backend. Gloo provides the rendezvous (HashStore, FileStore),
// the full-mesh TCP connections of a group (rendezvous::Context::connectFullMesh)
// and tagged, asynchronous point-to-point transfers between members
// (transport::UnboundBuffer send/recv). The collectives themselves are small
// direct exchanges written here, not gloo::allreduce / allgatherv / alltoallv,
// for three reasons (docs/comm.md has the long form):
//   1. abort: Gloo 0.5's algorithm functions ignore the `false` an aborted wait
//      returns and block in their next wait for the full timeout, and the tcp
//      context's signalException is unreachable (protected, and Debian's
//      libgloo-dev ships gloo/transport/tcp/context.h without the
//      gloo/common/memory.h it includes). Owning the waits lets abort() end them
//      at once through the public abortWaitRecv/abortWaitSend;
//   2. determinism: every element is reduced in member order 0, 1, ..., n-1 by
//      one member and then copied, so every member gets the same bits, and
//      reduce_scatter agrees bit for bit with all_reduce;
//   3. agreement: each collective opens with a 104-byte header to every peer
//      (op, dtype, sequence number, a fingerprint of the sizes, the byte count,
//      the local shape and dims),
//      so members that disagree get a Diag naming the difference instead of a
//      hang, or a Gloo assertion in its event-loop thread that terminates the
//      process (what mismatched gloo::allgatherv counts do).
// Zero-byte transfers are never posted (both ends know the count is zero).
//
// This file holds Comm::Impl's comm thread, its transfers and header exchange,
// Work, and Comm's public methods (create connects the groups). The rest of the
// backend: runtime/comm/comm_rendezvous.cpp, the rendezvous and the store a group
// connects through; runtime/comm/comm_wire.cpp, chunks along a dim and the reductions
// in the wire types; runtime/comm/comm_collectives.cpp, the collectives' data phases;
// runtime/comm/comm_internal.h, what these files share.
#include "runtime/comm/comm.h"

#include "runtime/core/collective.h"
#include "runtime/comm/comm_internal.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

namespace sf {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using comm_detail::clean_gloo_message;
using comm_detail::Fnv;
using comm_detail::Group;
using comm_detail::GroupStore;
using comm_detail::Op;
using comm_detail::RendezvousImpl;

namespace {

Diag diag(std::string msg) { return Diag{"", {}, std::move(msg)}; }
// An error that only reports another rank's abort (see Diag::from_peer).
Diag peer_diag(std::string msg) {
  Diag d = diag(std::move(msg));
  d.from_peer = true;
  return d;
}

std::string duration_str(milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

// "0 1 2 3"; a group of more than 16 ranks as its first 8 and last 4 and its size
// ("0 1 2 3 4 5 6 7 ... 996 997 998 999 (1000 ranks)"): a message naming a 1000-rank group
// must still fit on a screen.
std::string ranks_str(const std::vector<int>& ranks) {
  constexpr size_t kWhole = 16, kHead = 8, kTail = 4;
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks.size() > kWhole && i == kHead) {
      s += " ...";
      i = ranks.size() - kTail;
    }
    s += (s.empty() ? "" : " ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kWhole) s += " (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

std::string group_str(int index, const std::vector<int>& ranks) {
  return "group " + std::to_string(index) + " (ranks " + ranks_str(ranks) + ")";
}

// Gloo says "Timed out waiting 1000ms for recv operation to complete".
bool gloo_timed_out(const std::string& m) {
  std::string l = m;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return l.find("timed out") != std::string::npos;
}

// Gloo writes to its sockets with plain write(2)/writev(2), so a write to a
// connection the peer has reset raises SIGPIPE, whose default action kills the
// whole process (exit status 141, seen when one rank aborted). The threads that
// write block it instead, and the write fails with EPIPE, which Gloo reports as an
// IoException: the comm thread, Gloo's event-loop thread (it inherits the mask of
// the thread that creates the device) and the thread connecting in Comm::create.
// The process's signal disposition is left alone.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigset_t s = pipe_set();
    pthread_sigmask(SIG_BLOCK, &s, &old_);
  }
  // Restores the mask; a SIGPIPE raised meanwhile is pending on this thread and is
  // taken first, or unblocking would deliver it at once.
  ~SigpipeBlocked() {
    if (sigismember(&old_, SIGPIPE)) return;
    sigset_t s = pipe_set();
    const timespec zero{0, 0};
    for (;;) {
      sigset_t pending;
      if (sigpending(&pending) != 0 || !sigismember(&pending, SIGPIPE)) break;
      if (sigtimedwait(&s, nullptr, &zero) < 0) break;
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

  static sigset_t pipe_set() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    return s;
  }

 private:
  sigset_t old_;
};

}  // namespace

// ---------------------------------------------------------------------------------
// Work
// ---------------------------------------------------------------------------------

namespace detail {

struct OpState {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Result<Tensor>> result;
  bool taken = false;
  std::string label;  // "rank 2: all_gather over group 0 (ranks 0 1 2 3)"

  // The first completion wins: an abort completes the op the comm thread is
  // running, whose late result is then dropped.
  void complete(Result<Tensor> r) {
    {
      std::lock_guard<std::mutex> lock(m);
      if (result || taken) return;
      result.emplace(std::move(r));
    }
    cv.notify_all();
  }
};

}  // namespace detail

Result<Tensor> Work::wait() {
  if (!st_) return diag("wait() on a Work that holds no collective");
  std::unique_lock<std::mutex> lock(st_->m);
  st_->cv.wait(lock, [&] { return st_->result.has_value() || st_->taken; });
  if (st_->taken) return diag(st_->label + ": wait() called twice; the first call took the result");
  Result<Tensor> r = std::move(*st_->result);
  st_->result.reset();
  st_->taken = true;
  return r;
}

bool Work::ready() const {
  if (!st_) return true;
  std::lock_guard<std::mutex> lock(st_->m);
  return st_->result.has_value() || st_->taken;
}

// ---------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------

namespace {

// Thrown inside the comm thread when an abort interrupted a wait.
struct Interrupted {};

// A member disagreeing with this one, found from the headers.
struct Disagreement {
  std::string what;
};

}  // namespace

namespace comm_detail {

// Sent to every peer before a collective's data; 104 bytes. Besides the hash of
// what the members must agree on, it carries the sender's local shape and dims, so
// that a disagreement names both sides' shapes: equal byte counts alone ("it would
// send 72 bytes, this rank expects 72") do not tell f32[3, 6] from f32[6, 3].
constexpr int kHeaderDims = 8;  // dims described in full; the fingerprint covers any more
struct Header {
  uint32_t magic = 0x32434653;  // "SFC2"
  uint8_t kind = 0, dtype = 0, reduce = 0, ndim = 0;
  uint64_t seq = 0;
  uint64_t fingerprint = 0;  // of the arguments every member must agree on
  uint64_t bytes = 0;        // what the sender sends the receiver in phase 1
  int32_t dim = -1, dim2 = -1;  // all_gather/reduce_scatter: dim; all_to_all: split, concat
  int64_t shape[kHeaderDims] = {};  // the sender's local tensor's first kHeaderDims extents
};
static_assert(sizeof(Header) == 104);

}  // namespace comm_detail

using comm_detail::kHeaderDims;

// ---------------------------------------------------------------------------------
// Comm::Impl: the comm thread (declared in runtime/comm/comm_internal.h)
// ---------------------------------------------------------------------------------

std::string Comm::Impl::label(CollectiveKind k, int g) const {
  std::string s = "rank " + std::to_string(rank) + ": " + std::string(collective_name(k)) + " over ";
  if (g >= 0 && g < static_cast<int>(groups.size())) return s + group_str(g, groups[static_cast<size_t>(g)].ranks);
  return s + "group " + std::to_string(g);
}

void Comm::Impl::on_abort(const std::string& why) {
  std::vector<std::shared_ptr<detail::OpState>> pending;
  {
    std::lock_guard<std::mutex> lock(m);
    if (aborted) return;
    aborted = why;
    if (running) pending.push_back(running);
    for (Op& op : queue) pending.push_back(op.st);
    queue.clear();
    // Wake the comm thread out of Gloo: the flags stay set until a wait
    // consumes them, so an abort between two waits is not lost either.
    for (gloo::transport::UnboundBuffer* b : inflight) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }
  cv.notify_all();
  for (auto& st : pending) st->complete(peer_diag(st->label + " aborted: " + why));
  // Reset every connection so that peers in other processes fail at once too
  // (in-process peers are aborted by the rendezvous anyway).
  for (Group& g : groups) close_connections(g);
}

void Comm::Impl::close_connections(Group& g) {
  if (!g.ctx) return;
  try {
    g.ctx->closeConnections();
  } catch (...) {
    // already closed or failed: nothing left to reset
  }
}

Work Comm::Impl::issue(Op op) {
  op.st = std::make_shared<detail::OpState>();
  op.st->label = label(op.kind, op.group);
  Work w(op.st);
  if (std::optional<std::string> err = validate(op)) {
    op.st->complete(diag(op.st->label + ": " + *err));
    if (op.group < 0 || op.group >= static_cast<int>(groups.size())) return w;  // no group to tell
    op.invalid = op.st->label + ": " + *err;
  }
  std::unique_lock<std::mutex> lock(m);
  if (aborted) {
    std::string why = *aborted;
    lock.unlock();
    op.st->complete(peer_diag(op.st->label + " aborted: " + why));
    return w;
  }
  queue.push_back(std::move(op));
  lock.unlock();
  cv.notify_all();
  return w;
}

void Comm::Impl::loop() {
  // For good on this thread, which writes to Gloo's sockets (see SigpipeBlocked).
  sigset_t pipe = SigpipeBlocked::pipe_set();
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return !queue.empty() || stopping; });
      if (queue.empty()) return;
      op = std::move(queue.front());
      queue.pop_front();
      running = op.st;
    }
    Result<Tensor> r = run(op);
    {
      std::lock_guard<std::mutex> lock(m);
      running.reset();
    }
    op.st->complete(std::move(r));
  }
}

std::optional<std::string> Comm::Impl::abort_reason() {
  std::lock_guard<std::mutex> lock(m);
  return aborted;
}

Result<Tensor> Comm::Impl::run(Op& op) {
  const std::string& label = op.st->label;
  if (auto why = abort_reason()) return peer_diag(label + " aborted: " + *why);
  Group& g = groups[static_cast<size_t>(op.group)];
  if (g.broken) return diag(label + " failed: the group is unusable after an earlier failure (" + *g.broken + ")");
  if (op.invalid) {
    if (g.ctx) {  // a group of one has nobody to tell
      g.broken = *op.invalid;
      rv->record_failure(*op.invalid);
      close_connections(g);
    }
    return diag(*op.invalid);
  }
  const uint64_t seq = g.seq++;
  if (!g.ctx) return identity(op);
  auto t0 = Clock::now();
  std::string what;
  bool disagreement = false;
  try {
    return execute(op, g, seq);
  } catch (const Interrupted&) {
    what = "interrupted";
  } catch (const Disagreement& d) {
    what = d.what;
    disagreement = true;
  } catch (const gloo::EnforceNotMet& e) {
    what = clean_gloo_message(e.what());
  } catch (const std::exception& e) {  // gloo::IoException, gloo::Exception, bad_alloc
    what = clean_gloo_message(e.what());
  } catch (...) {
    what = "unknown exception";
  }
  auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  // The members still waiting on us must not sit out their timeout.
  close_connections(g);

  // Another process may have aborted: its connections resetting is how we
  // heard of it, and DIR/sf-abort says why.
  if (auto why = rv->aborted()) {
    rv->abort(*why);  // fail this process's queued ops too
    return peer_diag(label + " aborted: " + *why);
  }
  std::string msg;
  if (disagreement) {
    msg = label + " failed: " + what;
    rv->record_failure(msg);
  } else if (gloo_timed_out(what) || elapsed >= opts.timeout) {
    msg = label + " timed out after " + duration_str(opts.timeout);
    rv->record_failure(msg);
  } else {
    // A peer that gave up first (timed out, disagreed) reset its connections and
    // we see only that: name the first failure it reported, which in-process is
    // recorded at once and in a directory shows up within a poll or two.
    msg = label + " failed: " + what;
    if (auto first = rv->first_failure(milliseconds(rv->is_file() ? 500 : 250)))
      msg += " (after " + *first + ")";
    else
      rv->record_failure(msg);
  }
  g.broken = msg;
  return diag(msg);
}

// ---- validation: everything that can be checked without the peers -----------

std::optional<std::string> Comm::Impl::check_dim(int& dim, const Tensor& t, const char* what) {
  int r = static_cast<int>(t.shape().size());
  if (dim < -r || dim >= r) return std::string(what) + " " + std::to_string(dim) + " is out of range for " + t.type().str();
  if (dim < 0) dim += r;
  return std::nullopt;
}

std::optional<std::string> Comm::Impl::check_sizes(const std::vector<int64_t>& s, const Group& g,
                                                   const char* what) {
  if (s.size() != g.ranks.size())
    return std::string(what) + " " + shape_str(s) + " has " + std::to_string(s.size()) + " entries for a group of " +
           std::to_string(g.ranks.size());
  for (int64_t x : s)
    if (x < 0 || x > (int64_t{1} << 40)) return std::string(what) + " " + shape_str(s) + " has an invalid extent";
  return std::nullopt;
}

std::optional<std::string> Comm::Impl::validate(Op& op) const {
  if (op.group < 0 || op.group >= static_cast<int>(groups.size()))
    return "no group " + std::to_string(op.group) + " (this Comm has " + std::to_string(groups.size()) + ")";
  const Group& g = groups[static_cast<size_t>(op.group)];
  const Tensor& t = op.local;
  const size_t me = static_cast<size_t>(g.me);
  auto extent = [&](int d) { return t.shape()[static_cast<size_t>(d)]; };
  switch (op.kind) {
    case CollectiveKind::AllReduce: return std::nullopt;
    case CollectiveKind::AllGather: {
      if (auto e = check_dim(op.dim, t, "dim")) return e;
      if (auto e = check_sizes(op.sizes, g, "sizes")) return e;
      if (op.sizes[me] != extent(op.dim))
        return "sizes " + shape_str(op.sizes) + " give this member (position " + std::to_string(me) + ") extent " +
               std::to_string(op.sizes[me]) + " along dim " + std::to_string(op.dim) + ", but it holds " + t.type().str();
      return std::nullopt;
    }
    case CollectiveKind::ReduceScatter: {
      if (auto e = check_dim(op.dim, t, "dim")) return e;
      if (auto e = check_sizes(op.sizes, g, "sizes")) return e;
      int64_t sum = std::accumulate(op.sizes.begin(), op.sizes.end(), int64_t{0});
      if (sum != extent(op.dim))
        return "sizes " + shape_str(op.sizes) + " sum to " + std::to_string(sum) + ", but dim " + std::to_string(op.dim) +
               " of " + t.type().str() + " has extent " + std::to_string(extent(op.dim));
      return std::nullopt;
    }
    case CollectiveKind::AllToAll: {
      if (auto e = check_dim(op.dim, t, "split_dim")) return e;
      if (auto e = check_dim(op.dim2, t, "concat_dim")) return e;
      if (auto e = check_sizes(op.sizes, g, "send_sizes")) return e;
      if (auto e = check_sizes(op.sizes2, g, "recv_sizes")) return e;
      int64_t sum = std::accumulate(op.sizes.begin(), op.sizes.end(), int64_t{0});
      if (sum != extent(op.dim))
        return "send_sizes " + shape_str(op.sizes) + " sum to " + std::to_string(sum) + ", but split_dim " +
               std::to_string(op.dim) + " of " + t.type().str() + " has extent " + std::to_string(extent(op.dim));
      // The chunk a member keeps is both sent and received.
      int64_t mine = op.dim == op.dim2 ? op.sizes[me] : extent(op.dim2);
      if (op.sizes2[me] != mine)
        return "recv_sizes " + shape_str(op.sizes2) + " give this member (position " + std::to_string(me) +
               ") extent " + std::to_string(op.sizes2[me]) + " along concat_dim " + std::to_string(op.dim2) +
               ", but the chunk it keeps has " + std::to_string(mine);
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// ---- transfers (comm thread) ---------------------------------------------------

struct Comm::Impl::Tracked {
  Impl& impl;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  explicit Tracked(Impl& i) : impl(i) {}
  gloo::transport::UnboundBuffer* add(std::unique_ptr<gloo::transport::UnboundBuffer> b) {
    std::lock_guard<std::mutex> lock(impl.m);
    if (impl.aborted) throw Interrupted{};
    impl.inflight.push_back(b.get());
    bufs.push_back(std::move(b));
    return bufs.back().get();
  }
  ~Tracked() {
    std::lock_guard<std::mutex> lock(impl.m);
    impl.inflight.clear();
  }
};

uint64_t Comm::Impl::slot_of(uint64_t seq, int phase) {
  // Distinct per collective and phase; the top bits keep clear of the slots
  // Gloo's own algorithms would build (prefix byte << 56).
  return (uint64_t{0x53} << 48) | (seq << 4) | static_cast<uint64_t>(phase);
}

void Comm::Impl::exchange(Group& g, uint64_t seq, int phase, std::byte* send, size_t send_size,
                          const std::vector<Transfer>& sends, std::byte* recv, size_t recv_size,
                          const std::vector<Transfer>& recvs) {
  Tracked t(*this);
  const uint64_t slot = slot_of(seq, phase);
  gloo::transport::UnboundBuffer* rb = nullptr;
  gloo::transport::UnboundBuffer* sb = nullptr;
  int nrecv = 0, nsend = 0;
  for (const Transfer& r : recvs) {
    if (r.bytes == 0) continue;
    if (!rb) rb = t.add(g.ctx->createUnboundBuffer(recv, recv_size));
    rb->recv(r.peer, slot, r.offset, r.bytes);
    ++nrecv;
  }
  for (const Transfer& s : sends) {
    if (s.bytes == 0) continue;
    if (!sb) sb = t.add(g.ctx->createUnboundBuffer(send, send_size));
    sb->send(s.peer, slot, s.offset, s.bytes);
    ++nsend;
  }
  for (int i = 0; i < nrecv; ++i)
    if (!rb->waitRecv(nullptr, opts.timeout)) throw Interrupted{};
  for (int i = 0; i < nsend; ++i)
    if (!sb->waitSend(nullptr, opts.timeout)) throw Interrupted{};
}

void Comm::Impl::agree(Group& g, uint64_t seq, const Op& op, uint64_t fingerprint,
                       const std::vector<size_t>& bytes_to, const std::vector<size_t>& bytes_from) {
  const size_t n = g.ranks.size();
  std::vector<Header> out(n), in(n);
  std::vector<Transfer> sends, recvs;
  for (size_t p = 0; p < n; ++p) {
    Header& h = out[p];
    h.kind = static_cast<uint8_t>(op.kind);
    h.dtype = static_cast<uint8_t>(op.local.dtype());
    h.reduce = static_cast<uint8_t>(op.reduce);
    h.seq = seq;
    h.fingerprint = fingerprint;
    h.bytes = bytes_to[p];
    fill_local(h, op);
    if (static_cast<int>(p) == g.me) continue;
    sends.push_back({static_cast<int>(p), p * sizeof(Header), sizeof(Header)});
    recvs.push_back({static_cast<int>(p), p * sizeof(Header), sizeof(Header)});
  }
  exchange(g, seq, 0, reinterpret_cast<std::byte*>(out.data()), n * sizeof(Header), sends,
           reinterpret_cast<std::byte*>(in.data()), n * sizeof(Header), recvs);
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<int>(p) == g.me) continue;
    const Header& h = in[p];
    const std::string peer = "rank " + std::to_string(g.ranks[p]);
    if (h.magic != out[p].magic || h.seq != seq)
      throw Disagreement{"the members disagree: " + peer + " sent a malformed header"};
    if (h.kind != out[p].kind || h.dtype != out[p].dtype || h.reduce != out[p].reduce) {
      std::string theirs = std::string(collective_name(static_cast<CollectiveKind>(h.kind))) + " on " +
                           std::string(dtype_name(static_cast<DType>(h.dtype)));
      if (static_cast<CollectiveKind>(h.kind) == CollectiveKind::AllReduce || static_cast<CollectiveKind>(h.kind) == CollectiveKind::ReduceScatter)
        theirs += " (" + std::string(reduce_op_name(static_cast<ReduceOp>(h.reduce))) + ")";
      throw Disagreement{"the members disagree: " + peer + " issued " + theirs + " as collective #" +
                         std::to_string(seq) + " on this group, while this rank issued " + describe(op)};
    }
    if (h.fingerprint != fingerprint || h.bytes != bytes_from[p]) {
      const std::string mine = describe_local(out[p]), theirs = describe_local(h);
      std::string what = mine != theirs
                             ? ": " + peer + " issued " + theirs + ", this rank " + mine
                             : ": the split sizes differ (" + peer + " would send " + std::to_string(h.bytes) +
                                   " bytes, this rank expects " + std::to_string(bytes_from[p]) + ")";
      throw Disagreement{"the members disagree: " + peer + "'s shape, dims or sizes do not match this rank's " +
                         op.local.type().str() + what};
    }
  }
}

void Comm::Impl::fill_local(Header& h, const Op& op) {
  const Shape& s = op.local.shape();
  h.ndim = static_cast<uint8_t>(std::min<size_t>(s.size(), 255));
  for (size_t i = 0; i < s.size() && i < static_cast<size_t>(kHeaderDims); ++i) h.shape[i] = s[i];
  if (op.kind != CollectiveKind::AllReduce) h.dim = op.dim;
  if (op.kind == CollectiveKind::AllToAll) h.dim2 = op.dim2;
}

std::string Comm::Impl::describe_local(const Header& h) {
  const auto kind = static_cast<CollectiveKind>(h.kind);
  std::string s = std::string(collective_name(kind)) + " on " + std::string(dtype_name(static_cast<DType>(h.dtype))) + "[";
  for (int i = 0; i < h.ndim && i < kHeaderDims; ++i) s += (i ? ", " : "") + std::to_string(h.shape[i]);
  if (h.ndim > kHeaderDims) s += ", ...";
  s += "]";
  if (kind == CollectiveKind::AllToAll)
    s += " split along dim " + std::to_string(h.dim) + ", concatenated along dim " + std::to_string(h.dim2);
  else if (kind != CollectiveKind::AllReduce)
    s += " along dim " + std::to_string(h.dim);
  return s;
}

std::string Comm::Impl::describe(const Op& op) {
  std::string s = std::string(collective_name(op.kind)) + " on " + std::string(dtype_name(op.local.dtype()));
  if (op.kind == CollectiveKind::AllReduce || op.kind == CollectiveKind::ReduceScatter)
    s += " (" + std::string(reduce_op_name(op.reduce)) + ")";
  return s;
}

void Comm::Impl::hello(Group& g) {
  const size_t n = g.ranks.size();
  const uint64_t fp = Fnv().add_all(g.ranks).h;
  std::vector<uint64_t> out(n, fp), in(n, fp);
  std::vector<Transfer> sends, recvs;
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<int>(p) == g.me) continue;
    sends.push_back({static_cast<int>(p), p * 8, 8});
    recvs.push_back({static_cast<int>(p), p * 8, 8});
  }
  exchange(g, 0, kHelloPhase, reinterpret_cast<std::byte*>(out.data()), n * 8, sends,
           reinterpret_cast<std::byte*>(in.data()), n * 8, recvs);
  for (size_t p = 0; p < n; ++p)
    if (in[p] != fp)
      throw Disagreement{"rank " + std::to_string(g.ranks[p]) + " connected with other ranks for this group"};
}

// ---------------------------------------------------------------------------------
// Comm
// ---------------------------------------------------------------------------------

void comm_detail::comm_on_abort(Comm::Impl* impl, const std::string& why) { impl->on_abort(why); }

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Comm::~Comm() {
  if (!impl_) return;
  std::vector<std::shared_ptr<detail::OpState>> cancelled;
  std::optional<std::string> cause;
  bool aborted = false;
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    impl_->stopping = true;
    aborted = impl_->aborted.has_value();
    for (Op& op : impl_->queue) {
      cancelled.push_back(op.st);
      if (op.invalid && !cause) cause = op.invalid;
    }
    impl_->queue.clear();
  }
  impl_->cv.notify_all();
  for (auto& st : cancelled) st->complete(diag(st->label + " cancelled: its Comm was destroyed before it ran"));
  // The peers will see this rank's connections close; leave them the reason (an
  // invalid collective is the root cause; otherwise that work was dropped).
  if (!cancelled.empty() && !aborted)
    impl_->rv->record_failure(cause ? *cause : cancelled.front()->label + " was cancelled: its Comm was destroyed before it ran");
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->rv->remove(impl_.get());
  // Contexts before the device whose event loop serves their sockets.
  for (Group& g : impl_->groups) g.ctx.reset();
  impl_->device.reset();
}

int Comm::rank() const { return impl_->rank; }
std::optional<std::string> Comm::aborted() const { return impl_->rv->aborted(); }
int Comm::world() const { return impl_->world; }
int Comm::num_groups() const { return static_cast<int>(impl_->groups.size()); }
const std::vector<int>& Comm::group(int i) const { return impl_->groups.at(static_cast<size_t>(i)).ranks; }

Work Comm::all_gather(int group, Tensor local, int dim, std::vector<int64_t> sizes) {
  Op op;
  op.kind = CollectiveKind::AllGather;
  op.group = group;
  op.local = std::move(local);
  op.dim = dim;
  op.sizes = std::move(sizes);
  return impl_->issue(std::move(op));
}

Work Comm::reduce_scatter(int group, Tensor local, int dim, std::vector<int64_t> sizes, ReduceOp rop) {
  Op op;
  op.kind = CollectiveKind::ReduceScatter;
  op.group = group;
  op.local = std::move(local);
  op.dim = dim;
  op.sizes = std::move(sizes);
  op.reduce = rop;
  return impl_->issue(std::move(op));
}

Work Comm::all_reduce(int group, Tensor local, ReduceOp rop) {
  Op op;
  op.kind = CollectiveKind::AllReduce;
  op.group = group;
  op.local = std::move(local);
  op.reduce = rop;
  return impl_->issue(std::move(op));
}

Work Comm::all_to_all(int group, Tensor local, int split_dim, std::vector<int64_t> send_sizes, int concat_dim,
                      std::vector<int64_t> recv_sizes) {
  Op op;
  op.kind = CollectiveKind::AllToAll;
  op.group = group;
  op.local = std::move(local);
  op.dim = split_dim;
  op.dim2 = concat_dim;
  op.sizes = std::move(send_sizes);
  op.sizes2 = std::move(recv_sizes);
  return impl_->issue(std::move(op));
}

void Comm::abort(const std::string& why) { impl_->rv->abort(why); }

Result<std::unique_ptr<Comm>> Comm::create(std::shared_ptr<Rendezvous> rendezvous, int rank, int world,
                                           const std::vector<std::vector<int>>& groups, CommOptions opts) {
  const std::string who = "rank " + std::to_string(rank) + ": ";
  auto rv = std::dynamic_pointer_cast<RendezvousImpl>(rendezvous);
  if (!rv) return diag(who + "Comm::create needs a Rendezvous from Rendezvous::in_process() or Rendezvous::file()");
  if (!rv->error().empty()) return diag(who + rv->error());
  if (world < 1 || rank < 0 || rank >= world)
    return diag(who + "rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world));
  if (opts.timeout.count() <= 0) return diag(who + "the timeout must be positive");
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::vector<int>& g = groups[i];
    const std::string gs = group_str(static_cast<int>(i), g);
    if (std::count(g.begin(), g.end(), rank) != 1)
      return diag(who + gs + " does not hold rank " + std::to_string(rank) + " once");
    for (int r : g)
      if (r < 0 || r >= world) return diag(who + gs + " names a rank outside the world of " + std::to_string(world));
    std::vector<int> sorted = g;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return diag(who + gs + " repeats a rank");
  }
  if (auto why = rv->aborted()) return peer_diag(who + "connecting aborted: " + *why);

  auto impl = std::make_unique<Impl>();
  impl->rv = rv;
  impl->rank = rank;
  impl->world = world;
  impl->opts = opts;
  const int generation = rv->next_generation(rank);
  // opts.timeout bounds connecting as a whole, every group and every wait in it
  // together: a wait per peer, each within the timeout, added up to far more (a
  // world of 1000 with --timeout 2 was still connecting after 60 s).
  const auto deadline = opts.connect_deadline ? *opts.connect_deadline : Clock::now() + opts.timeout;
  for (size_t i = 0; i < groups.size(); ++i) {
    Group g;
    g.index = static_cast<int>(i);
    g.ranks = groups[i];
    g.me = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank) - g.ranks.begin());
    if (g.ranks.size() > 1) {
      const std::string gs = group_str(g.index, g.ranks);
      auto t0 = Clock::now();
      SigpipeBlocked no_sigpipe;  // also inherited by the device's event-loop thread
      try {
        if (!impl->device) {
          gloo::transport::tcp::attr attr;
          attr.hostname = opts.hostname;
          impl->device = gloo::transport::tcp::CreateDevice(attr);
        }
        // "sf.<generation>.d<mesh dim>.<first rank>.<hash of the ranks>.<Gloo's key>":
        // unique per (Comm, mesh dim, group), and without '/' (FileStore keys are
        // file names).
        std::ostringstream prefix;
        prefix << "sf." << generation << ".d" << i << "." << g.ranks[0] << "." << std::hex << Fnv().add_all(g.ranks).h
               << ".";
        const milliseconds left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        if (left <= milliseconds(0))
          return diag(who + "connecting " + gs + " timed out: the " + duration_str(opts.timeout) +
                      " timeout was spent before it began" +
                      (opts.connect_deadline ? " (it bounds set-up and connecting together: give a longer --timeout)"
                                             : " (by the groups connected before it)"));
        GroupStore store(*rv, prefix.str(), left);
        // Every member announces itself and waits for the others before any pair is
        // made: Gloo makes a listening pair per member at once, and a context given
        // up on destroys them one event-loop tick (10 ms) each, so a 1000-rank group
        // that timed out in connectFullMesh took 10 s more to fail than its timeout.
        // Here a member that never comes is found with no pairs made, and named.
        store.set("joined." + std::to_string(g.me), {'1'});
        std::vector<std::string> others;
        std::vector<int> other_ranks;
        for (size_t m = 0; m < g.ranks.size(); ++m)
          if (static_cast<int>(m) != g.me) {
            others.push_back("joined." + std::to_string(m));
            other_ranks.push_back(g.ranks[m]);
          }
        if (std::optional<size_t> k = store.first_missing(others, deadline))
          return diag(who + "connecting " + gs + " timed out after " + duration_str(opts.timeout) + ": rank " +
                      std::to_string(other_ranks[*k]) +
                      " never joined (the first member found missing; " +
                      (rv->is_file() ? "every process of the run must be started, with the same --rendezvous)"
                                     : "its thread did not call Comm::create)"));
        auto ctx = std::make_shared<gloo::rendezvous::Context>(g.me, static_cast<int>(g.ranks.size()));
        // Gloo's pairs wait 5 x the context timeout for a connection ("a longer
        // timeout when waiting for initial connect") and keep that timeout; a fifth
        // makes connecting honour what is left of opts.timeout. The collectives pass
        // their own timeout to every wait, so the context gets the full one back after.
        ctx->setTimeout(std::max(milliseconds(1), left / 5));
        ctx->connectFullMesh(store, impl->device);
        ctx->setTimeout(opts.timeout);
        g.ctx = std::move(ctx);
        impl->hello(g);
      } catch (const Disagreement& d) {
        return diag(who + "connecting " + gs + " failed: " + d.what);
      } catch (const std::exception& e) {
        std::string what = clean_gloo_message(e.what());
        auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
        if (auto why = rv->aborted()) return peer_diag(who + "connecting " + gs + " aborted: " + *why);
        if (gloo_timed_out(what) || elapsed >= opts.timeout)
          return diag(who + "connecting " + gs + " timed out after " + duration_str(opts.timeout) +
                      " (not every member called Comm::create with this group)");
        return diag(who + "connecting " + gs + " failed: " + what);
      }
    }
    impl->groups.push_back(std::move(g));
  }
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] { raw->loop(); });
  rv->add(raw);  // applies an abort that came while connecting
  return std::unique_ptr<Comm>(new Comm(std::move(impl)));
}

std::optional<std::string> reserve_rank_descriptors(const Mesh& mesh, int ranks_here) {
  if (ranks_here > kMaxThreadRanks)
    return std::to_string(ranks_here) + " ranks as threads of one process is above the limit of " +
           std::to_string(kMaxThreadRanks) + " (run one process per rank with --rank and --rendezvous)";
  // Per rank: its end of a connection to every other member of its group along
  // each mesh dim (as threads the peer's end is here too, counted as the peer's),
  // plus its device's epoll and listening sockets and a few Gloo holds while
  // connecting; 64 more for stdio, files and the JIT.
  int64_t per_rank = 4;
  for (const MeshDim& d : mesh.dims) per_rank += d.size - 1;
  const int64_t need = int64_t{ranks_here} * per_rank + 64;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return std::nullopt;  // cannot tell: let Gloo try
  if (lim.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(lim.rlim_cur) < need) {
    if (lim.rlim_max != RLIM_INFINITY && static_cast<int64_t>(lim.rlim_max) < need)
      return std::to_string(ranks_here) + " rank(s) of mesh '" + mesh.str() + "' need about " + std::to_string(need) +
             " file descriptors (a TCP connection per pair of ranks in a group), above this process's limit of " +
             std::to_string(lim.rlim_max) + " (ulimit -n)";
    rlimit raised = lim;
    raised.rlim_cur = static_cast<rlim_t>(need);
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0)
      return "cannot raise the file descriptor limit to " + std::to_string(need) + " for " +
             std::to_string(ranks_here) + " rank(s): " + std::strerror(errno);
  }
  return std::nullopt;
}

void destroy_comms(std::vector<std::unique_ptr<Comm>>& comms) {
  std::vector<std::thread> closers;
  for (std::unique_ptr<Comm>& c : comms)
    if (c) closers.emplace_back([&c] { c.reset(); });
  for (std::thread& t : closers) t.join();
  comms.clear();
}

}  // namespace sf
