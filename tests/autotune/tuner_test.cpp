// tune_kernel() end to end with a fake Builder and Runner: what is built, what is
// measured, what the cache keeps across runs, and how failures, pruning, ranking,
// duplicates, the budget and concurrent tuners are handled. The fakes answer from
// tables keyed by config text, so every assertion is exact; no assertion is on
// wall-clock time (the budget test only relies on sleep_for's lower bound).
#include "tests/autotune/tuner_test_fixture.h"

namespace sf {
namespace autotune_tuner_test {

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
