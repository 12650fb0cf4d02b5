// The tuner split across two machines (docs/autotuning.md, "Tuning on a GPU machine
// without LLVM"), for GPU machines that have the driver but no LLVM:
//   here (LLVM):  tune G.sf --device cuda --arch A --emit-candidates DIR
//                 the candidates tuning would measure, per distinct kernel: their PTX,
//                 launch shapes and arguments (candidates.json, one .ptx each)
//   GPU machine:  tune --measure DIR   (the runtime-only build: the CUDA Runner)
//                 every candidate timed as `tune --device cuda` times it;
//                 measurements.json records the device, its driver and the times
//   here:         tune G.sf --device cuda --arch A --import DIR --cache C
//                 the tuner run again with those times in place of a device
// Both files are read as hostile input: every field checked and named by its path.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autotune/cache.h"
#include "autotune/measure.h"
#include "runtime/core/diag.h"
#include "autotune/cuda_runner.h"

namespace sf {

struct TuneCandidate {
  std::string config;  // config_str of the (first) config that built this code; "extern=<library>" for a library GEMM
  std::string code;    // tune_code_hash of the artifact: what the measurement is of
  PtxArtifact artifact;
  // A library GEMM (an extern candidate, with or without its epilogue kernel) in
  // place of `artifact`: the GPU machine's cuBLAS or cuBLASLt runs it.
  std::shared_ptr<const GemmArtifact> gemm;
};

struct TuneCandidateKernel {
  std::string key;    // TuneKey::hash() where emitted (for the record)
  std::string name;   // "k0_matmul"
  std::string group;  // the kernel's group graph as .sf text (for the record)
  // The group's params (what the runner fills: random_tensors(params, int_bounds, 1),
  // the inputs the in-process tuner gives it) and its outputs.
  std::vector<TensorType> params;
  std::vector<int64_t> int_bounds;  // per param: integers are drawn from [0, bound)
  std::vector<TensorType> outputs;
  std::vector<TuneCandidate> candidates;
};

struct TuneCandidateSet {
  std::string arch;
  std::vector<TuneCandidateKernel> kernels;
};

// What a measurement is of: a hash of the PTX and the launch shape; of a library
// GEMM, its call (library, sizes, strides, epilogue), arguments and epilogue kernel.
std::string tune_code_hash(const PtxArtifact& a);
std::string tune_code_hash(const GemmArtifact& g);

// DIR/candidates.json and one .ptx per candidate, written into a fresh sibling
// directory that then replaces DIR. DIR must be absent, empty, or a candidate
// directory written before (its marker file says so); anything else is refused.
Result<void> write_tune_candidates(const TuneCandidateSet& s, const std::string& dir);
Result<TuneCandidateSet> read_tune_candidates(const std::string& dir);

struct TuneMeasurement {
  std::string kernel;  // TuneCandidateKernel::key
  std::string code;    // TuneCandidate::code
  std::string config;
  std::optional<Measurement> time;  // absent: it could not run; `error` says why
  std::string error;
};

struct TuneMeasurements {
  std::string device;      // "NVIDIA H100 80GB HBM3"
  std::string arch;        // "sm_90a"
  int driver_version = 0;  // 13000
  std::string date;        // UTC, ISO 8601
  std::vector<TuneMeasurement> results;
  // The GPU machine's cuBLAS and cuBLASLt (their versions key the cached library
  // measurements), or why it has none.
  GemmLibraries libraries;
  // Not written: a candidate's fault left CUDA unusable in this process, so the
  // candidates after it were not measured (tune --measure starts again for them).
  bool stopped_at_fault = false;
};

// The split tuner's Runners, in place of a device. Recording (--emit-candidates):
// each PTX or library GEMM candidate it is asked to measure is added to `k` (once per
// code hash), and every run is a Diag ("recorded for tune --measure"), so nothing is
// chosen. Replaying (--import): the time `m` holds for the candidate's code hash, a
// Diag naming `dir` when it has none, or the GPU's error when it failed there.
std::unique_ptr<Runner> make_recording_runner(TuneCandidateKernel* k);
std::unique_ptr<Runner> make_replay_runner(const TuneMeasurements& m, const std::string& dir);

// DIR/measurements.json (written to a temporary file, then renamed).
Result<void> write_tune_measurements(const TuneMeasurements& m, const std::string& dir);
Result<TuneMeasurements> read_tune_measurements(const std::string& dir);

// Times every candidate on CUDA device 0, as `tune --device cuda` does: per kernel a
// CUDA Runner over its group's seeded random inputs (random_inputs, seed 1), each
// candidate with `opts`, a library GEMM through this machine's cuBLAS or cuBLASLt. A candidate that fails is recorded with its error. A Diag
// when there is no device, or the device is not the candidates' arch.
// `done`: results of an earlier run on the same device, kept instead of measuring
// those candidates again. A fault that leaves CUDA unusable in the process
// (CudaRunner::lost) ends the run there, with stopped_at_fault set.
Result<TuneMeasurements> measure_tune_candidates(const TuneCandidateSet& s, const BenchOptions& opts,
                                                 const std::function<void(const std::string&)>& progress = {},
                                                 const TuneMeasurements* done = nullptr);

}  // namespace sf
