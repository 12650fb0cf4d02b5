// The autotuner's codegen side: what autotune/ cannot know without LLVM. It turns
// a fused kernel into a TuneProblem and a cache key, builds candidates (host code
// through the ORC JIT, or PTX checked by ptxas), times host candidates, and tunes
// or looks up every distinct kernel of a set of rank programs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autotune/tuner.h"
#include "codegen/dist/local_program.h"
#include "codegen/kernels/emitter.h"
#include "autotune/cuda_runner.h"

namespace sf {

// The tuning problem of a fused kernel; a Diag for kinds no emitter covers.
Result<TuneProblem> tune_problem(const LocalKernel& k);

// The config codegen uses when nothing was tuned: KernelConfig{} with, for GPU
// reductions, the emitter's suggestion for the row shape, and for GPU matmuls that
// can take tensor cores on `arch` (f16/bf16, or f32 under `allow_tf32`, sm_80+), a
// tensor-core tile (suggest_matmul_config; none without an arch), on sm_90a the
// warp-specialised persistent kernel where `tma` lets TMA read the operands.
KernelConfig default_kernel_config(const LocalKernel& k, ConfigTarget t, const std::string& arch = "",
                                   bool allow_tf32 = false, bool tma = true);

// The pointwise default of kernels too small for the persistent grid of wide blocks
// default_kernel_config gives large ones on sm_90+: `c` with 256 threads of one
// vector on up to 4096 blocks (its vector kept). compile falls back to it where the
// wide blocks' 64 registers a thread spill.
KernelConfig narrow_pointwise_default(const KernelConfig& c);

// The GPU that GPU keys are measured on: device 0's name, arch and driver version
// (cuda::device_info), looked up once per process; all empty without a driver or GPU.
struct GpuDeviceId {
  std::string name;        // "NVIDIA H200"
  std::string arch;        // "sm_90a"
  int driver_version = 0;  // 13000 for CUDA 13.0
};
const GpuDeviceId& local_gpu_device();

// The key's target and toolchain fields. Host: "host:<LLVM CPU name>:<model>" and
// "llvm 19.1.7", whatever GPU there is. GPU: the arch, followed by ":<device name>"
// when `dev` is a device of that arch (the cache then records which GPU measured
// the entry), and "llvm 19.1.7; ptxas V13.0.88" followed by "; driver 13000" when
// there is a device (its JIT turns the PTX into machine code, so a new driver can
// change the timings). The one-argument forms use local_gpu_device().
std::string target_id(const TargetInfo& t);
std::string target_id(const TargetInfo& t, const GpuDeviceId& dev);
std::string toolchain_id(ConfigTarget t);
std::string toolchain_id(ConfigTarget t, const GpuDeviceId& dev);

// Candidate builders for one kernel. The host builder JIT-compiles each config into
// `jit` (one JITDylib per config); the artifact is a callable entry. The PTX builder
// emits and compiles PTX for `arch` and runs ptxas for resources; its artifact holds
// the PTX and launch shape (for the CUDA Runner).
std::shared_ptr<Builder> make_host_builder(const LocalKernel& k, std::shared_ptr<llvmb::HostJit> jit);
std::shared_ptr<Builder> make_ptx_builder(const LocalKernel& k, const std::string& arch, bool allow_tf32 = false,
                                          bool tma = true);

// Times host artifacts of `k` on seeded random inputs of its params' shapes.
std::unique_ptr<Runner> make_host_runner(const LocalKernel& k, uint64_t seed = 1);

// Times PTX artifacts of `k` on device 0 (autotune/cuda_runner.h) with its params'
// seeded random values (random_inputs, as the host runner) and its outputs' sizes.
// A Diag without a device ("no CUDA device: ..."), or when `arch` is not the
// device's: candidates built for another arch cannot be measured here.
Result<std::unique_ptr<Runner>> make_cuda_runner(const LocalKernel& k, const std::string& arch, uint64_t seed = 1,
                                                 const CudaRunnerOptions& o = {});

// A Runner that cannot run anything, saying why (no CUDA device here).
std::unique_ptr<Runner> make_unavailable_runner(std::string why);

// The PTX builder's artifact is PtxArtifact (autotune/cuda_runner.h): PTX, entry,
// launch, zero_outputs and the kernel's argument sizes.

struct TuneSetup {
  std::string device = "cpu";     // cpu: host code, timed here; cuda: PTX for `arch`
  std::string arch = "sm_90a";
  ShapeBuckets buckets = ShapeBuckets::Exact;
  // cuda: f32 matmuls may take TF32 tensor cores (--allow-tf32); their keys then
  // say so (" tf32" after the signature), apart from the exact-FMA kernels'.
  bool allow_tf32 = false;
  // cuda, sm_90a: matmul candidates read their operands by TMA (KernelSpec::tma), as
  // compile builds them unless --no-tma.
  bool tma = true;
  // cuda: the GPU the keys name as the measuring one (tune --import: the device that
  // ran tune --measure); unset: local_gpu_device().
  std::optional<GpuDeviceId> gpu = std::nullopt;
  // cuda: the GEMM libraries the extern candidates run on (the split tuner: the GPU
  // machine's, as tune --measure recorded them); unset: this machine's.
  std::optional<GemmLibraries> libraries = std::nullopt;
};

// Makes the Runner that measures kernel `k` (under `key`) instead of a CUDA Runner on
// device 0 (tune --emit-candidates records, tune --import replays).
using GpuRunnerFactory = std::function<std::unique_ptr<Runner>(const LocalKernel& k, const TuneKey& key)>;

// Marks an f32 matmul problem TF32 under setup.allow_tf32 on cuda (TuneProblem::tf32,
// and " tf32" appended to its signature).
void mark_tf32(TuneProblem& p, const TuneSetup& setup);

// A kernel's config and where it came from.
struct KernelChoice {
  KernelConfig config;
  ConfigSource source = ConfigSource::Default;
  std::string text;     // config_str, or extern_config_str(library)
  std::string library;  // a library GEMM won ("cublaslt", "cublas"; codegen/kernels/extern_gemm.h); "" otherwise
};

// One line of `shardfuse tune` per distinct kernel, and the choice per key hash.
struct GraphTuneResult {
  std::vector<TuneReport> reports;
  std::map<std::string, KernelChoice> choices;  // TuneKey::hash() -> choice
  size_t cache_hits = 0, measured_kernels = 0;
};

// Tunes every distinct kernel (by key) of `programs` on the setup's target, with the
// setup's runner: host timing for cpu; for cuda, `gpu_runner` when given, else a
// CUDA Runner per kernel (make_cuda_runner), or, when none can be made (no device),
// one that says why, so every kernel keeps its default config with a warning.
// For cuda, a matmul a library can compute is also measured through it
// (extern_candidates): each report says which library was offered, or why none.
// Progress goes to `progress` with the kernel's index and count.
Result<GraphTuneResult> tune_programs(const std::vector<LocalProgram>& programs, const TuneSetup& setup,
                                      TuneCache& cache, const TuneOptions& opts,
                                      const std::function<void(size_t, size_t, const TuneProgress&)>& progress = {},
                                      Runner* gpu_runner = nullptr, const GpuRunnerFactory& gpu_runners = {});

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
