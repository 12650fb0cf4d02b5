// `shardfuse compile G.sf -o DIR`: write the Plan for a GPU arch.
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "autotune/config.h"
#include "runtime/core/file_io.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/kernels/tune.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace {

struct CompileCliOptions {
  std::string file;
  std::optional<int64_t> world;
  std::string arch;  // empty: --system's, else sm_90a
  std::string out;
  bool no_fuse = false;
  bool no_flash_attention = false;
  bool no_reorder = false;
  DecomposeCliOptions decompose;
  bool no_ptxas = false;
  bool no_host = false;
  std::string dump_after;
  CacheCliOptions cache;
  bool autotune = false;
  std::string precision = "fused";
  bool allow_tf32 = false;
  bool no_tma = false;
  std::string matmul_config;
  std::string attention_config;
  std::string reduction_config;
};

// --matmul-config, --attention-config, --reduction-config: that kind's GPU fields only (a pointwise or host
// knob would be ignored, so it is refused instead), each once, parsed as a cache's
// config text is, over `base`.
std::optional<KernelConfig> parse_kind_config(KernelKind kind, const std::string& text, const KernelConfig& base = {}) {
  const std::string what(kernel_kind_name(kind)), flag = "--" + what + "-config";
  const std::vector<const char*> names = config_fields(kind, ConfigTarget::Gpu);
  const std::set<std::string> fields(names.begin(), names.end());
  std::istringstream in(text);
  std::set<std::string> seen;
  for (std::string tok; in >> tok;) {
    const std::string name = tok.substr(0, tok.find('='));
    if (!fields.count(name)) {
      std::string list;
      for (const char* f : names) list += (list.empty() ? "" : ", ") + std::string(f);
      std::cerr << "error: " << flag << ": '" << name << "' is not " << (what[0] == 'a' ? "an " : "a ") << what
                << " field (" << list << ")\n";
      return std::nullopt;
    }
    if (!seen.insert(name).second) {
      std::cerr << "error: " << flag << ": " << name << " given twice\n";
      return std::nullopt;
    }
  }
  if (seen.empty()) {
    std::cerr << "error: " << flag << ": no field given (name=value, separated by spaces)\n";
    return std::nullopt;
  }
  Result<KernelConfig> c = parse_config_str(text, base);
  if (!c) {
    std::cerr << "error: " << flag << ": " << c.error().message << "\n";
    return std::nullopt;
  }
  return *c;
}

int compile(CompileCliOptions o) {
  // The one performance model (--system, else the arch's row); an empty --arch
  // becomes the system's.
  std::optional<DecomposeOptions> model = perf_model(o.decompose, &o.arch, o.allow_tf32);
  if (!model) return 1;
  std::optional<Graph> loaded = load_graph(o.file);
  if (!loaded) return 1;
  std::optional<Graph> g = resolve_world(std::move(*loaded), o.world);
  if (!g) return 1;
  std::optional<std::set<std::string>> dump = parse_dump_after(o.dump_after);
  if (!dump) return 1;
  PipelineDump dumper(*g, *dump, 0, model->comm);  // parse and propagate now, the pipeline's stages as compile_plan runs them
  CompileOptions co;
  co.arch = o.arch;
  co.run_ptxas = !o.no_ptxas;
  co.host = o.no_host ? CompileOptions::HostCode::None : CompileOptions::HostCode::Object;
  co.precision = precision_of(o.precision);
  co.allow_tf32 = o.allow_tf32;
  co.tma = !o.no_tma;
  if (!o.matmul_config.empty()) {
    std::optional<KernelConfig> c = parse_kind_config(KernelKind::Matmul, o.matmul_config);
    if (!c) return 1;
    co.matmul_config = *c;
  }
  if (!o.attention_config.empty()) {
    if (!parse_kind_config(KernelKind::Attention, o.attention_config)) return 1;
    co.attention_config = o.attention_config;
  }
  if (!o.reduction_config.empty()) {
    if (!parse_kind_config(KernelKind::Reduction, o.reduction_config)) return 1;
    co.reduction_config = o.reduction_config;
  }
  co.pipeline.fuse = !o.no_fuse;
  co.pipeline.flash_attention = !o.no_flash_attention;
  co.pipeline.reorder = !o.no_reorder;
  co.pipeline.decompose = *model;
  co.pipeline.after_stage = dumper.observer();
  if (o.autotune) {
    // Tuning for a GPU measures on it: the GPU must be here and be `--arch`.
    std::optional<cuda::DeviceInfo> dev = cuda_device_for("");
    if (!dev) return 1;
    if (dev->arch() != o.arch) {
      std::cerr << "error: --autotune measures on " << dev->name << " (" << dev->arch() << "), not " << o.arch
                << ": pass --arch " << dev->arch() << "\n";
      return 1;
    }
  }
  bool cache_failed = false;
  std::unique_ptr<TuneCache> cache = open_tune_cache(o.cache.dir, o.autotune, &cache_failed);
  if (cache_failed) return 1;
  const TuneSetup setup{"cuda", o.arch, parse_buckets(o.cache.buckets), o.allow_tf32, !o.no_tma};
  auto chooser = std::make_shared<ConfigChooser>(setup, cache.get());
  if (o.autotune) {
    if (!cache) {
      std::cerr << "error: --autotune needs a tuning cache to write to (--cache DIR)\n";
      return 1;
    }
    TuneOptions to;
    Result<std::vector<LocalProgram>> programs = programs_for_tuning(*g, "cuda", o.arch, !o.no_fuse, *model);
    if (!programs.ok()) return report_failure(programs.error());
    Result<GraphTuneResult> r = tune_programs(*programs, setup, *cache, to);
    if (!r) {
      std::cerr << o.file << ": error: autotune: " << r.error().message << "\n";
      return 1;
    }
    std::cout << "autotune: " << r->reports.size() << " kernel(s), " << r->cache_hits << " cache hit(s), "
              << r->measured_kernels << " measured on " << o.arch << "\n";
    chooser->set_table(std::move(r->choices));
  }
  co.choose = [chooser](const LocalKernel& k) { return chooser->choose(k); };
  Result<CompiledPlan> p = compile_plan(*g, co);
  dumper.emit(llvmb::Target::nvptx(o.arch));
  if (!p.ok()) return report_failure(p.error(), o.file);
  // The graph's text goes with the Plan: `exec` shards inputs and checks outputs with it.
  Result<std::string> text = read_regular_file(o.file, kMaxGraphFileBytes, "graph file (.sf)");
  if (!text) {
    std::cerr << text.error().str() << "\n";
    return 1;
  }
  p->graph_source = std::move(text).value();
  if (Result<void> err = write_plan_dir(*p, o.out); !err.ok()) {
    std::cerr << err.error().str() << "\n";
    return 1;
  }
  int from_cache = 0, gemms = 0;
  for (const PlanKernel& k : p->plan.kernels) from_cache += k.config_source == "cache";
  for (const PlanStep& s : p->plan.ranks[0].steps) gemms += s.op == "gemm";
  std::cout << "wrote " << o.out << ": plan.json, " << p->ptx.size() << " .ptx file(s) for " << o.arch
            << (p->plan.host_object.empty() ? "" : ", " + p->plan.host_object + " (host code)")
            << ", graph.sf, report.txt (" << p->plan.world << " rank(s)); "
            << from_cache << " of " << p->plan.kernels.size() << " kernel config(s) from the tuning cache";
  if (gemms) std::cout << "; " << gemms << " library GEMM step(s) on rank 0 (the cache's winners)";
  std::cout << "\n";
  return 0;
}

}  // namespace

void add_compile(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CompileCliOptions>();
  auto* cmd = app.add_subcommand("compile", "Write a Plan: plan.json, one .ptx per distinct kernel, report.txt");
  cmd->add_option("graph", o->file, "the .sf graph file")->required();
  cmd->add_option("--world", o->world, "number of ranks: resizes a 1-D mesh; must equal the product of an N-D mesh")
      ->check(CLI::Range(int64_t{1}, kMaxMeshRanks));
  cmd->add_option("--arch", o->arch, "GPU architecture of the PTX (default: --system's, else sm_90a)")
      ->check(CLI::IsMember({"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}));
  cmd->add_option("-o,--output", o->out, "the Plan directory: absent, empty, or a Plan an earlier compile wrote (then replaced atomically)")
      ->required()
      ->check(non_empty());
  cmd->add_flag("--no-fuse", o->no_fuse, "one kernel per op (no fusion)");
  cmd->add_flag("--no-flash-attention", o->no_flash_attention,
                "attention as matmul, softmax and matmul kernels (torch's math backend), not one kernel");
  add_verify_each_option(cmd);
  cmd->add_flag("--no-reorder", o->no_reorder,
                "collectives where lowering put them, each waited for at once (no raise/sink): the serial schedule");
  add_decompose_options(cmd, o->decompose);
  cmd->add_option("--dump-after", o->dump_after,
                  "also print the IR after these stages (rank 0): all, or a comma list of parse, propagate, lower, "
                  "decompose, collective-matmul, fuse, schedule, emit, as this command runs them (emit shows each kernel's LLVM IR for the arch)");
  add_cache_options(cmd, o->cache);
  cmd->add_flag("--autotune", o->autotune,
                "tune the kernels the cache has no config for first, measuring on GPU 0 (which must be --arch)");
  cmd->add_flag("--no-ptxas", o->no_ptxas, "do not check the PTX with ptxas (resources then show as -)");
  cmd->add_flag("--no-host", o->no_host,
                "leave out the kernels' host code (host_kernels.so): the Plan then runs only with exec --device cuda");
  add_precision_option(cmd, o->precision);
  add_allow_tf32_option(cmd, o->allow_tf32);
  add_no_tma_option(cmd, o->no_tma);
  cmd->add_option("--matmul-config", o->matmul_config,
                  "every matmul kernel takes this config instead of the cache's or the default, e.g. \"block_m=128 "
                  "block_n=256 block_k=64 warps=8 stages=4 group_m=8 split_k=1 warp_specialize=1 persistent=132\" "
                  "(fields not given keep their defaults; benchmarking a config by hand, as triton.Config does)");
  cmd->add_option("--attention-config", o->attention_config,
                  "these fields over every fused attention kernel's config (the cache's or the default), e.g. "
                  "\"wgmma=1\" (sm_90a: the products by wgmma) or \"block_m=128 block_n=64 warps=8\"");
  cmd->add_option("--reduction-config", o->reduction_config,
                  "these fields over every reduction kernel's config (the cache's or the emitter's suggestion), e.g. "
                  "\"rows_per_block=32 threads_per_row=32\"");
  cmd->footer(
      "Every kernel's PTX is assembled by ptxas (when the CUDA toolkit has it) and its registers and spills are\n"
      "recorded in plan.json and report.txt. docs/plan.md describes the Plan.\n"
      "Example:\n  shardfuse compile examples/transformer_block.sf --world 2 --arch sm_90a -o plan/");
  cmd->callback([o, &exit_code] { exit_code = compile(*o); });
}

}  // namespace sf::cli
