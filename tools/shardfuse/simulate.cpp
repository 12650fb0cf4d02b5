// `shardfuse simulate G.sf --system FILE`: every rank's fused, scheduled program run
// through the discrete-event model of codegen/fusion/timeline.h on a described multi-GPU
// system; prints serial and overlapped time and E_overlap, and writes a Perfetto
// trace with --trace. Kernel times are the tuning cache's GPU measurements where it
// has them for the system's GPU, else a roofline (docs/overlap.md).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "codegen/ir/decompose.h"
#include "autotune/problem.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/kernels/host_runner.h"
#include "runtime/core/file_io.h"
#include "codegen/kernels/tune.h"
#include "codegen/fusion/timeline.h"
#include "runtime/io/trace.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace {

namespace fs = std::filesystem;

struct SimulateOptions {
  std::string file;
  std::optional<int64_t> world;
  std::string system;
  std::string trace;
  std::string cache;  // empty: the default cache directory, if it exists
  bool no_fuse = false;
  bool no_reorder = false;
  DecomposeCliOptions decompose;
};

std::string us(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f us", v);
  return buf;
}

// Measured GPU times from the tuning cache, for kernels whose key (kind, signature,
// exact shapes) was measured on the system's GPU. The key's target names the device
// ("sm_90a:NVIDIA H100 80GB HBM3"); its toolchain (LLVM, ptxas, driver) is not
// compared, so a measurement from another driver still counts. Among a key's
// entries the fastest measured median wins: the config `run` would choose.
class CacheTimes {
 public:
  CacheTimes(std::unique_ptr<TuneCache> cache, std::string target) : cache_(std::move(cache)), target_(std::move(target)) {
    if (!cache_ || target_.empty()) return;
    std::error_code ec;
    fs::directory_iterator it(fs::path(cache_->dir()) / "v1", ec);
    if (ec) return;
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) break;
      // Like the cache's own reads: a FIFO or a huge file here is skipped, not read.
      Result<std::string> text = read_regular_file((it->path() / "key.json").string(), kMaxJsonFileBytes, "");
      if (!text) continue;
      nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) continue;
      TuneKey k;
      k.kind = j.value("kind", "");
      k.signature = j.value("signature", "");
      k.shapes = j.value("shapes", "");
      k.target = j.value("target", "");
      k.toolchain = j.value("toolchain", "");
      if (k.target == target_) keys_.emplace(k.kind + "\n" + k.signature + "\n" + k.shapes, std::move(k));
    }
  }

  bool usable() const { return cache_ && !target_.empty(); }
  const std::string& dir() const { static const std::string none; return cache_ ? cache_->dir() : none; }
  size_t keys() const { return keys_.size(); }

  // The measured median of `k` on the system's GPU, if the cache has one.
  std::optional<double> time_of(const LocalKernel& k) {
    if (keys_.empty()) return std::nullopt;
    Result<TuneProblem> p = tune_problem(k);
    if (!p) return std::nullopt;
    TuneKey mine = make_tune_key(*p, ShapeBuckets::Exact, target_, "");
    std::string id = mine.kind + "\n" + mine.signature + "\n" + mine.shapes;
    if (auto m = memo_.find(id); m != memo_.end()) return m->second;
    std::optional<double> best;
    auto [lo, hi] = keys_.equal_range(id);
    for (auto it = lo; it != hi; ++it)
      for (const auto& [cfg, e] : cache_->load(it->second))
        if (e.status == CacheEntry::Status::Measured && e.measurement.median_us > 0 &&
            (!best || e.measurement.median_us < *best))
          best = e.measurement.median_us;
    memo_[id] = best;
    return best;
  }

 private:
  std::unique_ptr<TuneCache> cache_;
  std::string target_;
  std::multimap<std::string, TuneKey> keys_;
  std::map<std::string, std::optional<double>> memo_;
};

int simulate(const SimulateOptions& o) {
  Result<SystemSpec> sys = load_system(o.system);
  if (!sys) {
    std::cerr << sys.error().str() << "\n";
    return 1;
  }
  std::optional<Graph> loaded = load_graph(o.file);
  if (!loaded) return 1;
  std::optional<Graph> g = resolve_world(std::move(*loaded), o.world);
  if (!g) return 1;
  DeviceMesh mesh(g->mesh());
  if (mesh.world() > sys->max_world()) {
    std::cerr << "error: " << (o.world ? "--world " : "the graph's mesh has ") << mesh.world()
              << (o.world ? "" : " ranks") << ", but the system " << o.system << " has " << sys->max_world()
              << " GPU(s) (" << sys->nodes << " node(s) x " << sys->gpus_per_node << ")\n";
    return 1;
  }

  // One performance model: the system's links choose the sharding strategies and
  // price the decomposition's collectives; its GPU's rates price the compute.
  const CommRates links = comm_rates(*sys);
  g = decompose_for_sharding(*g);  // as compile_plan
  ShardingPlan plan = propagate(*g, mesh, links);
  RankPipelineOptions po;
  po.fuse = !o.no_fuse;
  po.reorder = !o.no_reorder;
  po.can_emit = emit_checker(llvmb::Target::nvptx(sys->gpu.arch));  // split what the GPU emitters cannot take
  po.decompose.mode = decompose_mode(o.decompose);
  po.decompose.comm = links;
  po.decompose.rates = device_rates(sys->gpu);
  std::vector<DecomposeDecision> decisions;
  po.decisions = &decisions;
  Result<std::vector<LocalProgram>> ran = rank_programs(*g, plan, mesh, po);
  if (!ran.ok()) return report_failure(ran.error());
  std::vector<LocalProgram> programs = std::move(ran).value();
  // With collective matmuls decomposed, FLUX measures the overlap against the plain
  // schedule: its serial time and its T_compute (the decomposed kernels may cost more).
  const bool decomposed = std::any_of(decisions.begin(), decisions.end(), [](const DecomposeDecision& d) { return d.decomposed; });
  std::vector<LocalProgram> plain;
  if (decomposed) {
    RankPipelineOptions pp = po;
    pp.decisions = nullptr;
    pp.decompose.mode = DecomposeMode::Never;
    Result<std::vector<LocalProgram>> ran_plain = rank_programs(*g, plan, mesh, pp);
    if (!ran_plain.ok()) return report_failure(ran_plain.error());
    plain = std::move(ran_plain).value();
  }

  // The tuning cache: --cache, else the default directory when there is one (a
  // simulation never creates a cache).
  std::unique_ptr<TuneCache> cache;
  std::string cache_dir = o.cache.empty() ? TuneCache::default_dir() : o.cache;
  if (!o.cache.empty() || fs::is_directory(cache_dir)) {
    cache = open_tune_cache(o.cache, !o.cache.empty());
    if (!cache && !o.cache.empty()) return 1;
  }
  const std::string target = sys->gpu.device_name.empty() ? "" : sys->gpu.arch + ":" + sys->gpu.device_name;
  CacheTimes measured(std::move(cache), target);

  // Each compute step's time, measured or roofline, per program (by address: the
  // plain and decomposed programs share one model).
  size_t from_cache = 0, from_roofline = 0;
  auto times = std::make_shared<std::map<const LocalProgram*, std::vector<double>>>();
  const DeviceRates rates = device_rates(sys->gpu);
  auto add_times = [&](const std::vector<LocalProgram>& progs, bool count) {
    for (const LocalProgram& p : progs) {
      std::vector<double>& t = (*times)[&p];
      t.assign(p.steps.size(), 0);
      for (size_t i = 0; i < p.steps.size(); ++i) {
        const LocalStep& s = p.steps[i];
        if (s.kind == LocalStep::Kind::Start || s.kind == LocalStep::Kind::Wait) continue;
        std::optional<double> m;
        if (s.kind == LocalStep::Kind::Kernel) m = measured.time_of(p.kernels[static_cast<size_t>(s.kernel)]);
        t[i] = m ? *m : roofline_us(step_work(p, i), rates);
        if (count) ++(m ? from_cache : from_roofline);
      }
    }
  };
  add_times(programs, true);
  add_times(plain, false);
  TimelineModel model = timeline_model(*sys, [times](const LocalProgram& p, size_t step) { return times->at(&p)[step]; });
  Result<OverlapReport> rep = simulate_overlap(programs, mesh, model);
  if (!rep) {
    std::cerr << o.file << ": error: " << rep.error().message << "\n";
    return 1;
  }
  std::optional<OverlapReport> against_plain;
  if (decomposed) {
    Result<OverlapReport> a = simulate_overlap(plain, programs, mesh, model);
    if (!a) {
      std::cerr << o.file << ": error: " << a.error().message << "\n";
      return 1;
    }
    against_plain = std::move(a).value();
  }

  std::cout << "simulate " << g->name() << ": " << mesh.world() << " rank(s) on " << sys->name << " ("
            << sys->nodes << " node(s) x " << sys->gpus_per_node << " " << sys->gpu.name << ")\n";
  std::cout << "kernel times: " << from_roofline << " step(s) from the roofline (" << sys->gpu.fp32_tflops
            << " TFLOP/s fp32, "
            << (sys->gpu.bf16_tflops > 0 ? std::to_string(static_cast<int64_t>(sys->gpu.bf16_tflops)) + " TFLOP/s f16/bf16 matmuls, "
                                         : std::string())
            << sys->gpu.hbm_GB_s << " GB/s HBM, " << sys->gpu.launch_us << " us launch), "
            << from_cache << " measured";
  if (!measured.usable())
    std::cout << " (" << (target.empty() ? "the system names no device_name to match" : "no tuning cache") << ")";
  else
    std::cout << " (tuning cache " << measured.dir() << ", " << measured.keys() << " key(s) for " << target << ")";
  std::cout << "\n";
  std::cout << "links: nvlink " << sys->nvlink.bandwidth_GB_s << " GB/s, alpha " << sys->nvlink.alpha_us
            << " us, sm_fraction " << sys->nvlink.sm_fraction;
  if (sys->has_ib)
    std::cout << "; ib " << sys->ib.bandwidth_GB_s << " GB/s, alpha " << sys->ib.alpha_us << " us, sm_fraction "
              << sys->ib.sm_fraction;
  std::cout << "\n\n";

  const OverlapReport& r = *rep;
  std::cout << "rank  serial      overlapped  compute     collectives  comm        hidden\n";
  for (size_t i = 0; i < r.overlapped.ranks.size(); ++i) {
    const RankTimeline& s = r.serial.ranks[i];
    const RankTimeline& v = r.overlapped.ranks[i];
    std::printf("%4zu  %-10s  %-10s  %-10s  %11d  %-10s  %s\n", i, us(s.finish_us).c_str(), us(v.finish_us).c_str(),
                us(v.compute_us).c_str(), v.collectives, us(v.comm_us).c_str(), us(v.hidden_us).c_str());
  }
  std::fflush(stdout);
  double comm = 0, hidden = 0;
  int colls = 0;
  for (const RankTimeline& v : r.overlapped.ranks) {
    comm += v.comm_us;
    hidden += v.hidden_us;
    colls += v.collectives;
  }
  std::cout << "\nserial time:      " << us(r.serial.total_us) << "\n";
  std::cout << "overlapped time:  " << us(r.overlapped.total_us) << "\n";
  std::cout << "T_compute:        " << us(r.t_compute) << "\n";
  std::cout << "ECT serial:       " << us(r.ect_serial) << "\n";
  std::cout << "ECT overlapped:   " << us(r.ect_overlapped) << "\n";
  if (r.has_comm && r.ect_serial > 0)
    std::cout << "E_overlap:        " << std::fixed << std::setprecision(3) << r.e_overlap << "\n";
  else
    std::cout << "E_overlap:        0 (no communication to hide)\n";
  if (against_plain) {
    int n = 0;
    for (const DecomposeDecision& d : decisions) n += d.decomposed;
    std::cout << "decomposed:       " << n << " collective matmul(s) into ring steps; against the plain schedule "
              << "(FLUX): serial " << us(against_plain->serial.total_us) << ", T_compute "
              << us(against_plain->t_compute) << ", ECT overlapped " << us(against_plain->ect_overlapped)
              << ", E_overlap " << std::fixed << std::setprecision(3) << against_plain->e_overlap << "\n";
  }
  std::cout << "collectives:      " << colls << " over all ranks, " << us(comm) << " in all, " << us(hidden)
            << " hidden behind kernels";
  if (comm > 0) std::cout << " (" << std::fixed << std::setprecision(1) << 100.0 * hidden / comm << "%)";
  std::cout << "\n";

  if (!o.trace.empty()) {
    TraceWriter w;
    add_to_trace(r.overlapped, w);
    w.set_metadata("graph", g->name());
    w.set_metadata("source", o.file);
    w.set_metadata("system", sys->name);
    w.set_metadata("world", mesh.world());
    w.set_metadata("schedule", "overlapped (simulated)");
    w.set_metadata("serial_us", r.serial.total_us);
    w.set_metadata("overlapped_us", r.overlapped.total_us);
    w.set_metadata("e_overlap", r.e_overlap);
    if (Result<void> d = w.write(o.trace); !d.ok()) {
      std::cerr << d.error().str() << "\n";
      return 1;
    }
    std::cout << "trace: " << o.trace << " (" << w.size() << " events; open it in https://ui.perfetto.dev)\n";
  }
  return 0;
}

}  // namespace

void add_simulate(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<SimulateOptions>();
  auto* cmd = app.add_subcommand("simulate", "Simulate every rank's program on a described multi-GPU system");
  cmd->add_option("graph", o->file, "the .sf graph file")->required();
  cmd->add_option("--world", o->world,
                  "number of ranks: resizes a 1-D mesh; must equal the product of an N-D mesh, and fit the system")
      ->check(CLI::Range(int64_t{1}, kMaxMeshRanks));
  cmd->add_option("--system", o->system, "the system file (examples/systems/*.json)")->required();
  cmd->add_option("--trace", o->trace, "write a Chrome trace (opens in Perfetto) of the overlapped run")
      ->check(non_empty());
  cmd->add_option("--cache", o->cache,
                  "tuning cache to take measured GPU kernel times from (default: the default cache, if it exists)");
  cmd->add_flag("--no-fuse", o->no_fuse, "one kernel per op (no fusion)");
  add_verify_each_option(cmd);
  cmd->add_flag("--no-reorder", o->no_reorder, "collectives where lowering put them (no comm reordering)");
  add_decompose_options(cmd, o->decompose, false);  // its --system is the one above
  cmd->footer(
      "Prints each rank's serial time (every collective blocking), overlapped time (as scheduled) and compute\n"
      "time, then T_total, T_compute, ECT = T_total - T_compute for both, and E_overlap = 1 - ECT_overlapped /\n"
      "ECT_serial. docs/overlap.md describes the model and the system file.\n"
      "Example:\n  shardfuse simulate examples/tp_mlp.sf --world 8 --system examples/systems/h100x8_nvlink.json "
      "--trace /tmp/t.json");
  cmd->callback([o, &exit_code] { exit_code = simulate(*o); });
}

}  // namespace sf::cli
