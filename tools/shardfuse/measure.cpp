// `shardfuse tune --measure DIR`: the GPU machine's half of the split tuner
// (autotune/tune_split.h). In the runtime-only build (no LLVM) it is all `tune` does.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <vector>

#include "autotune/tune_split.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace {

// Runs this program again with the same arguments (after a fault that left CUDA
// unusable in this process: only a new process gets a working driver). Returns only
// on failure.
std::string exec_self_again() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (args.empty()) return "cannot read /proc/self/cmdline";
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  return std::string("cannot run /proc/self/exe: ") + std::strerror(errno);
}

}  // namespace

int tune_measure(const std::string& dir, const BenchOptions& bench) {
  Result<TuneCandidateSet> s = read_tune_candidates(dir);
  if (!s) {
    std::cerr << s.error().str() << "\n";
    return 1;
  }
  size_t n = 0;
  for (const TuneCandidateKernel& k : s->kernels) n += k.candidates.size();
  // Started again after a fault: what the earlier process measured stays.
  std::optional<TuneMeasurements> done;
  if (const char* r = std::getenv("SHARDFUSE_TUNE_RESUME"); r && std::string(r) == "1") {
    if (Result<TuneMeasurements> d = read_tune_measurements(dir)) done = std::move(d).value();
    ::unsetenv("SHARDFUSE_TUNE_RESUME");
  }
  const size_t have = done ? std::min(done->results.size(), n) : 0;
  std::cout << "measuring " << n - have << " candidate(s) of " << s->kernels.size()
            << " kernel(s) for " << s->arch << "\n";
  Result<TuneMeasurements> m = measure_tune_candidates(
      *s, bench, [](const std::string& line) { std::cout << "  " << line << "\n"; }, done ? &*done : nullptr);
  if (!m) {
    std::cerr << "error: " << m.error().message << "\n";
    return 1;
  }
  if (Result<void> err = write_tune_measurements(*m, dir); !err.ok()) {
    std::cerr << err.error().str() << "\n";
    return 1;
  }
  if (m->stopped_at_fault) {
    // The faulting candidate is recorded (failed), so every new process gets further.
    std::cout << "a candidate's fault left CUDA unusable in this process; starting again for the "
              << n - m->results.size() << " candidate(s) left" << std::endl;
    ::setenv("SHARDFUSE_TUNE_RESUME", "1", 1);
    std::cerr << "error: " << exec_self_again() << "\n";
    return 1;
  }
  size_t failed = 0;
  for (const TuneMeasurement& r : m->results) failed += !r.time;
  std::cout << "wrote " << dir << "/measurements.json: " << m->results.size() - failed << " measured, " << failed
            << " failed, on " << m->device << " (driver " << m->driver_version << "); bring it back and run: "
            << "shardfuse tune GRAPH --device cuda --arch " << m->arch << " --import " << dir << "\n";
  return 0;
}

void add_bench_options(CLI::App* cmd, BenchCliOptions& o) {
  cmd->add_option("--warmup-ms", o.warmup_ms, "warm-up time per candidate (default 10)")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--rep-ms", o.rep_ms, "timed time per candidate (default 40)")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--max-reps", o.max_reps, "most timed repetitions per candidate (default 100)")
      ->check(CLI::Range(1, 100000));
}

BenchOptions bench_options(const BenchCliOptions& o) {
  BenchOptions b;
  b.warmup_ms = o.warmup_ms;
  b.rep_ms = o.rep_ms;
  b.max_reps = o.max_reps;
  b.min_reps = std::min(b.min_reps, o.max_reps);
  return b;
}

void add_tune_measure_only(CLI::App& app, int& exit_code) {
  struct Options {
    std::string dir;
    BenchCliOptions bench;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("tune", "Measure the candidates `tune --emit-candidates` wrote (the GPU machine's half "
                                         "of the split tuner)");
  cmd->add_option("--measure", o->dir, "the candidate directory; measurements.json is written into it")->required();
  add_bench_options(cmd, o->bench);
  cmd->footer("The full build's `tune` also emits candidates and imports measurements (docs/autotuning.md,\n"
              "\"Tuning on a GPU machine without LLVM\").\nExample:\n  shardfuse tune --measure cands/");
  cmd->callback([o, &exit_code] { exit_code = tune_measure(o->dir, bench_options(o->bench)); });
}

}  // namespace sf::cli
