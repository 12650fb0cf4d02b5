// `shardfuse explain G.sf`: the sharding decisions, the collectives inserted and a
// rank's schedule, one step per line.
#include <iostream>

#include "codegen/ir/decompose.h"
#include "autotune/system.h"
#include "codegen/dist/explain.h"
#include "codegen/dist/lower.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/kernels/attention.h"
#include "codegen/kernels/extern_gemm.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/tune.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace {

struct ExplainOptions {
  std::string file;
  std::optional<int64_t> world;
  int rank = 0;
  bool no_reorder = false;
  bool no_fuse = false;
  bool no_flash_attention = false;
  DecomposeCliOptions decompose;
  std::string dump_after;
  CacheCliOptions cache;
  std::string device = "cpu";
  std::string arch;  // empty: --system's, else sm_90a
  bool allow_tf32 = false;
  bool no_tma = false;
};

int explain(const ExplainOptions& o) {
  std::optional<Graph> loaded = load_graph(o.file);
  if (!loaded) return 1;
  std::optional<Graph> g = resolve_world(std::move(*loaded), o.world);
  if (!g) return 1;
  if (o.rank < 0 || o.rank >= g->mesh().world_size()) {
    std::cerr << "error: --rank " << o.rank << " is not a rank of a " << g->mesh().world_size() << "-rank mesh\n";
    return 1;
  }
  std::optional<std::set<std::string>> dump = parse_dump_after(o.dump_after);
  if (!dump) return 1;
  // The decisions compile would take for this arch and --system (the one
  // performance model: autotune/perf_model.h).
  std::string arch = o.arch;
  std::optional<DecomposeOptions> model = perf_model(o.decompose, &arch, o.allow_tf32);
  if (!model) return 1;
  DeviceMesh mesh(g->mesh());
  const Graph parsed = *g;
  g = decompose_for_sharding(*g);  // as compile_plan: cross_entropy's statistics are placed one by one
  ShardingPlan plan = propagate(*g, mesh, model->comm);
  RankPipelineOptions po;
  po.fuse = !o.no_fuse;
  po.flash_attention = !o.no_flash_attention;
  po.reorder = !o.no_reorder;
  po.decompose = *model;
  std::vector<DecomposeDecision> decisions;
  po.decisions = &decisions;
  if (!dump->empty()) {  // the stages explain runs, printed as they run
    PipelineDump dumper(parsed, *dump, o.rank, model->comm);
    po.after_stage = dumper.observer();
    if (Result<LocalProgram> p = rank_program(*g, plan, mesh, o.rank, po); !p.ok()) return report_failure(p.error());
    dumper.emit(llvmb::Target::host());
    return 0;
  }
  Result<LocalProgram> ran = rank_program(*g, plan, mesh, o.rank, po);
  if (!ran.ok()) return report_failure(ran.error());
  const LocalProgram& p = *ran;
  std::cout << "graph " << g->name() << " on mesh " << (mesh.ndim() ? mesh.mesh().str() : "(none)") << " ("
            << mesh.world() << " rank" << (mesh.world() == 1 ? "" : "s") << ")\n\n";
  std::cout << explain_sharding(*g, plan, mesh) << "\n";
  int collectives = 0;
  for (const LocalStep& s : p.steps) collectives += s.kind == LocalStep::Kind::Start;
  std::cout << "redistributions (" << collectives << " collective" << (collectives == 1 ? "" : "s") << " per rank):\n";
  for (const LocalStep& s : p.steps)
    if (s.kind == LocalStep::Kind::Start || s.kind == LocalStep::Kind::Slice || s.kind == LocalStep::Kind::Partialize)
      std::cout << "  " << step_line(p, s, mesh) << "\n";
  if (!decisions.empty()) {
    std::cout << "\ncollective matmuls:\n";
    for (const DecomposeDecision& d : decisions)
      std::cout << "  " << d.what << ": " << (d.decomposed ? "decomposed into ring steps" : "kept whole") << " ("
                << d.why << ")\n";
  }
  std::cout << "\n" << explain_kernels(p) << "\n" << explain_schedule(p, mesh);
  // Each kernel's config for the target `run` (cpu) or `compile` (cuda) would use,
  // and where it comes from: the tuning cache's best measured entry, or the default.
  bool cache_failed = false;
  std::unique_ptr<TuneCache> cache = open_tune_cache(o.cache.dir, false, &cache_failed);
  if (cache_failed) return 1;
  TuneSetup setup{o.device, arch, parse_buckets(o.cache.buckets), o.allow_tf32, !o.no_tma};
  ConfigChooser chooser(setup, cache.get());
  std::cout << "\nkernel configs (" << (o.device == "cpu" ? "host" : arch) << ", cache " << (cache ? cache->dir() : std::string("none")) << "):\n";
  for (const LocalKernel& k : p.kernels) {
    KernelChoice c = chooser.choose(k);
    std::cout << "  " << k.name << ": " << (c.text.empty() ? "(no emitter)" : c.text) << "  ["
              << config_source_name(c.source) << "]\n";
    // Which matmul kernel that config gets on the GPU: tensor cores or SIMT FMA, and why.
    if (o.device == "cuda" && k.kind == KernelKind::Matmul)
      if (Result<MatmulPath> mp = matmul_path(KernelSpec{k.name, KernelKind::Matmul, k.group, Precision::Fused, o.allow_tf32, !o.no_tma},
                                              c.config, arch);
          mp.ok())
        std::cout << "    " << (mp->tensor_cores ? "tensor cores: " : "SIMT FMA, no tensor cores: ") << mp->why << "\n";
    // The wide pointwise default (sm_90+) holds 64 registers a thread: compile checks
    // it with ptxas and narrows it where it spills, which explain does not run.
    if (o.device == "cuda" && k.kind == KernelKind::Pointwise && c.source == ConfigSource::Default && c.config.block == 1024)
      std::cout << "    compile takes " << config_str(KernelKind::Pointwise, ConfigTarget::Gpu, narrow_pointwise_default(c.config))
                << " instead where ptxas reports spills for this one (report.txt says which)\n";
    // The attention's form on the GPU, and the wgmma form sm_90a offers.
    if (o.device == "cuda" && k.kind == KernelKind::Attention) {
      const KernelSpec spec{k.name, KernelKind::Attention, k.group};
      const bool tc = attention_uses_tensor_cores(spec, c.config, arch);
      std::cout << "    " << (tc ? (c.config.wgmma ? "tensor cores, wgmma" : "tensor cores, mma.sync") : "SIMT FMA, no tensor cores");
      if (tc && !c.config.wgmma && arch == "sm_90a") {
        KernelConfig g = c.config;
        g.wgmma = 1;
        const std::optional<std::string> why = attention_wgmma_unfit(k.group, g, arch);
        std::cout << (why ? " (not wgmma: " + *why + ")"
                          : std::string(" (the default takes wgmma from 256 query rows a head; compile "
                                        "--attention-config \"wgmma=1\" forces it on this tile)"));
      }
      std::cout << "\n";
      // Where the wgmma form's k and v come from (TMA through which maps, or the
      // copies and why): the emitter decides it, so it is built here (no PTX).
      if (tc && c.config.wgmma) {
        KernelSpec wspec = spec;
        wspec.tma = !o.no_tma;
        if (Result<EmittedKernel> e = emit_attention(wspec, c.config, llvmb::Target::nvptx(arch)); e.ok() && !e->form.empty())
          std::cout << "    " << e->form << "\n";
      }
      if (Result<AttentionKernelInfo> ai = attention_info(k.group); ai.ok())
        if (std::string order = attention_order_str(attention_block_order(k.group, *ai, c.config, attention_block_shape(*ai, c.config, tc)));
            !order.empty())
          std::cout << "    " << order << "\n";
    }
    // Whether `tune --device cuda` measures a library GEMM for it, and which call.
    if (o.device == "cuda" && k.kind == KernelKind::Matmul) {
      Result<ExternGemm> x = extern_gemm(k);
      if (x) x->desc.tf32 = o.allow_tf32 && x->desc.dtype == DType::F32;
      std::cout << "    library GEMM: " << (x ? "offered to the tuner: " + gemm_str(x->desc) : x.error().message) << "\n";
      if (!x) {  // then perhaps the library's bare product and a generated epilogue kernel
        Result<ExternGemmEpilogue> sx = extern_gemm_epilogue(k);
        if (sx) sx->gemm.desc.tf32 = o.allow_tf32 && sx->gemm.desc.dtype == DType::F32;
        std::cout << "    " << (sx ? "library GEMM + epilogue kernel: offered to the tuner: " + gemm_str(sx->gemm.desc) +
                                        ", then " + sx->epilogue.name
                                  : sx.error().message)
                  << "\n";
      }
    }
  }
  return 0;
}

}  // namespace

void add_explain(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ExplainOptions>();
  auto* cmd = app.add_subcommand("explain", "Print sharding decisions, inserted collectives and the per-rank schedule");
  cmd->add_option("graph", o->file, "the .sf graph file")->required();
  cmd->add_option("--world", o->world, "number of ranks: resizes a 1-D mesh; must equal the product of an N-D mesh")
      ->check(CLI::Range(int64_t{1}, kMaxMeshRanks));
  cmd->add_option("--rank", o->rank, "whose schedule to print (default 0; ranks differ only in local shapes)");
  cmd->add_flag("--no-fuse", o->no_fuse, "one kernel per op (no fusion)");
  cmd->add_flag("--no-flash-attention", o->no_flash_attention,
                "attention as matmul, softmax and matmul kernels (torch's math backend), not one kernel");
  add_verify_each_option(cmd);
  add_decompose_options(cmd, o->decompose);
  cmd->add_option("--dump-after", o->dump_after,
                  "print the IR after these stages instead: all, or a comma list of parse, propagate, lower, "
                  "decompose, collective-matmul, fuse, schedule, emit, as this command runs them (emit shows each kernel's LLVM IR for the host)");
  cmd->add_flag("--no-reorder", o->no_reorder,
                "print the schedule as lowered, without raising collectives and sinking waits");
  add_cache_options(cmd, o->cache);
  add_allow_tf32_option(cmd, o->allow_tf32);
  add_no_tma_option(cmd, o->no_tma);
  cmd->add_option("--device", o->device, "whose kernel configs to show: cpu (what run uses, default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--arch", o->arch, "GPU architecture for --device cuda (default: --system's, else sm_90a)")
      ->check(CLI::IsMember({"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}));
  cmd->footer(
      "The schedule has one step per line: 'all_gather x -> x_ag [tp, dim 0]' issues a collective,\n"
      "'wait x_ag' takes its result, 'kernel k0_matmul_add x_ag, w -> h' runs a fused kernel.\n"
      "Example:\n  shardfuse explain examples/tp_attention.sf --world 4");
  cmd->callback([o, &exit_code] { exit_code = explain(*o); });
}

void add_decompose_options(CLI::App* cmd, DecomposeCliOptions& o, bool system_option) {
  cmd->add_option("--decompose", o.mode,
                  "collective matmuls (all_gather -> matmul, matmul -> reduce_scatter) as ring steps that overlap "
                  "the shifts with per-shard compute: auto (when the estimate says it hides the collective; "
                  "default), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd->add_flag("--no-decompose", o.never, "the same as --decompose never");
  if (system_option) add_system_option(cmd, o.system);
}

void add_system_option(CLI::App* cmd, std::string& path) {
  cmd->add_option("--system", path,
                  "a system file (examples/systems/*.json): its links choose the shardings and price the "
                  "collective-matmul decomposition, its GPU's rates price the compute (default: one 8-GPU NVLink "
                  "node and the --arch row of the arch table)")
      ->check(non_empty());
}

DecomposeMode decompose_mode(const DecomposeCliOptions& o) {
  return o.never ? DecomposeMode::Never : parse_decompose_mode(o.mode).value_or(DecomposeMode::Auto);
}

std::optional<DecomposeOptions> perf_model(const DecomposeCliOptions& o, std::string* arch, bool allow_tf32) {
  DecomposeOptions d;
  d.mode = decompose_mode(o);
  d.allow_tf32 = allow_tf32;
  if (!o.system.empty()) {
    Result<SystemSpec> sys = load_system(o.system);
    if (!sys) {
      std::cerr << sys.error().str() << "\n";
      return std::nullopt;
    }
    if (arch && arch->empty()) *arch = sys->gpu.arch;
    if (arch && *arch != sys->gpu.arch) {
      std::cerr << "error: --system " << o.system << " has " << sys->gpu.name << " GPUs (" << sys->gpu.arch
                << "), but the kernels are for " << *arch << ": pass --arch " << sys->gpu.arch
                << " or a system of " << *arch << " GPUs\n";
      return std::nullopt;
    }
    d.comm = comm_rates(*sys);
    d.rates = device_rates(sys->gpu);
    return d;
  }
  if (arch && arch->empty()) *arch = "sm_90a";
  if (arch)
    if (Result<DeviceRates> r = arch_rates(*arch)) d.rates = *r;
  return d;
}

void add_precision_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--precision", value,
                  "f16/bf16 values inside a fused kernel: fused (default: kept in f32, rounded once where stored, "
                  "as Inductor) or eager (rounded at every op, as eager PyTorch and the reference)")
      ->check(CLI::IsMember({"fused", "eager"}));
}

Precision precision_of(const std::string& value) { return value == "eager" ? Precision::Eager : Precision::Fused; }

void add_no_tma_option(CLI::App* cmd, bool& value) {
  cmd->add_flag("--no-tma", value,
                "sm_90a matmuls copy their operands, and wgmma attention its k and v, with cp.async instead of TMA "
                "(cp.async.bulk.tensor through tensor maps the runtime encodes)");
}

void add_allow_tf32_option(CLI::App* cmd, bool& value) {
  cmd->add_flag("--allow-tf32", value,
                "f32 matmuls may multiply on the tensor cores in TF32 (10-bit mantissa inputs, f32 sums), as "
                "torch.backends.cuda.matmul.allow_tf32 = True; off: exact f32 FMA (GPU kernels only)");
}

}  // namespace sf::cli
