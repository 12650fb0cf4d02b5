#include "autotune/tuner.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <set>

#include "autotune/cost_model.h"
#include "autotune/space.h"

namespace sf {

std::string_view config_source_name(ConfigSource s) {
  switch (s) {
    case ConfigSource::Default: return "default";
    case ConfigSource::Cache: return "cache";
    case ConfigSource::Tuned: return "tuned";
  }
  return "?";
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

std::vector<bool> measured_set(const std::vector<std::string>& ranked, int top_k, const std::vector<bool>& is_default) {
  // A matmul's schedule: the model prices tiles, not how a schedule overlaps a
  // tile's epilogue with the next one's loads and products. Ping-pong counts each
  // tile height as its own schedule: a 64-row consumer tile reads a whole 256-wide B
  // tile for its products, a 128-row one (two m64 steps) a B tile half as wide,
  // which the model does not weigh either (on an H200 the 64 x 256 one measured
  // 1.45x the cooperative winner's time: bench/results/tune-h200-run7/).
  // Register reallocation (setmaxnreg) is a schedule of its own too: what the
  // consumers' extra registers buy (longer epilogue batches, freer scheduling) is
  // not in the model either, nor what TMA stores (tma_store) save the consumers, nor
  // what a cluster's multicast (cluster_m, cluster_n) saves L2. So is
  // each of an attention's wgmma forms (sm_90a, plain and pipelined): how they compare
  // with mma.sync is an estimate.
  auto schedule = [](const std::string& text) {
    Result<KernelConfig> c = parse_config_str(text);
    return c ? std::to_string(c->warp_specialize) + (c->persistent > 0 ? "p" : "") +
                   (c->pingpong ? "pp" + std::to_string(c->block_m) : "") + (c->setmaxnreg ? "r" : "") + (c->tma_store ? "t" : "") +
                   (c->cluster_m > 1 ? "cm" : "") + (c->cluster_n > 1 ? "cn" : "") + (c->wgmma ? "w" + std::to_string(c->wgmma) : "")
             : "";
  };
  std::set<std::string> schedules;
  for (size_t i = 0; i < ranked.size() && static_cast<int>(i) < top_k; ++i) schedules.insert(schedule(ranked[i]));
  std::vector<bool> out(ranked.size(), false);
  for (size_t i = 0; i < ranked.size(); ++i)
    out[i] = static_cast<int>(i) < top_k || (i < is_default.size() && is_default[i]) || schedules.insert(schedule(ranked[i])).second;
  return out;
}

Result<TuneReport> tune_kernel(const TuneProblem& problem, const TuneKey& key, const TargetInfo& target,
                               const KernelConfig& default_config, std::shared_ptr<Builder> builder,
                               Runner& runner, TuneCache& cache, const TuneOptions& opts,
                               const std::function<void(const TuneProgress&)>& progress,
                               const std::vector<ExternCandidate>& externs) {
  const auto t0 = Clock::now();
  const ConfigTarget ct = target.kind;
  TuneReport r;
  r.kernel = problem.name;
  r.key = key;
  auto text = [&](const KernelConfig& c) { return config_str(problem.kind, ct, c); };
  auto report = [&](const std::string& phase, size_t done, size_t total, double best) {
    if (progress) progress(TuneProgress{problem.name, phase, done, total, best});
  };

  // Concurrent tuners of the same key wait here; the second then finds everything cached.
  Result<TuneCache::Lock> lock = cache.lock(key);
  if (!lock) return lock.error();
  std::map<std::string, CacheEntry> entries = cache.load(key);
  for (std::string& w : cache.take_warnings()) r.warnings.push_back(std::move(w));

  // The space, in order, without duplicate texts; the default config always in it.
  std::vector<KernelConfig> space = opts.space ? opts.space(problem, target) : config_space(problem, target);
  const std::string default_text = text(default_config);
  std::vector<KernelConfig> candidates;
  std::set<std::string> seen;
  bool default_in_space = false;
  for (const KernelConfig& c : space) {
    std::string t = text(c);
    if (!seen.insert(t).second) continue;
    if (t == default_text) default_in_space = true;
  }
  r.space = seen.size();
  seen.clear();
  if (!default_in_space) space.insert(space.begin(), default_config);
  for (const KernelConfig& c : space) {
    std::string t = text(c);
    if (!seen.insert(t).second) continue;
    if (t != default_text && opts.prune) {
      if (rule_reject(problem, c, target)) {
        ++r.rule_pruned;
        continue;
      }
    }
    candidates.push_back(c);
  }

  auto store = [&](const CacheEntry& e) {
    entries[e.config] = e;
    if (Result<void> d = cache.store(key, e); !d.ok()) r.warnings.push_back(d.error().message);
  };

  // Build what the cache knows nothing about, in parallel.
  std::map<std::string, std::shared_ptr<Artifact>> artifacts;
  std::vector<KernelConfig> to_build;
  for (const KernelConfig& c : candidates)
    if (!entries.count(text(c))) to_build.push_back(c);
  auto record_build = [&](const KernelConfig& c, const BuildResult& b) {
    CacheEntry e;
    e.config = text(c);
    e.cfg = c;
    e.when = now_utc();
    e.resources = b.resources;
    e.code_hash = b.code_hash;
    if (!b.artifact) {
      e.status = CacheEntry::Status::Invalid;
      e.reason = b.error.empty() ? "the build produced nothing" : b.error;
    } else if (std::optional<std::string> why = resource_reject(problem, c, target, b)) {
      e.status = CacheEntry::Status::Pruned;
      e.reason = *why;
    } else {
      e.status = CacheEntry::Status::Built;
      e.predicted_us = predict_us(problem, c, target, b);
      artifacts[e.config] = b.artifact;
    }
    store(e);
  };
  if (!to_build.empty()) {
    size_t done = 0;
    report("build", 0, to_build.size(), 0);
    std::vector<BuildResult> built = build_all(builder, to_build, opts.build, [&](size_t) {
      report("build", ++done, to_build.size(), 0);
    });
    for (size_t i = 0; i < to_build.size(); ++i) record_build(to_build[i], built[i]);
    r.built = to_build.size();
  }

  // Rank the valid candidates: non-spilling first, then by predicted time; one per
  // distinct code (a measured one preferred, then the earlier in the space).
  struct Ranked {
    const CacheEntry* e;
    size_t order;
  };
  std::vector<Ranked> valid;
  std::map<std::string, size_t> by_code;  // code hash -> index in valid
  for (size_t i = 0; i < candidates.size(); ++i) {
    const CacheEntry& e = entries.at(text(candidates[i]));
    if (e.status == CacheEntry::Status::Invalid) {
      ++r.invalid;
      continue;
    }
    if (e.status == CacheEntry::Status::Pruned) {
      ++r.static_pruned;
      continue;
    }
    if (!e.code_hash.empty()) {
      auto [it, fresh] = by_code.emplace(e.code_hash, valid.size());
      if (!fresh) {
        ++r.duplicates;
        Ranked& kept = valid[it->second];
        bool better = e.status == CacheEntry::Status::Measured && kept.e->status != CacheEntry::Status::Measured;
        if (better || (e.config == default_text && kept.e->status != CacheEntry::Status::Measured)) kept.e = &e;
        continue;
      }
    }
    valid.push_back({&e, i});
  }
  auto spills = [](const CacheEntry* e) { return e->resources && e->resources->spills(); };
  std::stable_sort(valid.begin(), valid.end(), [&](const Ranked& a, const Ranked& b) {
    if (spills(a.e) != spills(b.e)) return !spills(a.e);
    return a.e->predicted_us < b.e->predicted_us;
  });
  // The default's code hash; empty when its build failed or the builder sets none,
  // and then it matches no other config (an empty hash says nothing about the code).
  const std::string default_hash = entries.count(default_text) ? entries.at(default_text).code_hash : "";
  auto same_code_as_default = [&](const CacheEntry* e) { return !default_hash.empty() && e->code_hash == default_hash; };
  const int top_k = opts.top_k > 0 ? opts.top_k : std::clamp(static_cast<int>(r.space / 5), 2, 16);
  std::vector<std::string> ranked;
  std::vector<bool> defaults;
  for (const Ranked& v : valid) {
    ranked.push_back(v.e->config);
    defaults.push_back(v.e->config == default_text || same_code_as_default(v.e));
  }
  const std::vector<bool> measure = opts.prune ? measured_set(ranked, top_k, defaults) : std::vector<bool>(valid.size(), true);
  std::vector<const CacheEntry*> chosen;
  for (size_t i = 0; i < valid.size(); ++i) {
    if (measure[i])
      chosen.push_back(valid[i].e);
    else
      ++r.ranked_out;
  }

  // Extern candidates first, so that a tuning budget spent on generated configs
  // never leaves the library baseline unmeasured; same Runner, same options.
  const CacheEntry* best_extern = nullptr;
  for (size_t j = 0; j < externs.size(); ++j) {
    const ExternCandidate& x = externs[j];
    ExternResult res;
    res.library = x.library;
    res.what = x.what;
    const std::string xt = extern_config_str(x.library);
    auto it = entries.find(xt);
    const bool fresh = it != entries.end() && it->second.is_extern() && it->second.extern_version == x.version &&
                       it->second.status != CacheEntry::Status::Built;
    if (!fresh) {
      report("extern", j, externs.size(), 0);
      CacheEntry e;
      e.config = xt;
      e.extern_library = x.library;
      e.extern_version = x.version;
      BenchOptions bench = opts.bench;
      if (opts.budget_s > 0) bench.budget_ms = std::max(1.0, (opts.budget_s - seconds_since(t0)) * 1e3);
      Result<Measurement> m = x.artifact ? runner.run(*x.artifact, bench) : Result<Measurement>(Diag{"", {}, "nothing to run"});
      e.when = now_utc();
      if (!m) {
        e.status = CacheEntry::Status::Invalid;
        e.reason = "run failed: " + m.error().message;
      } else {
        e.status = CacheEntry::Status::Measured;
        e.measurement = *m;
        ++r.measured;
      }
      store(e);
      it = entries.find(xt);
    } else {
      res.reused = it->second.status == CacheEntry::Status::Measured;
      if (res.reused) ++r.reused;
    }
    const CacheEntry& e = it->second;
    res.measured = e.status == CacheEntry::Status::Measured;
    res.time = e.measurement;
    res.reason = e.reason;
    if (res.measured && (!best_extern || e.measurement.median_us < best_extern->measurement.median_us)) best_extern = &e;
    r.externs.push_back(std::move(res));
  }
  if (!externs.empty()) report("extern", externs.size(), externs.size(), best_extern ? best_extern->measurement.median_us : 0);

  // Measure the chosen ones the cache has no time for.
  std::vector<std::string> to_measure;
  for (const CacheEntry* e : chosen) {
    if (e->status == CacheEntry::Status::Measured)
      ++r.reused;
    else
      to_measure.push_back(e->config);
  }
  double best_us = 0;
  for (const CacheEntry* e : chosen)
    if (e->status == CacheEntry::Status::Measured && (best_us == 0 || e->measurement.median_us < best_us))
      best_us = e->measurement.median_us;
  for (size_t j = 0; j < to_measure.size(); ++j) {
    if (opts.budget_s > 0 && seconds_since(t0) > opts.budget_s) {
      r.budget_exhausted = true;
      r.warnings.push_back("tuning budget of " + std::to_string(opts.budget_s) + " s spent after measuring " +
                           std::to_string(j) + " of " + std::to_string(to_measure.size()) + " candidates");
      break;
    }
    report("measure", j, to_measure.size(), best_us);
    CacheEntry e = entries.at(to_measure[j]);
    std::shared_ptr<Artifact> a = artifacts[e.config];
    if (!a) {  // built in an earlier run: build again to run it
      // Through the pool, like the first build: its deadline, and a throwing
      // builder becomes an error instead of escaping the tuner.
      BuildResult b = std::move(build_all(builder, {e.cfg}, opts.build)[0]);
      if (!b.artifact) {
        e.status = CacheEntry::Status::Invalid;
        e.reason = b.error;
        store(e);
        ++r.invalid;
        continue;
      }
      a = b.artifact;
    }
    BenchOptions bench = opts.bench;
    if (opts.budget_s > 0) bench.budget_ms = std::max(1.0, (opts.budget_s - seconds_since(t0)) * 1e3);
    Result<Measurement> m = runner.run(*a, bench);
    e.when = now_utc();
    if (!m) {
      e.status = CacheEntry::Status::Invalid;
      e.reason = "run failed: " + m.error().message;
      ++r.invalid;
    } else {
      e.status = CacheEntry::Status::Measured;
      e.measurement = *m;
      if (best_us == 0 || m->median_us < best_us) best_us = m->median_us;
      ++r.measured;
    }
    store(e);
  }
  report("measure", to_measure.size(), to_measure.size(), best_us);

  // The best measured candidate of this space.
  const CacheEntry* best = nullptr;
  for (const KernelConfig& c : candidates) {
    const CacheEntry& e = entries.at(text(c));
    if (e.status == CacheEntry::Status::Measured && (!best || e.measurement.median_us < best->measurement.median_us))
      best = &e;
  }
  if (entries.count(default_text) && entries.at(default_text).status == CacheEntry::Status::Measured)
    r.default_time = entries.at(default_text).measurement;
  else if (r.default_time == std::nullopt) {
    // The default's code may have been measured under another config's text.
    for (const Ranked& v : valid)
      if (same_code_as_default(v.e) && v.e->status == CacheEntry::Status::Measured)
        r.default_time = v.e->measurement;
  }
  if (best) {
    r.best_generated = best->config;
    r.best_generated_time = best->measurement;
  }
  if (best_extern && (!best || best_extern->measurement.median_us < best->measurement.median_us)) {
    r.best = default_config;
    r.best_str = best_extern->config;
    r.best_extern = best_extern->extern_library;
    r.best_time = best_extern->measurement;
    r.source = r.measured > 0 ? ConfigSource::Tuned : ConfigSource::Cache;
    return r;
  }
  if (!best) {
    r.warnings.push_back("no config of " + problem.name + " could be measured (" + std::to_string(r.invalid) +
                         " invalid); using the default config");
    r.best = default_config;
    r.best_str = default_text;
    r.source = ConfigSource::Default;
    return r;
  }
  r.best = best->cfg;
  r.best_str = best->config;
  r.best_time = best->measurement;
  r.source = r.measured > 0 ? ConfigSource::Tuned : ConfigSource::Cache;
  return r;
}

std::optional<CacheEntry> cached_choice(TuneCache& cache, const TuneKey& key) {
  std::optional<CacheEntry> best;
  for (auto& [text, e] : cache.load(key))
    if (e.status == CacheEntry::Status::Measured && (!best || e.measurement.median_us < best->measurement.median_us))
      best = e;
  return best;
}

}  // namespace sf
