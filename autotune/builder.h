// The Builder/Runner split of the tuner, as in TVM's measure infrastructure: a
// Builder compiles one candidate config into something a Runner can time, and
// build_all() compiles many at once on a thread pool with a per-candidate
// deadline. A candidate whose compile fails or runs past its deadline is marked
// invalid with the reason; the tuner never waits on it again.
//
// A compile that runs past its deadline cannot be cancelled (LLVM has no such
// hook): its thread is left to finish in the background and its result is
// dropped. docs/autotuning.md says why we accept that instead of compiling in
// child processes.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autotune/cache.h"
#include "autotune/config.h"
#include "autotune/measure.h"

namespace sf {

// What a Builder made of one config: opaque to the tuner, handed to the Runner.
struct Artifact {
  virtual ~Artifact() = default;
};

struct BuildResult {
  std::shared_ptr<Artifact> artifact;        // null when the build failed
  std::string error;                         // why it failed ("" on success)
  std::optional<KernelResources> resources;  // NVPTX builds: ptxas's report
  std::string code_hash;                     // hash of the generated code and launch: equal hashes, equal kernels
  double build_ms = 0;
  // NVPTX builds: the launch the Runner will use (the cost model's occupancy input).
  int threads_per_block = 0;
  int64_t dynamic_shared_bytes = 0;
  int64_t grid_blocks = 0;
  // The kernel's multiply-adds run on tensor cores (its PTX has mma.sync or wgmma):
  // the cost model prices it at the arch's tensor-core rate instead of FP32 FMA;
  // `wgmma`: by sm_90a's warpgroup MMA, which reaches the dense peak mma.sync does not.
  bool tensor_cores = false;
  bool wgmma = false;
  bool tf32 = false;  // its tensor-core operands are TF32 (--allow-tf32): the TF32 rate
  // Reductions: how often the kernel reads each row: 1 when it holds rows in registers,
  // else once per pass (softmax's multi-pass form reads 3 times).
  int row_reads = 1;
};

class Builder {
 public:
  virtual ~Builder() = default;
  // Must be callable from several threads at once.
  virtual BuildResult build(const KernelConfig& c) = 0;
};

class Runner {
 public:
  virtual ~Runner() = default;
  // Times one built candidate; a Diag when it cannot run it (the config is then invalid).
  virtual Result<Measurement> run(const Artifact& a, const BenchOptions& opts) = 0;
};

struct BuildPoolOptions {
  int threads = 0;                                     // 0: the hardware's concurrency
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // per candidate
};

// Builds every config, at most `threads` at a time; results in the configs' order.
// A build past its deadline gets error "compile timed out after N s"; one that
// throws gets the exception's text. `on_done(i)` (optional) is called, from the
// calling thread, as each result becomes final.
// The builder is shared with the worker threads, so a compile abandoned at its
// deadline can finish after build_all() has returned.
std::vector<BuildResult> build_all(std::shared_ptr<Builder> builder, const std::vector<KernelConfig>& configs,
                                   const BuildPoolOptions& opts,
                                   const std::function<void(size_t)>& on_done = {});

}  // namespace sf
