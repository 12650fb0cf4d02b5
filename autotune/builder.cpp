#include "autotune/builder.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

namespace sf {
namespace {

using Clock = std::chrono::steady_clock;

// What the calling thread and the workers share. Each worker holds a shared_ptr
// to it, so a worker abandoned at its deadline can still post its (ignored)
// result after build_all() has returned and the caller's frame is gone.
struct PoolState {
  std::mutex mu;
  std::condition_variable cv;  // a worker finished
  std::vector<char> done;      // by config index; guarded by mu
  std::vector<BuildResult> results;  // guarded by mu; valid where done
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Runs on a worker thread. Takes everything by value: the caller's `configs` may
// be gone by the time an abandoned build returns.
void run_build(std::shared_ptr<PoolState> state, std::shared_ptr<Builder> builder, KernelConfig cfg, size_t i) {
  const Clock::time_point t0 = Clock::now();
  BuildResult r;
  try {
    r = builder->build(cfg);
  } catch (const std::exception& e) {
    r = BuildResult{};
    r.error = std::string("compile failed: ") + e.what();
  } catch (...) {
    r = BuildResult{};
    r.error = "compile failed: unknown exception";
  }
  r.build_ms = ms_between(t0, Clock::now());
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->results[i] = std::move(r);
    state->done[i] = 1;
  }
  state->cv.notify_all();
  // The state goes first and the builder last, so that once the builder is
  // destroyed (or its last other owner sees use_count() == 1), this thread
  // touches nothing of the tuner's any more.
  state.reset();
  builder.reset();
}

std::string timeout_message(std::chrono::milliseconds timeout) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "compile timed out after %g s", static_cast<double>(timeout.count()) / 1000.0);
  return buf;
}

struct Running {
  size_t index;
  Clock::time_point started;
  Clock::time_point deadline;  // time_point::max(): none
};

}  // namespace

std::vector<BuildResult> build_all(std::shared_ptr<Builder> builder, const std::vector<KernelConfig>& configs,
                                   const BuildPoolOptions& opts, const std::function<void(size_t)>& on_done) {
  const size_t n = configs.size();
  std::vector<BuildResult> results(n);
  if (n == 0) return results;
  if (!builder) {
    for (size_t i = 0; i < n; ++i) {
      results[i].error = "compile failed: no builder";
      if (on_done) on_done(i);
    }
    return results;
  }

  const size_t threads = opts.threads > 0 ? static_cast<size_t>(opts.threads)
                                          : std::max<size_t>(std::thread::hardware_concurrency(), 1);
  // A zero or negative timeout would fail every build at once; it means "none".
  const bool has_timeout = opts.timeout.count() > 0;

  auto state = std::make_shared<PoolState>();
  state->done.assign(n, 0);
  state->results.resize(n);

  std::vector<Running> running;
  running.reserve(threads);
  std::vector<size_t> finished;  // final this round; on_done is called for them unlocked
  size_t next = 0;

  std::unique_lock<std::mutex> lock(state->mu);
  while (next < n || !running.empty()) {
    while (running.size() < threads && next < n) {
      const size_t i = next++;
      const Clock::time_point now = Clock::now();
      Clock::time_point deadline = Clock::time_point::max();
      // Saturating: a timeout of hours past the clock's range must not overflow.
      if (has_timeout &&
          opts.timeout < std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)) {
        deadline = now + opts.timeout;
      }
      try {
        // Detached: a compile past its deadline cannot be cancelled (builder.h), so
        // nobody can be made to join it. It owns copies of everything it touches.
        std::thread(run_build, state, builder, configs[i], i).detach();
        running.push_back({i, now, deadline});
      } catch (const std::system_error& e) {
        results[i].error = std::string("compile failed: cannot start a build thread: ") + e.what();
        finished.push_back(i);
      }
    }

    const Clock::time_point now = Clock::now();
    for (auto it = running.begin(); it != running.end();) {
      if (state->done[it->index]) {
        results[it->index] = std::move(state->results[it->index]);
      } else if (now >= it->deadline) {
        // Abandoned: the worker's late result lands in `state` and is dropped with
        // it. Its slot is freed so the remaining configs are not held up.
        results[it->index].error = timeout_message(opts.timeout);
        results[it->index].build_ms = ms_between(it->started, now);
      } else {
        ++it;
        continue;
      }
      finished.push_back(it->index);
      it = running.erase(it);
    }

    if (!finished.empty()) {
      // on_done may be slow (it writes the cache): workers must not wait on it to
      // post their results, so it runs with the lock released.
      lock.unlock();
      for (size_t i : finished) {
        if (on_done) on_done(i);
      }
      finished.clear();
      lock.lock();
      continue;  // launch into the freed slots before sleeping
    }
    if (running.empty()) continue;

    Clock::time_point wake = Clock::time_point::max();
    for (const Running& r : running) wake = std::min(wake, r.deadline);
    // Spurious wake-ups and notifications for other workers just re-scan above.
    if (wake == Clock::time_point::max()) {
      state->cv.wait(lock);
    } else {
      state->cv.wait_until(lock, wake);
    }
  }
  return results;
}

}  // namespace sf
