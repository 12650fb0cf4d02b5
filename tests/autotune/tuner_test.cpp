// tune_kernel() end to end with a fake Builder and Runner: what is built, what is
// measured, what the cache keeps across runs, and how failures, pruning, ranking,
// duplicates, the budget and concurrent tuners are handled. The fakes answer from
// tables keyed by config text, so every assertion is exact; no assertion is on
// wall-clock time (the budget test only relies on sleep_for's lower bound).
#include "autotune/tuner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <latch>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "autotune/space.h"

namespace sf {
namespace autotune_tuner_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr KernelKind kKind = KernelKind::Pointwise;

std::string text(const KernelConfig& c) { return config_str(kKind, ConfigTarget::Gpu, c); }

// Config i of the test spaces: only max_blocks differs (one-shot grid, so it
// changes nothing the rules look at), which makes every text distinct.
KernelConfig mk(int i) {
  KernelConfig c;
  c.block = 256;
  c.vector = 4;
  c.elems_per_thread = 1;
  c.grid_stride = false;
  c.max_blocks = 1000 + i;
  return c;
}

std::vector<KernelConfig> mks(int n) {
  std::vector<KernelConfig> v;
  for (int i = 0; i < n; ++i) v.push_back(mk(i));
  return v;
}

// What the fake builder makes of one config. The launch's grid sets the cost
// model's ranking: with at most one block an SM, the predicted time of a
// memory-bound kernel falls as the grid grows towards the SM count (more SMs busy).
struct FakeBuild {
  int64_t grid = 1;
  int threads = 256;
  int regs = 32;
  int64_t shared = 0;
  int64_t spill = 0;
  std::string code_hash;  // "": "code:<config text>"
  std::string error;      // build fails with it
  bool hang = false;      // blocks until release(), or 10 s
  bool throws = false;    // build() throws
};

struct TextArtifact : Artifact {
  explicit TextArtifact(std::string t) : text(std::move(t)) {}
  std::string text;
};

class FakeBuilder : public Builder {
 public:
  // Set before tuning; read-only while builds run.
  std::map<std::string, FakeBuild> table;
  bool fail_all = false;
  bool empty_hash = false;        // leave BuildResult::code_hash empty, as a builder may
  std::chrono::milliseconds delay{0};

  void set(const KernelConfig& c, FakeBuild b) { table[text(c)] = std::move(b); }

  BuildResult build(const KernelConfig& c) override {
    const std::string t = text(c);
    {
      std::lock_guard<std::mutex> l(mu_);
      calls_.push_back(t);
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    FakeBuild f;
    if (auto it = table.find(t); it != table.end()) f = it->second;
    BuildResult r;
    if (f.hang) {
      std::unique_lock<std::mutex> l(mu_);
      ++hung_;
      // Bounded, so that a tuner that waits on a hung build fails the test
      // instead of hanging it.
      cv_.wait_for(l, std::chrono::seconds(10), [&] { return released_; });
      --hung_;
      cv_.notify_all();
      r.error = "released by the test";
      return r;
    }
    if (f.throws) throw std::runtime_error("fake crash in " + t);
    if (fail_all) {
      r.error = "compile failed: fake error for " + t;
      return r;
    }
    if (!f.error.empty()) {
      r.error = f.error;
      return r;
    }
    r.artifact = std::make_shared<TextArtifact>(t);
    r.code_hash = empty_hash ? "" : f.code_hash.empty() ? "code:" + t : f.code_hash;
    KernelResources res;
    res.name = "k";
    res.arch = "sm_90a";
    res.registers = f.regs;
    res.shared_bytes = f.shared;
    res.spill_store_bytes = f.spill;
    res.spill_load_bytes = f.spill;
    r.resources = res;
    r.threads_per_block = f.threads;
    r.grid_blocks = f.grid;
    return r;
  }

  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }
  void reset_calls() {
    std::lock_guard<std::mutex> l(mu_);
    calls_.clear();
  }
  void release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // After release(): true once no build is blocked any more.
  bool wait_unblocked(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return hung_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> calls_;
  int hung_ = 0;
  bool released_ = false;
};

class FakeRunner : public Runner {
 public:
  std::map<std::string, double> times;  // median by config text; missing: 1000
  std::set<std::string> fail;            // these fail to run
  std::chrono::milliseconds sleep{0};

  Result<Measurement> run(const Artifact& a, const BenchOptions&) override {
    const std::string& t = dynamic_cast<const TextArtifact&>(a).text;
    {
      std::lock_guard<std::mutex> l(mu_);
      runs_.push_back(t);
    }
    if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
    if (fail.count(t)) return Diag{"", {}, "illegal memory access (fake)"};
    auto it = times.find(t);
    double us = it == times.end() ? 1000 : it->second;
    Measurement m;
    m.median_us = m.p20_us = m.p80_us = m.min_us = m.max_us = m.mean_us = us;
    m.reps = 5;
    return m;
  }

  std::vector<std::string> runs() {
    std::lock_guard<std::mutex> l(mu_);
    return runs_;
  }
  void reset_runs() {
    std::lock_guard<std::mutex> l(mu_);
    runs_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::string> runs_;
};

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

std::set<std::string> texts(std::initializer_list<int> ids) {
  std::set<std::string> s;
  for (int i : ids) s.insert(text(mk(i)));
  return s;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(needle) != std::string::npos; });
}

class TunerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "sf-tuner-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl << ": " << std::strerror(errno);
    dir_ = tmpl;
    Result<TargetInfo> t = gpu_target_info("sm_90a");
    ASSERT_TRUE(t.ok());
    target_ = *t;
    problem_.kind = kKind;
    problem_.name = "k0_test";
    problem_.signature = "sig";
    problem_.n = int64_t{1} << 26;
    problem_.num_inputs = 1;
    problem_.shapes = {{problem_.n}, {problem_.n}};
    problem_.elem_bytes = 4;
    problem_.bytes = problem_.n * 8;
    problem_.flops = problem_.n;
    key_ = make_tune_key(problem_, ShapeBuckets::Exact, "sm_90a", "fake toolchain");
    builder_ = std::make_shared<FakeBuilder>();
    runner_ = std::make_unique<FakeRunner>();
    opts_ = TuneOptions{};
    opts_.build.threads = 2;
    opts_.build.timeout = std::chrono::seconds(30);
    opts_.bench.warmup_ms = 0;
    opts_.bench.rep_ms = 0;
  }

  void TearDown() override {
    if (builder_) {
      builder_->release();
      EXPECT_TRUE(builder_->wait_unblocked(std::chrono::seconds(30)));
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A clean slate inside one test: new cache dir, fakes and options.
  void fresh() {
    TearDown();
    SetUp();
  }

  std::unique_ptr<TuneCache> open_cache() {
    Result<std::unique_ptr<TuneCache>> c = TuneCache::open(dir_.string());
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // One tuning run over `space` with its own TuneCache instance, as a new process would.
  TuneReport tune(const std::vector<KernelConfig>& space, const KernelConfig& dflt) {
    opts_.space = [space](const TuneProblem&, const TargetInfo&) { return space; };
    std::unique_ptr<TuneCache> cache = open_cache();
    Result<TuneReport> r = tune_kernel(problem_, key_, target_, dflt, builder_, *runner_, *cache, opts_);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? *r : TuneReport{};
  }

  std::map<std::string, CacheEntry> entries() { return open_cache()->load(key_); }

  // Config i gets grid `grid` (its rank: a larger grid is predicted faster) and a
  // measured time of `us`.
  void set(int i, int64_t grid, double us) {
    builder_->table[text(mk(i))].grid = grid;
    runner_->times[text(mk(i))] = us;
  }

  void reset_counts() {
    builder_->reset_calls();
    runner_->reset_runs();
  }

  fs::path dir_;
  TargetInfo target_;
  TuneProblem problem_;
  TuneKey key_;
  std::shared_ptr<FakeBuilder> builder_;
  std::unique_ptr<FakeRunner> runner_;
  TuneOptions opts_;
};

TEST_F(TunerTest, FirstRunBuildsSurvivorsMeasuresTopKSecondRunIsACacheHit) {
  // mk(0) is the default and ranked last; mk(1..3) are the top 3; mk(4), mk(5) are
  // the fastest when run but ranked out, so they must never be run.
  std::vector<KernelConfig> space = mks(6);
  KernelConfig wide = mk(6), wider = mk(7);
  wide.vector = 8;    // 32 bytes of f32: rule-rejected
  wider.vector = 16;  // 64 bytes: rule-rejected
  space.push_back(wide);
  space.push_back(wider);
  space.push_back(mk(3));  // a repeated text counts once
  set(0, 10, 70);
  set(1, 132, 50);
  set(2, 120, 40);
  set(3, 100, 45);
  set(4, 80, 10);
  set(5, 60, 11);
  opts_.top_k = 3;

  TuneReport r1 = tune(space, mk(0));
  EXPECT_EQ(r1.space, 8u);
  EXPECT_EQ(r1.rule_pruned, 2u);
  EXPECT_EQ(r1.built, 6u);
  std::vector<std::string> built = builder_->calls();
  EXPECT_EQ(built.size(), 6u) << "each surviving config built once";
  EXPECT_EQ(as_set(built), texts({0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r1.measured, 4u) << "top 3 and the default";
  EXPECT_EQ(as_set(runner_->runs()), texts({0, 1, 2, 3}));
  EXPECT_EQ(r1.ranked_out, 2u);
  EXPECT_EQ(r1.invalid, 0u);
  EXPECT_EQ(r1.reused, 0u);
  EXPECT_FALSE(r1.cache_hit());
  EXPECT_EQ(r1.source, ConfigSource::Tuned);
  EXPECT_EQ(r1.best, mk(2));
  EXPECT_EQ(r1.best_str, text(mk(2)));
  EXPECT_DOUBLE_EQ(r1.best_time.median_us, 40);
  ASSERT_TRUE(r1.default_time);
  EXPECT_DOUBLE_EQ(r1.default_time->median_us, 70);

  std::map<std::string, CacheEntry> e1 = entries();
  ASSERT_EQ(e1.size(), 6u) << "rule-pruned configs are not stored";
  EXPECT_EQ(e1.at(text(mk(4))).status, CacheEntry::Status::Built);
  EXPECT_GT(e1.at(text(mk(4))).predicted_us, e1.at(text(mk(3))).predicted_us);
  EXPECT_EQ(e1.at(text(mk(2))).status, CacheEntry::Status::Measured);

  reset_counts();
  TuneReport r2 = tune(space, mk(0));
  EXPECT_TRUE(r2.cache_hit());
  EXPECT_EQ(r2.built, 0u);
  EXPECT_EQ(r2.measured, 0u);
  EXPECT_EQ(r2.reused, 4u);
  EXPECT_TRUE(builder_->calls().empty()) << "nothing built on a cache hit";
  EXPECT_TRUE(runner_->runs().empty()) << "nothing run on a cache hit";
  EXPECT_EQ(r2.best, r1.best);
  EXPECT_EQ(r2.best_str, r1.best_str);
  EXPECT_EQ(r2.best_time, r1.best_time);
  EXPECT_EQ(r2.source, ConfigSource::Cache);
  ASSERT_TRUE(r2.default_time);
  EXPECT_DOUBLE_EQ(r2.default_time->median_us, 70);
  EXPECT_EQ(entries(), e1) << "a cache hit writes nothing";
}

TEST_F(TunerTest, UsesConfigSpaceWithoutOverride) {
  // The real GPU pointwise space of a 2^20-element problem: the persistent grids
  // cover it in one pass and are rule-pruned; the default (grid_stride=1,
  // max_blocks=4096) is not in the space and is added.
  problem_.n = 1 << 20;
  problem_.bytes = problem_.n * 8;
  std::vector<KernelConfig> space = config_space(problem_, target_);
  std::set<std::string> want;
  size_t rejected = 0;
  for (const KernelConfig& c : space) {
    if (rule_reject(problem_, c, target_))
      ++rejected;
    else
      want.insert(text(c));
  }
  ASSERT_GT(rejected, 0u);
  ASSERT_FALSE(want.count(text(KernelConfig{})));
  want.insert(text(KernelConfig{}));
  opts_.top_k = 4;
  std::unique_ptr<TuneCache> cache = open_cache();
  Result<TuneReport> r = tune_kernel(problem_, key_, target_, KernelConfig{}, builder_, *runner_, *cache, opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->space, space.size());
  EXPECT_EQ(r->rule_pruned, rejected);
  EXPECT_EQ(r->built, want.size());
  EXPECT_EQ(as_set(builder_->calls()), want);
  EXPECT_EQ(builder_->calls().size(), want.size());
  EXPECT_LE(r->measured, 5u);
  EXPECT_GE(r->measured, 4u);
  EXPECT_EQ(r->ranked_out, want.size() - r->measured);
}

TEST_F(TunerTest, AddingOneConfigBuildsOnlyThatOne) {
  opts_.prune = false;
  for (int i = 0; i < 5; ++i) set(i, 10 + i, 100 - i);
  TuneReport r1 = tune(mks(4), mk(0));
  EXPECT_EQ(r1.built, 4u);
  EXPECT_EQ(r1.measured, 4u);
  EXPECT_EQ(r1.best, mk(3));
  std::map<std::string, CacheEntry> before = entries();
  ASSERT_EQ(before.size(), 4u);

  reset_counts();
  TuneReport r2 = tune(mks(5), mk(0));
  EXPECT_EQ(builder_->calls(), std::vector<std::string>{text(mk(4))});
  EXPECT_EQ(runner_->runs(), std::vector<std::string>{text(mk(4))});
  EXPECT_EQ(r2.built, 1u);
  EXPECT_EQ(r2.measured, 1u);
  EXPECT_EQ(r2.reused, 4u);
  EXPECT_EQ(r2.best, mk(4));
  EXPECT_EQ(r2.source, ConfigSource::Tuned);
  std::map<std::string, CacheEntry> after = entries();
  ASSERT_EQ(after.size(), 5u);
  for (const auto& [t, e] : before) {
    ASSERT_TRUE(after.count(t)) << t;
    EXPECT_EQ(after.at(t), e) << "entry of " << t << " rewritten";
  }
  EXPECT_EQ(after.at(text(mk(4))).status, CacheEntry::Status::Measured);
}

TEST_F(TunerTest, CompileErrorAndTimeoutAreInvalidTheRestTuned) {
  opts_.prune = false;
  opts_.build.timeout = 200ms;
  for (int i = 0; i < 5; ++i) set(i, 100, 50 + i);
  builder_->table[text(mk(1))].error = "ptxas: fake syntax error";
  builder_->table[text(mk(3))].hang = true;
  runner_->times[text(mk(1))] = 1;  // would win, if it built
  runner_->times[text(mk(3))] = 1;

  TuneReport r = tune(mks(5), mk(0));
  EXPECT_EQ(r.invalid, 2u);
  EXPECT_EQ(r.built, 5u);
  EXPECT_EQ(r.measured, 3u);
  EXPECT_EQ(as_set(runner_->runs()), texts({0, 2, 4}));
  EXPECT_EQ(r.best, mk(0));
  EXPECT_EQ(r.source, ConfigSource::Tuned);
  std::map<std::string, CacheEntry> e = entries();
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e.at(text(mk(1))).status, CacheEntry::Status::Invalid);
  EXPECT_EQ(e.at(text(mk(1))).reason, "ptxas: fake syntax error");
  EXPECT_EQ(e.at(text(mk(3))).status, CacheEntry::Status::Invalid);
  EXPECT_EQ(e.at(text(mk(3))).reason, "compile timed out after 0.2 s");
  for (int i : {0, 2, 4}) EXPECT_EQ(e.at(text(mk(i))).status, CacheEntry::Status::Measured) << i;

  // Known failures are not retried.
  reset_counts();
  TuneReport again = tune(mks(5), mk(0));
  EXPECT_TRUE(again.cache_hit());
  EXPECT_EQ(again.invalid, 2u);
  EXPECT_TRUE(builder_->calls().empty());
  EXPECT_EQ(again.best, mk(0));
}

TEST_F(TunerTest, AllBuildsFailUseTheDefault) {
  builder_->fail_all = true;
  KernelConfig dflt = mk(2);
  TuneReport r = tune(mks(4), dflt);
  EXPECT_EQ(r.invalid, 4u);
  EXPECT_EQ(r.measured, 0u);
  EXPECT_TRUE(runner_->runs().empty());
  EXPECT_EQ(r.best, dflt);
  EXPECT_EQ(r.best_str, text(dflt));
  EXPECT_EQ(r.source, ConfigSource::Default);
  EXPECT_FALSE(r.default_time);
  EXPECT_TRUE(any_contains(r.warnings, "using the default config")) << ::testing::PrintToString(r.warnings);
  EXPECT_TRUE(any_contains(r.warnings, "k0_test"));
  for (const auto& [t, e] : entries()) {
    EXPECT_EQ(e.status, CacheEntry::Status::Invalid) << t;
    EXPECT_NE(e.reason.find("fake error"), std::string::npos) << e.reason;
  }
}

TEST_F(TunerTest, RunFailureIsInvalidAndBestAmongTheOthers) {
  for (int i = 0; i < 4; ++i) set(i, 100, 30 + i);
  runner_->times[text(mk(2))] = 5;  // fastest, but it fails to run
  runner_->fail.insert(text(mk(2)));
  opts_.top_k = 8;  // every config is measured
  TuneReport r = tune(mks(4), mk(0));
  EXPECT_EQ(r.invalid, 1u);
  EXPECT_EQ(r.measured, 3u);
  EXPECT_EQ(r.best, mk(0));
  EXPECT_DOUBLE_EQ(r.best_time.median_us, 30);
  const CacheEntry e = entries().at(text(mk(2)));
  EXPECT_EQ(e.status, CacheEntry::Status::Invalid);
  EXPECT_EQ(e.reason, "run failed: illegal memory access (fake)");

  // Not run again.
  reset_counts();
  TuneReport again = tune(mks(4), mk(0));
  EXPECT_TRUE(again.cache_hit());
  EXPECT_TRUE(runner_->runs().empty());
  EXPECT_EQ(again.invalid, 1u);
}

TEST_F(TunerTest, TopKRespected) {
  // Predicted order by grid: mk(9) (132) > mk(8) > ... > mk(0) (the default, grid 2).
  // Also with code hashes left empty (a builder need not set them), where no config
  // may be taken for the default.
  for (bool empty_hash : {false, true}) {
    for (bool default_on_top : {false, true}) {
      SCOPED_TRACE(std::string(empty_hash ? "no code hashes" : "code hashes") +
                   (default_on_top ? ", default ranked first" : ", default ranked last"));
      fresh();
      builder_->empty_hash = empty_hash;
      for (int i = 0; i < 10; ++i) set(i, 2 + 14 * i, 100 - i);
      if (default_on_top) builder_->table[text(mk(0))].grid = 132;
      opts_.top_k = 3;
      TuneReport r = tune(mks(10), mk(0));
      const size_t valid = 10;
      EXPECT_EQ(r.measured, default_on_top ? 3u : 4u);
      EXPECT_EQ(r.ranked_out, valid - r.measured);
      EXPECT_EQ(r.duplicates, 0u);
      if (default_on_top)
        EXPECT_EQ(as_set(runner_->runs()), texts({0, 9, 8}));
      else
        EXPECT_EQ(as_set(runner_->runs()), texts({9, 8, 7, 0}));
      EXPECT_EQ(r.best, mk(9));
      ASSERT_TRUE(r.default_time);
      EXPECT_DOUBLE_EQ(r.default_time->median_us, 100);
    }
  }
}

TEST_F(TunerTest, ExhaustiveMeasuresEveryValidConfig) {
  // The model ranks mk(7) first but mk(2) is truly fastest; mk(5) fails to build.
  for (int i = 0; i < 8; ++i) set(i, 10 + 10 * i, 100 - i);
  runner_->times[text(mk(2))] = 20;
  builder_->table[text(mk(5))].error = "fake";
  opts_.prune = false;
  opts_.top_k = 1;  // ignored when exhaustive
  TuneReport r = tune(mks(8), mk(0));
  EXPECT_EQ(r.measured, 7u);
  EXPECT_EQ(r.ranked_out, 0u);
  EXPECT_EQ(r.invalid, 1u);
  EXPECT_EQ(as_set(runner_->runs()), texts({0, 1, 2, 3, 4, 6, 7}));
  EXPECT_EQ(r.best, mk(2));
  EXPECT_DOUBLE_EQ(r.best_time.median_us, 20);

  // The same space pruned to the model's top 1 misses mk(2): it finds mk(7).
  fresh();
  for (int i = 0; i < 8; ++i) set(i, 10 + 10 * i, 100 - i);
  runner_->times[text(mk(2))] = 20;
  builder_->table[text(mk(5))].error = "fake";
  opts_.top_k = 1;
  TuneReport pruned = tune(mks(8), mk(0));
  EXPECT_EQ(pruned.measured, 2u) << "mk(7) and the default";
  EXPECT_EQ(pruned.best, mk(7));
  EXPECT_DOUBLE_EQ(pruned.best_time.median_us, 93);
}

TEST_F(TunerTest, PruningFindsTheExhaustiveBestWhenTheModelAgrees) {
  // Measured times follow the predicted order (larger grid, faster).
  auto setup = [&] {
    for (int i = 0; i < 12; ++i) set(i, 5 + 10 * i, 1000.0 / (5 + 10 * i));
  };
  setup();
  opts_.prune = false;
  TuneReport exhaustive = tune(mks(12), mk(0));
  EXPECT_EQ(exhaustive.measured, 12u);
  EXPECT_EQ(exhaustive.best, mk(11));

  fresh();
  setup();
  opts_.prune = true;
  opts_.top_k = 2;
  TuneReport pruned = tune(mks(12), mk(0));
  EXPECT_EQ(pruned.measured, 3u);
  EXPECT_EQ(pruned.best, exhaustive.best);
  EXPECT_EQ(pruned.best_time, exhaustive.best_time);
}

TEST_F(TunerTest, DuplicateCodeMeasuredOnce) {
  for (bool prune : {true, false}) {
    SCOPED_TRACE(prune ? "pruned" : "exhaustive");
    fresh();
    for (int i = 0; i < 5; ++i) set(i, 100 - i, 40 + i);
    builder_->table[text(mk(1))].code_hash = "same";
    builder_->table[text(mk(2))].code_hash = "same";
    builder_->table[text(mk(3))].code_hash = "same";
    opts_.prune = prune;
    opts_.top_k = 10;
    TuneReport r = tune(mks(5), mk(0));
    EXPECT_EQ(r.duplicates, 2u);
    EXPECT_EQ(r.measured, 3u);
    EXPECT_EQ(as_set(runner_->runs()), texts({0, 1, 4})) << "the first of equal kernels in the space";
    EXPECT_EQ(r.best, mk(0));
  }
}

TEST_F(TunerTest, SpillingConfigsRankAfterNonSpilling) {
  // mk(1) is predicted fastest but spills: with top_k 2 it is not measured, and
  // exhaustive measures it last.
  for (int i = 0; i < 5; ++i) set(i, 20 + 10 * i, 50);
  builder_->table[text(mk(1))].grid = 132;
  builder_->table[text(mk(1))].spill = 64;
  runner_->times[text(mk(1))] = 1;
  opts_.top_k = 2;
  TuneReport r = tune(mks(5), mk(0));
  EXPECT_EQ(as_set(runner_->runs()), texts({4, 3, 0}));
  EXPECT_EQ(r.ranked_out, 2u);
  std::map<std::string, CacheEntry> e = entries();
  EXPECT_EQ(e.at(text(mk(1))).status, CacheEntry::Status::Built);
  ASSERT_TRUE(e.at(text(mk(1))).resources);
  EXPECT_TRUE(e.at(text(mk(1))).resources->spills());
  EXPECT_LT(e.at(text(mk(1))).predicted_us, e.at(text(mk(4))).predicted_us) << "ranked down despite its prediction";

  fresh();
  for (int i = 0; i < 5; ++i) set(i, 20 + 10 * i, 50);
  builder_->table[text(mk(1))].grid = 132;
  builder_->table[text(mk(1))].spill = 64;
  opts_.top_k = 10;
  tune(mks(5), mk(0));
  std::vector<std::string> order = runner_->runs();
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order.back(), text(mk(1)));
  EXPECT_EQ(order.front(), text(mk(4)));
}

TEST_F(TunerTest, ConfigsThatFitNoSmArePruned) {
  for (int i = 0; i < 5; ++i) set(i, 100, 50 - i);
  builder_->table[text(mk(1))].regs = 256;             // over 255 a thread
  builder_->table[text(mk(2))].shared = 300 * 1024;    // over 227 KiB a block
  builder_->table[text(mk(3))].threads = 1024;         // 255 regs x 1024 threads > 65536
  builder_->table[text(mk(3))].regs = 255;
  opts_.top_k = 10;
  TuneReport r = tune(mks(5), mk(0));
  EXPECT_EQ(r.static_pruned, 3u);
  EXPECT_EQ(r.built, 5u);
  EXPECT_EQ(as_set(runner_->runs()), texts({0, 4}));
  EXPECT_EQ(r.best, mk(4));
  std::map<std::string, CacheEntry> e = entries();
  for (int i : {1, 2, 3}) {
    const CacheEntry& p = e.at(text(mk(i)));
    EXPECT_EQ(p.status, CacheEntry::Status::Pruned) << i;
    EXPECT_EQ(status_name(p.status), "pruned");
    EXPECT_NE(p.reason.find("no block fits"), std::string::npos) << p.reason;
  }
}

TEST_F(TunerTest, BudgetStopsMeasuringAndALaterRunResumes) {
  for (int i = 0; i < 10; ++i) set(i, 10 + i, 100 - i);
  opts_.top_k = 10;
  opts_.budget_s = 0.1;
  runner_->sleep = 50ms;  // two runs spend the budget
  TuneReport r = tune(mks(10), mk(0));
  EXPECT_TRUE(r.budget_exhausted);
  EXPECT_LE(r.measured, 2u);
  EXPECT_LT(r.measured, static_cast<size_t>(opts_.top_k));
  EXPECT_TRUE(any_contains(r.warnings, "tuning budget")) << ::testing::PrintToString(r.warnings);
  const size_t first = r.measured;

  // Without a budget, the next run measures the rest (building them again, since
  // artifacts do not outlive a run) and builds nothing new.
  reset_counts();
  runner_->sleep = 0ms;
  opts_.budget_s = 0;
  TuneReport rest = tune(mks(10), mk(0));
  EXPECT_FALSE(rest.budget_exhausted);
  EXPECT_EQ(rest.built, 0u);
  EXPECT_EQ(rest.measured, 10 - first);
  EXPECT_EQ(rest.reused, first);
  EXPECT_EQ(builder_->calls().size(), 10 - first);
  EXPECT_EQ(rest.best, mk(9));
  for (const auto& [t, e] : entries()) EXPECT_EQ(e.status, CacheEntry::Status::Measured) << t;
}

TEST_F(TunerTest, RaisingTopKMeasuresOnlyTheNewlyChosen) {
  for (int i = 0; i < 8; ++i) set(i, 10 + 10 * i, 100 - i);
  opts_.top_k = 2;
  TuneReport r1 = tune(mks(8), mk(0));
  EXPECT_EQ(as_set(runner_->runs()), texts({7, 6, 0}));
  reset_counts();
  opts_.top_k = 4;
  TuneReport r2 = tune(mks(8), mk(0));
  EXPECT_EQ(r2.built, 0u);
  EXPECT_EQ(r2.measured, 2u);
  EXPECT_EQ(r2.reused, 3u);
  EXPECT_EQ(as_set(builder_->calls()), texts({5, 4}));
  EXPECT_EQ(as_set(runner_->runs()), texts({5, 4}));
  EXPECT_EQ(r2.best, mk(7));
}

TEST_F(TunerTest, RebuildsForMeasuringHaveTheBuildPoolsDeadlineAndErrors) {
  // A config built (and ranked out) in one run is built again when a later run
  // measures it; that build must be as guarded as the first: a deadline and no
  // exception escaping the tuner.
  for (int i = 0; i < 6; ++i) set(i, 10 + 10 * i, 100 - i);
  opts_.top_k = 2;
  tune(mks(6), mk(0));
  ASSERT_EQ(as_set(runner_->runs()), texts({5, 4, 0}));
  reset_counts();
  builder_->table[text(mk(3))].throws = true;
  builder_->table[text(mk(2))].hang = true;
  opts_.top_k = 6;
  opts_.build.timeout = 200ms;
  TuneReport r = tune(mks(6), mk(0));
  EXPECT_EQ(r.built, 0u);
  EXPECT_EQ(r.measured, 1u);
  EXPECT_EQ(r.invalid, 2u);
  EXPECT_EQ(as_set(runner_->runs()), texts({1}));
  EXPECT_EQ(r.best, mk(5));
  std::map<std::string, CacheEntry> e = entries();
  EXPECT_EQ(e.at(text(mk(3))).status, CacheEntry::Status::Invalid);
  EXPECT_EQ(e.at(text(mk(3))).reason, "compile failed: fake crash in " + text(mk(3)));
  EXPECT_EQ(e.at(text(mk(2))).status, CacheEntry::Status::Invalid);
  EXPECT_EQ(e.at(text(mk(2))).reason, "compile timed out after 0.2 s");
}

TEST_F(TunerTest, DefaultIsNeverRulePruned) {
  KernelConfig dflt = mk(0);
  dflt.vector = 8;  // rule-rejected for f32, but the default is always a candidate
  builder_->table[text(dflt)].grid = 50;
  runner_->times[text(dflt)] = 5;
  for (int i = 1; i < 4; ++i) set(i, 100, 20);
  std::vector<KernelConfig> space = mks(4);
  space[0] = dflt;
  TuneReport r = tune(space, dflt);
  EXPECT_EQ(r.rule_pruned, 0u);
  EXPECT_EQ(r.best, dflt);
  ASSERT_TRUE(r.default_time);
  EXPECT_DOUBLE_EQ(r.default_time->median_us, 5);
}

TEST_F(TunerTest, DefaultOutsideTheSpaceIsAdded) {
  for (int i = 0; i < 4; ++i) set(i, 100, 20 + i);
  opts_.top_k = 8;  // every config is measured
  TuneReport r = tune({mk(1), mk(2), mk(3)}, mk(0));
  EXPECT_EQ(r.space, 3u);
  EXPECT_EQ(r.built, 4u);
  EXPECT_EQ(r.measured, 4u);
  EXPECT_EQ(r.best, mk(0));
  ASSERT_TRUE(r.default_time);
  EXPECT_DOUBLE_EQ(r.default_time->median_us, 20);
}

TEST_F(TunerTest, CachedChoiceReturnsTheFastestMeasured) {
  EXPECT_FALSE(cached_choice(*open_cache(), key_)) << "nothing cached yet";
  for (int i = 0; i < 6; ++i) set(i, 20 + 10 * i, 60 - i);
  runner_->times[text(mk(3))] = 7;
  opts_.top_k = 3;
  TuneReport r = tune(mks(6), mk(0));
  ASSERT_EQ(r.best, mk(3));
  std::unique_ptr<TuneCache> cache = open_cache();
  std::optional<CacheEntry> c = cached_choice(*cache, key_);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->config, text(mk(3)));
  EXPECT_EQ(c->cfg, mk(3));
  EXPECT_DOUBLE_EQ(c->measurement.median_us, 7);

  // Only measured entries count, whatever times the others carry.
  CacheEntry odd = entries().at(text(mk(1)));
  ASSERT_EQ(odd.status, CacheEntry::Status::Built);
  odd.measurement.median_us = 0.5;
  ASSERT_TRUE(cache->store(key_, odd).ok());
  EXPECT_EQ(cached_choice(*cache, key_)->config, text(mk(3)));
  odd.status = CacheEntry::Status::Measured;
  ASSERT_TRUE(cache->store(key_, odd).ok());
  EXPECT_EQ(cached_choice(*cache, key_)->config, text(mk(1)));

  // Another key has nothing.
  TuneKey other = key_;
  other.target = "sm_80";
  EXPECT_FALSE(cached_choice(*cache, other));
}

TEST_F(TunerTest, ProgressReportsBuildAndMeasure) {
  for (int i = 0; i < 4; ++i) set(i, 100, 20 + i);
  opts_.space = [](const TuneProblem&, const TargetInfo&) { return mks(4); };
  std::vector<TuneProgress> seen;
  std::unique_ptr<TuneCache> cache = open_cache();
  Result<TuneReport> r = tune_kernel(problem_, key_, target_, mk(0), builder_, *runner_, *cache, opts_,
                                     [&](const TuneProgress& p) { seen.push_back(p); });
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().phase, "build");
  EXPECT_EQ(seen.front().total, 4u);
  EXPECT_EQ(seen.back().phase, "measure");
  EXPECT_EQ(seen.back().done, seen.back().total);
  EXPECT_DOUBLE_EQ(seen.back().best_us, 20);
  for (const TuneProgress& p : seen) EXPECT_EQ(p.kernel, "k0_test");
}

TEST_F(TunerTest, ConcurrentTunersOfOneKeyBuildEachConfigOnce) {
  const int n = 8;
  for (int i = 0; i < n; ++i) set(i, 10 + 10 * i, 100 - i);
  builder_->delay = 20ms;  // long enough that the second tuner arrives while the first works
  opts_.top_k = 3;
  opts_.space = [](const TuneProblem&, const TargetInfo&) { return mks(n); };
  std::latch start(2);
  TuneReport reports[2];
  std::thread threads[2];
  for (int t = 0; t < 2; ++t) {
    threads[t] = std::thread([&, t] {
      std::unique_ptr<TuneCache> cache = open_cache();  // its own instance, as another process
      start.arrive_and_wait();
      Result<TuneReport> r = tune_kernel(problem_, key_, target_, mk(0), builder_, *runner_, *cache, opts_);
      EXPECT_TRUE(r.ok());
      if (r.ok()) reports[t] = *r;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(builder_->calls().size(), static_cast<size_t>(n)) << "every config built once across both";
  EXPECT_EQ(as_set(builder_->calls()).size(), static_cast<size_t>(n));
  EXPECT_EQ(runner_->runs().size(), 4u) << "top 3 and the default, measured once";
  EXPECT_EQ(reports[0].built + reports[1].built, static_cast<size_t>(n));
  EXPECT_TRUE(reports[0].cache_hit() != reports[1].cache_hit()) << "one tuned, the other found it all cached";
  EXPECT_EQ(reports[0].best, mk(7));
  EXPECT_EQ(reports[1].best, mk(7));
  EXPECT_EQ(reports[0].best_time, reports[1].best_time);
}

}  // namespace autotune_tuner_test
}  // namespace sf

namespace sf {
namespace autotune_tuner_test {

// top_k 0 (the default): a fifth of the space, between 2 and 16.
TEST_F(TunerTest, DefaultTopKIsAFifthOfTheSpaceBetweenTwoAndSixteen) {
  for (int i = 0; i < 30; ++i) set(i, 100, 10 + i);
  opts_.top_k = 0;
  TuneReport r = tune(mks(30), mk(29));
  EXPECT_EQ(r.measured, 6u + 1u) << "30 / 5 = 6, plus the default";
  EXPECT_EQ(r.ranked_out, 30u - 7u);
}

// Extern candidates (library GEMMs): measured by the same Runner beside the
// generated configs, chosen when fastest, cached under "extern=<library>" and
// measured again only under another library version.
ExternCandidate lib(const std::string& version) {
  return ExternCandidate{"cublaslt", version, std::make_shared<TextArtifact>("extern=cublaslt"), "a GEMM"};
}

TEST_F(TunerTest, AFasterExternCandidateWinsAndIsCachedAsALibraryCall) {
  for (int i = 0; i < 4; ++i) set(i, 100, 20 + i);
  runner_->times["extern=cublaslt"] = 5;
  opts_.space = [](const TuneProblem&, const TargetInfo&) { return mks(4); };
  auto run = [&](const std::string& version) {
    std::unique_ptr<TuneCache> cache = open_cache();
    Result<TuneReport> r =
        tune_kernel(problem_, key_, target_, mk(0), builder_, *runner_, *cache, opts_, {}, {lib(version)});
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : TuneReport{};
  };
  TuneReport r = run("v1");
  EXPECT_EQ(r.best_extern, "cublaslt");
  EXPECT_EQ(r.best_str, "extern=cublaslt");
  EXPECT_EQ(r.best_time.median_us, 5);
  EXPECT_EQ(r.best_generated, text(mk(0)));
  ASSERT_TRUE(r.best_generated_time);
  EXPECT_EQ(r.best_generated_time->median_us, 20);
  ASSERT_EQ(r.externs.size(), 1u);
  EXPECT_TRUE(r.externs[0].measured);
  EXPECT_FALSE(r.externs[0].reused);
  const std::vector<std::string> runs = runner_->runs();
  EXPECT_EQ(std::count(runs.begin(), runs.end(), "extern=cublaslt"), 1);
  const CacheEntry e = entries().at("extern=cublaslt");
  EXPECT_TRUE(e.is_extern());
  EXPECT_EQ(e.extern_version, "v1");
  EXPECT_EQ(e.status, CacheEntry::Status::Measured);
  std::unique_ptr<TuneCache> cache = open_cache();
  std::optional<CacheEntry> chosen = cached_choice(*cache, key_);
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->extern_library, "cublaslt") << "what compile then turns into a gemm step";

  runner_->reset_runs();
  TuneReport again = run("v1");
  EXPECT_TRUE(again.cache_hit());
  EXPECT_TRUE(runner_->runs().empty());
  EXPECT_EQ(again.best_extern, "cublaslt");
  EXPECT_EQ(again.source, ConfigSource::Cache);
  EXPECT_TRUE(again.externs[0].reused);

  // Another cuBLASLt: only the library call is measured again.
  runner_->times["extern=cublaslt"] = 50;
  TuneReport upgraded = run("v2");
  EXPECT_EQ(runner_->runs(), std::vector<std::string>{"extern=cublaslt"});
  EXPECT_EQ(upgraded.best_extern, "") << "slower now: the generated config wins";
  EXPECT_EQ(upgraded.best, mk(0));
  EXPECT_EQ(entries().at("extern=cublaslt").extern_version, "v2");
}

// The library GEMM + epilogue kernel pair (codegen/kernels/extern_gemm.h) is one more
// extern candidate: kept when the pair measures faster, else the generated kernel.
TEST_F(TunerTest, ALibraryGemmPlusEpilogueKernelWinsOnlyWhenFaster) {
  for (int i = 0; i < 4; ++i) set(i, 100, 20 + i);
  opts_.space = [](const TuneProblem&, const TargetInfo&) { return mks(4); };
  const std::string t = "extern=cublaslt+epilogue";
  auto run = [&](const std::string& version) {
    std::unique_ptr<TuneCache> cache = open_cache();
    ExternCandidate pair{"cublaslt+epilogue", version, std::make_shared<TextArtifact>(t), "a GEMM, then k0_epilogue"};
    Result<TuneReport> r = tune_kernel(problem_, key_, target_, mk(0), builder_, *runner_, *cache, opts_, {}, {pair});
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : TuneReport{};
  };
  runner_->times[t] = 8;
  TuneReport fast = run("v1");
  EXPECT_EQ(fast.best_str, t);
  EXPECT_EQ(fast.best_extern, "cublaslt+epilogue");
  EXPECT_EQ(entries().at(t).extern_library, "cublaslt+epilogue");
  runner_->times[t] = 30;
  TuneReport slow = run("v2");
  EXPECT_EQ(slow.best_extern, "");
  EXPECT_EQ(slow.best, mk(0));
  ASSERT_EQ(slow.externs.size(), 1u);
  EXPECT_EQ(slow.externs[0].time.median_us, 30) << "listed with its measurement";
}

TEST_F(TunerTest, AnExternCandidateThatFailsIsInvalidAndTheConfigsStillWin) {
  for (int i = 0; i < 3; ++i) set(i, 100, 20 + i);
  runner_->fail.insert("extern=cublaslt");
  TuneReport r;
  {
    opts_.space = [](const TuneProblem&, const TargetInfo&) { return mks(3); };
    std::unique_ptr<TuneCache> cache = open_cache();
    Result<TuneReport> t = tune_kernel(problem_, key_, target_, mk(0), builder_, *runner_, *cache, opts_, {}, {lib("v1")});
    ASSERT_TRUE(t.ok());
    r = *t;
  }
  EXPECT_EQ(r.best_extern, "");
  EXPECT_EQ(r.best, mk(0));
  ASSERT_EQ(r.externs.size(), 1u);
  EXPECT_FALSE(r.externs[0].measured);
  EXPECT_NE(r.externs[0].reason.find("illegal memory access"), std::string::npos) << r.externs[0].reason;
  EXPECT_EQ(entries().at("extern=cublaslt").status, CacheEntry::Status::Invalid);
}

}  // namespace autotune_tuner_test
}  // namespace sf
