// tune_kernel() with extern candidates (library GEMMs) beside the generated configs,
// and the default top-k: the fixture of tuner_test.cpp (tuner_test_fixture.h).
#include "tests/autotune/tuner_test_fixture.h"

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
