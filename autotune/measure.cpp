#include "autotune/measure.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

namespace sf {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The p-th quantile (0 <= p <= 1) of sorted, non-empty `v` by linear interpolation
// between the two nearest ranks: numpy.percentile's default method ('linear').
double quantile(const std::vector<double>& v, double p) {
  const double pos = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Triton's do_bench and most CUDA benchmarking guides size the eviction buffer
// from the L2; on a host the last-level cache is the L3. 32 MiB covers the L3 of
// most server sockets' CCX/tile when the size cannot be read (containers often
// report 0).
int64_t last_level_cache_bytes() {
#ifdef _SC_LEVEL3_CACHE_SIZE
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc > 0) return llc;
#endif
  return int64_t{32} << 20;
}

// Writes every byte of a buffer larger than the last-level cache, so the next
// repetition finds none of its data cached. Allocated once per measure() call:
// allocating per repetition would time page faults into the flush and hand back
// memory the OS may zero lazily.
class CacheFlusher {
 public:
  explicit CacheFlusher(int64_t bytes)
      : size_(static_cast<size_t>(bytes)), buf_(new unsigned char[size_]) {}

  void flush() {
    // A new value each time, so no write is a no-op on memory already holding it.
    std::memset(buf_.get(), ++fill_, size_);
#if defined(__GNUC__)
    // Tells the compiler the buffer's memory is read here, so the memset (a dead
    // store otherwise) must really happen, in full.
    __asm__ __volatile__("" : : "r"(buf_.get()) : "memory");
#endif
    // Portable fallback and belt-and-braces: one byte read into a volatile.
    sink_ = buf_[size_ - 1];
  }

 private:
  size_t size_;
  std::unique_ptr<unsigned char[]> buf_;
  unsigned char fill_ = 0;
  volatile unsigned char sink_ = 0;
};

}  // namespace

Measurement summarize(std::vector<double> times_us) {
  // A NaN breaks std::sort's ordering (undefined behaviour) and an infinity makes
  // the mean meaningless; neither is a time, so neither counts as a repetition.
  std::erase_if(times_us, [](double t) { return !std::isfinite(t); });
  Measurement m;
  if (times_us.empty()) return m;
  std::sort(times_us.begin(), times_us.end());
  const size_t n = times_us.size();
  m.reps = static_cast<int>(n);
  m.min_us = times_us.front();
  m.max_us = times_us.back();
  m.median_us = n % 2 ? times_us[n / 2] : (times_us[n / 2 - 1] + times_us[n / 2]) / 2;
  m.p20_us = quantile(times_us, 0.2);
  m.p80_us = quantile(times_us, 0.8);
  double sum = 0;
  for (double t : times_us) sum += t;
  m.mean_us = sum / static_cast<double>(n);
  // Tukey's fences: the usual box-plot definition of an outlier.
  const double q1 = quantile(times_us, 0.25), q3 = quantile(times_us, 0.75);
  const double lo = q1 - 1.5 * (q3 - q1), hi = q3 + 1.5 * (q3 - q1);
  m.outliers = static_cast<int>(std::count_if(times_us.begin(), times_us.end(),
                                              [&](double t) { return t < lo || t > hi; }));
  return m;
}

Measurement measure(const BenchHooks& hooks, const BenchOptions& opts) {
  if (!hooks.run) return {};
  const Clock::time_point start = Clock::now();

  // At least one timed repetition, and min_reps wins over a smaller max_reps.
  const int min_reps = std::max(opts.min_reps, 1);
  const int max_reps = std::max(opts.max_reps, min_reps);

  // Warm-up for a fixed time: JIT caches, page faults, clocks ramping up. Keeps the
  // last kWarmupKept reported times; a kernel of a few ns would otherwise store
  // millions of them in 25 ms, and the later runs are the warm ones anyway.
  constexpr size_t kWarmupKept = 1024;
  std::vector<double> warm;
  warm.reserve(kWarmupKept);
  size_t warm_calls = 0;
  do {
    if (hooks.restore) hooks.restore();
    const double t = hooks.run();
    if (warm.size() < kWarmupKept) {
      warm.push_back(t);
    } else {
      warm[warm_calls % kWarmupKept] = t;
    }
    ++warm_calls;
  } while (ms_since(start) < opts.warmup_ms);
  const double warm_wall_us = ms_since(start) * 1000.0;

  // The per-call estimate is the runner's own time (for a GPU, event time without
  // the host's launch overhead); the warm-up's wall time per call (restore included)
  // is the fallback when the runner reports nothing usable.
  double estimate_us = median_of(warm);
  if (!(estimate_us > 0) || !std::isfinite(estimate_us)) estimate_us = warm_wall_us / static_cast<double>(warm_calls);
  // Clamped in double: rep_ms / a tiny estimate overflows int.
  const double want = estimate_us > 0 ? std::floor(opts.rep_ms * 1000.0 / estimate_us) : max_reps;
  const int reps = static_cast<int>(std::clamp(want, static_cast<double>(min_reps), static_cast<double>(max_reps)));

  std::unique_ptr<CacheFlusher> flusher;
  if (opts.flush_cache && !hooks.flush) {
    const int64_t bytes = opts.flush_bytes > 0 ? opts.flush_bytes
                                               : std::max(2 * last_level_cache_bytes(), int64_t{64} << 20);
    flusher = std::make_unique<CacheFlusher>(bytes);
  }

  std::vector<double> times;
  times.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    if (opts.budget_ms > 0 && i >= min_reps && ms_since(start) > opts.budget_ms) break;
    // Restore first, then flush: the restored inputs must not be left in cache.
    if (hooks.restore) hooks.restore();
    if (opts.flush_cache) {
      if (hooks.flush) {
        hooks.flush();
      } else {
        flusher->flush();
      }
    }
    times.push_back(hooks.run());
  }
  return summarize(std::move(times));
}

}  // namespace sf
