// The Gloo backend's rendezvous (runtime/comm/comm.h's Rendezvous): where the ranks of a
// run meet, in-process (a Gloo HashStore) or in a directory they share (a
// FileStore), with the abort reason and the first failure they share (for a
// directory, DIR/sf-abort and DIR/sf-first-failure); GroupStore, the store as one
// group sees it while it connects; and the file helpers they use.
#include "runtime/comm/comm_internal.h"

#include <fcntl.h>
#include <unistd.h>

#include <gloo/common/error.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "runtime/core/file_io.h"

namespace sf {
namespace comm_detail {

namespace fs = std::filesystem;

namespace {

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

}  // namespace

RendezvousImpl::RendezvousImpl(std::string dir) : dir_(std::move(dir)) {
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

std::optional<std::string> RendezvousImpl::aborted() const {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (why_) return why_;
  }
  if (dir_.empty()) return std::nullopt;
  return read_file_if_any(fs::path(dir_) / "sf-abort");
}

void RendezvousImpl::abort(const std::string& why) {
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

std::optional<std::string> RendezvousImpl::first_failure(milliseconds patience) {
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

void RendezvousImpl::record_failure(const std::string& msg) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (failure_) return;
    failure_ = msg;
  }
  if (!dir_.empty()) write_first_wins(fs::path(dir_) / "sf-first-failure", msg);
  failure_cv_.notify_all();
}

int RendezvousImpl::next_generation(int rank) {
  std::lock_guard<std::mutex> lock(m_);
  return generation_[rank]++;
}

void RendezvousImpl::add(Comm::Impl* c) {
  std::lock_guard<std::mutex> lock(m_);
  comms_.push_back(c);
  if (why_) comm_on_abort(c, *why_);
}

void RendezvousImpl::remove(Comm::Impl* c) {
  std::lock_guard<std::mutex> lock(m_);
  comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
}

void GroupStore::set(const std::string& key, const std::vector<char>& data) {
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

std::vector<char> GroupStore::get(const std::string& key) {
  wait({key}, timeout_);
  return inner_.get(prefix_ + key);
}

std::optional<size_t> GroupStore::first_missing(const std::vector<std::string>& keys, Clock::time_point deadline) {
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

void GroupStore::wait(const std::vector<std::string>& keys, const milliseconds& /*gloo's, shortened: see create*/) {
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

}  // namespace comm_detail

std::shared_ptr<Rendezvous> Rendezvous::in_process() { return std::make_shared<comm_detail::RendezvousImpl>(""); }

std::shared_ptr<Rendezvous> Rendezvous::file(const std::string& dir) {
  return std::make_shared<comm_detail::RendezvousImpl>(dir.empty() ? "." : dir);
}

}  // namespace sf
