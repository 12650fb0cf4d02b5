#include "codegen/kernels/compile_plan.h"

#include "codegen/kernels/attention.h"

#include "codegen/ir/decompose.h"

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cstdio>
#include <deque>
#include <functional>
#include <thread>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "autotune/ptxas.h"
#include "autotune/target.h"
#include "runtime/core/file_io.h"
#include "codegen/ir/printer.h"
#include "codegen/kernels/extern_gemm.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/reduction.h"
#include "codegen/reference/evaluate.h"
#include "runtime/core/shard.h"
#include "codegen/dist/plan_graph.h"
#include "runtime/plan/plan_verify.h"

namespace sf {

namespace {

constexpr const char* kHostObjectFile = "host_kernels.so";

// A kernel run by the reference evaluator on its group: the args' bytes in, the
// outputs' bytes out (`run --kernels reference`, and groups no host emitter builds).
std::function<Result<void>(void**)> reference_host_kernel(const Graph& group) {
  auto g = std::make_shared<const Graph>(group);
  return [g](void** args) -> Result<void> {
    std::vector<Tensor> in;
    size_t a = 0;
    for (ValueId p : g->params()) {
      const TensorType& t = g->node(p).type;
      in.emplace_back(t.dtype, t.shape);
      if (in.back().nbytes()) std::memcpy(in.back().data(), args[a], in.back().nbytes());
      ++a;
    }
    Result<std::vector<Tensor>> out = evaluate(*g, in);
    if (!out) return out.error();
    for (const Tensor& t : *out) {
      if (t.nbytes()) std::memcpy(args[a], t.data(), t.nbytes());
      ++a;
    }
    return {};
  };
}

// Links the kernels' host objects (empty where a kernel has none) into one shared
// object, through a scratch directory; its bytes, or "" when no kernel has host code.
Result<std::string> link_host_objects(const std::vector<PlanKernel>& kernels, const std::vector<std::string>& objects) {
  namespace fs = std::filesystem;
  if (std::all_of(objects.begin(), objects.end(), [](const std::string& o) { return o.empty(); })) return std::string();
  std::error_code ec;
  std::mt19937_64 rng(std::random_device{}());
  const fs::path dir = fs::temp_directory_path(ec) / ("shardfuse-host-" + std::to_string(rng() % 1000000000000));
  if (ec || !fs::create_directory(dir, ec)) return Diag{dir.string(), {}, "cannot create a scratch directory"};
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(dir, e);
    }
  } cleanup{dir};
  std::vector<std::string> paths;
  for (size_t i = 0; i < objects.size(); ++i) {
    if (objects[i].empty()) continue;
    paths.push_back((dir / (kernels[i].id + ".o")).string());
    std::ofstream f(paths.back(), std::ios::binary);
    f.write(objects[i].data(), static_cast<std::streamsize>(objects[i].size()));
    f.close();
    if (!f) return Diag{paths.back(), {}, "cannot write it"};
  }
  const std::string so = (dir / kHostObjectFile).string();
  SF_TRY(llvmb::link_host_shared_object(paths, so));
  return read_regular_file(so, kMaxPlanFileBytes, "");
}



std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The steps of a fused kernel whose chosen winner is a library GEMM (the tuning
// cache's choice, codegen/kernels/extern_gemm.h), over the kernel step's buffers
// (`in`: its params in order; `out`: its outputs): one gemm step, or for the split
// form ("cublaslt+epilogue") a gemm step writing the bare product into a buffer
// added to `r` (or into the output that is the product) followed by a kernel step of
// the epilogue kernel, which is kept in `epilogues` and named by `kernel_id`. Empty
// when the choice is a generated config, or when the library cannot compute the
// kernel after all (then `notes` says why, and the kernel is compiled with its
// default config).
std::vector<PlanStep> extern_steps(const LocalKernel& k, const std::vector<int>& in, const std::vector<int>& out,
                                   const CompileOptions& opts, PlanRank& r, std::deque<LocalKernel>& epilogues,
                                   const std::function<std::string(const LocalKernel&)>& kernel_id,
                                   std::map<std::string, std::string>* notes) {
  if (!opts.choose) return {};
  const KernelChoice c = opts.choose(k);
  if (c.library.empty()) return {};
  std::optional<ExternChoice> choice = parse_extern_choice(c.library);
  std::string why = !choice ? "unknown library \"" + c.library + "\"" : "";
  std::optional<ExternGemm> x;
  std::optional<ExternGemmEpilogue> split;
  if (choice && !choice->epilogue_kernel) {
    Result<ExternGemm> whole = extern_gemm(k);
    if (whole) x = *whole;
    else why = whole.error().message;
  } else if (choice) {
    Result<ExternGemmEpilogue> s = extern_gemm_epilogue(k);
    if (s) {
      split = std::move(s).value();
      x = split->gemm;
    } else {
      why = s.error().message;
    }
  }
  if (x && std::find(x->libraries.begin(), x->libraries.end(), choice->library) == x->libraries.end())
    why = c.library + " cannot compute its epilogue " + std::string(gemm_epilogue_name(x->desc.epilogue));
  auto fits = [](int i, const std::vector<int>& v) { return i >= 0 && i < static_cast<int>(v.size()); };
  bool args_fit = x && fits(x->a, in) && fits(x->b, in) && x->bias < static_cast<int>(in.size()) &&
                  (fits(x->c, out) || (split && x->c == kGemmProduct));
  if (split) {
    for (int i : split->epilogue_in) args_fit = args_fit && (i == kGemmProduct || fits(i, in));
    for (int o : split->epilogue_out) args_fit = args_fit && fits(o, out);
  }
  if (why.empty() && !args_fit) why = "internal: the kernel step's buffers are not the group's arguments";
  if (!why.empty()) {
    (*notes)[k.name] = "the cache chose " + c.text + ", but " + why + "; compiled as a generated kernel";
    return {};
  }
  PlanStep ps;
  ps.op = "gemm";
  ps.stream = "compute";
  ps.gemm.name = k.name;
  ps.gemm.desc = x->desc;
  ps.gemm.desc.library = choice->library;
  ps.gemm.desc.tf32 = opts.allow_tf32 && x->desc.dtype == DType::F32;
  ps.in = {in[static_cast<size_t>(x->a)], in[static_cast<size_t>(x->b)]};
  if (x->bias >= 0) ps.in.push_back(in[static_cast<size_t>(x->bias)]);
  std::string& note = (*notes)[k.name];
  note = gemm_str(ps.gemm.desc);
  if (!split) {
    ps.out = {out[static_cast<size_t>(x->c)]};
    note += " (" + std::string(config_source_name(c.source)) + ")";
    return {ps};
  }
  // The product: the output that is the matmul's own result, or a buffer of its own
  // (the matmul's local type), which only these two steps touch.
  int product = 0;
  if (x->c == kGemmProduct) {
    const TensorType& pt = split->epilogue.group.node(split->epilogue.group.params()[0]).type;
    r.buffers.push_back({k.name + ".product", pt.dtype, pt.shape});
    product = static_cast<int>(r.buffers.size()) - 1;
  } else {
    product = out[static_cast<size_t>(x->c)];
  }
  ps.out = {product};
  PlanStep ks;
  ks.op = "kernel";
  ks.stream = "compute";
  for (int i : split->epilogue_in) ks.in.push_back(i == kGemmProduct ? product : in[static_cast<size_t>(i)]);
  for (int o : split->epilogue_out) ks.out.push_back(out[static_cast<size_t>(o)]);
  epilogues.push_back(std::move(split->epilogue));
  ks.kernel = kernel_id(epilogues.back());
  note += ", then kernel " + ks.kernel + " (" + std::string(config_source_name(c.source)) + ")";
  return {ps, ks};
}

}  // namespace

Result<CompiledPlan> compile_plan(const Graph& g0, const CompileOptions& opts) {
  // cross_entropy decomposed before propagation (decompose.h); params and outputs
  // keep their order and names, so the Plan runs g0's inputs and outputs.
  const Graph g = decompose_for_sharding(g0);
  DeviceMesh mesh(g.mesh());
  RankPipelineOptions po = opts.pipeline;
  // One performance model for every choice below and the report: the links of
  // po.decompose.comm (a system file's, else the defaults) choose the shardings and
  // price the decomposition's collectives; compute is priced at the system's GPU
  // when the caller gave one, else at the target arch's row.
  ShardingPlan sharding = propagate(g, mesh, po.decompose.comm);
  if (opts.replicate_outputs)
    for (PlacementSpec& s : sharding.outputs) s = replicated(mesh);
  if (!po.decompose.rates)
    if (Result<DeviceRates> r = arch_rates(opts.arch)) po.decompose.rates = *r;
  po.decompose.allow_tf32 = opts.allow_tf32;
  if (!po.can_emit && opts.host == CompileOptions::HostCode::Reference && !opts.ptx)
    po.can_emit = [](const LocalKernel&) { return true; };  // the evaluator runs any group
  if (!po.can_emit)
    po.can_emit = emit_checker(opts.ptx ? llvmb::Target::nvptx(opts.arch) : llvmb::Target::host(), opts.config);
  Result<std::vector<LocalProgram>> ran = rank_programs(g, sharding, mesh, po);
  if (!ran.ok()) return ran.error();
  std::vector<LocalProgram> programs = std::move(ran).value();

  CompiledPlan out;
  Plan& plan = out.plan;
  plan.graph = g.name();
  plan.graph_digest = plan_graph_digest(g0);  // the graph file's, which exec reloads
  plan.mesh = g.mesh().str();
  plan.world = mesh.world();
  plan.arch = opts.arch;
  plan.precision = opts.precision == Precision::Eager ? "eager" : "fused";
  for (ValueId p : g.params()) plan.params.push_back(g.node(p).name);
  for (const Output& o : g.outputs()) plan.outputs.push_back(o.name);

  // Distinct kernels first (ranks with equal local shapes share one), then every
  // one emitted and compiled, in parallel: each has its own LLVMContext.
  std::map<std::string, std::string> id_of;  // kernel key -> PlanKernel id
  std::vector<const LocalKernel*> sources;
  auto kernel_id = [&](const LocalKernel& k) -> std::string {
    std::string key = kernel_key(k);
    if (auto it = id_of.find(key); it != id_of.end()) return it->second;
    std::string id = "k" + std::to_string(plan.kernels.size()) + k.name.substr(k.name.find('_'));
    id_of.emplace(key, id);
    PlanKernel pk;
    pk.id = id;
    pk.entry = "sf_" + id;
    pk.kind = k.kind;
    pk.ptx_file = opts.ptx ? id + ".ptx" : "";
    pk.bytes_read = k.bytes_read;
    pk.bytes_written = k.bytes_written;
    pk.flops = k.flops;
    pk.ops = k.ops;
    plan.kernels.push_back(std::move(pk));
    sources.push_back(&k);
    return id;
  };
  std::vector<std::string> errors;
  std::deque<LocalKernel> epilogues;  // the epilogue kernels of split library GEMMs (sources point into it)
  std::map<std::string, std::string> gemm_notes;  // report.txt: per fused kernel, its library GEMM or why not

  for (const LocalProgram& p : programs) {
    PlanRank r;
    r.rank = p.rank;
    std::map<int, int> buf;  // local value -> buffer
    auto buffer = [&](int v) {
      auto it = buf.find(v);
      if (it != buf.end()) return it->second;
      r.buffers.push_back({p.names[static_cast<size_t>(v)], p.types[static_cast<size_t>(v)].dtype,
                           p.types[static_cast<size_t>(v)].shape});
      int b = static_cast<int>(r.buffers.size()) - 1;
      buf.emplace(v, b);
      return b;
    };
    for (size_t i = 0; i < p.param_values.size(); ++i) {
      r.inputs.push_back(buffer(p.param_values[i]));
      r.input_specs.push_back(sharding.nodes[static_cast<size_t>(g.params()[i])].output.str(mesh.mesh()));
    }
    for (const LocalStep& s : p.steps) {
      PlanStep ps;
      for (int v : s.in) ps.in.push_back(buffer(v));
      if (s.out >= 0) ps.out.push_back(buffer(s.out));
      for (int v : s.outs) ps.out.push_back(buffer(v));
      std::string md = mesh.ndim() ? mesh.mesh().dims[static_cast<size_t>(s.mesh_dim)].name : "";
      switch (s.kind) {
        case LocalStep::Kind::Kernel: {
          const LocalKernel& lk = p.kernels[static_cast<size_t>(s.kernel)];
          std::vector<PlanStep> xs = extern_steps(lk, ps.in, ps.out, opts, r, epilogues, kernel_id, &gemm_notes);
          if (!xs.empty()) {
            ps = std::move(xs.back());
            xs.pop_back();
            for (PlanStep& x : xs) r.steps.push_back(std::move(x));
            break;
          }
          ps.op = "kernel";
          ps.stream = "compute";
          ps.kernel = kernel_id(lk);
          break;
        }
        case LocalStep::Kind::Start:
          ps.op = std::string(collective_name(s.collective));
          ps.stream = "comm";
          ps.handle = s.handle;
          ps.mesh_dim = md;
          ps.group = mesh.group(p.rank, s.mesh_dim);
          ps.dim = s.dim;
          ps.dim2 = s.dim2;
          if (s.collective == CollectiveKind::AllReduce || s.collective == CollectiveKind::ReduceScatter)
            ps.reduce_op = std::string(reduce_op_name(s.op));
          ps.sizes = s.sizes;
          ps.sizes2 = s.sizes2;
          break;
        case LocalStep::Kind::Wait:
          ps.op = "wait";
          ps.stream = "compute";
          ps.handle = s.handle;
          break;
        case LocalStep::Kind::Slice:
          ps.op = "slice";
          ps.stream = "compute";
          ps.mesh_dim = md;
          ps.offset = s.offset;
          break;
        case LocalStep::Kind::Concat:
          ps.op = "concat";
          ps.stream = "compute";
          ps.dim = s.dim;
          break;
        case LocalStep::Kind::Partialize:
          ps.op = "partialize";
          ps.stream = "compute";
          ps.mesh_dim = md;
          ps.keep = s.keep;
          break;
        case LocalStep::Kind::Compute:
          errors.push_back("rank " + std::to_string(p.rank) + ": an unfused " + std::string(op_name(s.node.op)) +
                           " step is left (internal)");
          continue;
      }
      r.steps.push_back(std::move(ps));
    }
    for (size_t o = 0; o < p.output_values.size(); ++o) {
      r.outputs.push_back(buffer(p.output_values[o]));
      r.output_specs.push_back(p.output_specs[o].str(mesh.mesh()));
    }
    plan.ranks.push_back(std::move(r));
  }
  // Host code: one object per kernel (linked into one shared object below), or
  // functions in this process's JIT.
  std::vector<std::string> host_objects(plan.kernels.size()), host_why(plan.kernels.size());
  std::vector<void*> host_fns(plan.kernels.size(), nullptr);
  std::shared_ptr<llvmb::HostJit> jit;
  if (opts.host == CompileOptions::HostCode::Jit) {
    Result<std::unique_ptr<llvmb::HostJit>> j = llvmb::HostJit::create();
    if (!j) return j.error();
    jit = std::move(j).value();
  }
  auto build_host = [&](size_t i, KernelKind kind) {
    PlanKernel& pk = plan.kernels[i];
    const LocalKernel& k = *sources[i];
    KernelSpec spec{pk.entry, kind, k.group, opts.precision, opts.allow_tf32, false};
    const KernelConfig cfg = opts.host_choose ? opts.host_choose(k) : KernelConfig{};
    Result<EmittedKernel> e = emitter_for(kind).emit(spec, cfg, llvmb::Target::host());
    if (!e) {
      host_why[i] = e.error().message;
      return;
    }
    const std::string entry = e->entry;
    if (jit) {
      Result<void*> fn = jit->add(std::move(e->module), std::move(e->context), entry);
      if (!fn) {
        host_why[i] = fn.error().message;
        return;
      }
      host_fns[i] = *fn;
    } else {
      Result<std::string> obj = llvmb::compile_to_host_object(*e->module);
      if (!obj) {
        host_why[i] = obj.error().message;
        return;
      }
      host_objects[i] = std::move(obj).value();
    }
    pk.host_symbol = entry;
    pk.host_zero_outputs = e->launch.zero_outputs;
    pk.host_config = config_str(kind, ConfigTarget::Host, cfg);
  };
  std::vector<std::string> kernel_errors(plan.kernels.size());
  std::vector<std::string> forms(plan.kernels.size());  // report.txt: how a kernel reads its data
  std::vector<std::string> emitted_forms(plan.kernels.size());  // EmittedKernel::form, appended to it
  std::vector<std::string> kernel_ptx(plan.kernels.size());
  // Emits kernel i's PTX under `cfg` into the Plan and kernel_ptx (or kernel_errors),
  // running ptxas where asked: whether ptxas reported spills.
  auto build_ptx = [&](size_t i, const KernelSpec& spec, const KernelConfig& cfg) -> bool {
    PlanKernel& pk = plan.kernels[i];
    Result<EmittedKernel> e = emitter_for(spec.kind).emit(spec, cfg, llvmb::Target::nvptx(opts.arch));
    if (!e.ok()) {
      kernel_errors[i] = pk.id + ": " + e.error().message;
      return false;
    }
    pk.grid = e->launch.grid;
    pk.block = e->launch.block;
    pk.shared_bytes = e->launch.shared_bytes;
    pk.zero_outputs = e->launch.zero_outputs;
    pk.persistent = e->launch.persistent;
    pk.cluster = e->launch.cluster;
    pk.workspace_bytes = e->launch.workspace_bytes;
    emitted_forms[i] = e->form;
    pk.tensor_maps = e->launch.tensor_maps;
    Result<std::string> ptx = llvmb::compile_to_ptx(*e->module, opts.arch);
    if (!ptx.ok()) {
      kernel_errors[i] = pk.id + ": " + ptx.error().message;
      return false;
    }
    if (opts.run_ptxas && find_ptxas().ok()) {
      PtxasOptions po;
      po.arch = opts.arch;
      po.ptx_name = pk.ptx_file;
      Result<std::vector<KernelResources>> res = run_ptxas(*ptx, po);
      if (!res.ok()) {
        kernel_errors[i] = pk.id + ": ptxas rejected it: " + res.error().str();
        return false;
      }
      if (!res->empty()) {
        pk.registers = (*res)[0].registers;
        pk.spill_bytes = (*res)[0].spill_store_bytes + (*res)[0].spill_load_bytes;
      }
    }
    kernel_ptx[i] = std::move(ptx).value();
    return pk.spill_bytes > 0;
  };
  const std::string default_source(config_source_name(ConfigSource::Default));
  auto build = [&](size_t i) {
    PlanKernel& pk = plan.kernels[i];
    const LocalKernel& k = *sources[i];
    const KernelKind kind = k.kind;
    if (opts.host == CompileOptions::HostCode::Reference) {
      const std::string why = "--kernels reference";
      if (opts.ptx) kernel_errors[i] = pk.id + ": " + why;
      else host_why[i] = why;  // runs on the reference evaluator
      return;
    }
    KernelSpec spec{pk.entry, kind, k.group, opts.precision, opts.allow_tf32, opts.tma};
    KernelConfig cfg = opts.config;
    pk.config_source = std::string(config_source_name(ConfigSource::Default));
    if (opts.choose) {
      KernelChoice c = opts.choose(k);
      cfg = c.config;
      // A library GEMM that cannot compute the kernel here (gemm_step said why):
      // the generated kernel, with the default config the choice carries.
      pk.config_source = std::string(config_source_name(c.library.empty() ? c.source : ConfigSource::Default));
    } else if (kind == KernelKind::Reduction) {
      // Untuned reductions start from the emitter's suggestion for their row shape
      // (a 16-wide row wants few threads per row).
      if (Result<KernelConfig> s = suggest_reduction_config(spec, cfg); s.ok()) cfg = *s;
    }
    const std::optional<std::string>& flag_text =
        kind == KernelKind::Attention ? opts.attention_config
                                      : kind == KernelKind::Reduction ? opts.reduction_config : std::optional<std::string>{};
    if (flag_text) {
      Result<KernelConfig> c = parse_config_str(*flag_text, cfg);
      if (!c) {
        kernel_errors[i] = pk.id + ": --" + std::string(kernel_kind_name(kind)) + "-config: " + c.error().message;
        return;
      }
      cfg = *c;
      pk.config_source = "flag";
    }
    if (kind == KernelKind::Matmul && opts.matmul_config) {
      cfg = *opts.matmul_config;
      pk.config_source = "flag";
      if (cfg.warp_specialize || cfg.persistent || cfg.pingpong || cfg.setmaxnreg || cfg.tma_store || cfg.cluster_m > 1 ||
          cfg.cluster_n > 1) {
        Result<MatmulPath> path = matmul_path(spec, cfg, opts.arch);
        if (path.ok() && !path->tensor_cores) {
          kernel_errors[i] = pk.id + ": --matmul-config '" + config_str(kind, ConfigTarget::Gpu, cfg) +
                             "' asks for the tensor-core kernel, which cannot compute it: " + path->why;
          return;
        }
      }
    }
    pk.config = config_str(kind, ConfigTarget::Gpu, cfg);
    if (kind == KernelKind::Reduction)
      if (Result<ReductionInfo> ri = reduction_info(spec, cfg); ri.ok()) {
        forms[i] = ri->persistent
                       ? "rows in registers (" + std::to_string(ri->elems_per_thread) + " elements per thread, " +
                             std::to_string(ri->vector) + " per access), read once"
                       : "multi-pass: each row read " + std::to_string(ri->row_reads()) +
                             " time(s) (" +
                             std::to_string((ri->row_elems + int64_t{cfg.threads_per_row} * ri->split - 1) /
                                            (int64_t{cfg.threads_per_row} * ri->split)) +
                             " elements per thread do not fit 32 registers, or the row is split)";
        if (ri->split > 1)
          forms[i] += "; each row split over " + std::to_string(ri->split) +
                      " blocks (grid y), its shares' partials combined in order by the last block to finish (a " +
                      std::to_string(ri->launch.workspace_bytes) + "-byte workspace)";
        if (ri->inner_kept && ri->rows > 1)
          forms[i] += ri->adjacent_lanes > 1
                          ? "; outer reduction: a warp's lanes read " + std::to_string(ri->adjacent_lanes) +
                                " neighbouring rows at each element"
                          : std::string("; outer reduction with one row a block: a warp's lanes read one row's "
                                        "elements, which lie a row or more apart (uncoalesced; rows_per_block >= 2 "
                                        "puts the lanes on neighbouring rows)");
      }
    if (kind == KernelKind::Attention)
      if (Result<AttentionKernelInfo> ai = attention_info(spec.group); ai.ok()) {
        const std::optional<std::string> unfit = attention_mma_unfit(spec.group, cfg);
        const bool tc = attention_uses_tensor_cores(spec, cfg, opts.arch);
        const AttentionBlockShape shape = attention_block_shape(*ai, cfg, tc);
        forms[i] = std::string(tc ? std::string(cfg.wgmma ? "tensor cores (wgmma.mma_async m64nNk16, a warpgroup's 64 rows)"
                                                          : "tensor cores (mma.sync m16n8k16)") +
                                        std::string(shape.registers
                                                        ? ", scores and output in registers (" +
                                                              std::to_string(16 * shape.mtiles) + " rows a warp)"
                                                        : ", scores and output through shared memory (block_m " +
                                                              std::to_string(shape.bm) + " is not 16 or 32 x " +
                                                              std::to_string(cfg.warps) + " warps)")
                                  : "FMA tiles (" + unfit.value_or(opts.arch + " has no mma.sync") + ")") +
                   ", online softmax over key tiles of up to " + std::to_string(cfg.block_n) +
                   (ai->match.causal_diagonal ? ", causal: tiles past the diagonal skipped" : "") +
                   "; no score matrix in memory";
        if (std::string order = attention_order_str(attention_block_order(spec.group, *ai, cfg, shape)); !order.empty())
          forms[i] += "; " + order;
      }
    if (opts.host != CompileOptions::HostCode::None) build_host(i, kind);
    if (!opts.ptx) return;
    // The large-kernel pointwise default (1024 threads, so at most 64 registers a
    // thread; default_kernel_config) spills where a kernel's element needs more (a
    // RoPE's sin and cos): such a kernel is built again with the narrow default, 256
    // threads, which allows 255. Where that spills too (libdevice's sin and cos over
    // a vector of 8: their range reductions' cold paths), halving the vector, down
    // to 2, keeps the first config that does not; if none, the narrow default.
    const bool spills = build_ptx(i, spec, cfg);
    if (spills && kind == KernelKind::Pointwise && pk.config_source == default_source) {
      const KernelConfig narrow = narrow_pointwise_default(cfg);
      KernelConfig c = narrow;
      bool still = narrow == cfg || build_ptx(i, spec, narrow);
      while (still && c.vector > 2) {
        c.vector /= 2;
        still = build_ptx(i, spec, c);
      }
      if (still && c != narrow) build_ptx(i, spec, c = narrow);
      if (c != cfg) pk.config = config_str(kind, ConfigTarget::Gpu, c);
    }
    // sm_90a's wgmma attention default, 256 rows on 16 warps, leaves 128 registers a
    // thread; where that spills (76 bytes in the bench attention and transformer
    // blocks' kernels), 192 x 96 on 12 warps (168 registers; on an H200 within 2% of
    // it on the sdpa block, run 11), then the 128 x 64 mma.sync default.
    if (spills && kind == KernelKind::Attention && pk.config_source == default_source && cfg.wgmma == 1 &&
        cfg.block_m == 256) {
      KernelConfig c = cfg;
      c.block_m = 192;
      c.block_n = 96;
      c.warps = 12;
      if (!attention_tiles_fit(spec.group, c, opts.arch) || build_ptx(i, spec, c)) {
        c.block_m = 128;
        c.block_n = 64;
        c.warps = 8;
        c.wgmma = 0;
        build_ptx(i, spec, c);
      }
      pk.config = config_str(kind, ConfigTarget::Gpu, c);
    }
  };
  {
    std::atomic<size_t> next{0};
    unsigned n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(),
                                                 static_cast<unsigned>(plan.kernels.size())));
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < n; ++t)
      pool.emplace_back([&] {
        for (size_t i; (i = next++) < plan.kernels.size();) build(i);
      });
    for (std::thread& t : pool) t.join();
  }
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    if (!kernel_errors[i].empty()) errors.push_back(kernel_errors[i]);
    else if (opts.ptx) out.ptx.emplace(plan.kernels[i].ptx_file, std::move(kernel_ptx[i]));
  }
  if (!errors.empty()) {
    std::string m = "cannot compile " + std::to_string(errors.size()) + " kernel(s) for " + opts.arch + ":";
    for (const std::string& e : errors) m += "\n  " + e;
    return Diag{"", {}, m};
  }

  if (opts.host == CompileOptions::HostCode::Jit || opts.host == CompileOptions::HostCode::Reference) {
    // Generated code where the host emitter built it, the reference evaluator on the
    // kernel's group elsewhere (named in `missing`, so `run` can list them).
    auto hk = std::make_shared<HostKernels>();
    hk->owner = jit;
    hk->origin = jit ? "compiled in this process" : "the reference evaluator";
    for (size_t i = 0; i < plan.kernels.size(); ++i) {
      const PlanKernel& pk = plan.kernels[i];
      if (host_fns[i]) {
        hk->by_id[pk.id] = {[entry = reinterpret_cast<HostKernel::Entry>(host_fns[i])](void** args)
                                -> Result<void> {
                              entry(args);
                              return {};
                            },
                            pk.host_zero_outputs, true};
      } else {
        hk->by_id[pk.id] = {reference_host_kernel(sources[i]->group), false, false};
        hk->missing[pk.id] = host_why[i];
      }
    }
    out.host_kernels = std::move(hk);
  } else if (opts.host == CompileOptions::HostCode::Object) {
    Result<std::string> so = link_host_objects(plan.kernels, host_objects);
    if (!so) return with_context("the kernels' host code: ", so.error());
    if (!so->empty()) {
      plan.host_object = kHostObjectFile;
      out.host_object = std::move(so).value();
    }
  }

  std::string& rep = out.report;
  rep = "graph " + plan.graph + " for " + opts.arch + ", " + std::to_string(plan.world) + " rank(s)" +
        (plan.mesh.empty() ? "" : " on mesh " + plan.mesh) + "\n";
  // The rates the decomposition above priced with (autotune/perf_model.h: the
  // system's GPU, else the arch's row, datasheet figures), the one model simulate and
  // the tuner's ranking use too. A kernel whose PTX has mma.sync or wgmma is priced
  // at the tensor-core rate (TF32's for TF32 operands), the rest at FP32 SIMT.
  const bool known = po.decompose.rates.has_value();
  const DeviceRates peaks = known ? *po.decompose.rates : default_device_rates();
  const double tensor = peaks.tensor16_flops_s;
  rep += "roofline estimate on " + (known ? peaks.name : std::string("an unknown GPU (H100 SXM figures)")) + " (" +
         fmt("%.0f", peaks.hbm_bytes_s / 1e9) + " GB/s HBM, " + fmt("%.1f", peaks.fp32_flops_s / 1e12) +
         " TFLOP/s FP32 SIMT" +
         (tensor > 0 ? ", " + fmt("%.0f", tensor / 1e12) + " TFLOP/s f16/bf16 tensor cores" : std::string()) +
         "): time = max(bytes / bandwidth, flops / peak of the kernel's path)\n\n";
  rep += "kernel                                   kind       regs  spill     bytes      flops   est. us  bound\n";
  double total = 0;
  for (size_t ki = 0; ki < plan.kernels.size(); ++ki) {
    const PlanKernel& k = plan.kernels[ki];
    double bytes = static_cast<double>(k.bytes_read + k.bytes_written);
    auto ptx = out.ptx.find(k.ptx_file);
    const bool mma = tensor > 0 && ptx != out.ptx.end() && ptx_uses_tensor_cores(ptx->second);
    // TF32 (--allow-tf32) runs at half the 16-bit rate on the archs the table has.
    const bool tf32 = mma && ptx_uses_tf32(ptx->second);
    const double rate = tf32 ? peaks.tf32_flops_s : mma ? tensor : peaks.fp32_flops_s;
    const double tm = peaks.roofline_s(0, 0, bytes), tc = peaks.roofline_s(static_cast<double>(k.flops), rate, 0);
    total += std::max(tm, tc);
    char line[256];
    std::snprintf(line, sizeof line, "%-40s %-10s %4s %6s %9.0f %10lld %9.3f  %s\n", k.id.c_str(), std::string(kernel_kind_name(k.kind)).c_str(),
                  k.registers < 0 ? "-" : std::to_string(k.registers).c_str(),
                  k.spill_bytes < 0 ? "-" : std::to_string(k.spill_bytes).c_str(), bytes,
                  static_cast<long long>(k.flops), std::max(tm, tc) * 1e6,
                  tm >= tc ? "memory" : mma ? "compute (tensor cores)" : "compute");
    rep += line;
    rep += "    ops: ";
    for (size_t i = 0; i < k.ops.size(); ++i) rep += (i ? " " : "") + k.ops[i];
    rep += "\n    config (" + k.config_source + "): " + k.config + "\n";
    std::string form = forms[ki];
    if (!emitted_forms[ki].empty()) form += (form.empty() ? "" : "; ") + emitted_forms[ki];
    if (!form.empty()) rep += "    form: " + form + "\n";
    if (opts.host != CompileOptions::HostCode::None)
      rep += k.host_symbol.empty() ? "    host code: none (" + host_why[ki] + ")\n"
                                   : "    host config: " + k.host_config + "\n";
  }
  if (!gemm_notes.empty()) {
    rep += "\nlibrary GEMMs (the tuning cache's winners; run through the library at exec, no PTX):\n";
    for (const auto& [name, note] : gemm_notes) rep += "  " + name + ": " + note + "\n";
  }
  int64_t launches = 0, gemms = 0;
  for (const PlanStep& st : plan.ranks.empty() ? std::vector<PlanStep>{} : plan.ranks[0].steps) {
    launches += st.op == "kernel";
    gemms += st.op == "gemm";
  }
  rep += "\n" + std::to_string(plan.kernels.size()) + " distinct kernel(s); rank 0 runs " + std::to_string(launches) +
         " kernel launch(es)" + (gemms ? " and " + std::to_string(gemms) + " library GEMM(s)" : std::string()) +
         "; sum of estimates " + fmt("%.3f", total * 1e6) + " us\n";
  return out;
}

namespace {

// The file that marks a directory as a Plan `compile` wrote, listing the files it
// wrote there (one name a line after the first): `compile -o DIR` replaces DIR only
// when DIR is absent, empty, or holds this marker and nothing but the files it
// lists, so no directory or file of the user's is ever deleted (a directory named
// like a Plan is not one; a Plan the user saved outputs into is not ours alone).
constexpr const char* kPlanMarker = ".shardfuse-plan";
constexpr const char* kPlanMarkerHeader = "shardfuse plan directory: written by `shardfuse compile`";

// Why `target` (absolute, normalised) may not be replaced by a new Plan; nullopt
// when it may.
std::optional<std::string> why_not_replace(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The working directory or one that holds it: replacing it would pull the
  // directory out from under the user's shell (`-o .`, `-o ..`, `-o "$PWD"`).
  fs::path cwd = fs::current_path(ec);
  fs::path canon = fs::weakly_canonical(target, ec);
  if (!ec && !cwd.empty()) {
    auto [c, t] = std::mismatch(cwd.begin(), cwd.end(), canon.begin(), canon.end());
    if (t == canon.end())
      return std::string("is the current directory") + (c == cwd.end() ? "" : " or holds it") +
             ": refusing to replace it (name a new directory for the Plan)";
  }
  fs::file_status st = fs::symlink_status(target, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) return "cannot inspect it: " + ec.message();
  if (!fs::exists(st)) return std::nullopt;
  if (fs::is_symlink(st))
    return "is a symbolic link: refusing to replace it (name the Plan directory itself, or a new one)";
  if (!fs::is_directory(st))
    return "exists and is not a directory: refusing to replace it (remove it or choose another -o)";
  std::set<std::string> entries;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec))
    entries.insert(it->path().filename().string());
  if (ec) return "cannot list it: " + ec.message();
  if (entries.empty()) return std::nullopt;
  const std::string not_plan =
      "exists, is not empty, and is not a Plan directory written by `shardfuse compile` (no " +
      std::string(kPlanMarker) + " in it): refusing to replace it (remove it or choose another -o)";
  if (!entries.count(kPlanMarker)) return not_plan;
  Result<std::string> marker = read_regular_file((target / kPlanMarker).string(), kMaxJsonFileBytes, "");
  if (!marker) return not_plan;
  std::istringstream lines(*marker);
  std::string line;
  if (!std::getline(lines, line) || line != kPlanMarkerHeader) return not_plan;
  std::set<std::string> ours = {kPlanMarker};
  while (std::getline(lines, line)) ours.insert(line);
  for (const std::string& e : entries)
    if (!ours.count(e) || !fs::is_regular_file(fs::symlink_status(target / e, ec)))
      return "is a Plan directory, but " + e +
             " in it was not written by `shardfuse compile`: refusing to replace it (move " + e +
             " out, or choose another -o)";
  return std::nullopt;
}

}  // namespace

Result<void> write_plan_dir(const CompiledPlan& p, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) return Diag{dir, {}, "the Plan directory name is empty"};
  fs::path target = fs::absolute(dir, ec).lexically_normal();
  if (ec) return Diag{dir, {}, "cannot resolve the path: " + ec.message()};
  // "plan/" and "a/b/.." normalise to a trailing separator: drop it, so that
  // filename() names the directory itself.
  if (target.filename().empty() && target.has_relative_path()) target = target.parent_path();
  if (!target.has_relative_path()) return Diag{dir, {}, "is the root directory: refusing to replace it"};
  if (std::optional<std::string> why = why_not_replace(target)) return Diag{dir, {}, *why};
  fs::path parent = target.parent_path();
  fs::create_directories(parent, ec);
  if (ec) return Diag{dir, {}, "cannot create " + parent.string() + ": " + ec.message()};
  std::mt19937_64 rng(std::random_device{}());
  fs::path tmp = parent / (target.filename().string() + ".tmp-" + std::to_string(rng() % 1000000000));
  if (!fs::create_directory(tmp, ec))
    return Diag{dir, {}, "cannot create " + tmp.string() + ": " + (ec ? ec.message() : "it already exists")};
  std::string marker = std::string(kPlanMarkerHeader) + "\n";
  auto write = [&](const std::string& name, const std::string& text) {
    marker += name + "\n";
    std::ofstream f(tmp / name, std::ios::binary);
    f << text;
    f.close();
    return static_cast<bool>(f);
  };
  bool ok = write("plan.json", plan_to_json(p.plan)) && write("report.txt", p.report);
  for (const auto& [name, text] : p.ptx) ok = ok && write(name, text);
  if (!p.plan.host_object.empty()) ok = ok && write(p.plan.host_object, p.host_object);
  if (!p.graph_source.empty()) ok = ok && write("graph.sf", p.graph_source);
  if (ok) {
    std::ofstream f(tmp / kPlanMarker, std::ios::binary);
    f << marker;
    f.close();
    ok = static_cast<bool>(f);
  }
  if (!ok) {
    fs::remove_all(tmp, ec);
    return Diag{dir, {}, "cannot write the plan files"};
  }
  // Swap the new directory in (why_not_replace allowed replacing the old one: empty
  // or a Plan of ours), so a reader sees either the old plan or the new one.
  if (std::optional<std::string> why = swap_in_directory(tmp.string(), target.string())) return Diag{dir, {}, *why};
  return {};
}

}  // namespace sf
