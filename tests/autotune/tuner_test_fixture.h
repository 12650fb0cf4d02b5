// The fixture of the tuner's tests (tuner_test.cpp, tuner_extern_test.cpp):
// tune_kernel() with a fake Builder and Runner that answer from tables keyed by
// config text, so every assertion is exact.
#pragma once

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
#include "autotune/tuner.h"

namespace sf {
namespace autotune_tuner_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr KernelKind kKind = KernelKind::Pointwise;

inline std::string text(const KernelConfig& c) { return config_str(kKind, ConfigTarget::Gpu, c); }

// Config i of the test spaces: only max_blocks differs (one-shot grid, so it
// changes nothing the rules look at), which makes every text distinct.
inline KernelConfig mk(int i) {
  KernelConfig c;
  c.block = 256;
  c.vector = 4;
  c.elems_per_thread = 1;
  c.grid_stride = false;
  c.max_blocks = 1000 + i;
  return c;
}

inline std::vector<KernelConfig> mks(int n) {
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

inline std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

inline std::set<std::string> texts(std::initializer_list<int> ids) {
  std::set<std::string> s;
  for (int i : ids) s.insert(text(mk(i)));
  return s;
}

inline bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
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

}  // namespace autotune_tuner_test
}  // namespace sf
