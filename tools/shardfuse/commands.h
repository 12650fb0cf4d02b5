// The shardfuse subcommands. Each registers its options on the app and returns the
// exit code through the callback it installs.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <set>

#include "codegen/ir/graph.h"
#include "codegen/ir/limits.h"
#include "autotune/cache.h"
#include "autotune/measure.h"
#include "codegen/dist/local_program.h"
#include "runtime/core/device_mesh.h"
#include "codegen/dist/plan_graph.h"
#include "codegen/dist/propagate.h"
#include "codegen/fusion/collective_matmul.h"
#include "codegen/llvm/backend.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/plan/plan_exec.h"

namespace sf::cli {

void add_check(CLI::App& app, int& exit_code);
void add_run(CLI::App& app, int& exit_code);
void add_explain(CLI::App& app, int& exit_code);
void add_compile(CLI::App& app, int& exit_code);
void add_tune(CLI::App& app, int& exit_code);
// The split tuner's GPU half (measure.cpp, in both builds): `tune --measure DIR`, and
// the timing options it shares with `tune`.
struct BenchCliOptions {
  double warmup_ms = 10, rep_ms = 40;
  int max_reps = 100;
};
void add_bench_options(CLI::App* cmd, BenchCliOptions& o);
BenchOptions bench_options(const BenchCliOptions& o);
int tune_measure(const std::string& dir, const BenchOptions& bench);
void add_tune_measure_only(CLI::App& app, int& exit_code);  // the runtime-only build's `tune`
void add_simulate(CLI::App& app, int& exit_code);
void add_exec(CLI::App& app, int& exit_code);  // the only one besides check without LLVM

// Option checks for what CLI11's own let through (each refusal is a usage error,
// exit 2): CLI::Range passes NaN; a uint64_t option takes "-1" as 2^64-1 and
// 2^64 as 2^64-1; an empty string reads as "not given".
CLI::Validator finite_range(double lo, double hi);  // a finite number in [lo, hi]
CLI::Validator uint64_text();                       // a decimal integer in [0, 2^64)
CLI::Validator non_empty();                         // not ''

// Parses and verifies a graph file, printing the located error on failure.
std::optional<Graph> load_graph(const std::string& path);

// `d` as "file:line:col: error: ...". A Diag located in the graph (a line:col from
// the evaluator or the executor, which see nodes, not files) but without a file
// gets the graph file the command loaded last (load_graph), so no error reads
// "3:7: error: ..." alone.
std::string diag_str(Diag d);
// Prints a failed command's Diag and returns its exit status: 3 with "internal
// error" for a bug (Diag::internal), else 1, as diag_str or, with `context`, as
// "<context>: error: <message>".
int report_failure(const Diag& d, const std::string& context = "");

// `--world N` against the graph's mesh. On a mesh of one dim, N resizes that dim
// (a graph written for tp=4 runs on 3 ranks, with uneven shards); on an N-D mesh N
// must equal the product. Returns the graph to run, or nullopt after printing why not.
std::optional<Graph> resolve_world(Graph g, std::optional<int64_t> world);

// --dump-after: the set of stages to print, or nullopt (after printing why) for an
// unknown stage name: parse, propagate, the pipeline's stages (pipeline.h), emit.
std::optional<std::set<std::string>> parse_dump_after(const std::string& arg);
// The printer, for rank `rank` of the graph's mesh: prints parse and propagate at
// once; observer() goes into the RankPipelineOptions of the command's own pipeline
// run and prints each wanted stage as it runs ("(unchanged)" when it changed nothing),
// so what is printed is what the command ran; emit() then prints the LLVM IR of the
// last stage's kernels for `target`.
class PipelineDump {
 public:
  // `comm`: the links propagation prices with (perf_model), as the command's own run.
  PipelineDump(const Graph& g, std::set<std::string> want, int rank, const CommRates& comm = default_comm_rates());
  std::function<void(std::string_view, const std::vector<LocalProgram>&)> observer();
  void emit(const llvmb::Target& target) const;

 private:
  std::set<std::string> want_;
  int rank_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::string last_text_;
  std::optional<LocalProgram> last_;
};
// --verify-each: check every rank's programs after each pipeline stage
// (codegen/fusion/verify_programs.h); a broken stage is an internal error (exit 3).
void add_verify_each_option(CLI::App* cmd);

// --decompose auto|always|never and --no-decompose (collective-matmul decomposition),
// shared by explain, run, compile and simulate; with them (but on simulate, whose
// --system is its own and required) --system FILE, the system file whose links and
// GPU price the command's choices (autotune/system.h).
struct DecomposeCliOptions {
  std::string mode = "auto";
  bool never = false;
  std::string system;
};
void add_decompose_options(CLI::App* cmd, DecomposeCliOptions& o, bool system_option = true);
void add_system_option(CLI::App* cmd, std::string& path);
DecomposeMode decompose_mode(const DecomposeCliOptions& o);
// The one performance model a command's choices use (docs/performance-model.md): the
// --system file's links (propagation and decomposition) and GPU rates (decomposition
// and the compile report), else the default links and `*arch`'s row of the arch table.
// `arch` (may be null: no check) is the GPU arch the command builds for: when empty
// it becomes the system's arch, else sm_90a; a system whose GPU is another arch is an
// error. Returns nullopt after printing why (an unreadable or invalid system file).
std::optional<DecomposeOptions> perf_model(const DecomposeCliOptions& o, std::string* arch, bool allow_tf32);

// --precision fused|eager (Precision, autotune/config.h), on compile and run.
void add_precision_option(CLI::App* cmd, std::string& value);
Precision precision_of(const std::string& value);
void add_allow_tf32_option(CLI::App* cmd, bool& value);
void add_no_tma_option(CLI::App* cmd, bool& value);

// The tuning cache options shared by tune, run, compile and explain.
struct CacheCliOptions {
  std::string dir;                 // --cache; empty: TuneCache::default_dir()
  std::string buckets = "exact";   // --shape-buckets
};
void add_cache_options(CLI::App* cmd, CacheCliOptions& o);
ShapeBuckets parse_buckets(const std::string& s);
// Opens (creating) the cache directory. When it cannot: an error (and *failed set)
// if the cache is `required` or `dir` was given explicitly, else a warning; null
// either way, and kernels then use default configs.
std::unique_ptr<TuneCache> open_tune_cache(const std::string& dir, bool required, bool* failed = nullptr);
// Every rank's fused program, split where the target's emitters cannot go, with the
// shardings chosen and collective matmuls decomposed as `model` says (perf_model),
// so the kernels tuned are the ones the run or the Plan will have (on cuda, unset
// rates are `arch`'s, as compile prices them).
Result<std::vector<LocalProgram>> programs_for_tuning(const Graph& g, const std::string& device, const std::string& arch,
                                              bool fuse, const DecomposeOptions& model = {});

// --- shared by run and exec (exec.cpp; no LLVM) -----------------------------------

// Each parameter's global tensor: DIR/<param>.npy, or seeded random values.
std::optional<std::vector<Tensor>> load_inputs(const Graph& g, const std::string& inputs_dir, uint64_t seed);
// Global inputs -> each rank's local tensors, by the Plan's param placements.
std::vector<std::vector<Tensor>> shard_inputs(const Graph& g, const PlanPlacements& placed, const DeviceMesh& mesh,
                                              const std::vector<Tensor>& global);
// Each rank's local outputs -> global outputs, by the Plan's output placements;
// nullopt after printing why.
std::optional<std::vector<Tensor>> gather_outputs(const Graph& g, const PlanPlacements& placed, const DeviceMesh& mesh,
                                                  const std::vector<std::vector<Tensor>>& per_rank);
// Prints every output (and with `check`, its error against the reference evaluator
// on `inputs`), saves them to `outputs_dir` if given; the exit code.
// `allow_tf32`: f32 matmuls may have multiplied in TF32 (check_tolerance).
// `fused16`: the kernels ran under --precision fused; a float output computed from
// f16/bf16 values that misses the eager reference is checked against the one without
// 16-bit rounding (evaluate_unrounded.h), and one that misses both gets a note on
// stderr naming --precision eager.
int report_outputs(const Graph& g, const std::vector<Tensor>& out, const std::vector<Tensor>& inputs, bool check,
                   const std::string& outputs_dir, bool allow_tf32 = false, bool fused16 = false);

// How the ranks of a GPU run spread over GPUs and run their collectives.
struct GpuCommOptions {
  std::string collectives = "auto";  // auto | nccl | host
  int gpus = 0;                      // 0: min(world, the GPUs there are)
  int nccl_max_ctas = 0;             // 0: NCCL's default
};
void add_gpu_comm_options(CLI::App* cmd, GpuCommOptions& o);

struct GpuCliOptions {
  GpuCommOptions comm;
  // One process per GPU: this process runs rank `rank` only, meeting its peers
  // through the directory `rendezvous`.
  std::optional<int> rank;
  std::string rendezvous;
  std::string inputs_dir, outputs_dir;
  uint64_t seed = 0;
  bool check = false;
  bool allow_tf32 = false;  // --check: f32 matmuls may have run in TF32 (check_tolerance)
  bool cuda_graph = false;
  double timeout_s = 60;
  std::string trace_file;  // --trace: a Chrome trace of the run
  // When the command started (the options are made as the process starts):
  // --timeout bounds set-up and connecting together, from here.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};
void add_gpu_options(CLI::App* cmd, GpuCliOptions& o);
// GPU 0, if there is one and it runs PTX for `arch` ("" for any); else nullopt
// after printing why ("no CUDA device: ...").
std::optional<cuda::DeviceInfo> cuda_device_for(const std::string& arch);
// Runs the Plan of graph `g` on the GPUs, every rank a thread, and reports like `run`.
int run_plan_cuda(const Graph& g, const PlanSource& src, const GpuCliOptions& o);
// The same on the host CPU when `host` is given: the Plan's host code through the
// same executor (runtime/plan/plan_host.h).
int run_plan(const Graph& g, const PlanSource& src, const GpuCliOptions& o, std::shared_ptr<const HostKernels> host);

}  // namespace sf::cli
