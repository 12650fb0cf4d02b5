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
#include "runtime/comm.h"

#include "codegen/ir/collective.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

#include "codegen/ir/file_io.h"

namespace sf {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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

// Gloo's messages start with "[/build/.../pair.cc:589] " or "[enforce fail at ...] ";
// the source position means nothing to a user of shardfuse.
std::string clean_gloo_message(std::string m) {
  if (!m.empty() && m[0] == '[') {
    size_t end = m.find("] ");
    if (end != std::string::npos) m = m.substr(end + 2);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

// Gloo says "Timed out waiting 1000ms for recv operation to complete".
bool gloo_timed_out(const std::string& m) {
  std::string l = m;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return l.find("timed out") != std::string::npos;
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

// Why this process cannot create files in `dir` (nullopt: it can), found by
// creating and removing a probe file: permission bits alone do not tell (root, ACLs,
// a read-only mount).
std::optional<std::string> not_writable(const std::string& dir) {
  static std::atomic<uint64_t> counter{0};
  const std::string probe =
      (fs::path(dir) / (".sf-probe-" + std::to_string(::getpid()) + "-" + std::to_string(counter++))).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return std::string(std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return std::nullopt;
}

// Only a regular file of at most 1 MiB (what we write here is one line): a FIFO
// planted in the rendezvous directory must not block the rank.
std::optional<std::string> read_file_if_any(const fs::path& p) {
  Result<std::string> text = read_regular_file(p.string(), uint64_t{1} << 20, "");
  if (!text) return std::nullopt;
  return std::move(text).value();
}

// Creates `p` holding `text` unless it exists: written under a temporary name,
// then link(2)ed into place, which fails if the name is taken, so the first of
// several processes wins and nobody reads a half-written file.
void write_first_wins(const fs::path& p, const std::string& text) {
  fs::path tmp = p;
  tmp += ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.good()) return;
  }
  (void)::link(tmp.c_str(), p.c_str());
  std::error_code ec;
  fs::remove(tmp, ec);
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

// What a Comm does when its Rendezvous is aborted (defined with Comm::Impl).
void comm_on_abort(Comm::Impl* impl, const std::string& why);

// ---------------------------------------------------------------------------------
// Rendezvous
// ---------------------------------------------------------------------------------

namespace {

class RendezvousImpl final : public Rendezvous {
 public:
  // dir empty: in-process (HashStore); else a FileStore in dir.
  explicit RendezvousImpl(std::string dir) : dir_(std::move(dir)) {
    if (dir_.empty()) {
      store_ = std::make_unique<gloo::rendezvous::HashStore>();
      return;
    }
    try {
      std::error_code ec;
      fs::create_directories(dir_, ec);
      if (ec) {
        error_ = "cannot create rendezvous directory " + dir_ + ": " + ec.message();
        return;
      }
      // Every process writes its address here: a directory it cannot write to is
      // reported now, in these words, rather than as a Gloo assertion while
      // connecting (and as a timeout on every peer).
      if (std::optional<std::string> why = not_writable(dir_)) {
        error_ = "rendezvous directory " + dir_ + " is not writable: " + *why +
                 " (every process of the run writes its address there)";
        return;
      }
      store_ = std::make_unique<gloo::rendezvous::FileStore>(dir_);
    } catch (const std::exception& e) {
      error_ = "rendezvous directory " + dir_ + ": " + clean_gloo_message(e.what());
    }
  }

  std::string str() const override { return dir_.empty() ? "in-process" : "directory " + dir_; }

  std::optional<std::string> aborted() const override {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (why_) return why_;
    }
    if (dir_.empty()) return std::nullopt;
    return read_file_if_any(fs::path(dir_) / "sf-abort");
  }

  // Records the reason (the first wins; for a directory, the first of any
  // process, left in DIR/sf-abort) and tells every Comm registered here.
  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!why_) {
        if (!dir_.empty()) {
          write_first_wins(fs::path(dir_) / "sf-abort", why);
          why_ = read_file_if_any(fs::path(dir_) / "sf-abort").value_or(why);
        } else {
          why_ = why;
        }
      }
      // Comms unregister under m_ before they go away, so calling them with m_
      // held keeps them alive; they never take m_ while holding their own lock.
      for (Comm::Impl* c : comms_) comm_on_abort(c, *why_);
    }
    failure_cv_.notify_all();
  }

  // The first failure a rank meeting here reported (a collective that timed out,
  // arguments that disagree), so that a rank whose peer gave up first can say why
  // rather than just "connection reset". Waits up to `patience` for one.
  std::optional<std::string> first_failure(milliseconds patience) {
    auto deadline = Clock::now() + patience;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      if (failure_) return failure_;
      if (!dir_.empty()) {
        lock.unlock();
        auto f = read_file_if_any(fs::path(dir_) / "sf-first-failure");
        lock.lock();
        if (f) return failure_ = f;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      // In-process record_failure wakes us; a directory is polled.
      failure_cv_.wait_until(lock, std::min(deadline, Clock::now() + milliseconds(20)));
    }
  }

  void record_failure(const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (failure_) return;
      failure_ = msg;
    }
    if (!dir_.empty()) write_first_wins(fs::path(dir_) / "sf-first-failure", msg);
    failure_cv_.notify_all();
  }

  // The n-th Comm::create of `rank` here gets n: every rank creates its Comms in
  // the same order, so the n-th ones meet under the same keys, and a second Comm
  // on the same rendezvous does not read the first one's addresses.
  int next_generation(int rank) {
    std::lock_guard<std::mutex> lock(m_);
    return generation_[rank]++;
  }

  void add(Comm::Impl* c) {
    std::lock_guard<std::mutex> lock(m_);
    comms_.push_back(c);
    if (why_) comm_on_abort(c, *why_);
  }
  void remove(Comm::Impl* c) {
    std::lock_guard<std::mutex> lock(m_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
  }

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

  void set(const std::string& key, const std::vector<char>& data) override {
    try {
      inner_.set(prefix_ + key, data);
    } catch (const std::exception& e) {
      // FileStore refuses a key whose file exists ("!ifs.is_open(). File already
      // exists", a gloo::EnforceNotMet, which is no gloo::Exception): this rank's
      // key from an earlier run in the same directory.
      const std::string what = clean_gloo_message(e.what());
      if (rv_.is_file() && what.find("already exists") != std::string::npos)
        throw gloo::IoException("the rendezvous directory " + rv_.dir() +
                                " already holds this rank's keys (" + prefix_ + key +
                                "): it was used by an earlier run, or another process runs the same rank; "
                                "give every run a fresh, empty directory");
      if (rv_.is_file())
        throw gloo::IoException("cannot write to the rendezvous directory " + rv_.dir() + ": " + what);
      throw;
    }
  }

  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return inner_.get(prefix_ + key);
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  // Waits for each key in turn until `deadline`: the index of the first one still
  // missing then, or nullopt when all are there. Throws as wait() does on an abort.
  std::optional<size_t> first_missing(const std::vector<std::string>& keys, Clock::time_point deadline) {
    for (size_t i = 0; i < keys.size(); ++i) {
      for (;;) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        try {
          inner_.wait({prefix_ + keys[i]}, std::max(milliseconds(1), std::min(left, milliseconds(100))));
          break;
        } catch (const gloo::Exception&) {
          // this slice timed out: the key is still missing
        }
        if (auto why = rv_.aborted()) throw gloo::IoException("aborted: " + *why);
        if (Clock::now() >= deadline) return i;
      }
    }
    return std::nullopt;
  }

  void wait(const std::vector<std::string>& keys, const milliseconds& /*gloo's, shortened: see create*/) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    auto deadline = Clock::now() + timeout_;
    for (;;) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      try {
        inner_.wait(full, std::max(milliseconds(1), std::min(left, milliseconds(100))));
        return;
      } catch (const gloo::Exception&) {
        // this slice timed out: a key is still missing
      }
      if (auto why = rv_.aborted()) throw gloo::IoException("aborted: " + *why);
      if (Clock::now() >= deadline) throw gloo::IoException("timed out waiting for the other members");
    }
  }

 private:
  RendezvousImpl& rv_;
  gloo::rendezvous::Store& inner_;
  std::string prefix_;
  milliseconds timeout_;
};

}  // namespace

std::shared_ptr<Rendezvous> Rendezvous::in_process() { return std::make_shared<RendezvousImpl>(""); }

std::shared_ptr<Rendezvous> Rendezvous::file(const std::string& dir) {
  return std::make_shared<RendezvousImpl>(dir.empty() ? "." : dir);
}

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
// Layout helpers: a C-order buffer of `shape` with elements of `esize` bytes seen
// as [outer, extent(dim), inner].
// ---------------------------------------------------------------------------------

namespace {

struct DimView {
  int64_t outer = 1;
  int64_t extent = 0;
  int64_t inner_bytes = 0;
};

DimView view_at(const Shape& s, int dim, int64_t esize) {
  DimView v;
  for (int i = 0; i < dim; ++i) v.outer *= s[static_cast<size_t>(i)];
  v.extent = s[static_cast<size_t>(dim)];
  v.inner_bytes = esize;
  for (size_t i = static_cast<size_t>(dim) + 1; i < s.size(); ++i) v.inner_bytes *= s[i];
  return v;
}

// `src` cut along `dim` into chunks of the given extents, each chunk in C order,
// one after the other (what a member sends: chunk k to member k).
std::vector<std::byte> pack_split(const std::byte* src, const Shape& s, int64_t esize, int dim,
                                  const std::vector<int64_t>& extents) {
  DimView v = view_at(s, dim, esize);
  std::vector<std::byte> out(static_cast<size_t>(numel(s) * esize));
  std::byte* dst = out.data();
  int64_t off = 0;
  for (int64_t e : extents) {
    const int64_t row = e * v.inner_bytes;
    for (int64_t o = 0; o < v.outer && row > 0; ++o) {
      std::memcpy(dst, src + (o * v.extent + off) * v.inner_bytes, static_cast<size_t>(row));
      dst += row;
    }
    off += e;
  }
  return out;
}

// The inverse: chunks one after the other in `src` (chunk k has extent extents[k]
// along dim, the other dims of `s`), concatenated along dim into `dst` of shape s.
void unpack_concat(const std::byte* src, const std::vector<int64_t>& extents, std::byte* dst, const Shape& s,
                   int64_t esize, int dim) {
  DimView v = view_at(s, dim, esize);
  int64_t off = 0;
  for (int64_t e : extents) {
    const int64_t row = e * v.inner_bytes;
    for (int64_t o = 0; o < v.outer && row > 0; ++o) {
      std::memcpy(dst + (o * v.extent + off) * v.inner_bytes, src, static_cast<size_t>(row));
      src += row;
    }
    off += e;
  }
}

// ---------------------------------------------------------------------------------
// Reductions on the wire types: floats travel as double, integers and bool as
// int64. acc = acc (op) x, elementwise; loads and stores through memcpy.
// ---------------------------------------------------------------------------------

using Reducer = std::function<void(std::byte* acc, const std::byte* x, size_t n)>;

template <class T, class F>
Reducer elementwise(F f) {
  return [f](std::byte* acc, const std::byte* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      std::memcpy(&b, x + i * sizeof(T), sizeof(T));
      a = f(a, b);
      std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
  };
}

Reducer reducer(ReduceOp op, bool floats) {
  if (floats) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return elementwise<double>([](double a, double b) { return a + b; });
      // NaN wins, as in torch.maximum / torch.minimum.
      case ReduceOp::Max: return elementwise<double>([](double a, double b) { return std::isnan(a) || a >= b ? a : b; });
      case ReduceOp::Min: return elementwise<double>([](double a, double b) { return std::isnan(a) || a <= b ? a : b; });
    }
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      // Two's-complement wrap-around, without signed-overflow UB.
      return elementwise<int64_t>([](int64_t a, int64_t b) {
        return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      });
    case ReduceOp::Max: return elementwise<int64_t>([](int64_t a, int64_t b) { return std::max(a, b); });
    case ReduceOp::Min: return elementwise<int64_t>([](int64_t a, int64_t b) { return std::min(a, b); });
  }
  return nullptr;
}

// `n` elements of dtype `t` at `src` in the wire type (8 bytes an element):
// double for floats, int64 for integers and bool. Typed loops, not Tensor::get:
// a million-element all_reduce spent most of its time in its per-element switch.
template <class From, class To, class F>
void widen_with(const std::byte* src, std::byte* dst, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(From)), sizeof(From));
    To w = f(v);
    std::memcpy(dst + i * 8, &w, 8);
  }
}

void to_wire(const std::byte* src, DType t, int64_t n, std::byte* dst) {
  switch (t) {
    case DType::F32: widen_with<float, double>(src, dst, n, [](float v) { return static_cast<double>(v); }); return;
    case DType::F16: widen_with<uint16_t, double>(src, dst, n, [](uint16_t v) { return double(f16_bits_to_f32(v)); }); return;
    case DType::BF16: widen_with<uint16_t, double>(src, dst, n, [](uint16_t v) { return double(bf16_bits_to_f32(v)); }); return;
    case DType::I32: widen_with<int32_t, int64_t>(src, dst, n, [](int32_t v) { return int64_t{v}; }); return;
    case DType::I64: if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 8); return;
    case DType::Bool: widen_with<uint8_t, int64_t>(src, dst, n, [](uint8_t v) { return int64_t{v != 0}; }); return;
  }
}

// Back from the wire type, rounding once; avg divides by `members` first:
// floats in double, integers and bool in int64 truncating toward zero (as
// codegen/dist/host_collectives.h's oracle does; for bool: true only if every
// member is).
Tensor from_wire(const std::byte* w, DType t, const Shape& s, ReduceOp op, int64_t members) {
  Tensor out(t, s);
  const int64_t n = out.numel();
  const bool avg = op == ReduceOp::Avg;
  std::byte* dst = out.data();
  for (int64_t i = 0; i < n; ++i) {
    if (is_float(t)) {
      double v;
      std::memcpy(&v, w + i * 8, 8);
      if (avg) v /= static_cast<double>(members);
      if (t == DType::F32) {
        float f = static_cast<float>(v);  // round to nearest even, once
        std::memcpy(dst + i * 4, &f, 4);
      } else {
        out.set(i, v);  // rounds the double straight to f16 / bf16
      }
      continue;
    }
    int64_t v;
    std::memcpy(&v, w + i * 8, 8);
    if (avg) v /= members;
    switch (t) {
      case DType::I64: std::memcpy(dst + i * 8, &v, 8); break;
      case DType::I32: {
        int32_t x = static_cast<int32_t>(v);  // wraps like a C cast (Tensor::set_int)
        std::memcpy(dst + i * 4, &x, 4);
        break;
      }
      default: {
        uint8_t b = v != 0;
        std::memcpy(dst + i, &b, 1);
        break;
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Ops
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

// Thrown inside the comm thread when an abort interrupted a wait.
struct Interrupted {};

// A member disagreeing with this one, found from the headers.
struct Disagreement {
  std::string what;
};

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

// One point-to-point transfer of a phase: `bytes` at `offset` of the phase's
// send or receive buffer, to or from group position `peer`.
struct Transfer {
  int peer = 0;
  size_t offset = 0;
  size_t bytes = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------
// Comm
// ---------------------------------------------------------------------------------

struct Comm::Impl {
  std::shared_ptr<RendezvousImpl> rv;
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

  std::string label(CollectiveKind k, int g) const {
    std::string s = "rank " + std::to_string(rank) + ": " + std::string(collective_name(k)) + " over ";
    if (g >= 0 && g < static_cast<int>(groups.size())) return s + group_str(g, groups[static_cast<size_t>(g)].ranks);
    return s + "group " + std::to_string(g);
  }

  // Called by the rendezvous (its lock held, ours not).
  void on_abort(const std::string& why) {
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

  static void close_connections(Group& g) {
    if (!g.ctx) return;
    try {
      g.ctx->closeConnections();
    } catch (...) {
      // already closed or failed: nothing left to reset
    }
  }

  Work issue(Op op) {
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

  void loop() {
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

  std::optional<std::string> abort_reason() {
    std::lock_guard<std::mutex> lock(m);
    return aborted;
  }

  Result<Tensor> run(Op& op) {
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

  static std::optional<std::string> check_dim(int& dim, const Tensor& t, const char* what) {
    int r = static_cast<int>(t.shape().size());
    if (dim < -r || dim >= r) return std::string(what) + " " + std::to_string(dim) + " is out of range for " + t.type().str();
    if (dim < 0) dim += r;
    return std::nullopt;
  }

  static std::optional<std::string> check_sizes(const std::vector<int64_t>& s, const Group& g, const char* what) {
    if (s.size() != g.ranks.size())
      return std::string(what) + " " + shape_str(s) + " has " + std::to_string(s.size()) + " entries for a group of " +
             std::to_string(g.ranks.size());
    for (int64_t x : s)
      if (x < 0 || x > (int64_t{1} << 40)) return std::string(what) + " " + shape_str(s) + " has an invalid extent";
    return std::nullopt;
  }

  std::optional<std::string> validate(Op& op) const {
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

  // Keeps the phase's buffers where on_abort can reach them while they live.
  struct Tracked {
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

  static uint64_t slot_of(uint64_t seq, int phase) {
    // Distinct per collective and phase; the top bits keep clear of the slots
    // Gloo's own algorithms would build (prefix byte << 56).
    return (uint64_t{0x53} << 48) | (seq << 4) | static_cast<uint64_t>(phase);
  }

  // Posts every receive and send of one phase, then waits for all of them. A
  // wait ends when its transfer is done, after opts.timeout (Gloo throws and
  // resets the group's connections), or when on_abort interrupts it.
  void exchange(Group& g, uint64_t seq, int phase, std::byte* send, size_t send_size, const std::vector<Transfer>& sends,
                std::byte* recv, size_t recv_size, const std::vector<Transfer>& recvs) {
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

  // Phase 0: every member tells every peer what it is about to do and how many
  // bytes it will send it in phase 1; a disagreement ends the collective here.
  // `fingerprint` hashes the arguments the members must share; bytes_to[p] is
  // what this member sends p, and bytes_from[p] what it expects from p.
  void agree(Group& g, uint64_t seq, const Op& op, uint64_t fingerprint, const std::vector<size_t>& bytes_to,
             const std::vector<size_t>& bytes_from) {
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

  // The local tensor and dims of `op`, as the header carries them.
  static void fill_local(Header& h, const Op& op) {
    const Shape& s = op.local.shape();
    h.ndim = static_cast<uint8_t>(std::min<size_t>(s.size(), 255));
    for (size_t i = 0; i < s.size() && i < static_cast<size_t>(kHeaderDims); ++i) h.shape[i] = s[i];
    if (op.kind != CollectiveKind::AllReduce) h.dim = op.dim;
    if (op.kind == CollectiveKind::AllToAll) h.dim2 = op.dim2;
  }

  // "all_gather on f32[4, 3] along dim 0" from a header (ours or a peer's).
  static std::string describe_local(const Header& h) {
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

  static std::string describe(const Op& op) {
    std::string s = std::string(collective_name(op.kind)) + " on " + std::string(dtype_name(op.local.dtype()));
    if (op.kind == CollectiveKind::AllReduce || op.kind == CollectiveKind::ReduceScatter)
      s += " (" + std::string(reduce_op_name(op.reduce)) + ")";
    return s;
  }

  // Member k's chunk (chunk_bytes[k] bytes, one after the other in `buf`) ends up
  // on every member; this member's is in place already.
  void gather_chunks(Group& g, uint64_t seq, int phase, std::byte* buf, size_t size, const std::vector<size_t>& chunk_bytes) {
    std::vector<size_t> off(chunk_bytes.size(), 0);
    for (size_t k = 1; k < off.size(); ++k) off[k] = off[k - 1] + chunk_bytes[k - 1];
    std::vector<Transfer> sends, recvs;
    const size_t me = static_cast<size_t>(g.me);
    for (size_t p = 0; p < chunk_bytes.size(); ++p) {
      if (p == me) continue;
      sends.push_back({static_cast<int>(p), off[me], chunk_bytes[me]});
      recvs.push_back({static_cast<int>(p), off[p], chunk_bytes[p]});
    }
    exchange(g, seq, phase, buf, size, sends, buf, size, recvs);
  }

  // `packed` holds chunk k for member k one after the other (counts[k] elements
  // of dtype t, as the tensor stores them). Every member sends each peer its chunk
  // and gets every member's contribution to its own, which it widens to the wire
  // type and reduces in member order; returns that, in the wire type. Only the
  // tensor's own bytes travel: the contributions are the members' raw values.
  std::vector<std::byte> reduce_chunks(Group& g, uint64_t seq, int phase, std::byte* packed, size_t packed_size,
                                       const std::vector<size_t>& counts, DType t, ReduceOp op) {
    const size_t n = counts.size(), me = static_cast<size_t>(g.me);
    const size_t esize = static_cast<size_t>(dtype_size(t));
    const size_t mine = counts[me] * esize;
    std::vector<size_t> off(n, 0);
    for (size_t k = 1; k < n; ++k) off[k] = off[k - 1] + counts[k - 1] * esize;
    std::vector<std::byte> got(n * mine);  // slot p: p's contribution
    std::vector<Transfer> sends, recvs;
    for (size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      sends.push_back({static_cast<int>(p), off[p], counts[p] * esize});
      recvs.push_back({static_cast<int>(p), p * mine, mine});
    }
    if (mine) std::memcpy(got.data() + me * mine, packed + off[me], mine);
    exchange(g, seq, phase, packed, packed_size, sends, got.data(), got.size(), recvs);
    const int64_t count = static_cast<int64_t>(counts[me]);
    std::vector<std::byte> acc(counts[me] * 8), next(counts[me] * 8);
    const Reducer f = reducer(op, is_float(t));
    for (size_t p = 0; p < n; ++p) {
      to_wire(got.data() + p * mine, t, count, p == 0 ? acc.data() : next.data());
      if (p > 0) f(acc.data(), next.data(), counts[me]);
    }
    return acc;
  }

  // The last step of connecting a group: every member sends every peer the hash of
  // the group's ranks and waits for theirs. connectFullMesh returns once this
  // side of each pair is connected, while a peer's event loop may still be
  // accepting; resetting the connection then (an abort right after create) makes
  // Gloo's loop thread fail an assertion (getpeername: ENOTCONN) and terminate
  // the process. A message from every peer proves both ends are established.
  void hello(Group& g) {
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
  static constexpr int kHelloPhase = 15;  // collectives use phases 0 to 2

  // ---- the collectives (comm thread) ------------------------------------------------

  Result<Tensor> identity(Op& op) {
    // A group of one; validate() made sure the sizes describe `local` itself.
    return std::move(op.local);
  }

  Tensor execute(Op& op, Group& g, uint64_t seq) {
    switch (op.kind) {
      case CollectiveKind::AllGather: return all_gather(op, g, seq);
      case CollectiveKind::ReduceScatter: return reduce_scatter(op, g, seq);
      case CollectiveKind::AllReduce: return all_reduce(op, g, seq);
      case CollectiveKind::AllToAll: return all_to_all(op, g, seq);
    }
    return {};
  }

  Tensor all_gather(Op& op, Group& g, uint64_t seq) {
    const Tensor& x = op.local;
    const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
    Shape shape = x.shape();
    shape[static_cast<size_t>(op.dim)] = std::accumulate(op.sizes.begin(), op.sizes.end(), int64_t{0});
    const int64_t esize = dtype_size(x.dtype());
    DimView v = view_at(shape, op.dim, esize);
    std::vector<size_t> chunk(n);
    for (size_t k = 0; k < n; ++k) chunk[k] = static_cast<size_t>(v.outer * op.sizes[k] * v.inner_bytes);
    Shape agreed = shape;
    Fnv fp;
    fp.add(op.dim).add_all(agreed).add_all(op.sizes);
    agree(g, seq, op, fp.h, std::vector<size_t>(n, chunk[me]), chunk);

    Tensor out(x.dtype(), shape);
    // Along dim 0 (or below leading dims of extent 1) the result is the members'
    // buffers one after the other: receive straight into it.
    const bool direct = v.outer == 1;
    std::vector<std::byte> scratch(direct ? 0 : out.nbytes());
    std::byte* buf = direct ? out.data() : scratch.data();
    size_t my_off = 0;
    for (size_t k = 0; k < me; ++k) my_off += chunk[k];
    if (x.nbytes()) std::memcpy(buf + my_off, x.data(), x.nbytes());
    gather_chunks(g, seq, 1, buf, out.nbytes(), chunk);
    if (!direct) unpack_concat(buf, op.sizes, out.data(), shape, esize, op.dim);
    return out;
  }

  Tensor reduce_scatter(Op& op, Group& g, uint64_t seq) {
    const Tensor& x = op.local;
    const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
    const int64_t esize = dtype_size(x.dtype());
    DimView v = view_at(x.shape(), op.dim, 1);  // inner in elements
    std::vector<size_t> counts(n), bytes_to(n);
    for (size_t k = 0; k < n; ++k) {
      counts[k] = static_cast<size_t>(v.outer * op.sizes[k] * v.inner_bytes);
      bytes_to[k] = counts[k] * static_cast<size_t>(esize);
    }
    Fnv fp;
    fp.add(op.dim).add_all(x.shape()).add_all(op.sizes);
    agree(g, seq, op, fp.h, bytes_to, std::vector<size_t>(n, bytes_to[me]));

    std::vector<std::byte> packed = pack_split(x.data(), x.shape(), esize, op.dim, op.sizes);
    std::vector<std::byte> mine = reduce_chunks(g, seq, 1, packed.data(), packed.size(), counts, x.dtype(), op.reduce);
    Shape s = x.shape();
    s[static_cast<size_t>(op.dim)] = op.sizes[me];
    return from_wire(mine.data(), x.dtype(), s, op.reduce, static_cast<int64_t>(n));
  }

  // A reduce-scatter over an even split of the flat elements, then an all-gather
  // of the reduced chunks, rounded to the dtype: each element is reduced once, by
  // one member, in member order, so every member ends with the same bits.
  Tensor all_reduce(Op& op, Group& g, uint64_t seq) {
    Tensor& x = op.local;
    const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
    const size_t total = static_cast<size_t>(x.numel());
    const size_t esize = static_cast<size_t>(dtype_size(x.dtype()));
    std::vector<size_t> counts(n), bytes(n);
    for (size_t k = 0; k < n; ++k) {
      counts[k] = total / n + (k < total % n ? 1 : 0);
      bytes[k] = counts[k] * esize;
    }
    Fnv fp;
    fp.add_all(x.shape());
    agree(g, seq, op, fp.h, bytes, std::vector<size_t>(n, bytes[me]));

    // The flat chunks are contiguous: x itself is the packed buffer (ours to use,
    // it was moved in).
    std::vector<std::byte> mine = reduce_chunks(g, seq, 1, x.data(), x.nbytes(), counts, x.dtype(), op.reduce);
    Tensor reduced = from_wire(mine.data(), x.dtype(), {static_cast<int64_t>(counts[me])}, op.reduce,
                               static_cast<int64_t>(n));
    Tensor out(x.dtype(), x.shape());
    size_t my_off = 0;
    for (size_t k = 0; k < me; ++k) my_off += bytes[k];
    if (reduced.nbytes()) std::memcpy(out.data() + my_off, reduced.data(), reduced.nbytes());
    gather_chunks(g, seq, 2, out.data(), out.nbytes(), bytes);
    return out;
  }

  Tensor all_to_all(Op& op, Group& g, uint64_t seq) {
    const Tensor& x = op.local;
    const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
    const int64_t esize = dtype_size(x.dtype());
    Shape shape = x.shape();
    shape[static_cast<size_t>(op.dim)] = op.sizes[me];
    shape[static_cast<size_t>(op.dim2)] = std::accumulate(op.sizes2.begin(), op.sizes2.end(), int64_t{0});
    // To member k: local's shape with split_dim = send_sizes[k]. From member k: the
    // result's shape with concat_dim = recv_sizes[k].
    std::vector<size_t> to(n), from(n), send_off(n, 0), recv_off(n, 0);
    for (size_t k = 0; k < n; ++k) {
      Shape s = x.shape();
      s[static_cast<size_t>(op.dim)] = op.sizes[k];
      to[k] = static_cast<size_t>(numel(s) * esize);
      Shape r = shape;
      r[static_cast<size_t>(op.dim2)] = op.sizes2[k];
      from[k] = static_cast<size_t>(numel(r) * esize);
      if (k) {
        send_off[k] = send_off[k - 1] + to[k - 1];
        recv_off[k] = recv_off[k - 1] + from[k - 1];
      }
    }
    // The members agree on the dims and on the extents other than split/concat;
    // the sizes only pairwise, which the byte counts in the headers check.
    Shape others = x.shape();
    others[static_cast<size_t>(op.dim)] = -1;
    others[static_cast<size_t>(op.dim2)] = -1;
    Fnv fp;
    fp.add(op.dim).add(op.dim2).add_all(others);
    agree(g, seq, op, fp.h, to, from);

    std::vector<std::byte> send = pack_split(x.data(), x.shape(), esize, op.dim, op.sizes);
    Tensor out(x.dtype(), shape);
    std::vector<std::byte> recv(out.nbytes());
    if (to[me]) std::memcpy(recv.data() + recv_off[me], send.data() + send_off[me], to[me]);
    std::vector<Transfer> sends, recvs;
    for (size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      sends.push_back({static_cast<int>(p), send_off[p], to[p]});
      recvs.push_back({static_cast<int>(p), recv_off[p], from[p]});
    }
    exchange(g, seq, 1, send.data(), send.size(), sends, recv.data(), recv.size(), recvs);
    unpack_concat(recv.data(), op.sizes2, out.data(), shape, esize, op.dim2);
    return out;
  }
};

void comm_on_abort(Comm::Impl* impl, const std::string& why) { impl->on_abort(why); }

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
