// Timing a kernel the way Triton's do_bench does, fixed where it is weak:
//  - warm-up runs for a fixed time (not a fixed count), so slow kernels are not
//    timed cold and fast ones are not warmed for seconds;
//  - between repetitions a buffer larger than the last-level cache is written, so
//    each repetition starts with cold caches (as it would inside a model);
//  - arguments the kernel writes in place are restored before each repetition
//    (outside the timed region), so repeated runs see the same inputs;
//  - every repetition is timed on its own, and the summary is the median with the
//    20th/80th percentiles and the number of outliers, not a mean over a batch.
// The clock is pluggable: the host Runner uses steady_clock around the call; the
// CUDA Runner (runtime/) brackets the launch with events.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "autotune/cache.h"

namespace sf {

struct BenchOptions {
  double warmup_ms = 25;     // warm-up time before timing
  double rep_ms = 100;       // target total timed time; reps = rep_ms / estimated time
  int min_reps = 5;
  int max_reps = 1000;
  bool flush_cache = true;
  int64_t flush_bytes = 0;   // 0: 2 x the last-level cache, at least 64 MiB
  double budget_ms = 0;      // > 0: stop early (keeping >= min_reps) once this much wall time is spent
};

struct BenchHooks {
  // Runs the kernel once and returns its time in microseconds. A host runner times
  // the call itself; a GPU runner returns the event-measured time.
  std::function<double()> run;
  // Called before every run, untimed: restores arguments written in place. May be empty.
  std::function<void()> restore;
  // Called before every timed run, untimed: evicts the caches. Empty: measure()
  // writes its own flush buffer (BenchOptions::flush_bytes).
  std::function<void()> flush;
};

// Warm-up, then reps timed runs; the summary of their times.
Measurement measure(const BenchHooks& hooks, const BenchOptions& opts = {});

// The summary of a list of per-repetition times (exposed for tests).
Measurement summarize(std::vector<double> times_us);

}  // namespace sf
