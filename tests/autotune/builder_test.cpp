// build_all(): order of results, the concurrency limit, failure reasons and the
// per-candidate deadline, with fake builders keyed by KernelConfig::block. The
// only timing assertions are lower bounds that sleep_for guarantees, or bounds of
// seconds where the work takes milliseconds.
#include "autotune/builder.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace sf {
namespace autotune_builder_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct TagArtifact : Artifact {
  explicit TagArtifact(int t) : tag(t) {}
  int tag;
};

std::vector<KernelConfig> configs_with_blocks(int n) {
  std::vector<KernelConfig> cs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) cs[static_cast<size_t>(i)].block = i;
  return cs;
}

BuildResult ok_result(int tag) {
  BuildResult r;
  r.artifact = std::make_shared<TagArtifact>(tag);
  r.code_hash = std::to_string(tag);
  return r;
}

int tag_of(const BuildResult& r) {
  auto* a = dynamic_cast<const TagArtifact*>(r.artifact.get());
  return a ? a->tag : -1;
}

// Later configs build faster, so they finish first: the results must still come
// back in input order.
class ReverseSpeedBuilder : public Builder {
 public:
  explicit ReverseSpeedBuilder(int n) : n_(n) {}
  BuildResult build(const KernelConfig& c) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * (n_ - c.block)));
    return ok_result(c.block);
  }
 private:
  int n_;
};

TEST(BuildPoolTest, ResultsInInputOrderOnDoneOncePerIndex) {
  constexpr int kN = 8;
  auto builder = std::make_shared<ReverseSpeedBuilder>(kN);
  std::vector<int> done_count(kN, 0);
  const std::thread::id caller = std::this_thread::get_id();
  int on_other_thread = 0;
  BuildPoolOptions o;
  o.threads = 4;
  std::vector<BuildResult> rs = build_all(builder, configs_with_blocks(kN), o, [&](size_t i) {
    ++done_count.at(i);
    if (std::this_thread::get_id() != caller) ++on_other_thread;
  });
  ASSERT_EQ(rs.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(rs[i].error, "");
    EXPECT_EQ(tag_of(rs[i]), i);
    EXPECT_EQ(rs[i].code_hash, std::to_string(i));
    EXPECT_GE(rs[i].build_ms, 5.0 * (kN - i));  // sleep_for sleeps at least that long
    EXPECT_EQ(done_count[i], 1);
  }
  EXPECT_EQ(on_other_thread, 0);
}

// Records the most builds ever in flight at once. The first builds wait (up to
// 5 s) until `expect` are in flight at once, which latches `released_` for all
// later ones; every build then holds 20 ms more. A pool that runs `expect` at a
// time so reaches exactly that count however slowly its threads start, and one
// that ran more would be caught overlapping.
class ConcurrencyBuilder : public Builder {
 public:
  explicit ConcurrencyBuilder(int expect) : expect_(expect) {}
  BuildResult build(const KernelConfig& c) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const int now = ++in_flight_;
      max_in_flight_ = std::max(max_in_flight_, now);
      cv_.notify_all();
      cv_.wait_for(lock, 5s, [&] { return in_flight_ >= expect_ || released_; });
      released_ = released_ || in_flight_ >= expect_;
    }
    std::this_thread::sleep_for(20ms);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    return ok_result(c.block);
  }
  int max_in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_;
  }
 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int expect_;
  int in_flight_ = 0, max_in_flight_ = 0;
  bool released_ = false;
};

TEST(BuildPoolTest, RunsThreadsBuildsAtOnce) {
  for (int threads : {4, 1}) {
    SCOPED_TRACE(threads);
    auto builder = std::make_shared<ConcurrencyBuilder>(threads);
    BuildPoolOptions o;
    o.threads = threads;
    std::vector<BuildResult> rs = build_all(builder, configs_with_blocks(8), o);
    for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(rs[i].error, "") << i;
    EXPECT_EQ(builder->max_in_flight(), threads);
  }
}

TEST(BuildPoolTest, ZeroThreadsMeansHardwareConcurrency) {
  auto builder = std::make_shared<ConcurrencyBuilder>(1);
  BuildPoolOptions o;
  o.threads = 0;
  std::vector<BuildResult> rs = build_all(builder, configs_with_blocks(6), o);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(tag_of(rs[i]), static_cast<int>(i));
  EXPECT_GE(builder->max_in_flight(), 1);
  EXPECT_LE(builder->max_in_flight(), static_cast<int>(std::max(std::thread::hardware_concurrency(), 1u)));
}

// block 1: returns an error; 2: throws a std::exception; 3: throws something else.
class FailingBuilder : public Builder {
 public:
  BuildResult build(const KernelConfig& c) override {
    if (c.block == 1) {
      BuildResult r;
      r.error = "bad config";
      return r;
    }
    if (c.block == 2) throw std::runtime_error("boom");
    if (c.block == 3) throw 7;
    return ok_result(c.block);
  }
};

TEST(BuildPoolTest, FailuresKeepTheirReasons) {
  BuildPoolOptions o;
  o.threads = 2;
  std::vector<BuildResult> rs = build_all(std::make_shared<FailingBuilder>(), configs_with_blocks(6), o);
  ASSERT_EQ(rs.size(), 6u);
  EXPECT_EQ(rs[1].error, "bad config");
  EXPECT_EQ(rs[2].error, "compile failed: boom");
  EXPECT_EQ(rs[3].error, "compile failed: unknown exception");
  for (int i : {1, 2, 3}) EXPECT_EQ(rs[i].artifact, nullptr) << i;
  for (int i : {0, 4, 5}) {
    EXPECT_EQ(rs[i].error, "") << i;
    EXPECT_EQ(tag_of(rs[i]), i);
  }
}

// block 0 blocks until release(); the others return at once.
class HangingBuilder : public Builder {
 public:
  BuildResult build(const KernelConfig& c) override {
    if (c.block == 0) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return released_; });
    }
    return ok_result(c.block);
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  bool released() {
    std::lock_guard<std::mutex> lock(mu_);
    return released_;
  }
 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST(BuildPoolTest, HangingBuildTimesOutAndFreesItsSlot) {
  auto builder = std::make_shared<HangingBuilder>();
  std::weak_ptr<HangingBuilder> watch = builder;
  BuildPoolOptions o;
  o.threads = 1;  // the hang holds the only slot: the others run only if it is freed
  o.timeout = 200ms;
  std::vector<int> done_count(4, 0);
  const Clock::time_point t0 = Clock::now();
  // On another thread, so that a build_all() that waits on the hang fails this
  // test after 10 s instead of hanging it.
  std::future<std::vector<BuildResult>> call = std::async(std::launch::async, [&] {
    return build_all(builder, configs_with_blocks(4), o, [&](size_t i) { ++done_count.at(i); });
  });
  const bool returned = call.wait_for(10s) == std::future_status::ready;
  const double call_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!returned) builder->release();
  std::vector<BuildResult> rs = call.get();

  // build_all returned while the hanging build was still blocked.
  ASSERT_TRUE(returned) << "build_all waited on a build past its deadline";
  EXPECT_FALSE(builder->released());
  EXPECT_GE(call_ms, 200.0);
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[0].error, "compile timed out after 0.2 s");
  EXPECT_EQ(rs[0].artifact, nullptr);
  EXPECT_GE(rs[0].build_ms, 200.0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(rs[i].error, "") << i;
    EXPECT_EQ(tag_of(rs[i]), i);
  }
  EXPECT_EQ(done_count, std::vector<int>(4, 1));

  // Let the abandoned thread finish: it posts its result into the pool's state and
  // drops the builder last, so once the builder is gone the thread touches nothing
  // (keeps LeakSanitizer and TSan quiet at exit).
  builder->release();
  builder.reset();
  const Clock::time_point wait_until = Clock::now() + 10s;
  while (!watch.expired() && Clock::now() < wait_until) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(watch.expired());
}

class SleepBuilder : public Builder {
 public:
  explicit SleepBuilder(std::chrono::milliseconds d) : d_(d) {}
  BuildResult build(const KernelConfig& c) override {
    std::this_thread::sleep_for(d_);
    return ok_result(c.block);
  }
 private:
  std::chrono::milliseconds d_;
};

TEST(BuildPoolTest, DeadlineCountsFromEachStart) {
  // One at a time, 6 x 100 ms = 600 ms in all, past the 400 ms timeout; each build
  // alone is well inside it, so none times out.
  BuildPoolOptions o;
  o.threads = 1;
  o.timeout = 400ms;
  std::vector<BuildResult> rs = build_all(std::make_shared<SleepBuilder>(100ms), configs_with_blocks(6), o);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(rs[i].error, "") << i;
}

TEST(BuildPoolTest, EmptyAndNullBuilder) {
  int calls = 0;
  EXPECT_TRUE(build_all(std::make_shared<SleepBuilder>(0ms), {}, {}, [&](size_t) { ++calls; }).empty());
  EXPECT_EQ(calls, 0);
  std::vector<BuildResult> rs = build_all(nullptr, configs_with_blocks(2), {}, [&](size_t) { ++calls; });
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].error, "compile failed: no builder");
  EXPECT_EQ(calls, 2);
}

}  // namespace autotune_builder_test
}  // namespace sf
