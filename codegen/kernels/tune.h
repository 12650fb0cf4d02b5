// The autotuner's codegen side: what autotune/ cannot know without LLVM. It turns
// a fused kernel into a TuneProblem and a cache key, builds candidates (host code
// through the ORC JIT, or PTX checked by ptxas), times host candidates, and tunes
// or looks up every distinct kernel of a set of rank programs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autotune/tuner.h"
#include "codegen/dist/local_program.h"
#include "codegen/kernels/emitter.h"

namespace sf {

// The tuning problem of a fused kernel; a Diag for kinds no emitter covers.
Result<TuneProblem> tune_problem(const LocalKernel& k);

// The config codegen uses when nothing was tuned: KernelConfig{} with, for GPU
// reductions, the emitter's suggestion for the row shape.
KernelConfig default_kernel_config(const LocalKernel& k, ConfigTarget t);

// The key's target and toolchain fields: "host:<LLVM CPU name>:<model>" or the
// arch; "llvm 19.1.7" plus "; ptxas V13.0.88" for GPU targets.
std::string target_id(const TargetInfo& t);
std::string toolchain_id(ConfigTarget t);

// Candidate builders for one kernel. The host builder JIT-compiles each config into
// `jit` (one JITDylib per config); the artifact is a callable entry. The PTX builder
// emits and compiles PTX for `arch` and runs ptxas for resources; its artifact holds
// the PTX and launch shape (for the CUDA Runner).
std::shared_ptr<Builder> make_host_builder(const LocalKernel& k, std::shared_ptr<llvmb::HostJit> jit);
std::shared_ptr<Builder> make_ptx_builder(const LocalKernel& k, const std::string& arch);

// Times host artifacts of `k` on seeded random inputs of its params' shapes.
std::unique_ptr<Runner> make_host_runner(const LocalKernel& k, uint64_t seed = 1);

// A Runner that cannot run anything, saying why (no CUDA device here).
std::unique_ptr<Runner> make_unavailable_runner(std::string why);

// The PTX a PTX builder made (for tests and the CUDA Runner).
struct PtxArtifact final : Artifact {
  std::string ptx, entry;
  LaunchShape launch;
};

struct TuneSetup {
  std::string device = "cpu";     // cpu: host code, timed here; cuda: PTX for `arch`
  std::string arch = "sm_90a";
  ShapeBuckets buckets = ShapeBuckets::Exact;
};

// A kernel's config and where it came from.
struct KernelChoice {
  KernelConfig config;
  ConfigSource source = ConfigSource::Default;
  std::string text;  // config_str
};

// One line of `shardfuse tune` per distinct kernel, and the choice per key hash.
struct GraphTuneResult {
  std::vector<TuneReport> reports;
  std::map<std::string, KernelChoice> choices;  // TuneKey::hash() -> choice
  size_t cache_hits = 0, measured_kernels = 0;
};

// Tunes every distinct kernel (by key) of `programs` on the setup's target, with the
// setup's runner (host timing for cpu; for cuda, `gpu_runner`, or an unavailable one
// when null). Progress goes to `progress` with the kernel's index and count.
Result<GraphTuneResult> tune_programs(const std::vector<LocalProgram>& programs, const TuneSetup& setup,
                                      TuneCache& cache, const TuneOptions& opts,
                                      const std::function<void(size_t, size_t, const TuneProgress&)>& progress = {},
                                      Runner* gpu_runner = nullptr);

// Looks up each kernel's config in the cache (its best measured entry), else the
// default. For `run` and `compile`.
class ConfigChooser {
 public:
  ConfigChooser(TuneSetup setup, TuneCache* cache);  // cache may be null: defaults only
  KernelChoice choose(const LocalKernel& k) const;
  // Choices fixed in advance (a table agreed by every rank) take precedence.
  void set_table(std::map<std::string, KernelChoice> table) { table_ = std::move(table); }
  // The key of `k` on this chooser's target; nullopt for kinds without emitter.
  std::optional<TuneKey> key_of(const LocalKernel& k) const;
  const TargetInfo& target() const { return target_; }

 private:
  TuneSetup setup_;
  TuneCache* cache_;
  TargetInfo target_;
  std::string toolchain_;
  std::map<std::string, KernelChoice> table_;
  mutable std::map<std::string, KernelChoice> memo_;
  mutable std::mutex mu_;
};

// The choices table as text ("<key hash> <config text>" per line, sorted) and back;
// what rank 0 broadcasts so that every rank runs the same configs.
std::string choices_to_text(const std::map<std::string, KernelChoice>& t);
Result<std::map<std::string, KernelChoice>> choices_from_text(const std::string& s);

}  // namespace sf
