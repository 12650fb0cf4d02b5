// `shardfuse run G.sf`: shard the global inputs per the parameters' placements, run
// every rank's program (ranks as threads meeting in-process, or one rank of a
// multi-process run meeting through a directory), gather the outputs to their
// global shapes, and optionally check them against the reference evaluator.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include "codegen/dist/explain.h"
#include "codegen/dist/lower.h"
#include "codegen/ir/printer.h"
#include "codegen/fusion/pipeline.h"
#include "runtime/core/shard.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/tune.h"
#include "runtime/comm/agree.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/plan/plan_exec.h"
#include "runtime/plan/plan_host.h"
#include "runtime/io/npy.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace {

struct RunOptions {
  std::string file;
  std::optional<int64_t> world;
  std::optional<int> rank;
  std::string rendezvous;
  std::string device = "cpu";
  std::string inputs_dir;
  std::string outputs_dir;
  uint64_t seed = 0;
  bool check = false;
  bool no_reorder = false;
  bool no_fuse = false;
  bool no_flash_attention = false;
  std::string kernels = "generated";
  std::string precision = "fused";
  bool allow_tf32 = false;
  bool no_tma = false;
  double timeout_s = 60;
  CacheCliOptions cache;
  bool autotune = false;
  bool cuda_graph = false;
  GpuCommOptions gpu_comm;
  DecomposeCliOptions decompose;
  DecomposeOptions model;  // perf_model(decompose): the choices' performance model
  std::string trace_file;
  // When the command started (the options are made as the process starts):
  // --timeout bounds set-up and connecting together, from here.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// What the host Plan ran: kernel launches of generated code and on the reference
// evaluator (per rank that this process ran), and the kernels that fell back.
struct HostRunStats {
  int64_t generated = 0, fallbacks = 0;
  int compiled = 0;  // distinct kernels with generated code
  std::map<std::string, std::string> fallback_reasons;  // kernel id -> why
  int exit_status = 1;  // when the run failed: 3 for an internal error (report_failure)
};

// Compiles the graph to a Plan for the host in memory (its kernels JIT-compiled,
// or on the reference evaluator) and runs it through the Plan executor the GPU
// uses (runtime/plan/plan_exec.h); returns the global outputs (every process of a
// multi-process run gets them all). A multi-process rank first compares `digest`
// (plus the Plan) with its peers' at connect.
std::optional<std::vector<Tensor>> run_distributed(const Graph& g, const RunOptions& o,
                                                   const std::vector<Tensor>& global_in, const ConfigChooser* chooser,
                                                   RunDigest digest, HostRunStats& st, bool& ok) {
  ok = false;
  DeviceMesh mesh(g.mesh());
  CompileOptions co;
  co.arch = "host";
  co.ptx = false;
  co.host = chooser ? CompileOptions::HostCode::Jit : CompileOptions::HostCode::Reference;
  co.pipeline.fuse = !o.no_fuse;
  co.pipeline.flash_attention = !o.no_flash_attention;
  co.pipeline.reorder = !o.no_reorder;
  co.pipeline.decompose = o.model;
  co.precision = precision_of(o.precision);
  // One process of several: every rank gathers the outputs (they are replicated at
  // the end), so rank 0 can save and check them without another exchange.
  co.replicate_outputs = o.rank.has_value();
  if (chooser) co.host_choose = [chooser](const LocalKernel& k) { return chooser->choose(k).config; };
  Result<CompiledPlan> cp = compile_plan(g, co);
  if (!cp) {
    st.exit_status = report_failure(cp.error(), o.file);
    return std::nullopt;
  }
  const HostKernels& hk = *cp->host_kernels;
  for (const PlanRank& r : cp->plan.ranks) {
    if (o.rank && r.rank != *o.rank) continue;
    for (const PlanStep& s : r.steps)
      if (s.op == "kernel") ++(hk.by_id.at(s.kernel).generated ? st.generated : st.fallbacks);
  }
  for (const auto& [id, k] : hk.by_id) st.compiled += k.generated;
  if (chooser) st.fallback_reasons = hk.missing;
  // Inputs are sharded and outputs gathered by the placements the Plan chose.
  Result<PlanPlacements> placed = plan_placements(cp->plan, g, o.file);
  if (!placed.ok()) {
    std::cerr << diag_str(placed.error()) << "\n";
    return std::nullopt;
  }

  GpuRunOptions ro;
  ro.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  TraceWriter trace;
  if (!o.trace_file.empty()) {
    ro.trace = &trace;
    trace.set_metadata("graph", g.name());
    trace.set_metadata("command", "run");
    trace.set_metadata("device", "cpu");
  }
  // Written once the ranks are done, whether or not they succeeded; a trace asked
  // for and not written fails the command (ok = false), like any output.
  struct WriteTrace {
    const TraceWriter& t;
    const std::string& path;
    bool& ok;
    ~WriteTrace() {
      if (path.empty()) return;
      if (Result<void> err = t.write(path); !err.ok()) {
        std::cerr << err.error().str() << "\n";
        ok = false;
      }
    }
  } write_trace{trace, o.trace_file, ok};
  auto local_inputs = [&](int r) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < g.params().size(); ++i)
      in.push_back(shard_tensor(global_in[i], placed->params[i], mesh, r));
    return in;
  };

  if (o.rank) {
    Result<std::unique_ptr<Comm>> comm =
        connect_rank(mesh, *o.rank, o.rendezvous, ro.timeout, o.started + ro.timeout);
    if (!comm) {
      std::cerr << "error: rank " << *o.rank << ": " << comm.error().message << "\n";
      return std::nullopt;
    }
    // Every process compiles every rank's program; the Plan stands for them all.
    digest.add("plan", plan_to_json(cp->plan));
    if (Result<void> d = agree_on_run(**comm, digest); !d.ok()) {
      std::cerr << "error: " << d.error().message << "\n";
      return std::nullopt;
    }
    Result<std::vector<Tensor>> out = run_rank_on_host(cp->plan, cp->host_kernels, **comm, local_inputs(*o.rank), ro);
    if (!out.ok()) {
      std::cerr << diag_str(out.error()) << "\n";
      return std::nullopt;
    }
    ok = true;
    return std::move(out).value();  // replicated: the global outputs
  }

  std::vector<std::vector<Tensor>> inputs;
  for (int r = 0; r < mesh.world(); ++r) inputs.push_back(local_inputs(r));
  Result<std::vector<std::vector<Tensor>>> out = run_plan_on_host(cp->plan, cp->host_kernels, inputs, ro);
  if (!out.ok()) {
    std::cerr << diag_str(out.error()) << "\n";
    return std::nullopt;
  }
  std::optional<std::vector<Tensor>> global = gather_outputs(g, *placed, mesh, *out);
  if (!global) return std::nullopt;
  ok = true;
  return global;
}

// --device cuda: the graph compiled to a Plan for GPU 0's arch in memory, then run
// like `exec` runs a Plan directory.
int run_cuda(const Graph& g, const RunOptions& o) {
  if (o.kernels != "generated") {
    std::cerr << "error: --kernels reference evaluates on the CPU; use --device cpu\n";
    return 1;
  }
  std::optional<cuda::DeviceInfo> dev = cuda_device_for("");
  if (!dev) return 1;
  bool cache_failed = false;
  std::unique_ptr<TuneCache> cache = open_tune_cache(o.cache.dir, o.autotune, &cache_failed);
  if (cache_failed) return 1;
  const TuneSetup setup{"cuda", dev->arch(), parse_buckets(o.cache.buckets), o.allow_tf32, !o.no_tma};
  auto chooser = std::make_shared<ConfigChooser>(setup, cache.get());
  if (o.autotune) {
    // Ranks are threads here: one table for all of them.
    Result<std::vector<LocalProgram>> programs = programs_for_tuning(g, "cuda", dev->arch(), !o.no_fuse, o.model);
    if (!programs.ok()) return report_failure(programs.error());
    Result<GraphTuneResult> r = tune_programs(*programs, setup, *cache, TuneOptions{});
    if (!r) {
      std::cerr << o.file << ": error: autotune: " << r.error().message << "\n";
      return 1;
    }
    std::cout << "autotune: " << r->reports.size() << " kernel(s), " << r->cache_hits << " cache hit(s), "
              << r->measured_kernels << " measured on " << dev->name << "\n";
    chooser->set_table(std::move(r->choices));
  }
  CompileOptions co;
  co.arch = dev->arch();
  co.pipeline.fuse = !o.no_fuse;
  co.pipeline.flash_attention = !o.no_flash_attention;
  co.pipeline.reorder = !o.no_reorder;
  co.pipeline.decompose = o.model;
  co.precision = precision_of(o.precision);
  co.allow_tf32 = o.allow_tf32;
  co.tma = !o.no_tma;
  co.choose = [chooser](const LocalKernel& k) { return chooser->choose(k); };
  Result<CompiledPlan> cp = compile_plan(g, co);
  if (!cp) return report_failure(cp.error(), o.file);
  PlanSource src{std::move(cp->plan), std::move(cp->ptx), ""};
  GpuCliOptions go;
  go.inputs_dir = o.inputs_dir;
  go.outputs_dir = o.outputs_dir;
  go.seed = o.seed;
  go.check = o.check;
  go.allow_tf32 = o.allow_tf32;
  go.cuda_graph = o.cuda_graph;
  go.comm = o.gpu_comm;
  go.rank = o.rank;
  go.rendezvous = o.rendezvous;
  go.timeout_s = o.timeout_s;
  go.started = o.started;
  go.trace_file = o.trace_file;
  return run_plan_cuda(g, src, go);
}

int run(RunOptions o) {
  if (o.rank.has_value() != !o.rendezvous.empty()) {
    std::cerr << "error: --rank and --rendezvous go together (one process per rank meeting through a directory)\n";
    return 2;
  }
  std::optional<DecomposeOptions> model = perf_model(o.decompose, nullptr, o.allow_tf32);
  if (!model) return 1;
  o.model = *model;
  std::optional<Graph> loaded = load_graph(o.file);
  if (!loaded) return 1;
  std::optional<Graph> g = resolve_world(std::move(*loaded), o.world);
  if (!g) return 1;
  int64_t world = g->mesh().world_size();
  if (o.rank && (*o.rank < 0 || *o.rank >= world)) {
    std::cerr << "error: --rank " << *o.rank << " is not a rank of a " << world << "-rank mesh\n";
    return 1;
  }
  // The ranks this process will run (every rank as a thread, or the one --rank):
  // refused now, before inputs are read and kernels compiled, if they are more
  // than one process may run or need more descriptors than it may open.
  if (std::optional<std::string> why = reserve_rank_descriptors(g->mesh(), o.rank ? 1 : static_cast<int>(world))) {
    std::cerr << o.file << ": error: " << *why << "\n";
    return 1;
  }
  if (o.device == "cuda") return run_cuda(*g, o);
  std::optional<std::vector<Tensor>> inputs = load_inputs(*g, o.inputs_dir, o.seed);
  if (!inputs) return 1;

  // Each kernel's config: the tuning cache's choice, else the default; with
  // --autotune, what the cache lacks is tuned first, by rank 0, and every rank uses
  // the table rank 0 broadcasts.
  bool cache_failed = false;
  std::unique_ptr<TuneCache> cache = open_tune_cache(o.cache.dir, o.autotune, &cache_failed);
  if (cache_failed) return 1;
  const TuneSetup setup{"cpu", "", parse_buckets(o.cache.buckets)};
  auto chooser = std::make_shared<ConfigChooser>(setup, cache.get());
  std::vector<LocalProgram> tuned_programs;
  if (o.kernels == "generated") {
    Result<std::vector<LocalProgram>> programs = programs_for_tuning(*g, "cpu", "", !o.no_fuse, o.model);
    if (!programs.ok()) return report_failure(programs.error());
    tuned_programs = std::move(programs).value();
  }
  if (o.autotune && o.kernels == "generated") {
    TuneOptions to;
    to.bench.warmup_ms = 10;
    to.bench.rep_ms = 40;
    to.bench.max_reps = 100;
    std::string table, error;
    auto tune_all = [&] {
      Result<GraphTuneResult> r = tune_programs(tuned_programs, setup, *cache, to);
      if (!r) {
        error = r.error().message;
        return std::string("!error");
      }
      std::cout << "autotune: " << r->reports.size() << " kernel(s), " << r->cache_hits << " cache hit(s), "
                << r->measured_kernels << " measured\n";
      return choices_to_text(r->choices);
    };
    if (!o.rank) {
      table = tune_all();  // ranks are threads of this process: one table for all
    } else {
      // Peers wait while rank 0 tunes: an hour, or the collective timeout if longer.
      auto wait = std::chrono::milliseconds(static_cast<int64_t>(std::max(3600.0, o.timeout_s) * 1000));
      // A rendezvous of its own (a subdirectory): the run's comm later starts its
      // store keys afresh in the main one.
      std::string dir = (std::filesystem::path(o.rendezvous) / "autotune").string();
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      Result<std::unique_ptr<Comm>> comm = connect_rank(DeviceMesh(g->mesh()), *o.rank, dir, wait);
      if (!comm) {
        std::cerr << "error: rank " << *o.rank << ": " << comm.error().message << "\n";
        return 1;
      }
      Result<std::string> agreed = broadcast_text(**comm, *o.rank == 0 ? tune_all() : std::string());
      if (!agreed) {
        std::cerr << "error: rank " << *o.rank << ": agreeing on configs: " << agreed.error().message << "\n";
        return 1;
      }
      table = *agreed;
    }
    if (table == "!error") {
      std::cerr << o.file << ": error: autotune: " << (error.empty() ? "rank 0 failed to tune" : error) << "\n";
      return 1;
    }
    Result<std::map<std::string, KernelChoice>> choices = choices_from_text(table);
    if (!choices) {
      std::cerr << "error: autotune: " << choices.error().str() << "\n";
      return 1;
    }
    chooser->set_table(std::move(choices).value());
  }

  // What every process of a multi-process run must agree on before it runs: a rank
  // started with another graph, seed, option or tuning cache would otherwise
  // exchange collectives that happen to fit and save a wrong result.
  RunDigest digest;
  if (o.rank) {
    digest.add("graph", print_graph(*g));
    digest.add("options", "device=cpu kernels=" + o.kernels + " precision=" + o.precision + " fuse=" + (o.no_fuse ? "no" : "yes") +
                              " flash_attention=" + (o.no_flash_attention ? "no" : "yes") +
                              " reorder=" + (o.no_reorder ? "no" : "yes") +
                              " decompose=" + (o.decompose.never ? std::string("never") : o.decompose.mode) +
                              " system=" + o.decompose.system);
    Digest in;
    for (const Tensor& t : *inputs) in.update(t.type().str()).update(t.data(), t.nbytes());
    digest.add("inputs", in);
    std::string configs;
    for (const LocalProgram& p : tuned_programs)
      for (const LocalKernel& k : p.kernels)
        configs += k.name + " " + chooser->choose(k).text + "\n";
    digest.add("configs", configs);
  }
  // Generated host kernels by default; the reference evaluator stays the oracle.
  const bool generated = o.kernels == "generated";
  // Generated kernels keep f16/bf16 values unrounded inside (report_outputs' note).
  const bool fused16 = generated && o.precision == "fused";
  bool ok = false;
  HostRunStats st;
  std::optional<std::vector<Tensor>> out =
      run_distributed(*g, o, *inputs, generated ? chooser.get() : nullptr, std::move(digest), st, ok);
  if (!ok || !out) return st.exit_status;
  if (o.rank && *o.rank != 0) {
    // Rank 0 alone prints and saves the outputs; with --check every rank checks
    // them (each holds them all), so that a mismatch fails every rank.
    std::cout << "rank " << *o.rank << ": done\n";
    return o.check ? report_outputs(*g, *out, *inputs, true, "", false, fused16) : 0;
  }

  std::cout << "graph " << g->name() << ": " << world << " rank(s)"
            << (o.rank ? " as processes" : world > 1 ? " as threads" : "") << ", device " << o.device
            << ", inputs " << (o.inputs_dir.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.inputs_dir)
            << "\n";
  if (generated) {
    std::cout << "kernels: " << st.generated << " launch(es) of generated host code (" << st.compiled
              << " distinct kernel(s) compiled)";
    if (st.fallbacks) std::cout << ", " << st.fallbacks << " on the reference evaluator";
    std::cout << "\n";
    for (const auto& [name, why] : st.fallback_reasons) std::cout << "  " << name << ": " << why << "\n";
    std::map<std::string, int> sources;
    std::set<std::string> counted;
    for (const LocalProgram& p : tuned_programs)
      for (const LocalKernel& k : p.kernels)
        if (std::optional<TuneKey> key = chooser->key_of(k); key && counted.insert(key->hash()).second)
          ++sources[std::string(config_source_name(chooser->choose(k).source))];
    std::cout << "configs:";
    for (const char* s : {"tuned", "cache", "default"}) std::cout << " " << sources[s] << " " << s;
    std::cout << " (distinct kernels; tuning cache " << (cache ? cache->dir() : std::string("none")) << ")\n";
  } else {
    std::cout << "kernels: on the reference evaluator (--kernels reference)\n";
  }
  return report_outputs(*g, *out, *inputs, o.check, o.outputs_dir, false, fused16);
}

}  // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Execute a graph on N ranks and optionally check it against the reference");
  cmd->add_option("graph", o->file, "the .sf graph file")->required();
  cmd->add_option("--world", o->world, "number of ranks: resizes a 1-D mesh; must equal the product of an N-D mesh")
      ->check(CLI::Range(int64_t{1}, kMaxMeshRanks));
  auto* rank = cmd->add_option("--rank", o->rank,
                                "run only this rank, as one process of a multi-process run (needs --rendezvous)");
  auto* rendezvous = cmd->add_option("--rendezvous", o->rendezvous,
                  "directory (on a filesystem every process sees) where the processes of a multi-process run meet")
      ->check(non_empty());
  // One without the other is a usage error (exit 2), found before the graph is read.
  rank->needs(rendezvous);
  rendezvous->needs(rank);
  cmd->add_option("--device", o->device,
                  "where kernels run: cpu (default: host code) or cuda (PTX for GPU 0's arch, ranks as threads "
                  "sharing it, collectives through the CPU backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--inputs", o->inputs_dir, "read DIR/<param>.npy as each parameter's global tensor")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--save-outputs", o->outputs_dir,
                  "write each returned value, gathered to its global shape, to DIR/<name>.npy "
                  "(float32 for f32/bf16, float16 for f16)")
      ->check(non_empty());
  cmd->add_option("--seed", o->seed, "seed for random inputs when --inputs is not given (default 0)")
      ->check(uint64_text());
  cmd->add_flag("--check", o->check,
                "compare with the reference evaluator on the global graph; print max abs/rel error, exit 1 on mismatch");
  cmd->add_flag("--no-reorder", o->no_reorder, "run collectives where lowering put them (no raise/sink)");
  cmd->add_flag("--no-fuse", o->no_fuse, "one kernel per op (no fusion)");
  cmd->add_flag("--no-flash-attention", o->no_flash_attention,
                "attention as matmul, softmax and matmul kernels (torch's math backend), not one kernel");
  add_precision_option(cmd, o->precision);
  add_allow_tf32_option(cmd, o->allow_tf32);
  add_no_tma_option(cmd, o->no_tma);
  add_verify_each_option(cmd);
  add_decompose_options(cmd, o->decompose);
  cmd->add_option("--kernels", o->kernels,
                  "generated: fused kernels compiled to host code (kinds without an emitter yet fall back to the "
                  "reference, and are listed); reference: every kernel on the reference evaluator")
      ->check(CLI::IsMember({"generated", "reference"}));
  add_cache_options(cmd, o->cache);
  cmd->add_flag("--autotune", o->autotune,
                "tune the kernels the cache has no config for first (rank 0 tunes; every rank uses its choices)");
  cmd->add_option("--trace", o->trace_file,
                  "write a Chrome trace (Perfetto) of every rank's kernels and collectives to FILE.json; with --rank, "
                  "that rank's only")
      ->check(non_empty());
  cmd->add_flag("--cuda-graph", o->cuda_graph,
                "--device cuda: capture each rank's kernels between collectives as CUDA Graphs and launch those");
  add_gpu_comm_options(cmd, o->gpu_comm);
  cmd->add_option("--timeout", o->timeout_s, "seconds a collective may take before every rank gives up, and set-up plus connecting together (default 60)")
      ->check(finite_range(0.1, 86400.0));
  cmd->footer(
      "Examples:\n"
      "  shardfuse run examples/tp_mlp.sf --check                 # 4 ranks as threads (mesh tp=4)\n"
      "  shardfuse run examples/tp_mlp.sf --world 3 --check       # the 1-D mesh resized: uneven shards\n"
      "  shardfuse run examples/tp_mlp.sf --inputs in/ --save-outputs out/   # in/x.npy, in/w1.npy, ...\n"
      "  for r in 0 1 2 3; do shardfuse run examples/tp_mlp.sf --rank $r --rendezvous /tmp/rv & done; wait");
  cmd->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace sf::cli
