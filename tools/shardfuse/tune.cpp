// `shardfuse tune G.sf`: autotune every distinct kernel of a graph's rank programs
// into the tuning cache, then make every rank agree on the chosen configs. Also the
// pieces `run`, `compile` and `explain` share to use the cache (--cache,
// --shape-buckets, --autotune).
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "codegen/ir/decompose.h"
#include "codegen/dist/lower.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/printer.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/tune.h"
#include "codegen/reference/evaluate.h"
#include "runtime/comm/agree.h"
#include "runtime/gpu/cuda_driver.h"
#include "autotune/tune_split.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

std::unique_ptr<TuneCache> open_tune_cache(const std::string& dir, bool required, bool* failed) {
  std::string d = dir.empty() ? TuneCache::default_dir() : dir;
  Result<std::unique_ptr<TuneCache>> c = TuneCache::open(d);
  if (failed) *failed = false;
  if (!c) {
    if (required || !dir.empty()) {
      std::cerr << d << ": error: cannot use it as the tuning cache: " << c.error().message << "\n";
      if (failed) *failed = true;
    } else {
      // Reading the default cache is a convenience: without it kernels get default configs.
      std::cerr << "warning: no tuning cache (" << c.error().message << "); kernels use default configs\n";
    }
    return nullptr;
  }
  return std::move(c).value();
}

void add_cache_options(CLI::App* cmd, CacheCliOptions& o) {
  cmd->add_option("--cache", o.dir,
                  "tuning cache directory (default $SHARDFUSE_CACHE_DIR, else $XDG_CACHE_HOME/shardfuse, else "
                  "~/.cache/shardfuse)")
      ->check(non_empty());
  cmd->add_option("--shape-buckets", o.buckets,
                  "how shapes key the cache: exact (default) or pow2 (each extent rounded up to a power of two)")
      ->check(CLI::IsMember({"exact", "pow2"}));
}

ShapeBuckets parse_buckets(const std::string& s) { return s == "pow2" ? ShapeBuckets::Pow2 : ShapeBuckets::Exact; }

Result<std::vector<LocalProgram>> programs_for_tuning(const Graph& g0, const std::string& device, const std::string& arch,
                                              bool fuse, const DecomposeOptions& model) {
  const Graph g = decompose_for_sharding(g0);  // as compile_plan
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(g, mesh, model.comm);
  RankPipelineOptions po;
  po.fuse = fuse;
  po.decompose = model;
  if (device == "cuda" && !po.decompose.rates)
    if (Result<DeviceRates> r = arch_rates(arch)) po.decompose.rates = *r;
  if (device != "cuda") po.decompose.allow_tf32 = false;
  po.can_emit = emit_checker(device == "cpu" ? llvmb::Target::host() : llvmb::Target::nvptx(arch));
  return rank_programs(g, plan, mesh, po);
}

namespace {

struct TuneCliOptions {
  std::string file;
  std::optional<int64_t> world;
  std::string device = "cpu";
  std::string arch;  // --device cuda: the device's arch unless given
  CacheCliOptions cache;
  double budget_s = 0;
  int top_k = 0;
  bool exhaustive = false;
  double warmup_ms = 10, rep_ms = 40;
  int max_reps = 100;
  int jobs = 0;
  double compile_timeout_s = 60;
  bool no_fuse = false;
  bool allow_tf32 = false;
  bool no_tma = false;
  std::string emit_dir, import_dir, measure_dir;  // the split tuner (autotune/tune_split.h)
  std::string system;                              // --system: the performance model compile is given
};

std::string us_text(double v) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(v < 10 ? 2 : 1) << v << " us";
  return os.str();
}

// A one-line progress display redrawn in place on a terminal; on a pipe or file,
// one plain line per kernel phase (no carriage returns in logs).
class Progress {
 public:
  Progress() : tty_(::isatty(2) == 1) {}
  void update(size_t i, size_t n, const TuneProgress& p) {
    std::ostringstream os;
    os << "[kernel " << i + 1 << "/" << n << "] " << p.kernel << ": " << p.phase << " " << p.done << "/" << p.total;
    if (p.best_us > 0) os << ", best so far " << us_text(p.best_us);
    if (tty_) {
      std::string line = os.str();
      std::cerr << "\r" << line << std::string(last_ > line.size() ? last_ - line.size() : 0, ' ') << std::flush;
      last_ = line.size();
    } else if (p.done == p.total && p.total > 0) {
      std::cerr << os.str() << "\n";
    }
  }
  void clear() {
    if (tty_ && last_) std::cerr << "\r" << std::string(last_, ' ') << "\r" << std::flush;
    last_ = 0;
  }

 private:
  bool tty_;
  size_t last_ = 0;
};

void print_report(const TuneReport& r) {
  std::cout << "kernel " << r.kernel << " [" << r.key.kind << "] " << r.key.shapes << "  key " << r.key.hash() << "\n";
  size_t pruned = r.rule_pruned + r.static_pruned + r.duplicates + r.ranked_out;
  std::cout << "  space " << r.space << ", pruned " << pruned << " (rules " << r.rule_pruned << ", resources "
            << r.static_pruned << ", same code " << r.duplicates << ", ranked out " << r.ranked_out << "), invalid "
            << r.invalid << ", built " << r.built << ", measured " << r.measured << " (cached " << r.reused << ")"
            << (r.cache_hit() ? "  [cache hit]" : "") << "\n";
  if (r.source == ConfigSource::Default) {
    std::cout << "  best: default config " << r.best_str << " (nothing could be measured)\n";
  } else {
    std::cout << "  best: " << r.best_str << "  " << us_text(r.best_time.median_us) << " median (p20 "
              << us_text(r.best_time.p20_us) << ", p80 " << us_text(r.best_time.p80_us) << ", " << r.best_time.reps
              << " reps, " << r.best_time.outliers << " outliers)";
    if (r.default_time && r.default_time->median_us > 0 && r.best_time.median_us > 0)
      std::cout << "; default " << us_text(r.default_time->median_us) << ", speedup " << std::fixed << std::setprecision(2)
                << r.default_time->median_us / r.best_time.median_us << "x";
    std::cout << "\n";
  }
  // Library GEMMs measured beside the generated configs (or why none was).
  if (!r.extern_note.empty()) std::cout << "  " << r.extern_note << "\n";
  for (const ExternResult& x : r.externs) {
    std::cout << "  extern " << x.library << ": ";
    if (x.measured)
      std::cout << us_text(x.time.median_us) << " median" << (x.reused ? " (cached)" : "")
                << (r.best_extern == x.library ? "  [best]" : "");
    else
      std::cout << "not measured: " << x.reason;
    std::cout << "\n";
  }
  if (!r.best_extern.empty() && r.best_generated_time)
    std::cout << "  best generated: " << r.best_generated << "  " << us_text(r.best_generated_time->median_us) << " median\n";
  for (const std::string& w : r.warnings) std::cout << "  warning: " << w << "\n";
}

// A temporary directory, removed with what it holds.
struct TempCacheDir {
  std::string path;
  TempCacheDir() {
    std::string t = (std::filesystem::temp_directory_path() / "sf-emit-XXXXXX").string();
    if (::mkdtemp(t.data())) path = t;
  }
  ~TempCacheDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;
};

int tune(const TuneCliOptions& o) {
  if (!o.measure_dir.empty()) {
    if (!o.file.empty() || !o.emit_dir.empty() || !o.import_dir.empty()) {
      std::cerr << "error: --measure DIR takes no graph and no --emit-candidates or --import: it measures what DIR "
                   "holds\n";
      return 2;
    }
    BenchCliOptions b{o.warmup_ms, o.rep_ms, o.max_reps};
    return tune_measure(o.measure_dir, bench_options(b));
  }
  if (o.file.empty()) {
    std::cerr << "error: tune needs a graph file (or --measure DIR)\n";
    return 2;
  }
  if (!o.emit_dir.empty() && !o.import_dir.empty()) {
    std::cerr << "error: --emit-candidates and --import are the two ends of the split tuner: give one\n";
    return 2;
  }
  const bool split = !o.emit_dir.empty() || !o.import_dir.empty();
  if (split && o.device != "cuda") {
    std::cerr << "error: --emit-candidates and --import are for --device cuda\n";
    return 2;
  }
  std::optional<TuneMeasurements> imported;
  if (!o.import_dir.empty()) {
    Result<TuneMeasurements> m = read_tune_measurements(o.import_dir);
    if (!m) {
      std::cerr << m.error().str() << "\n";
      return 1;
    }
    if (!o.arch.empty() && o.arch != m->arch) {
      std::cerr << "error: --arch " << o.arch << ": " << o.import_dir << " was measured on " << m->device << " ("
                << m->arch << ")\n";
      return 1;
    }
    imported = std::move(m).value();
  }
  if (!o.emit_dir.empty() && o.arch.empty()) {
    std::cerr << "error: --emit-candidates needs --arch: the GPU that will measure them is not here\n";
    return 2;
  }
  std::optional<Graph> loaded = load_graph(o.file);
  if (!loaded) return 1;
  std::optional<Graph> g = resolve_world(std::move(*loaded), o.world);
  if (!g) return 1;
  // --emit-candidates tunes into a throwaway cache: its entries say "recorded".
  std::optional<TempCacheDir> scratch;
  if (!o.emit_dir.empty()) {
    scratch.emplace();
    if (scratch->path.empty()) {  // never fall back to the user's cache
      std::cerr << "error: --emit-candidates: cannot create a temporary directory for its scratch cache\n";
      return 1;
    }
  }
  std::unique_ptr<TuneCache> cache = open_tune_cache(scratch ? scratch->path : o.cache.dir, true);
  if (!cache) return 1;
  std::string arch = imported ? imported->arch : o.arch;
  std::string device_line;
  if (split) {
    if (!gpu_target_info(arch)) {
      std::cerr << "error: the tuner has no limits and rates for " << arch << "\n";
      return 1;
    }
    device_line = imported ? "measured on " + imported->device + ", driver " + std::to_string(imported->driver_version) +
                                 ", " + imported->date + " (" + o.import_dir + ")"
                           : "candidates for " + o.emit_dir;
  } else if (o.device == "cuda") {
    // Candidates are timed on device 0 (autotune/cuda_runner.h): its arch is the
    // default, and PTX for another arch cannot be measured on it.
    Result<cuda::DeviceInfo> dev = cuda::device_info(0);
    if (!dev) {
      std::cerr << "error: " << dev.error().message << "\n";
      return 1;
    }
    if (arch.empty()) arch = dev->arch();
    if (arch != dev->arch()) {
      std::cerr << "error: --arch " << arch << ": the device is " << dev->name << " (" << dev->arch()
                << "); candidates for " << arch << " cannot be measured on it (leave --arch out, or use "
                << dev->arch() << ")\n";
      return 1;
    }
    if (!gpu_target_info(arch)) {
      std::cerr << "error: " << dev->name << " is " << arch << ", which the tuner has no limits and rates for\n";
      return 1;
    }
    device_line = dev->name + ", driver " + std::to_string(dev->driver_version);
  }
  TuneSetup setup;
  setup.device = o.device;
  setup.arch = arch;
  setup.buckets = parse_buckets(o.cache.buckets);
  setup.allow_tf32 = o.allow_tf32;
  setup.tma = !o.no_tma;
  if (imported) setup.gpu = GpuDeviceId{imported->device, imported->arch, imported->driver_version};
  // The library GEMMs run on the GPU machine's libraries: their versions are unknown
  // until it measures them (emit: placeholders in the scratch cache), then recorded.
  if (imported) setup.libraries = imported->libraries;
  else if (!o.emit_dir.empty()) setup.libraries = GemmLibraries{"", "recorded", "recorded", ""};
  TuneOptions to;
  to.top_k = o.top_k;
  to.budget_s = o.budget_s;
  to.prune = !o.exhaustive;
  to.build.threads = o.jobs;
  to.build.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.compile_timeout_s * 1000));
  to.bench.warmup_ms = o.warmup_ms;
  to.bench.rep_ms = o.rep_ms;
  to.bench.max_reps = o.max_reps;
  to.bench.min_reps = std::min(to.bench.min_reps, o.max_reps);

  // The choices compile makes with the same --system (and arch): the kernels tuned
  // are the ones its Plan will have.
  std::optional<DecomposeOptions> model =
      perf_model(DecomposeCliOptions{"auto", false, o.system}, o.device == "cuda" ? &arch : nullptr, o.allow_tf32);
  if (!model) return 1;
  Result<std::vector<LocalProgram>> tuned = programs_for_tuning(*g, o.device, arch, !o.no_fuse, *model);
  if (!tuned.ok()) return report_failure(tuned.error());
  std::vector<LocalProgram> programs = std::move(tuned).value();
  DeviceMesh mesh(g->mesh());
  std::cout << "tuning " << g->name() << " for "
            << (o.device == "cpu" ? std::string("the host CPU") : arch + " (" + device_line + ")") << " on "
            << mesh.world() << " rank(s); cache " << cache->dir() << "\n";

  // The split tuner's runners: record (--emit-candidates) or replay (--import).
  std::deque<TuneCandidateKernel> recorded;
  GpuRunnerFactory runners;
  if (!o.emit_dir.empty())
    runners = [&](const LocalKernel& k, const TuneKey& key) -> std::unique_ptr<Runner> {
      TuneCandidateKernel rec{key.hash(), k.name, print_graph(k.group), {}, random_input_bounds(k.group), {}, {}};
      for (ValueId v : k.group.params()) rec.params.push_back(k.group.node(v).type);
      for (const Output& out : k.group.outputs()) rec.outputs.push_back(k.group.node(out.value).type);
      recorded.push_back(std::move(rec));
      return make_recording_runner(&recorded.back());
    };
  if (imported)
    runners = [&](const LocalKernel&, const TuneKey&) -> std::unique_ptr<Runner> {
      return make_replay_runner(*imported, o.import_dir);
    };

  // Rank 0 tunes every distinct kernel of every rank and broadcasts the table of
  // choices; each rank then reads its own kernels' configs from that one table.
  std::optional<GraphTuneResult> result;
  std::string tune_error;
  std::vector<std::string> rank_lines(static_cast<size_t>(mesh.world()));
  std::string disagreement;
  Progress progress;
  // Peers wait in the broadcast while rank 0 tunes: give them the whole budget.
  auto timeout = std::chrono::hours(24);
  Result<void> err = on_rank_threads(mesh, timeout, [&](Comm& comm) -> Result<void> {
    std::string table;
    if (comm.rank() == 0) {
      Result<GraphTuneResult> r = tune_programs(
          programs, setup, *cache, to, [&](size_t i, size_t n, const TuneProgress& p) { progress.update(i, n, p); },
          nullptr, runners);
      progress.clear();
      if (!r) {
        tune_error = r.error().message;
        table = "!error";
      } else {
        table = choices_to_text(r->choices);
        result = std::move(r).value();
      }
    }
    Result<std::string> agreed = broadcast_text(comm, table);
    if (!agreed) return agreed.error();
    if (*agreed == "!error") return {};
    Result<std::map<std::string, KernelChoice>> choices = choices_from_text(*agreed);
    if (!choices) return choices.error();
    // This rank's kernels, each with the agreed config of its key.
    ConfigChooser chooser(setup, nullptr);
    chooser.set_table(*choices);
    std::string mine;
    for (const LocalKernel& k : programs[static_cast<size_t>(comm.rank())].kernels) {
      std::optional<TuneKey> key = chooser.key_of(k);
      if (!key) continue;
      if (!choices->count(key->hash())) return Diag{"", {}, "rank " + std::to_string(comm.rank()) + ": kernel " + k.name + " has no agreed config"};
      mine += k.name + " " + chooser.choose(k).text + "\n";
    }
    // Every rank states the table it received; they must all be the same.
    Result<std::vector<std::string>> digests = all_gather_text(comm, fnv1a_hex(*agreed));
    if (!digests) return digests.error();
    for (const std::string& d : *digests)
      if (d != (*digests)[0]) disagreement = "ranks received different config tables";
    rank_lines[static_cast<size_t>(comm.rank())] = "rank " + std::to_string(comm.rank()) + ": " +
                                                   std::to_string(programs[static_cast<size_t>(comm.rank())].kernels.size()) +
                                                   " kernel(s), config table " + fnv1a_hex(*agreed) + ", own configs " +
                                                   fnv1a_hex(mine);
    return {};
  });
  if (!tune_error.empty()) {
    std::cerr << o.file << ": error: " << tune_error << "\n";
    return 1;
  }
  if (!err.ok()) {
    std::cerr << "error: " << err.error().message << "\n";
    return 1;
  }
  if (!disagreement.empty()) {
    std::cerr << "error: " << disagreement << "\n";
    return 1;
  }
  if (!o.emit_dir.empty()) {
    TuneCandidateSet set{arch, {recorded.begin(), recorded.end()}};
    if (Result<void> e = write_tune_candidates(set, o.emit_dir); !e.ok()) {
      std::cerr << e.error().str() << "\n";
      return 1;
    }
    size_t n = 0;
    for (const TuneCandidateKernel& k : set.kernels) n += k.candidates.size();
    std::cout << "wrote " << o.emit_dir << ": " << n << " candidate(s) of " << set.kernels.size()
              << " kernel(s) for " << arch << "; measure them on a " << arch
              << " GPU (the runtime-only build will do) with: shardfuse tune --measure " << o.emit_dir << "\n";
    return 0;
  }
  if (imported) {
    // Also under the arch-only keys that a machine without a GPU looks up (compile
    // --cache here): every entry of the device's key copied to it.
    Result<TargetInfo> t = gpu_target_info(arch);
    for (const TuneReport& r : result->reports) {
      TuneKey here = r.key;
      here.target = target_id(*t, GpuDeviceId{});
      here.toolchain = toolchain_id(ConfigTarget::Gpu, GpuDeviceId{});
      for (const auto& [config, entry] : cache->load(r.key))
        if (Result<void> e = cache->store(here, entry); !e.ok()) {
          std::cerr << "error: " << e.error().str() << "\n";
          return 1;
        }
    }
  }
  for (const TuneReport& r : result->reports) print_report(r);
  if (mesh.world() > 1)
    for (const std::string& l : rank_lines) std::cout << l << "\n";
  std::cout << "tuned " << result->reports.size() << " kernels: " << result->cache_hits << " cache hits, "
            << result->measured_kernels << " measured\n";
  return 0;
}

}  // namespace

void add_tune(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<TuneCliOptions>();
  auto* cmd = app.add_subcommand("tune", "Autotune every distinct kernel of a graph into the tuning cache");
  cmd->add_option("graph", o->file, "the .sf graph file (none with --measure)");
  cmd->add_option("--world", o->world, "number of ranks: resizes a 1-D mesh; must equal the product of an N-D mesh")
      ->check(CLI::Range(int64_t{1}, kMaxMeshRanks));
  cmd->add_option("--device", o->device, "where candidates are timed: cpu (host code, default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_allow_tf32_option(cmd, o->allow_tf32);
  add_no_tma_option(cmd, o->no_tma);
  add_system_option(cmd, o->system);
  cmd->add_option("--arch", o->arch, "GPU architecture for --device cuda (default: the device's; another is an error)")
      ->check(CLI::IsMember({"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}));
  add_cache_options(cmd, o->cache);
  cmd->add_option("--tune-budget", o->budget_s, "seconds of tuning per kernel; 0 = no limit (default)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--top-k", o->top_k,
                  "candidates measured after the cost model's ranking, plus the default config (default: a fifth "
                  "of the space, 2 to 16)")
      ->check(CLI::Range(1, 100000));
  cmd->add_flag("--exhaustive", o->exhaustive, "no pruning: measure every config that builds");
  cmd->add_option("--warmup-ms", o->warmup_ms, "warm-up time per candidate (default 10)")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--rep-ms", o->rep_ms, "timed time per candidate (default 40)")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--max-reps", o->max_reps, "most timed repetitions per candidate (default 100)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("-j,--jobs", o->jobs, "parallel compiles (default: the number of cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--compile-timeout", o->compile_timeout_s, "seconds one candidate may take to compile (default 60)")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_flag("--no-fuse", o->no_fuse, "one kernel per op (no fusion)");
  cmd->add_option("--emit-candidates", o->emit_dir,
                  "write the candidates tuning would measure (PTX, launch, arguments) into DIR instead of measuring "
                  "them: for a GPU machine without LLVM (needs --device cuda --arch)")
      ->check(non_empty());
  cmd->add_option("--measure", o->measure_dir,
                  "on the GPU machine: time every candidate in DIR (from --emit-candidates) on GPU 0 and write "
                  "DIR/measurements.json; no graph")
      ->check(non_empty());
  cmd->add_option("--import", o->import_dir,
                  "tune with the times in DIR/measurements.json (from --measure) instead of a device, into --cache; "
                  "the keys name the GPU that measured")
      ->check(non_empty());
  add_verify_each_option(cmd);
  cmd->footer(
      "Per kernel it prints the space size, what was pruned and why, how many candidates were measured, and the\n"
      "best config's median time against the default config's. The last line counts cache hits (nothing built\n"
      "or measured) and kernels measured. docs/autotuning.md explains the search and the cache.\n"
      "Example:\n  shardfuse tune examples/tp_mlp.sf --world 4 --cache /tmp/sf-cache");
  cmd->callback([o, &exit_code] { exit_code = tune(*o); });
}

}  // namespace sf::cli
