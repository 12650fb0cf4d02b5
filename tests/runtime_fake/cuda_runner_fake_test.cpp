// The CUDA Runner (autotune/cuda_runner.h) against the fake driver
// (tests/fake_cuda/README.md): which calls it makes and what it does on failure,
// without a GPU. The fake runs no kernel code and each launch takes exactly 10 us
// of its clock, so these tests check the plumbing — a faulting candidate is
// invalid and the next one still measures, a JIT error carries the log, short
// kernels are timed in CUDA graphs, the L2 flush buffer is written before every
// timed repetition — never real timings (tests/autotune/cuda_runner_test.cpp does
// that on a GPU).
#include <dlfcn.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "autotune/cuda_runner.h"
#include "autotune/tune_split.h"
#include "tests/result_util.h"
#include "tests/runtime_fake/call_log.h"

namespace sf {
namespace runtime_fake_cuda_runner_fake_test {

#ifdef FAKE_CUDA_LIB
// This binary runs on the fake whatever the environment says: driver() reads the
// variable on its first call, after this has run.
const bool kUseFake = [] {
  ::setenv("SHARDFUSE_LIBCUDA", FAKE_CUDA_LIB, 1);
  return true;
}();
constexpr const char* kFakeLib = FAKE_CUDA_LIB;
#else
// Registered with ENVIRONMENT SHARDFUSE_LIBCUDA=<the fake> instead.
const bool kUseFake = true;
const char* const kFakeLib = std::getenv("SHARDFUSE_LIBCUDA");
#endif

struct Hooks {
  long long (*stat)(const char*) = nullptr;
  int (*set)(const char*, long long) = nullptr;
};

// The fake's test hooks, or nulls when the driver is not the fake.
const Hooks& hooks() {
  static const Hooks h = [] {
    Hooks x;
    (void)kUseFake;
    if (!kFakeLib || !cuda::driver()) return x;
    void* lib = ::dlopen(kFakeLib, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return x;
    x.stat = reinterpret_cast<long long (*)(const char*)>(::dlsym(lib, "fake_cuda_stat"));
    x.set = reinterpret_cast<int (*)(const char*, long long)>(::dlsym(lib, "fake_cuda_set"));
    return x;
  }();
  return h;
}

long long stat(const char* name) { return hooks().stat ? hooks().stat(name) : -2; }

#define REQUIRE_FAKE()                                                                        \
  do {                                                                                        \
    if (!hooks().stat) GTEST_SKIP() << "not running on the fake driver (tests/fake_cuda)"; \
  } while (0)

// Event times are float milliseconds: 10 us reads back as 9.99999995 us.
constexpr double kUs = 1e-6;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A module with one entry of our ABI (two pointers: one input, one output).
std::string ptx(const std::string& entry, const std::string& extra = "") {
  return ".version 8.0\n.target sm_90a\n.address_size 64\n" + extra + "\n.visible .entry " + entry +
         "(\n\t.param .u64 in0,\n\t.param .u64 out0\n)\n{\n\tret;\n}\n";
}

PtxArtifact artifact(const std::string& entry, const std::string& extra = "") {
  PtxArtifact a;
  a.ptx = ptx(entry, extra);
  a.entry = entry;
  a.launch.grid = {4, 1, 1};
  a.launch.block = {128, 1, 1};
  a.inputs = {{DType::F32, 512}};
  a.outputs = {{DType::F32, 512}};
  return a;
}

CudaRunnerOptions small() {
  CudaRunnerOptions o;
  o.flush_bytes = int64_t{1} << 20;  // the fake's memory is host memory: keep it small
  // The fake's launches take 10 us, which float event times read back as a hair
  // under 10: time them one by one unless a test asks for graphs.
  o.graph_below_us = 5;
  return o;
}

BenchOptions quick() {
  BenchOptions b;
  b.warmup_ms = 1;
  b.rep_ms = 1;
  b.min_reps = 5;
  b.max_reps = 7;
  return b;
}

std::unique_ptr<CudaRunner> runner(const CudaRunnerOptions& o = small()) {
  Result<std::unique_ptr<CudaRunner>> r =
      CudaRunner::create({random_tensor(DType::F32, {512}, 1)}, {{DType::F32, 512}}, o);
  if (!r) throw std::runtime_error(r.error().message);
  return std::move(r).value();
}


TEST(CudaRunnerFake, MeasuresWithEventsOnTheFakeClock) {
  REQUIRE_FAKE();
  auto r = runner();
  EXPECT_EQ(r->device().name, "shardfuse fake GPU");
  long long launches = stat("launches");
  Result<Measurement> m = r->run(artifact("sf_ok"), quick());
  ASSERT_TRUE(m) << m.error().message;
  // Every launch is 10 us of fake time: exactly 10 us, every repetition.
  EXPECT_NEAR(m->median_us, 10.0, kUs);
  EXPECT_NEAR(m->min_us, 10.0, kUs);
  EXPECT_NEAR(m->max_us, 10.0, kUs);
  EXPECT_GE(m->reps, 5);
  EXPECT_LE(m->reps, 7);
  EXPECT_FALSE(r->last_run().graph_mode) << "10 us is not under the 5 us threshold";
  EXPECT_NEAR(r->last_run().estimate_us, 10.0, kUs);
  // A probe launch, three for the estimate, then warm-up and the timed ones.
  EXPECT_EQ(stat("launches") - launches, 1 + r->last_run().timed_runs);
  EXPECT_EQ(stat("last_args"), 2) << "one pointer per input and output";
  EXPECT_EQ(stat("sticky"), 0);
}

// A TMA candidate (sm_90a wgmma fed by TMA): its tensor maps are encoded over the
// runner's input buffers (a TMA store's over its output buffers) and passed after the
// outputs at every launch; a map over an input or output the kernel lacks is refused
// before anything runs.
TEST(CudaRunnerFake, TensorMapsAreEncodedOverTheRunnersInputs) {
  REQUIRE_FAKE();
  auto r = runner();
  PtxArtifact a;
  a.entry = "sf_tma";
  a.ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n\n.visible .entry sf_tma(\n\t.param .u64 in0,\n\t.param "
          ".u64 out0,\n\t.param .u64 tmap0\n)\n{\n\tret;\n}\n";
  a.launch.grid = {4, 1, 1};
  a.launch.block = {128, 1, 1};
  a.inputs = {{DType::F32, 512}};
  a.outputs = {{DType::F32, 512}};
  a.tensor_maps.push_back(PlanTensorMap{0, DType::F32, 2, {32, 16, 1}, {128, 0}, {32, 16, 1}});
  const long long maps = stat("tensor_maps");
  Result<Measurement> m = r->run(a, quick());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(stat("tensor_maps") - maps, 1) << "encoded once per run";
  EXPECT_EQ(stat("last_args"), 3) << "input, output, tensor map";
  a.tensor_maps[0].input = 1;
  Result<Measurement> bad = r->run(a, quick());
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().message, "tensor map of input 1: the kernel has 1 inputs")) << bad.error().message;
  // A TMA store's map (tma_store=1), over the output: encoded too, and one over an
  // output the kernel lacks refused.
  a.tensor_maps[0].input = 0;
  PlanTensorMap store{0, DType::F32, 2, {32, 16, 1}, {128, 0}, {32, 16, 1}};
  store.output = 0;
  a.tensor_maps.push_back(store);
  a.ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n\n.visible .entry sf_tma(\n\t.param .u64 in0,\n\t.param "
          ".u64 out0,\n\t.param .u64 tmap0,\n\t.param .u64 tmap1\n)\n{\n\tret;\n}\n";
  const long long maps2 = stat("tensor_maps");
  Result<Measurement> st = r->run(a, quick());
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(stat("tensor_maps") - maps2, 2);
  EXPECT_EQ(stat("last_args"), 4) << "input, output, the input's map, the output's";
  a.tensor_maps[1].output = 1;
  Result<Measurement> bad_out = r->run(a, quick());
  ASSERT_FALSE(bad_out);
  EXPECT_TRUE(has(bad_out.error().message, "tensor map of output 1: the kernel has 1 outputs")) << bad_out.error().message;
}

TEST(CudaRunnerFake, AFaultMarksTheCandidateInvalidAndTheNextOneStillMeasures) {
  REQUIRE_FAKE();
  auto r = runner();
  long long resets = stat("resets");
  Result<Measurement> bad = r->run(artifact("sf_fault_k"), quick());
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().message, "CUDA_ERROR_ILLEGAL_ADDRESS")) << bad.error().message;
  EXPECT_TRUE(has(bad.error().message, "the context was reset")) << bad.error().message;
  EXPECT_TRUE(r->last_run().recovered);
  EXPECT_EQ(r->recoveries(), 1);
  EXPECT_FALSE(r->lost());
  EXPECT_EQ(stat("resets"), resets + 1);
  EXPECT_EQ(stat("sticky"), 0) << "the reset cleared the fault";
  // The runner allocates its buffers again in the new context and goes on.
  Result<Measurement> good = r->run(artifact("sf_ok"), quick());
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_NEAR(good->median_us, 10.0, kUs);
  EXPECT_FALSE(r->last_run().recovered);
}

TEST(CudaRunnerFake, AFaultThatOutlivesTheResetLeavesCudaUnusableAndSaysSo) {
  REQUIRE_FAKE();
  // As driver 580 did on an H200: the reset succeeds, and retaining the context
  // again returns the fault.
  ASSERT_EQ(hooks().set("sticky_for_process", 1), 0);
  auto r = runner();
  Result<Measurement> bad = r->run(artifact("sf_fault_k"), quick());
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().message, "CUDA_ERROR_ILLEGAL_ADDRESS")) << bad.error().message;
  EXPECT_TRUE(has(bad.error().message, "CUDA cannot be used again in this process")) << bad.error().message;
  EXPECT_TRUE(r->lost());
  // Every later candidate fails at once, naming why, without calling the driver.
  const long long launches = stat("launches");
  Result<Measurement> next = r->run(artifact("sf_ok"), quick());
  ASSERT_FALSE(next);
  EXPECT_TRUE(has(next.error().message, "an earlier candidate's fault left CUDA unusable")) << next.error().message;
  EXPECT_EQ(stat("launches"), launches);
  // The fake (not a real driver) can be put back for the tests after this one.
  ASSERT_EQ(hooks().set("sticky_for_process", 0), 0);
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary();
  ASSERT_TRUE(ctx);
  ASSERT_TRUE(succeeded((*ctx)->reset()));
  EXPECT_EQ(stat("sticky"), 0);
}

TEST(CudaRunnerFake, AFaultSeenOnlyAtTheSynchronisationIsCaughtToo) {
  REQUIRE_FAKE();
  // As on a GPU: the launch returns success and the fault shows at the next call.
  ASSERT_EQ(hooks().set("async_errors", 1), 0);
  auto r = runner();
  Result<Measurement> bad = r->run(artifact("sf_fault_async"), quick());
  hooks().set("async_errors", 0);
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().message, "faulted")) << bad.error().message;
  EXPECT_TRUE(has(bad.error().message, "CUDA_ERROR_ILLEGAL_ADDRESS")) << bad.error().message;
  EXPECT_EQ(r->recoveries(), 1);
  Result<Measurement> good = r->run(artifact("sf_ok"), quick());
  EXPECT_TRUE(good) << good.error().message;
}

TEST(CudaRunnerFake, ALaunchErrorIsInvalidWithoutAReset) {
  REQUIRE_FAKE();
  auto r = runner();
  PtxArtifact a = artifact("sf_big_block");
  a.launch.block = {2048, 1, 1};  // over 1024 threads: CUDA_ERROR_INVALID_VALUE, not sticky
  long long resets = stat("resets");
  Result<Measurement> bad = r->run(a, quick());
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().message, "failed to launch")) << bad.error().message;
  EXPECT_TRUE(has(bad.error().message, "CUDA_ERROR_INVALID_VALUE")) << bad.error().message;
  EXPECT_EQ(r->recoveries(), 0);
  EXPECT_EQ(stat("resets"), resets);
  EXPECT_TRUE(r->run(artifact("sf_ok"), quick()));
}

TEST(CudaRunnerFake, AJitErrorIsInvalidWithTheJitLog) {
  REQUIRE_FAKE();
  auto r = runner();
  Result<Measurement> bad = r->run(artifact("sf_bad_ptx", "// FAKE_JIT_ERROR"), quick());
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().message, "JIT")) << bad.error().message;
  EXPECT_TRUE(has(bad.error().message, "fake JIT error at FAKE_JIT_ERROR")) << bad.error().message;
  EXPECT_EQ(r->recoveries(), 0);
  EXPECT_TRUE(r->run(artifact("sf_ok"), quick()));
}

TEST(CudaRunnerFake, ShortKernelsAreTimedInCudaGraphs) {
  REQUIRE_FAKE();
  CudaRunnerOptions o = small();
  o.graph_below_us = 20;   // the fake's 10 us launches count as short
  o.graph_target_us = 100;  // -> 10 launches per graph
  auto r = runner(o);
  long long launches = stat("launches");
  CallLog log;
  Result<Measurement> m = r->run(artifact("sf_short"), quick());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(r->last_run().graph_mode);
  EXPECT_EQ(r->last_run().launches_per_timing, 10);
  // The graph's time divided by its launches: still 10 us per launch.
  EXPECT_NEAR(m->median_us, 10.0, kUs);
  // Every timed run after the estimate replays the graph of 10 launches.
  const int graph_runs = r->last_run().timed_runs - 3;
  EXPECT_EQ(static_cast<int>(log.lines("graph launch nodes=10").size()), graph_runs);
  EXPECT_EQ(stat("launches") - launches, 1 + 3 + 10 * graph_runs);
  // One flush per timed repetition, that is per graph, not per launch.
  EXPECT_EQ(r->last_run().flushes, m->reps);
}

TEST(CudaRunnerFake, TheFlushBufferIsWrittenBeforeEveryTimedRepetition) {
  REQUIRE_FAKE();
  auto r = runner();
  CallLog log;
  Result<Measurement> m = r->run(artifact("sf_flushed"), quick());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(r->last_run().flushes, m->reps);
  std::vector<std::string> sets = log.lines("memset32 ");
  ASSERT_EQ(static_cast<int>(sets.size()), m->reps);
  // The whole 1 MiB buffer, with a new value each time.
  std::set<std::string> values;
  for (const std::string& l : sets) {
    std::istringstream in(l);
    std::string word, ptr, value, bytes;
    in >> word >> ptr >> value >> bytes;
    EXPECT_EQ(bytes, std::to_string(1 << 20)) << l;
    values.insert(value);
  }
  EXPECT_EQ(values.size(), sets.size());
  // Without flushing, nothing is written.
  CallLog quiet;
  BenchOptions b = quick();
  b.flush_cache = false;
  ASSERT_TRUE(r->run(artifact("sf_flushed"), b));
  EXPECT_EQ(r->last_run().flushes, 0);
  EXPECT_TRUE(quiet.lines("memset32 ").empty());
}

TEST(CudaRunnerFake, OutputsAreZeroedBeforeEveryRunWhenTheLaunchAddsIntoThem) {
  REQUIRE_FAKE();
  auto r = runner();
  PtxArtifact a = artifact("sf_split_k");
  a.zero_outputs = true;
  CallLog log;
  Result<Measurement> m = r->run(a, quick());
  ASSERT_TRUE(m) << m.error().message;
  // Before the probe launch, each estimate launch and every measured run.
  EXPECT_EQ(r->last_run().zeroings, 1 + r->last_run().timed_runs);
  std::vector<std::string> zeroes = log.lines("memset8 ");
  ASSERT_EQ(static_cast<int>(zeroes.size()), r->last_run().zeroings);
  for (const std::string& l : zeroes) EXPECT_TRUE(has(l, " 0 2048")) << l;  // byte 0 over 512 floats
  PtxArtifact plain = artifact("sf_plain");
  ASSERT_TRUE(r->run(plain, quick()));
  EXPECT_EQ(r->last_run().zeroings, 0);
}

// A split-K kernel's workspace: allocated and zeroed once per candidate (the kernel
// leaves it zero, so nothing is cleared between runs, nor between the launches of a
// CUDA graph), passed after the outputs; the fake driver faults an argument that is
// not an allocation.
TEST(CudaRunnerFake, AWorkspaceIsZeroedOnceAndPassedLast) {
  REQUIRE_FAKE();
  for (bool graphs : {false, true}) {
    CudaRunnerOptions o = small();
    if (graphs) o.graph_below_us = 1000;
    auto r = runner(o);
    PtxArtifact a = artifact("sf_split_ws");
    a.ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n\n.visible .entry sf_split_ws(\n\t.param .u64 in0,\n"
            "\t.param .u64 out0,\n\t.param .u64 ws\n)\n{\n\tret;\n}\n";
    a.workspace_bytes = 2052;
    CallLog log;
    Result<Measurement> m = r->run(a, quick());
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(r->last_run().zeroings, 0);
    EXPECT_EQ(r->last_run().graph_mode, graphs);
    std::vector<std::string> zeroes = log.lines("memset8 ");
    ASSERT_EQ(zeroes.size(), 1u) << graphs;
    EXPECT_TRUE(has(zeroes[0], " 0 2052")) << zeroes[0];
    std::vector<std::string> launches = log.lines("launch sf_split_ws ");
    ASSERT_FALSE(launches.empty());
    for (const std::string& l : launches) EXPECT_TRUE(has(l, " args=3 ")) << l;
  }
}

// A persistent candidate (LaunchShape::persistent) is measured as exec launches it:
// with at most the blocks the device holds at once. 400 blocks of 1024 threads on
// the fake's 132 SMs (2 blocks an SM): 264; the same grid not persistent keeps 400.
TEST(CudaRunnerFake, APersistentCandidateLaunchesAtMostTheBlocksTheDeviceHolds) {
  REQUIRE_FAKE();
  for (bool persistent : {true, false}) {
    auto r = runner();
    PtxArtifact a = artifact("sf_walk");
    a.launch.grid = {400, 1, 1};
    a.launch.block = {1024, 1, 1};
    a.persistent = persistent;
    CallLog log;
    Result<Measurement> m = r->run(a, quick());
    ASSERT_TRUE(m) << m.error().message;
    std::vector<std::string> launches = log.lines("launch sf_walk ");
    ASSERT_FALSE(launches.empty());
    for (const std::string& l : launches)
      EXPECT_TRUE(has(l, persistent ? " grid=264,1,1 " : " grid=400,1,1 ")) << persistent << ": " << l;
  }
}

// The split tuner's candidate files keep a kernel's workspace and whether its grid is
// persistent, and both are part of what a measurement is of.
TEST(TuneSplitFake, AWorkspaceSurvivesTheCandidateFiles) {
  TuneCandidateKernel k{"key0", "k0_matmul", "graph ...", {{DType::F32, {512}}}, {8}, {{DType::F32, {512}}}, {}};
  PtxArtifact a = artifact("sf_split_ws");
  a.workspace_bytes = 2052;
  a.persistent = true;
  PtxArtifact plain = artifact("sf_split_ws");
  EXPECT_NE(tune_code_hash(a), tune_code_hash(plain));
  PtxArtifact walk = plain;
  walk.persistent = true;
  EXPECT_NE(tune_code_hash(walk), tune_code_hash(plain));
  k.candidates.push_back(TuneCandidate{"split_k=4", tune_code_hash(a), a, nullptr});
  const std::string dir = std::filesystem::temp_directory_path() / ("sf-ws-cands-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_tune_candidates({"sm_90a", {k}}, dir).ok());
  Result<TuneCandidateSet> back = read_tune_candidates(dir);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->kernels.at(0).candidates.at(0).artifact.workspace_bytes, 2052);
  EXPECT_TRUE(back->kernels.at(0).candidates.at(0).artifact.persistent);
}

// Replaces the first `from` with `to` in each of the candidate files under `dir`
// that holds it (a hand edit of what tune --emit-candidates wrote); whether any did.
bool edit_candidate_files(const std::string& dir, const std::string& from, const std::string& to) {
  bool edited = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(from);
    if (at == std::string::npos) continue;
    text.replace(at, from.size(), to);
    std::ofstream(e.path()) << text;
    edited = true;
  }
  return edited;
}

// A clustered candidate keeps its cluster through the candidate files; one whose grid
// is not whole clusters is refused when they are read.
TEST(TuneSplitFake, ClustersSurviveTheCandidateFiles) {
  TuneCandidateKernel k{"key0", "k0_matmul", "graph ...", {{DType::F32, {512}}}, {8}, {{DType::F32, {512}}}, {}};
  PtxArtifact a = artifact("sf_cluster");
  a.persistent = true;
  a.launch.grid = {4, 1, 1};
  a.launch.cluster = 2;
  k.candidates.push_back(TuneCandidate{"cluster_m=2", tune_code_hash(a), a, nullptr});
  const std::string dir = std::filesystem::temp_directory_path() / ("sf-cl-cands-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_tune_candidates({"sm_90a", {k}}, dir).ok());
  Result<TuneCandidateSet> back = read_tune_candidates(dir);
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->kernels.at(0).candidates.at(0).artifact.launch.cluster, 2);
  ASSERT_TRUE(edit_candidate_files(dir, "\"cluster\": 2", "\"cluster\": 3"));
  Result<TuneCandidateSet> bad = read_tune_candidates(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().str(), "grid: is not whole clusters of 3")) << bad.error().str();
}

// A TMA candidate's maps survive the candidate files, a TMA store's (over an output)
// as such; one over an output the kernel lacks is refused when the files are read.
TEST(TuneSplitFake, TensorMapsSurviveTheCandidateFiles) {
  TuneCandidateKernel k{"key0", "k0_matmul", "graph ...", {{DType::F32, {512}}}, {8}, {{DType::F32, {512}}}, {}};
  PtxArtifact a = artifact("sf_tma_store");
  a.tensor_maps.push_back(PlanTensorMap{0, DType::F32, 2, {32, 16, 1}, {128, 0}, {32, 16, 1}});
  PlanTensorMap store{0, DType::F32, 2, {32, 16, 1}, {128, 0}, {32, 16, 1}};
  store.output = 0;
  a.tensor_maps.push_back(store);
  k.candidates.push_back(TuneCandidate{"tma_store=1", tune_code_hash(a), a, nullptr});
  const std::string dir = std::filesystem::temp_directory_path() / ("sf-tma-cands-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_tune_candidates({"sm_90a", {k}}, dir).ok());
  Result<TuneCandidateSet> back = read_tune_candidates(dir);
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->kernels.at(0).candidates.at(0).artifact.tensor_maps, a.tensor_maps);
  // The same files with the store's map over output 1.
  ASSERT_TRUE(edit_candidate_files(dir, "\"output\": 0", "\"output\": 1"));
  Result<TuneCandidateSet> bad = read_tune_candidates(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(bad);
  EXPECT_TRUE(has(bad.error().str(), "tensor_maps[1].output: no such output")) << bad.error().str();
}

TEST(CudaRunnerFake, ArgumentsThatAreNotTheRunnersAreRefused) {
  REQUIRE_FAKE();
  auto r = runner();
  PtxArtifact a = artifact("sf_other");
  a.outputs = {{DType::BF16, 512}};
  Result<Measurement> m = r->run(a, quick());
  ASSERT_FALSE(m);
  EXPECT_TRUE(has(m.error().message, "bf16[512]")) << m.error().message;
  struct NotPtx final : Artifact {};
  EXPECT_FALSE(r->run(NotPtx{}, quick()));
}

#ifdef FAKE_CUBLAS_LIB
// An extern candidate (a library GEMM) through the same measurement as a kernel: the
// fake cuBLAS (tests/fake_cublas) advances the fake clock by $FAKE_CUBLAS_NS per call.
TEST(CudaRunnerFake, TimesALibraryGemmOnTheSameClockAsKernels) {
  REQUIRE_FAKE();
  ::setenv("SHARDFUSE_LIBCUBLAS", FAKE_CUBLAS_LIB, 1);  // before cublas::api()'s first call
  ::setenv("SHARDFUSE_LIBCUBLASLT", FAKE_CUBLAS_LIB, 1);
  ::setenv("FAKE_CUBLAS_NS", "20000", 1);
  CallLog log("sf-runner-gemm");
  Result<std::unique_ptr<CudaRunner>> made = CudaRunner::create(
      {random_tensor(DType::F32, {64, 32}, 1), random_tensor(DType::F32, {48, 32}, 2), random_tensor(DType::F32, {48}, 3)},
      {{DType::F32, 64 * 48}}, small());
  ASSERT_TRUE(made) << made.error().message;
  CudaRunner& r = **made;
  GemmArtifact g;
  g.desc = cublas::linear_gemm(GemmLibrary::CublasLt, DType::F32, 64, 48, 32, GemmEpilogue::BiasRelu);
  g.a = 0;
  g.b = 1;
  g.bias = 2;
  g.c = 0;
  Result<Measurement> m = r.run(g, quick());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_NEAR(m->median_us, 20.0, kUs) << "the library's time, read by the same events";
  EXPECT_FALSE(r.last_run().graph_mode);
  const std::vector<std::string> calls = log.lines("cublasLtMatmul ");
  EXPECT_EQ(static_cast<int>(calls.size()), 1 + r.last_run().timed_runs) << "the probe, then every timed run";
  ASSERT_FALSE(calls.empty());
  EXPECT_TRUE(has(calls[0], "m=48 n=64 k=32 batch=1 transa=T transb=N lda=32 ldb=32 ldc=48 ")) << calls[0];
  EXPECT_TRUE(has(calls[0], "epilogue=bias_relu compute=32F workspace=33554432")) << calls[0];
  EXPECT_EQ(static_cast<int>(log.lines("memset32 ").size()), r.last_run().flushes) << "flushed like a kernel";

  // Arguments the runner does not have, and a GEMM the library has no algorithm for.
  GemmArtifact wrong = g;
  wrong.c = 1;
  Result<Measurement> w = r.run(wrong, quick());
  ASSERT_FALSE(w);
  EXPECT_TRUE(has(w.error().message, "not one of the runner's outputs")) << w.error().message;
  ::setenv("FAKE_CUBLASLT_NO_ALGO", "1", 1);
  Result<Measurement> none = r.run(g, quick());
  ::unsetenv("FAKE_CUBLASLT_NO_ALGO");
  ASSERT_FALSE(none);
  EXPECT_TRUE(has(none.error().message, "cuBLASLt has no algorithm for cublaslt f32 [64x48x32]")) << none.error().message;
  EXPECT_TRUE(r.run(g, quick())) << "and the next one measures";
}
// Library GEMMs in the split tuner (autotune/tune_split.h): recorded as candidates
// beside the PTX ones, written and read back whole, measured on this machine's
// (here the fake) cuBLASLt and cuBLAS with their versions recorded, and replayed by
// code hash. A cuBLASLt call that takes bias + ReLU whole, and the split candidate:
// cuBLAS's bare product into a buffer of its own, then an epilogue kernel that reads
// it and the bias.
TEST(TuneSplitFake, LibraryGemmCandidatesAreWrittenMeasuredAndReplayed) {
  REQUIRE_FAKE();
  ::setenv("SHARDFUSE_LIBCUBLAS", FAKE_CUBLAS_LIB, 1);
  ::setenv("SHARDFUSE_LIBCUBLASLT", FAKE_CUBLAS_LIB, 1);
  ::setenv("FAKE_CUBLAS_NS", "20000", 1);
  TuneCandidateKernel k{"key0", "k0_matmul_add_relu", "graph ...", {}, {8, 8, 8}, {}, {}};
  k.params = {{DType::F32, {64, 32}}, {DType::F32, {48, 32}}, {DType::F32, {48}}};
  k.outputs = {{DType::F32, {64, 48}}};
  GemmArtifact whole;
  whole.desc = cublas::linear_gemm(GemmLibrary::CublasLt, DType::F32, 64, 48, 32, GemmEpilogue::BiasRelu);
  whole.a = 0, whole.b = 1, whole.bias = 2, whole.c = 0;
  GemmArtifact split;
  split.desc = cublas::linear_gemm(GemmLibrary::Cublas, DType::F32, 64, 48, 32, GemmEpilogue::None);
  split.a = 0, split.b = 1, split.c = kGemmProduct;
  auto epi = std::make_shared<PtxArtifact>();
  epi->entry = "k0_epilogue";
  epi->ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k0_epilogue(\n\t.param .u64 in0,\n"
             "\t.param .u64 in1,\n\t.param .u64 out0\n)\n{\n\tret;\n}\n";
  epi->launch.grid = {12, 1, 1};
  epi->launch.block = {256, 1, 1};
  epi->inputs = {{DType::F32, 64 * 48}, {DType::F32, 48}};
  epi->outputs = {{DType::F32, 64 * 48}};
  split.epilogue = epi;
  split.epilogue_in = {kGemmProduct, 2};
  split.epilogue_out = {0};

  std::unique_ptr<Runner> rec = make_recording_runner(&k);
  for (const GemmArtifact* g : {&whole, &split, &whole}) {
    Result<Measurement> r = rec->run(*g, quick());
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().message, "recorded for tune --measure");
  }
  ASSERT_EQ(k.candidates.size(), 2u) << "one candidate per code";
  EXPECT_EQ(k.candidates[0].config, "extern=cublaslt");
  EXPECT_EQ(k.candidates[1].config, "extern=cublas+epilogue");
  EXPECT_NE(k.candidates[0].code, k.candidates[1].code);

  const std::string dir = std::filesystem::temp_directory_path() / ("sf-split-cands-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_tune_candidates({"sm_90a", {k}}, dir).ok());
  Result<TuneCandidateSet> back = read_tune_candidates(dir);
  ASSERT_TRUE(back) << back.error().str();
  ASSERT_EQ(back->kernels.at(0).candidates.size(), 2u);
  const TuneCandidate& w = back->kernels[0].candidates[0];
  const TuneCandidate& sp = back->kernels[0].candidates[1];
  ASSERT_TRUE(w.gemm && sp.gemm);
  EXPECT_EQ(w.gemm->desc, whole.desc);
  EXPECT_EQ(std::vector<int>({w.gemm->a, w.gemm->b, w.gemm->bias, w.gemm->c}), std::vector<int>({0, 1, 2, 0}));
  EXPECT_FALSE(w.gemm->epilogue);
  EXPECT_EQ(sp.gemm->desc, split.desc);
  ASSERT_TRUE(sp.gemm->epilogue);
  EXPECT_EQ(sp.gemm->epilogue->ptx, epi->ptx);
  EXPECT_EQ(sp.gemm->epilogue_in, split.epilogue_in);
  EXPECT_EQ(sp.code, tune_code_hash(split));

  CallLog log("sf-split-gemm");
  Result<TuneMeasurements> m = measure_tune_candidates(*back, quick());
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_EQ(m->results.size(), 2u);
  ASSERT_TRUE(m->results[0].time) << m->results[0].error;
  ASSERT_TRUE(m->results[1].time) << m->results[1].error;
  EXPECT_NEAR(m->results[0].time->median_us, 20.0, 1e-3) << "one library call";
  EXPECT_NEAR(m->results[1].time->median_us, 30.0, 1e-3) << "the call, then the epilogue's 10 us launch";
  EXPECT_FALSE(log.lines("cublasLtMatmul m=48 n=64 k=32 batch=1 transa=T transb=N").empty());
  EXPECT_FALSE(log.lines("cublasGemmEx ").empty());
  EXPECT_TRUE(m->libraries.error.empty()) << m->libraries.error;
  EXPECT_FALSE(m->libraries.cublas_version.empty());
  EXPECT_FALSE(m->libraries.cublaslt_version.empty());
  ASSERT_TRUE(write_tune_measurements(*m, dir).ok());
  Result<TuneMeasurements> mb = read_tune_measurements(dir);
  ASSERT_TRUE(mb) << mb.error().str();
  EXPECT_EQ(mb->libraries.cublaslt_version, m->libraries.cublaslt_version);
  std::unique_ptr<Runner> replay = make_replay_runner(*mb, dir);
  Result<Measurement> again = replay->run(split, quick());
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->median_us, m->results[1].time->median_us);
  GemmArtifact other = whole;
  other.desc.lda = 64;
  Result<Measurement> none = replay->run(other, quick());
  ASSERT_FALSE(none);
  EXPECT_TRUE(has(none.error().message, "not in " + dir + "/measurements.json")) << none.error().message;

  // Edited or hostile library candidates are refused, naming the field.
  std::ifstream in(dir + "/candidates.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  struct Case {
    std::string key;
    nlohmann::json value;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"a", 7, "kernels[0].candidates[0].gemm.a"},
           {"library", "openblas", "kernels[0].candidates[0].gemm.library"},
           {"k", int64_t{1} << 40, "kernels[0].candidates[0].gemm.k"},
           {"c", -1, "kernels[0].candidates[0].gemm.c"},
           {"lda", 64, "kernels[0].candidates[0].code"},
       }) {
    SCOPED_TRACE(c.key);
    nlohmann::json bad = j;
    bad["kernels"][0]["candidates"][0]["gemm"][c.key] = c.value;
    std::ofstream(dir + "/candidates.json") << bad.dump(1);
    Result<TuneCandidateSet> r = read_tune_candidates(dir);
    ASSERT_FALSE(r);
    EXPECT_TRUE(has(r.error().str(), c.says)) << r.error().str();
  }
  nlohmann::json bad = j;
  bad["kernels"][0]["candidates"][1]["gemm"]["epilogue_in"] = {kGemmProduct};
  std::ofstream(dir + "/candidates.json") << bad.dump(1);
  Result<TuneCandidateSet> r = read_tune_candidates(dir);
  ASSERT_FALSE(r);
  EXPECT_TRUE(has(r.error().str(), "not one per argument of the epilogue kernel")) << r.error().str();
  std::filesystem::remove_all(dir);
}
#endif

}  // namespace runtime_fake_cuda_runner_fake_test
}  // namespace sf
