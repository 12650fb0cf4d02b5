// Running every rank of a Plan (runtime/plan/plan_exec.h): as threads of this process or
// as one process of several, on GPUs (NCCL or host-staged collectives) or on the
// host CPU, each rank a RankExec.
#include <filesystem>
#include <mutex>

#include "runtime/core/device_mesh.h"
#include "runtime/comm/agree.h"
#include "runtime/plan/plan_cuda.h"
#include "runtime/plan/plan_exec.h"
#include "runtime/plan/plan_host.h"

namespace sf {

namespace fs = std::filesystem;

// --- every rank as a thread --------------------------------------------------------------

namespace {

// What a run needs to know before its ranks start: the mesh, how many GPUs,
// whether NCCL carries the collectives (and its options). Fills the stats'
// `collectives`.
struct RunSetup {
  DeviceMesh mesh{Mesh{}};
  int gpus = 1;
  bool use_nccl = false;
  bool use_standin = false;
  nccl::Options nccl;
};

Result<RunSetup> setup_run(const PlanSource& src, const GpuRunOptions& opts, int gpus_for_world, GpuRunStats* stats) {
  const Plan& plan = src.plan;
  Result<Mesh> mesh = parse_plan_mesh(plan.mesh, src.dir.empty() ? "plan.json" : (fs::path(src.dir) / "plan.json").string());
  if (!mesh) return mesh.error();
  RunSetup rs;
  rs.mesh = DeviceMesh(*mesh);
  if (rs.mesh.world() != plan.world)
    return Diag{"", {}, "the plan's mesh \"" + plan.mesh + "\" has " + std::to_string(rs.mesh.world()) +
                            " rank(s), world is " + std::to_string(plan.world)};
  rs.gpus = gpus_for_world;
  bool has_collectives = false;
  for (const PlanRank& r : plan.ranks)
    for (const PlanStep& st : r.steps) has_collectives = has_collectives || st.op == "wait";
  rs.use_nccl = opts.collectives == GpuCollectives::Nccl && has_collectives;
  rs.use_standin = opts.collectives == GpuCollectives::CopyStandin && has_collectives;
  if (rs.use_nccl && rs.gpus < plan.world)
    return Diag{"", {}, "NCCL needs a GPU per rank: world " + std::to_string(plan.world) + " on " +
                            std::to_string(rs.gpus) + " GPU(s) (stage the collectives through the host instead)"};
  rs.nccl = opts.nccl;
  rs.nccl.timeout = opts.timeout;
  if (rs.use_nccl) {
    Result<const nccl::Library*> lib = nccl::library();
    if (!lib) return lib.error();
    SF_TRY(nccl::check_options(rs.nccl));
    if (stats) stats->collectives = "NCCL " + (*lib)->version_str() + " on a comm stream";
  } else if (stats && rs.use_standin) {
    stats->collectives = "a device-to-device copy of each collective's bus bytes on a comm stream (a stand-in: the "
                         "outputs are not the collectives' results)";
  } else if (stats) {
    stats->collectives = has_collectives ? "host-staged (Gloo)" : "none";
  }
  return rs;
}

// Uploads the inputs, runs the steps, adds the counts to the stats, downloads the
// outputs.
Result<std::vector<Tensor>> run_and_collect(RankExec& rank, Comm& comm, const std::vector<Tensor>& inputs,
                                            GpuRunStats* stats, std::mutex& mu) {
  SF_TRY(rank.upload_inputs(inputs));
  SF_TRY(rank.run(&comm));
  if (stats) {
    std::lock_guard<std::mutex> lock(mu);
    stats->launches += rank.launches();
    stats->library_gemms += rank.library_calls();
    stats->graph_launches += rank.graph_launches();
    stats->nccl_ops += rank.nccl_ops();
  }
  return rank.download_outputs();
}

// One rank on its GPU: buffers, NCCL communicators if the setup says so, the run,
// the outputs.
Result<std::vector<Tensor>> run_one_rank(const std::shared_ptr<GpuPlan>& loaded, const RunSetup& rs, int device,
                                         Comm& comm, const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                         GpuRunStats* stats, std::mutex& mu) {
  const int r = comm.rank();
  if (opts.trace) opts.trace->add_rank(r);
  Result<std::unique_ptr<RankExec>> gr = RankExec::create_cuda(loaded, r, opts);
  if (!gr) return gr.error();
  if (rs.use_nccl) {
    // One communicator per mesh dim, its unique id exchanged through Gloo.
    std::vector<std::unique_ptr<nccl::NcclComm>> comms;
    for (int d = 0; d < rs.mesh.ndim(); ++d) {
      Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(comm, d, device, rs.nccl);
      if (!c) return c.error();
      comms.push_back(std::move(c).value());
    }
    SF_TRY((*gr)->use_nccl(std::move(comms)));
  } else if (rs.use_standin) {
    SF_TRY((*gr)->use_copy_standin());
  }
  return run_and_collect(**gr, comm, inputs, stats, mu);
}

Result<std::shared_ptr<GpuPlan>> load_on(const PlanSource& src, int device, GpuRunStats* stats) {
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(device);
  if (!ctx) return Diag{"", {}, "GPU " + std::to_string(device) + ": " + ctx.error().message};
  if (stats && stats->device.empty()) stats->device = (*ctx)->info().name;
  return GpuPlan::load(*ctx, src);
}

}  // namespace

Result<std::vector<std::vector<Tensor>>> run_plan_on_gpu(const PlanSource& src,
                                                         const std::vector<std::vector<Tensor>>& inputs,
                                                         const GpuRunOptions& opts, GpuRunStats* stats) {
  const Plan& plan = src.plan;
  if (static_cast<int>(inputs.size()) != plan.world)
    return Diag{"", {}, "inputs for " + std::to_string(inputs.size()) + " rank(s), the plan's world is " +
                            std::to_string(plan.world)};
  Result<RunSetup> rs = setup_run(src, opts, std::max(1, std::min(opts.gpus, plan.world)), stats);
  if (!rs) return rs.error();
  // The Plan's modules, loaded once per GPU.
  std::vector<std::shared_ptr<GpuPlan>> loaded;
  for (int g = 0; g < rs->gpus; ++g) {
    Result<std::shared_ptr<GpuPlan>> p = load_on(src, opts.device + g, stats);
    if (!p) return p.error();
    loaded.push_back(std::move(p).value());
  }
  if (stats) stats->gpus = rs->gpus;
  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(plan.world));
  std::mutex mu;
  Result<void> failed = on_rank_threads(rs->mesh, opts.timeout, [&](Comm& comm) -> Result<void> {
    const int r = comm.rank();
    const int g = r % rs->gpus;
    Result<std::vector<Tensor>> out = run_one_rank(loaded[static_cast<size_t>(g)], *rs, opts.device + g, comm,
                                                   inputs[static_cast<size_t>(r)], opts, stats, mu);
    if (!out) return out.error();
    outputs[static_cast<size_t>(r)] = std::move(out).value();
    return {};
  });
  SF_TRY(failed);
  return outputs;
}

Result<std::vector<Tensor>> run_rank_on_gpu(const PlanSource& src, Comm& comm, const std::vector<Tensor>& inputs,
                                            const GpuRunOptions& opts, GpuRunStats* stats) {
  const int r = comm.rank();
  if (r < 0 || r >= src.plan.world)
    return Diag{"", {}, "rank " + std::to_string(r) + " is not in the plan (world " + std::to_string(src.plan.world) + ")"};
  // Each process drives one GPU, so NCCL's one-GPU-per-rank holds by construction
  // (across machines, or with one process per GPU of this one).
  Result<RunSetup> rs = setup_run(src, opts, src.plan.world, stats);
  if (!rs) return rs.error();
  const int device = opts.device + r % std::max(1, opts.gpus);
  Result<std::shared_ptr<GpuPlan>> loaded = load_on(src, device, stats);
  if (!loaded) return loaded.error();
  if (stats) stats->gpus = 1;
  std::mutex mu;
  return run_one_rank(*loaded, *rs, device, comm, inputs, opts, stats, mu);
}

// --- on the host CPU ----------------------------------------------------------------------

namespace {

// (RankExec::create_host refuses the GPU-only options.)
Result<DeviceMesh> host_setup(const Plan& plan, GpuRunStats* stats) {
  Result<Mesh> mesh = parse_plan_mesh(plan.mesh, "plan.json");
  if (!mesh) return mesh.error();
  DeviceMesh dm(*mesh);
  if (dm.world() != plan.world)
    return Diag{"", {}, "the plan's mesh \"" + plan.mesh + "\" has " + std::to_string(dm.world()) +
                            " rank(s), world is " + std::to_string(plan.world)};
  if (stats) {
    bool has_collectives = false;
    for (const PlanRank& r : plan.ranks)
      for (const PlanStep& st : r.steps) has_collectives = has_collectives || st.op == "wait";
    stats->device = "host CPU";
    stats->gpus = 0;
    stats->collectives = has_collectives ? "Gloo" : "none";
  }
  return dm;
}

Result<std::vector<Tensor>> run_host_rank(const Plan& plan, const std::shared_ptr<const HostKernels>& kernels,
                                          Comm& comm, const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                          GpuRunStats* stats, std::mutex& mu) {
  if (opts.trace) opts.trace->add_rank(comm.rank());
  Result<std::unique_ptr<RankExec>> r = RankExec::create_host(plan, kernels, comm.rank(), opts);
  if (!r) return r.error();
  return run_and_collect(**r, comm, inputs, stats, mu);
}

}  // namespace

Result<std::vector<std::vector<Tensor>>> run_plan_on_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels,
                                                          const std::vector<std::vector<Tensor>>& inputs,
                                                          const GpuRunOptions& opts, GpuRunStats* stats) {
  if (static_cast<int>(inputs.size()) != plan.world)
    return Diag{"", {}, "inputs for " + std::to_string(inputs.size()) + " rank(s), the plan's world is " +
                            std::to_string(plan.world)};
  Result<DeviceMesh> mesh = host_setup(plan, stats);
  if (!mesh) return mesh.error();
  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(plan.world));
  std::mutex mu;
  Result<void> failed = on_rank_threads(*mesh, opts.timeout, [&](Comm& comm) -> Result<void> {
    Result<std::vector<Tensor>> out =
        run_host_rank(plan, kernels, comm, inputs[static_cast<size_t>(comm.rank())], opts, stats, mu);
    if (!out) return out.error();
    outputs[static_cast<size_t>(comm.rank())] = std::move(out).value();
    return {};
  });
  SF_TRY(failed);
  return outputs;
}

Result<std::vector<Tensor>> run_rank_on_host(const Plan& plan, std::shared_ptr<const HostKernels> kernels, Comm& comm,
                                             const std::vector<Tensor>& inputs, const GpuRunOptions& opts,
                                             GpuRunStats* stats) {
  if (comm.rank() < 0 || comm.rank() >= plan.world)
    return Diag{"", {}, "rank " + std::to_string(comm.rank()) + " is not in the plan (world " +
                            std::to_string(plan.world) + ")"};
  Result<DeviceMesh> mesh = host_setup(plan, stats);
  if (!mesh) return mesh.error();
  std::mutex mu;
  return run_host_rank(plan, kernels, comm, inputs, opts, stats, mu);
}

}  // namespace sf
