// measure() and summarize(): the statistics against hand-computed values (numpy's
// default 'linear' percentiles), and the order of restore / flush / run with fake
// kernels that report a fixed time. No assertion depends on how fast this machine
// is: the only wall-clock checks are lower bounds that sleep_for guarantees.
#include "autotune/measure.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace sf {
namespace autotune_measure_test {

using namespace std::chrono_literals;

// --- summarize -------------------------------------------------------------------

TEST(MeasureTest, SummarizeOddCount) {
  // Sorted: 1 2 3 4 5. Median: the middle one, 3.
  // p20: position 0.2 * (5 - 1) = 0.8, between 1 and 2: 1 + 0.8 * (2 - 1) = 1.8.
  // p80: position 0.8 * 4 = 3.2, between 4 and 5: 4 + 0.2 * 1 = 4.2.
  // q1 = 2 (position 1), q3 = 4 (position 3), IQR 2, fences -1 and 7: no outliers.
  Measurement m = summarize({5, 1, 3, 2, 4});
  EXPECT_EQ(m.reps, 5);
  EXPECT_DOUBLE_EQ(m.median_us, 3);
  EXPECT_DOUBLE_EQ(m.p20_us, 1.8);
  EXPECT_DOUBLE_EQ(m.p80_us, 4.2);
  EXPECT_DOUBLE_EQ(m.min_us, 1);
  EXPECT_DOUBLE_EQ(m.max_us, 5);
  EXPECT_DOUBLE_EQ(m.mean_us, 3);
  EXPECT_EQ(m.outliers, 0);
}

TEST(MeasureTest, SummarizeEvenCount) {
  // Sorted: 10 20 30 40. Median: (20 + 30) / 2 = 25.
  // p20: position 0.2 * 3 = 0.6: 10 + 0.6 * 10 = 16. p80: position 2.4: 30 + 0.4 * 10 = 34.
  Measurement m = summarize({10, 40, 20, 30});
  EXPECT_EQ(m.reps, 4);
  EXPECT_DOUBLE_EQ(m.median_us, 25);
  EXPECT_DOUBLE_EQ(m.p20_us, 16);
  EXPECT_DOUBLE_EQ(m.p80_us, 34);
  EXPECT_DOUBLE_EQ(m.min_us, 10);
  EXPECT_DOUBLE_EQ(m.max_us, 40);
  EXPECT_DOUBLE_EQ(m.mean_us, 25);
  EXPECT_EQ(m.outliers, 0);
}

TEST(MeasureTest, SummarizeCountsOutliers) {
  // Sorted: 1 .. 9, 100 (n = 10). q1: position 0.25 * 9 = 2.25: 3 + 0.25 = 3.25;
  // q3: position 6.75: 7 + 0.75 = 7.75; IQR 4.5; fences 3.25 - 6.75 = -3.5 and
  // 7.75 + 6.75 = 14.5: only 100 is outside. Median (5 + 6) / 2 = 5.5;
  // p20: position 1.8: 2.8; p80: position 7.2: 8.2; mean 145 / 10 = 14.5.
  Measurement m = summarize({100, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(m.reps, 10);
  EXPECT_EQ(m.outliers, 1);
  EXPECT_DOUBLE_EQ(m.median_us, 5.5);
  EXPECT_DOUBLE_EQ(m.p20_us, 2.8);
  EXPECT_DOUBLE_EQ(m.p80_us, 8.2);
  EXPECT_DOUBLE_EQ(m.mean_us, 14.5);
  EXPECT_DOUBLE_EQ(m.max_us, 100);
}

TEST(MeasureTest, SummarizeFencesAreInclusive) {
  // Sorted: 7 10 10 11 11 12 12 15 40 (n = 9). q1: position 2: 10; q3: position 6:
  // 12; IQR 2; fences 7 and 15. 7 and 15 lie on the fences and are not outliers;
  // 40 is. p20: position 1.6, between 10 and 10: 10; p80: position 6.4: 12 + 0.4 *
  // 3 = 13.2; mean 128 / 9.
  Measurement m = summarize({40, 12, 7, 11, 15, 10, 12, 11, 10});
  EXPECT_EQ(m.outliers, 1);
  EXPECT_DOUBLE_EQ(m.median_us, 11);
  EXPECT_DOUBLE_EQ(m.p20_us, 10);
  EXPECT_DOUBLE_EQ(m.p80_us, 13.2);
  EXPECT_DOUBLE_EQ(m.mean_us, 128.0 / 9);
}

TEST(MeasureTest, SummarizeEdgeCases) {
  EXPECT_EQ(summarize({}), Measurement{});
  Measurement one = summarize({7});
  EXPECT_EQ(one.reps, 1);
  EXPECT_DOUBLE_EQ(one.median_us, 7);
  EXPECT_DOUBLE_EQ(one.p20_us, 7);
  EXPECT_DOUBLE_EQ(one.p80_us, 7);
  EXPECT_DOUBLE_EQ(one.min_us, 7);
  EXPECT_DOUBLE_EQ(one.max_us, 7);
  EXPECT_EQ(one.outliers, 0);
  // NaN and infinity are not times: dropped (a NaN would also break sorting).
  Measurement odd = summarize({std::nan(""), 2, std::numeric_limits<double>::infinity(), 4});
  EXPECT_EQ(odd.reps, 2);
  EXPECT_DOUBLE_EQ(odd.median_us, 3);
  EXPECT_DOUBLE_EQ(odd.max_us, 4);
}

// --- measure ---------------------------------------------------------------------

// warmup_ms = 0 makes the warm-up exactly one call: the loop runs once and stops.
BenchOptions quick(double rep_ms, int min_reps, int max_reps) {
  BenchOptions o;
  o.warmup_ms = 0;
  o.rep_ms = rep_ms;
  o.min_reps = min_reps;
  o.max_reps = max_reps;
  return o;
}

TEST(MeasureTest, HookOrderRestoreFlushRun) {
  // R restore, F flush, X run. Every run is preceded by a restore; only timed runs
  // by a flush, which comes after the restore (so restored inputs are evicted too).
  std::string log;
  BenchHooks h;
  h.restore = [&] { log += 'R'; };
  h.flush = [&] { log += 'F'; };
  h.run = [&] { log += 'X'; return 100.0; };
  // reps = 1 ms / 100 us = 10.
  Measurement m = measure(h, quick(1, 1, 1000));
  EXPECT_EQ(m.reps, 10);
  std::string want = "RX";
  for (int i = 0; i < 10; ++i) want += "RFX";
  EXPECT_EQ(log, want);
}

TEST(MeasureTest, RestoreBeforeEveryRunInPlaceKernel) {
  // An in-place kernel x[0] += 1: it must always find the original value, in
  // warm-up and timed runs alike.
  constexpr int kOriginal = 42;
  std::vector<int> buf(16, kOriginal);
  int restores = 0, runs = 0, violations = 0, flushes = 0;
  BenchHooks h;
  h.restore = [&] { buf[0] = kOriginal; ++restores; };
  h.flush = [&] { ++flushes; };
  h.run = [&] {
    if (buf[0] != kOriginal) ++violations;
    ++buf[0];
    ++runs;
    return 1.0;
  };
  BenchOptions o;
  o.warmup_ms = 2;  // several warm-up calls
  o.rep_ms = 10;    // 10 ms / 1 us = 10000, clamped to 50
  o.max_reps = 50;
  Measurement m = measure(h, o);
  EXPECT_EQ(m.reps, 50);
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(restores, runs);
  EXPECT_EQ(flushes, 50);
  EXPECT_GT(runs, 50);  // the warm-up ran at least once
  EXPECT_DOUBLE_EQ(m.median_us, 1);
}

TEST(MeasureTest, OwnFlushBufferWhenNoHook) {
  int runs = 0;
  BenchHooks h;
  h.run = [&] { ++runs; return 50.0; };
  BenchOptions o = quick(1, 1, 1000);  // 1 ms / 50 us = 20 reps
  o.flush_bytes = 1 << 20;
  Measurement m = measure(h, o);
  EXPECT_EQ(m.reps, 20);
  EXPECT_EQ(runs, 21);
  EXPECT_DOUBLE_EQ(m.median_us, 50);
}

TEST(MeasureTest, DefaultFlushBuffer) {
  // flush_bytes = 0: max(2 x LLC, 64 MiB), written before the one rep. Only a
  // smoke test of that path: on a host with a 480 MiB L3 this writes 960 MiB.
  BenchHooks h;
  h.run = [] { return 1000.0; };
  Measurement m = measure(h, quick(1, 1, 1));
  EXPECT_EQ(m.reps, 1);
}

TEST(MeasureTest, NoFlushWhenDisabled) {
  int flushes = 0;
  BenchHooks h;
  h.flush = [&] { ++flushes; };
  h.run = [] { return 100.0; };
  BenchOptions o = quick(1, 1, 1000);
  o.flush_cache = false;
  EXPECT_EQ(measure(h, o).reps, 10);
  EXPECT_EQ(flushes, 0);
}

TEST(MeasureTest, WarmupRunsForItsTimeAndEstimatesFromReportedTime) {
  // Each call sleeps >= 1 ms but reports 250 us. The warm-up lasts >= 20 ms, so it
  // makes between 1 and 20 calls (each takes >= 1 ms); the rep count comes from
  // the reported 250 us (10 ms / 250 us = 40), not from the >= 1 ms of wall time
  // per call (which would give <= 10).
  using Clock = std::chrono::steady_clock;
  int calls = 0, flushes = 0;
  Clock::time_point first_timed{};
  BenchHooks h;
  h.flush = [&] {
    if (flushes++ == 0) first_timed = Clock::now();
  };
  h.run = [&] {
    ++calls;
    std::this_thread::sleep_for(1ms);
    return 250.0;
  };
  BenchOptions o;
  o.warmup_ms = 20;
  o.rep_ms = 10;
  o.min_reps = 5;
  o.max_reps = 1000;
  const Clock::time_point start = Clock::now();
  Measurement m = measure(h, o);
  EXPECT_EQ(m.reps, 40);
  EXPECT_EQ(flushes, 40);
  const int warmup_calls = calls - m.reps;
  EXPECT_GE(warmup_calls, 1);
  EXPECT_LE(warmup_calls, 20);
  const double warmup_ms = std::chrono::duration<double, std::milli>(first_timed - start).count();
  EXPECT_GE(warmup_ms, 20.0);
}

TEST(MeasureTest, WarmupAtLeastOnce) {
  int calls = 0;
  BenchHooks h;
  h.run = [&] { ++calls; return 1000.0; };
  BenchOptions o = quick(10, 1, 1000);  // 10 ms / 1000 us = 10 reps
  o.flush_cache = false;
  o.warmup_ms = -1;  // nonsense still warms up once
  EXPECT_EQ(measure(h, o).reps, 10);
  EXPECT_EQ(calls, 11);
}

TEST(MeasureTest, RepsClampedToMinAndMax) {
  BenchHooks slow;
  slow.run = [] { return 1000.0; };
  BenchOptions o = quick(10, 25, 1000);  // 10 ms / 1000 us = 10 -> min 25
  o.flush_cache = false;
  EXPECT_EQ(measure(slow, o).reps, 25);

  BenchHooks fast;
  fast.run = [] { return 1.0; };
  o = quick(100, 5, 30);  // 100 ms / 1 us = 100000 -> max 30
  o.flush_cache = false;
  EXPECT_EQ(measure(fast, o).reps, 30);

  // min_reps above max_reps: min wins; a tiny reported time does not overflow.
  BenchHooks tiny;
  tiny.run = [] { return 1e-300; };
  o = quick(1e6, 8, 3);
  o.flush_cache = false;
  EXPECT_EQ(measure(tiny, o).reps, 8);
}

TEST(MeasureTest, ZeroReportedTimeFallsBackToWallTime) {
  // A runner that reports 0 must not divide by zero; the reps stay in range.
  BenchHooks h;
  h.run = [] { return 0.0; };
  BenchOptions o = quick(1, 3, 40);
  o.flush_cache = false;
  Measurement m = measure(h, o);
  EXPECT_GE(m.reps, 3);
  EXPECT_LE(m.reps, 40);
}

TEST(MeasureTest, BudgetStopsEarly) {
  // 1000 ms / 2000 us = 500 reps wanted, but each call sleeps >= 2 ms and the
  // budget is 30 ms: after 15 timed calls (plus a warm-up call) more than 30 ms
  // have passed, so at most 15 reps; never fewer than min_reps.
  BenchHooks h;
  h.run = [] {
    std::this_thread::sleep_for(2ms);
    return 2000.0;
  };
  BenchOptions o = quick(1000, 5, 1000);
  o.flush_cache = false;
  o.budget_ms = 30;
  Measurement m = measure(h, o);
  EXPECT_GE(m.reps, 5);
  EXPECT_LE(m.reps, 15);
}

TEST(MeasureTest, BudgetKeepsMinReps) {
  // The warm-up alone (>= 5 ms) exceeds the 1 ms budget: exactly min_reps timed.
  BenchHooks h;
  h.run = [] {
    std::this_thread::sleep_for(1ms);
    return 1000.0;
  };
  BenchOptions o = quick(1000, 7, 1000);
  o.warmup_ms = 5;
  o.flush_cache = false;
  o.budget_ms = 1;
  EXPECT_EQ(measure(h, o).reps, 7);
}

TEST(MeasureTest, NoRunHook) {
  EXPECT_EQ(measure(BenchHooks{}), Measurement{});
}

}  // namespace autotune_measure_test
}  // namespace sf
