// `shardfuse tune --measure DIR`: the GPU machine's half of the split tuner
// (runtime/tune_split.h). In the runtime-only build (no LLVM) it is all `tune` does.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "runtime/tune_split.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

int tune_measure(const std::string& dir, const BenchOptions& bench) {
  Result<TuneCandidateSet> s = read_tune_candidates(dir);
  if (!s) {
    std::cerr << s.error().str() << "\n";
    return 1;
  }
  size_t n = 0;
  for (const TuneCandidateKernel& k : s->kernels) n += k.candidates.size();
  std::cout << "measuring " << n << " candidate(s) of " << s->kernels.size() << " kernel(s) for " << s->arch << "\n";
  Result<TuneMeasurements> m = measure_tune_candidates(*s, bench, [](const std::string& line) {
    std::cout << "  " << line << "\n";
  });
  if (!m) {
    std::cerr << "error: " << m.error().message << "\n";
    return 1;
  }
  if (std::optional<Diag> err = write_tune_measurements(*m, dir)) {
    std::cerr << err->str() << "\n";
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
