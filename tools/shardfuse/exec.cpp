// `shardfuse exec PLAN_DIR --device cuda`: run a Plan compiled elsewhere (a machine
// with LLVM) on this machine's GPU, and the pieces `run` shares with it: inputs,
// sharding them per rank, gathering and reporting the outputs. No LLVM here: this
// file is part of the runtime-only build (SHARDFUSE_LLVM=OFF).
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "runtime/core/device_mesh.h"
#include "codegen/dist/propagate.h"
#include "runtime/core/shard.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "codegen/reference/evaluate_unrounded.h"
#include "codegen/ir/printer.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/nccl.h"
#include "runtime/io/npy.h"
#include "runtime/plan/plan_exec.h"
#include "runtime/plan/plan_host.h"
#include "codegen/dist/plan_graph.h"
#include "runtime/plan/plan_verify.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace fs = std::filesystem;

std::optional<std::vector<Tensor>> load_inputs(const Graph& g, const std::string& inputs_dir, uint64_t seed) {
  if (inputs_dir.empty()) return random_inputs(g, seed);
  std::vector<Tensor> in;
  for (ValueId p : g.params()) {
    const Node& n = g.node(p);
    std::string path = (fs::path(inputs_dir) / (n.name + ".npy")).string();
    Result<Tensor> t = read_npy(path, n.type, n.name);
    if (!t.ok()) {
      std::cerr << t.error().str() << "\n";
      return std::nullopt;
    }
    in.push_back(std::move(t).value());
  }
  return in;
}

std::vector<std::vector<Tensor>> shard_inputs(const Graph& g, const PlanPlacements& placed, const DeviceMesh& mesh,
                                              const std::vector<Tensor>& global) {
  std::vector<std::vector<Tensor>> out(static_cast<size_t>(mesh.world()));
  for (int r = 0; r < mesh.world(); ++r)
    for (size_t i = 0; i < g.params().size(); ++i)
      out[static_cast<size_t>(r)].push_back(
          shard_tensor(global[i], placed.params[i], mesh, r));
  return out;
}

std::optional<std::vector<Tensor>> gather_outputs(const Graph& g, const PlanPlacements& placed, const DeviceMesh& mesh,
                                                  const std::vector<std::vector<Tensor>>& per_rank) {
  std::vector<Tensor> global;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    std::vector<Tensor> locals;
    for (int r = 0; r < mesh.world(); ++r) locals.push_back(per_rank[static_cast<size_t>(r)][i]);
    Result<Tensor> t = unshard_tensor(locals, g.node(g.outputs()[i].value).type, placed.outputs[i], mesh);
    if (!t.ok()) {
      std::cerr << "error: output " << g.outputs()[i].name << ": " << t.error().message << "\n";
      return std::nullopt;
    }
    global.push_back(std::move(t).value());
  }
  return global;
}

namespace {

std::string preview(const Tensor& t) {
  std::ostringstream os;
  os << std::setprecision(6) << "[";
  int64_t n = std::min<int64_t>(t.numel(), 6);
  for (int64_t i = 0; i < n; ++i) os << (i ? ", " : "") << t.get(i);
  if (t.numel() > n) os << ", ...";
  os << "]";
  return os.str();
}

}  // namespace

int report_outputs(const Graph& g, const std::vector<Tensor>& out, const std::vector<Tensor>& inputs, bool check,
                   const std::string& outputs_dir, bool allow_tf32, bool fused16) {
  std::optional<std::vector<Tensor>> want;
  if (check) {
    Result<std::vector<Tensor>> ref = evaluate(g, inputs);
    if (!ref.ok()) {
      std::cerr << diag_str(ref.error()) << "\n";
      return 1;
    }
    want = std::move(ref).value();
  }
  bool all_ok = true;
  std::vector<std::string> rounded_apart;  // float outputs from 16-bit values that missed under fused precision
  // The reference without 16-bit rounding (evaluate_unrounded.h), made the first time
  // an output of f16/bf16 origin misses the eager one under fused precision.
  std::optional<Result<std::vector<Tensor>>> unrounded;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Tensor& t = out[i];
    std::cout << "  " << g.outputs()[i].name << ": " << t.type().str() << " " << preview(t);
    if (want) {
      const Tolerance tol = check_tolerance(g, g.outputs()[i].value, allow_tf32);
      Comparison c = compare(t, (*want)[i], tol);
      std::cout << std::setprecision(3) << "  max_abs_err=" << c.max_abs_err << " max_rel_err=" << c.max_rel_err;
      // f16's tolerance or looser: the output is computed from f16/bf16 values. The
      // kernels round those once, at their stores, where the eager reference rounds at
      // every op: an output that meets the reference that never rounds them is as
      // right as one that meets the eager reference.
      const bool from16 = fused16 && is_float(t.dtype()) && tol.rtol >= default_tolerance(DType::F16).rtol;
      if (!c.ok() && from16) {
        if (!unrounded) unrounded = evaluate_unrounded(g, inputs);
        if (unrounded->ok()) {
          Comparison u = compare(t, (**unrounded)[i], tol);
          if (u.ok()) {
            std::cout << "  ok against the reference without 16-bit rounding (max_rel_err=" << u.max_rel_err
                      << "; against eager's, " << c.mismatches << " element(s) apart)\n";
            continue;
          }
        }
      }
      std::cout << (c.ok() ? "  ok" : "  MISMATCH");
      if (!c.ok()) {
        all_ok = false;
        std::cout << " (" << c.mismatches << " element(s), first at flat index " << c.first_mismatch << ")";
        if (from16) rounded_apart.push_back(g.outputs()[i].name);
      }
    }
    std::cout << "\n";
  }
  if (!rounded_apart.empty()) {
    std::cerr << "note: under --precision fused (the default) the kernels round f16/bf16 values once, at their "
                 "stores, where the reference rounds them at every op; these outputs meet neither that reference nor "
                 "one that never rounds them, and an op that magnifies differences (softmax, exp, log, a division) "
                 "can do that. Run again with --precision eager, which rounds as the reference does, to tell it from "
                 "an error (";
    for (size_t i = 0; i < rounded_apart.size(); ++i) std::cerr << (i ? ", " : "") << rounded_apart[i];
    std::cerr << "; docs/kernels.md, \"Checks\")\n";
  }
  if (!outputs_dir.empty()) {
    std::error_code ec;
    const bool existed = fs::exists(outputs_dir, ec);
    fs::create_directories(outputs_dir, ec);
    if (ec) {
      std::cerr << outputs_dir << ": error: cannot create directory: " << ec.message() << "\n";
      return 1;
    }
    // All outputs land or none: a set with one file missing would pass for a
    // complete result (write_npy_all stages every file before renaming any).
    std::vector<std::pair<std::string, const Tensor*>> files;
    for (size_t i = 0; i < g.outputs().size(); ++i)
      files.emplace_back((fs::path(outputs_dir) / (g.outputs()[i].name + ".npy")).string(), &out[i]);
    if (Result<void> err = write_npy_all(files); !err.ok()) {
      std::cerr << err.error().str() << "\n";
      if (!existed) fs::remove(outputs_dir, ec);  // only if still empty: what we created
      return 1;
    }
    std::cout << "saved " << g.outputs().size() << " output(s) to " << outputs_dir << "\n";
  }
  if (want) std::cout << (all_ok ? "check: ok\n" : "check: MISMATCH\n");
  return all_ok ? 0 : 1;
}

std::optional<cuda::DeviceInfo> cuda_device_for(const std::string& arch) {
  Result<cuda::DeviceInfo> dev = cuda::device_info(0);
  if (!dev) {
    std::cerr << "error: " << dev.error().message << "\n";
    return std::nullopt;
  }
  if (!arch.empty())
    if (std::optional<std::string> why = arch_mismatch(arch, *dev)) {
      std::cerr << "error: " << *why << "\n";
      return std::nullopt;
    }
  return *dev;
}

namespace {

// --gpus and --collectives against the GPUs there are: how many GPUs the ranks
// spread over, and whether NCCL carries the collectives.
std::optional<std::pair<int, GpuCollectives>> resolve_comm(const GpuCommOptions& o, int world) {
  Result<int> count = cuda::device_count();
  if (!count) {
    std::cerr << "error: " << count.error().message << "\n";
    return std::nullopt;
  }
  if (o.gpus > *count) {
    std::cerr << "error: --gpus " << o.gpus << ", but the driver sees " << *count << " GPU(s)\n";
    return std::nullopt;
  }
  const int gpus = o.gpus > 0 ? std::min(o.gpus, world) : std::min(world, *count);
  if (o.collectives == "host") return std::make_pair(gpus, GpuCollectives::Host);
  if (o.collectives == "copy-standin") return std::make_pair(gpus, GpuCollectives::CopyStandin);
  if (o.collectives == "nccl") {
    if (gpus < world) {
      std::cerr << "error: --collectives nccl needs a GPU per rank: world " << world << ", " << gpus
                << " GPU(s) (NCCL cannot put two ranks of a communicator on one GPU; use --collectives host)\n";
      return std::nullopt;
    }
    return std::make_pair(gpus, GpuCollectives::Nccl);
  }
  // auto: NCCL where it can run (a GPU per rank, the library there), else the host.
  const bool nccl_ok = world > 1 && gpus >= world && nccl::library().ok();
  return std::make_pair(gpus, nccl_ok ? GpuCollectives::Nccl : GpuCollectives::Host);
}

}  // namespace

void add_gpu_comm_options(CLI::App* cmd, GpuCommOptions& o) {
  cmd->add_option("--collectives", o.collectives,
                  "--device cuda: nccl (on a comm stream, overlapping the kernels; a GPU per rank), host (staged "
                  "through the CPU backend, any number of ranks per GPU), auto (nccl when it can run; default), "
                  "copy-standin (each collective a device-to-device copy of its bus bytes on the comm stream: times "
                  "the overlap on one GPU; the outputs are not the collectives', so no --check)")
      ->check(CLI::IsMember({"auto", "nccl", "host", "copy-standin"}));
  cmd->add_option("--gpus", o.gpus, "--device cuda: spread the ranks over N GPUs, rank r on GPU r % N (default: "
                                    "as many as there are, up to the world)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--nccl-max-ctas", o.nccl_max_ctas,
                  "--device cuda: the most CTAs (SMs) NCCL's kernels may take from ours (ncclConfig_t.maxCTAs; "
                  "default: NCCL's choice)")
      ->check(CLI::Range(1, 64));
}

namespace {

// The run options the command line gives, for `gpus` GPUs and collectives `how`;
// with --trace, `trace` receives the events.
GpuRunOptions run_options(const GpuCliOptions& o, int gpus, GpuCollectives how, TraceWriter& trace,
                          const std::string& graph) {
  GpuRunOptions ro;
  ro.gpus = gpus;
  ro.collectives = how;
  ro.nccl.max_ctas = o.comm.nccl_max_ctas;
  ro.cuda_graph = o.cuda_graph;
  ro.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  if (!o.trace_file.empty()) {
    ro.trace = &trace;
    trace.set_metadata("graph", graph);
    trace.set_metadata("cuda_graph", o.cuda_graph);
    trace.set_metadata("collectives", how == GpuCollectives::Nccl          ? "nccl"
                                      : how == GpuCollectives::CopyStandin ? "copy-standin"
                                                                           : "host");
  }
  return ro;
}

// One rank of a multi-process run on this process's GPU. With --check, the rank
// compares its own local outputs with its shard of the reference result.
int run_rank_process(const Graph& g, const PlanSource& src, const GpuCliOptions& o,
                     const std::shared_ptr<const HostKernels>& host) {
  DeviceMesh mesh(g.mesh());
  const int rank = *o.rank;
  const std::string who = "rank " + std::to_string(rank) + ": ";
  if (rank < 0 || rank >= mesh.world()) {
    std::cerr << "error: --rank " << rank << " is not a rank of a " << mesh.world() << "-rank mesh\n";
    return 1;
  }
  if (!o.outputs_dir.empty()) {
    std::cerr << "error: --save-outputs needs every rank's outputs: run the ranks as threads (without --rank)\n";
    return 1;
  }
  int gpus = 0;
  GpuCollectives how = GpuCollectives::Host;
  if (!host) {
    Result<int> count = cuda::device_count();
    if (!count) {
      std::cerr << "error: " << count.error().message << "\n";
      return 1;
    }
    gpus = o.comm.gpus > 0 ? std::min(o.comm.gpus, *count) : *count;
    // A process drives one GPU, so NCCL's GPU per rank is the launcher's to keep
    // (one process per GPU of each machine): auto trusts it, for a world of 2 or more.
    const bool auto_nccl = mesh.world() > 1 && nccl::library().ok();
    if (o.comm.collectives == "nccl" || (o.comm.collectives == "auto" && auto_nccl)) how = GpuCollectives::Nccl;
  }
  TraceWriter trace;
  GpuRunOptions ro = run_options(o, gpus, how, trace, g.name());
  if (ro.trace) trace.set_metadata("rank", rank);
  Result<PlanPlacements> sharding = plan_placements(src.plan, g, "plan.json");
  if (!sharding.ok()) {
    std::cerr << diag_str(sharding.error()) << "\n";
    return 1;
  }
  std::optional<std::vector<Tensor>> inputs = load_inputs(g, o.inputs_dir, o.seed);
  if (!inputs) return 1;
  std::vector<std::vector<Tensor>> local = shard_inputs(g, *sharding, mesh, *inputs);
  Result<std::unique_ptr<Comm>> comm = connect_rank(mesh, rank, o.rendezvous, ro.timeout, o.started + ro.timeout);
  if (!comm) {
    std::cerr << "error: " << who << comm.error().message << "\n";
    return 1;
  }
  // Before any kernel or collective: every process must be about to run the same
  // graph, Plan (its kernels' PTX too), options and inputs, or the collectives that
  // happen to fit would give a wrong result (docs/comm.md, "Ranks that agree").
  RunDigest digest;
  digest.add("graph", print_graph(g));
  digest.add("options", std::string(host ? "device=cpu" : "device=cuda") + " collectives=" +
                            (how == GpuCollectives::Nccl ? "nccl" : "host") + " cuda_graph=" + (o.cuda_graph ? "yes" : "no"));
  Digest in;
  for (const Tensor& t : *inputs) in.update(t.type().str()).update(t.data(), t.nbytes());
  digest.add("inputs", in);
  Digest plan;
  plan.update(plan_to_json(src.plan));
  for (const auto& [file, text] : src.ptx) plan.update(file).update(text);
  digest.add("plan", plan);
  if (Result<void> d = agree_on_run(**comm, digest); !d.ok()) {
    std::cerr << "error: " << d.error().message << "\n";
    return 1;
  }
  GpuRunStats stats;
  Result<std::vector<Tensor>> out = host ? run_rank_on_host(src.plan, host, **comm, local[static_cast<size_t>(rank)], ro, &stats)
                                         : run_rank_on_gpu(src, **comm, local[static_cast<size_t>(rank)], ro, &stats);
  bool trace_failed = false;  // a trace asked for and not written fails the rank, like any output
  if (!o.trace_file.empty())
    if (Result<void> err = trace.write(o.trace_file); !err.ok()) {
      std::cerr << err.error().str() << "\n";
      trace_failed = true;
    }
  if (!out) {
    std::cerr << diag_str(out.error()) << "\n";
    return 1;
  }
  if (trace_failed) return 1;
  std::cout << "graph " << g.name() << ": rank " << rank << " of " << mesh.world() << " as a process on "
            << (host ? "the host CPU" : "GPU " + std::to_string(ro.device + rank % std::max(1, ro.gpus)) + " (" +
                                            stats.device + ", " + src.plan.arch + ")")
            << "; kernels: " << stats.launches << " launch(es); collectives: " << stats.collectives << "\n";
  if (!o.check) return 0;
  Result<std::vector<Tensor>> ref = evaluate(g, *inputs);
  if (!ref) {
    std::cerr << diag_str(ref.error()) << "\n";
    return 1;
  }
  bool ok = true;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const PlacementSpec& spec = sharding->outputs[i];
    std::cout << "  " << who << g.outputs()[i].name << ": " << (*out)[i].type().str();
    if (std::any_of(spec.per_dim.begin(), spec.per_dim.end(), [](const Placement& p) { return p.is_partial(); })) {
      std::cout << "  (partial: checked only as a whole, run the ranks as threads)\n";
      continue;
    }
    Tensor want = shard_tensor((*ref)[i], spec, mesh, rank);
    Comparison c = compare((*out)[i], want, check_tolerance(g, g.outputs()[i].value, o.allow_tf32));
    std::cout << std::setprecision(3) << "  max_abs_err=" << c.max_abs_err << (c.ok() ? "  ok" : "  MISMATCH") << "\n";
    ok = ok && c.ok();
  }
  std::cout << who << (ok ? "check: ok\n" : "check: MISMATCH\n");
  return ok ? 0 : 1;
}

}  // namespace

int run_plan_cuda(const Graph& g, const PlanSource& src, const GpuCliOptions& o) { return run_plan(g, src, o, nullptr); }

int run_plan(const Graph& g, const PlanSource& src, const GpuCliOptions& o, std::shared_ptr<const HostKernels> host) {
  if (o.comm.collectives == "copy-standin" && (o.check || !o.outputs_dir.empty())) {
    std::cerr << "error: --collectives copy-standin replaces each collective by a copy of its size, so the outputs "
                 "are not the graph's: it takes no "
              << (o.check ? "--check" : "--save-outputs") << " (time the run, with --trace)\n";
    return 2;
  }
  if (o.rank.has_value() != !o.rendezvous.empty()) {
    std::cerr << "error: --rank and --rendezvous go together (one process per rank meeting through a directory)\n";
    return 2;
  }
  if (o.rank) return run_rank_process(g, src, o, host);
  DeviceMesh mesh(g.mesh());
  // Every rank a thread of this process: refused now, above kMaxThreadRanks or the
  // descriptors the connections need, not after the inputs are read.
  if (std::optional<std::string> why = reserve_rank_descriptors(g.mesh(), mesh.world())) {
    std::cerr << "error: " << *why << "\n";
    return 1;
  }
  std::optional<std::pair<int, GpuCollectives>> comm =
      host ? std::make_optional(std::make_pair(0, GpuCollectives::Host)) : resolve_comm(o.comm, mesh.world());
  if (!comm) return 1;
  Result<PlanPlacements> sharding = plan_placements(src.plan, g, "plan.json");
  if (!sharding.ok()) {
    std::cerr << diag_str(sharding.error()) << "\n";
    return 1;
  }
  std::optional<std::vector<Tensor>> inputs = load_inputs(g, o.inputs_dir, o.seed);
  if (!inputs) return 1;
  std::vector<std::vector<Tensor>> local = shard_inputs(g, *sharding, mesh, *inputs);
  TraceWriter trace;
  GpuRunOptions ro = run_options(o, comm->first, comm->second, trace, g.name());
  if (ro.trace)
    trace.set_metadata("command", src.dir.empty() ? std::string("run --device ") + (host ? "cpu" : "cuda")
                                                  : "exec " + src.dir + (host ? " --device cpu" : ""));
  GpuRunStats stats;
  Result<std::vector<std::vector<Tensor>>> out =
      host ? run_plan_on_host(src.plan, host, local, ro, &stats) : run_plan_on_gpu(src, local, ro, &stats);
  if (!o.trace_file.empty()) {
    trace.set_metadata("device", stats.device);
    if (Result<void> err = trace.write(o.trace_file); !err.ok()) {
      std::cerr << err.error().str() << "\n";
      return 1;
    }
  }
  if (!out) {
    std::cerr << diag_str(out.error()) << "\n";
    return 1;
  }
  std::optional<std::vector<Tensor>> global = gather_outputs(g, *sharding, mesh, *out);
  if (!global) return 1;
  std::cout << "graph " << g.name() << ": " << mesh.world() << " rank(s)" << (mesh.world() > 1 ? " as threads" : "")
            << " on "
            << (host ? std::string("the host CPU")
                     : std::to_string(stats.gpus) + " GPU(s) (" + stats.device + ", " + src.plan.arch + ")")
            << ", inputs " << (o.inputs_dir.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.inputs_dir)
            << "\n";
  std::cout << "kernels: " << stats.launches << " launch(es) of " << src.plan.kernels.size() << " distinct kernel(s) ";
  if (host) std::cout << "as host code (" << host->origin << ")";
  else std::cout << "from " << src.ptx.size() << " PTX module(s)";
  if (o.cuda_graph) std::cout << ", replayed from " << stats.graph_launches << " CUDA graph launch(es)";
  if (stats.library_gemms) std::cout << "; library GEMMs: " << stats.library_gemms << " call(s)";
  std::cout << "; collectives: " << stats.collectives;
  if (stats.nccl_ops) std::cout << ", " << stats.nccl_ops << " enqueued";
  std::cout << "\n";
  // A Plan compiled under --precision fused (the default) rounds f16/bf16 values at
  // its kernels' stores: its outputs may meet the reference without 16-bit rounding
  // instead of the eager one (report_outputs).
  return report_outputs(g, *global, *inputs, o.check, o.outputs_dir, o.allow_tf32, src.plan.precision == "fused");
}

namespace {

struct ExecCliOptions {
  std::string dir;
  std::string device = "cuda";
  GpuCliOptions gpu;
};

int exec(const ExecCliOptions& o) {
  // The Plan is checked before anything needs a GPU, so a broken one is reported
  // the same everywhere.
  Result<PlanSource> src = read_plan_dir(o.dir);
  if (!src) {
    std::cerr << src.error().str() << "\n";
    return 1;
  }
  const std::string graph_path = (fs::path(o.dir) / "graph.sf").string();
  std::error_code ec;
  if (!fs::exists(graph_path, ec)) {
    std::cerr << graph_path << ": error: missing: exec shards the inputs and checks the outputs with the graph "
              << "`shardfuse compile` copies into the Plan (recompile the Plan)\n";
    return 1;
  }
  std::optional<Graph> loaded = load_graph(graph_path);
  if (!loaded) return 1;
  std::optional<Graph> g = resolve_world(std::move(*loaded), src->plan.world);
  if (!g) return 1;
  // graph.sf shards the inputs and gathers the outputs: it must describe the
  // program the Plan runs (shapes and placements per rank, then its digest).
  if (Result<void> e = verify_plan_matches_graph(src->plan, *g, graph_path, (fs::path(o.dir) / "plan.json").string());
      !e.ok()) {
    std::cerr << e.error().str() << "\n";
    return 1;
  }
  if (o.device == "cpu") {
    if (o.gpu.cuda_graph) {
      std::cerr << "error: --cuda-graph needs --device cuda\n";
      return 2;
    }
    if (o.gpu.comm.collectives == "nccl" || o.gpu.comm.collectives == "copy-standin") {
      std::cerr << "error: --collectives " << o.gpu.comm.collectives << " needs --device cuda\n";
      return 2;
    }
    Result<std::shared_ptr<const HostKernels>> host = load_host_kernels(*src);
    if (!host) {
      std::cerr << host.error().str() << "\n";
      return 1;
    }
    // Host kernels multiply f32 exactly, --allow-tf32 or not: the default tolerance.
    return run_plan(*g, *src, o.gpu, *host);
  }
  if (!cuda_device_for(src->plan.arch)) return 1;
  // A Plan compiled with --allow-tf32 has kernels that multiply in TF32: its PTX says
  // so, and --check allows for TF32's rounding of their f32 inputs.
  GpuCliOptions go = o.gpu;
  for (const auto& [file, text] : src->ptx)
    if (text.find(".f32.tf32.tf32") != std::string::npos) go.allow_tf32 = true;
  for (const PlanRank& r : src->plan.ranks)
    for (const PlanStep& s : r.steps) go.allow_tf32 = go.allow_tf32 || (s.op == "gemm" && s.gemm.desc.tf32);
  return run_plan_cuda(*g, *src, go);
}

}  // namespace

void add_gpu_options(CLI::App* cmd, GpuCliOptions& o) {
  cmd->add_option("--inputs", o.inputs_dir, "read DIR/<param>.npy as each parameter's global tensor")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--save-outputs", o.outputs_dir,
                  "write each returned value, gathered to its global shape, to DIR/<name>.npy")
      ->check(non_empty());
  cmd->add_option("--seed", o.seed, "seed for random inputs when --inputs is not given (default 0)")
      ->check(uint64_text());
  cmd->add_flag("--check", o.check,
                "compare with the reference evaluator on the global graph; print max abs/rel error, exit 1 on mismatch");
  cmd->add_flag("--cuda-graph", o.cuda_graph,
                "capture each rank's kernels between collectives as CUDA Graphs and launch those (--device cuda)");
  cmd->add_option("--timeout", o.timeout_s, "seconds a collective may take before every rank gives up, and set-up plus connecting together (default 60)")
      ->check(finite_range(0.1, 86400.0));
  cmd->add_option("--trace", o.trace_file,
                  "write a Chrome trace (Perfetto) to FILE.json: kernels timed by CUDA events, host-staged "
                  "collectives by wall time")
      ->check(non_empty());
}

void add_exec(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ExecCliOptions>();
  auto* cmd = app.add_subcommand("exec", "Run a Plan directory (from `shardfuse compile`) on the GPU");
  cmd->add_option("plan", o->dir, "the Plan directory: plan.json, the .ptx files, graph.sf")->required();
  cmd->add_option("--device", o->device,
                  "where the Plan runs: cuda (its PTX on the GPU; default) or cpu (its host code, through the same "
                  "executor)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  add_gpu_options(cmd, o->gpu);
  add_gpu_comm_options(cmd, o->gpu.comm);
  auto* rank = cmd->add_option("--rank", o->gpu.rank,
                                "run only this rank, as one process of a multi-process run (one per GPU; needs "
                                "--rendezvous)");
  auto* rendezvous = cmd->add_option("--rendezvous", o->gpu.rendezvous,
                  "a directory every rank's process can reach (a shared file system across machines)")
      ->check(non_empty());
  // One without the other is a usage error (exit 2), found before the Plan is read.
  rank->needs(rendezvous);
  rendezvous->needs(rank);
  cmd->footer(
      "Every rank runs as a thread; rank r on GPU r % N. With a GPU per rank, collectives go through NCCL on a\n"
      "comm stream of each rank (--collectives nccl), else through the CPU backend (Gloo).\n"
      "The Plan is validated first (plan.json, each kernel's .ptx and .entry), with or without a GPU.\n"
      "Example:\n"
      "  shardfuse compile examples/tp_mlp.sf --arch sm_90a -o plan/   # where LLVM is\n"
      "  shardfuse exec plan/ --device cuda --check                    # where the GPU is\n"
      "  for r in 0 1 2 3; do shardfuse exec plan/ --device cuda --rank $r --rendezvous /tmp/rv --check & done; wait");
  cmd->callback([o, &exit_code] { exit_code = exec(*o); });
}

}  // namespace sf::cli
