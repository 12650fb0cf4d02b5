// Tunes one kernel: the space, rule pruning, parallel builds of what the cache
// does not know yet, static pruning on ptxas's resources, cost-model ranking,
// measurement of the top_k (and the default config), the best measured config.
// Every fact learnt about a config is stored under (key, config) at once, so an
// interrupted tuning keeps what it measured, a second run measures nothing, and
// adding a config to a space costs one build.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autotune/builder.h"
#include "autotune/cache.h"
#include "autotune/measure.h"
#include "autotune/problem.h"
#include "autotune/target.h"

namespace sf {

struct TuneOptions {
  // Candidates measured after ranking (plus the default config). 0: a fifth of the
  // space, at least 2 and at most 16, so small spaces are not measured nearly whole.
  int top_k = 0;
  double budget_s = 0;         // per kernel; 0: none. Past it, no further candidate is measured
  bool prune = true;           // false: measure every config that builds (exhaustive)
  BuildPoolOptions build;
  BenchOptions bench;
  std::function<std::vector<KernelConfig>(const TuneProblem&, const TargetInfo&)> space;  // empty: config_space
};

// A library call measured beside a kernel's generated configs (docs/autotuning.md,
// "Extern candidates"), as Inductor's max-autotune measures cuBLAS beside its
// templates: timed by the same Runner with the same BenchOptions, stored under
// extern_config_str(library) with its version, and chosen like any config when it
// is the fastest.
struct ExternCandidate {
  std::string library;  // "cublaslt"
  std::string version;  // the library's; a cached measurement under another version is taken again
  std::shared_ptr<Artifact> artifact;  // what the Runner times
  std::string what;     // for the report: "epilogue bias_relu, B transposed"
};

// The GEMM libraries extern candidates run on: their versions, or why none (or only
// cuBLAS) can be used. This machine's (local_gemm_libraries, autotune/cuda_runner.h),
// or for the split tuner the GPU machine's, as tune --measure recorded them.
struct GemmLibraries {
  std::string error;  // non-empty: no library GEMM can be run (why)
  std::string cublas_version, cublaslt_version;
  std::string cublaslt_error;  // non-empty: cuBLAS without cuBLASLt (why)
};

// What became of one extern candidate in a tuning run.
struct ExternResult {
  std::string library, what;
  bool measured = false;  // `time` holds its measurement (this run's or the cache's)
  bool reused = false;    // the measurement came from the cache
  Measurement time;
  std::string reason;     // not measured: why (the Runner's error)
};

// Where a kernel's config came from.
enum class ConfigSource : uint8_t { Default, Cache, Tuned };
std::string_view config_source_name(ConfigSource s);

// The time now, UTC, ISO 8601 ("2026-11-25T21:03:05Z"): when a measurement was taken.
std::string now_utc();

struct TuneReport {
  std::string kernel;
  TuneKey key;
  size_t space = 0;          // configs in the space
  size_t rule_pruned = 0;    // dropped by rule_reject before compiling
  size_t invalid = 0;        // failed to compile or run, or timed out
  size_t static_pruned = 0;  // dropped on resources (do not fit an SM)
  size_t duplicates = 0;     // same code as another candidate
  size_t ranked_out = 0;     // valid but below top_k in the ranking
  size_t built = 0;          // compiled in this run
  size_t measured = 0;       // measured in this run
  size_t reused = 0;         // measurements taken from the cache
  bool budget_exhausted = false;
  bool cache_hit() const { return built == 0 && measured == 0; }
  KernelConfig best;
  std::string best_str;
  Measurement best_time;
  std::optional<Measurement> default_time;  // the default config's, when it could be measured
  ConfigSource source = ConfigSource::Default;
  // The winner is a library call: its name ("cublaslt"); best_str is then
  // "extern=<library>", best the default config, and best_generated the fastest
  // generated config's text and time.
  std::string best_extern;
  std::string best_generated;
  std::optional<Measurement> best_generated_time;
  std::vector<ExternResult> externs;  // one per extern candidate offered
  std::string extern_note;            // set by the caller: why no (or which) library was offered
  std::vector<std::string> warnings;
};

// What the progress display gets: phase "build" or "measure", j of m done, the best
// median so far (0 when none).
struct TuneProgress {
  std::string kernel;
  std::string phase;
  size_t done = 0, total = 0;
  double best_us = 0;
};

// Which configs of `ranked` (config texts, best predicted first) are measured: the
// first `top_k`, those marked `is_default` (the default config and any with its
// code), and the best-ranked of each matmul schedule (plain, warp-specialised,
// warp-specialised persistent, ping-pong) the first top_k lack: the cost model prices
// tiles, not how a schedule overlaps one tile's epilogue with the next tile's work,
// so it is not trusted to rank schedules against each other.
std::vector<bool> measured_set(const std::vector<std::string>& ranked, int top_k, const std::vector<bool>& is_default);

Result<TuneReport> tune_kernel(const TuneProblem& problem, const TuneKey& key, const TargetInfo& target,
                               const KernelConfig& default_config,
                               std::shared_ptr<Builder> builder, Runner& runner, TuneCache& cache,
                               const TuneOptions& opts, const std::function<void(const TuneProgress&)>& progress = {},
                               const std::vector<ExternCandidate>& externs = {});

// The best measured entry under `key`, if any (what `run` and `compile` use); an
// extern entry (CacheEntry::is_extern) when a library call measured fastest.
std::optional<CacheEntry> cached_choice(TuneCache& cache, const TuneKey& key);

}  // namespace sf
