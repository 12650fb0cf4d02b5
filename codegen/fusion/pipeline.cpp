#include "codegen/fusion/pipeline.h"

#include "codegen/dist/schedule.h"
#include "codegen/fusion/decompose_program.h"
#include "codegen/fusion/gather_views.h"
#include "codegen/fusion/verify_programs.h"
#include "codegen/ir/printer.h"

#include <map>
#include <stdexcept>

namespace sf {

namespace {

// What stage `name` does (pipeline_stages names them, in order).
std::function<void(std::vector<LocalProgram>&)> stage_fn(const std::string& name, const Graph& g,
                                                         const ShardingPlan& plan, const DeviceMesh& mesh,
                                                         const RankPipelineOptions& opts) {
  if (name == "lower")
    return [&](std::vector<LocalProgram>& ps) {
      for (int r = 0; r < mesh.world(); ++r) ps.push_back(lower(g, plan, mesh, r));
    };
  if (name == "decompose")
    return [](std::vector<LocalProgram>& ps) {
      for (LocalProgram& p : ps) p = gather_before_views(decompose_program(std::move(p)));
    };
  if (name == "collective-matmul")
    return [&](std::vector<LocalProgram>& ps) {
      std::vector<DecomposeDecision> decisions = decompose_collective_matmuls(ps, mesh, opts.decompose);
      if (opts.decisions) *opts.decisions = std::move(decisions);
    };
  if (name == "fuse")
    return [&](std::vector<LocalProgram>& ps) {
      FusionOptions fo;
      fo.enabled = opts.fuse;
      fo.attention = opts.flash_attention;
      std::vector<LocalProgram> fused = fuse_all(ps, fo);
      if (opts.can_emit && opts.fuse) {
        // Kernels are alike on every rank but for shapes: a kernel that fails on any
        // rank has its steps isolated on all.
        std::map<std::string, bool> verdict;
        for (const LocalProgram& p : fused)
          for (const LocalKernel& k : p.kernels) {
            if (k.steps.size() < 2 && k.kind != KernelKind::Attention) continue;
            std::string key = kernel_key(k);
            auto it = verdict.find(key);
            if (it == verdict.end()) it = verdict.emplace(key, opts.can_emit(k)).first;
            if (it->second) continue;
            if (k.kind == KernelKind::Attention) fo.no_attention.insert(k.steps.begin(), k.steps.end());
            else fo.isolate.insert(k.steps.begin(), k.steps.end());
          }
        if (!fo.isolate.empty() || !fo.no_attention.empty()) fused = fuse_all(std::move(ps), fo);
      }
      ps = std::move(fused);
    };
  // "schedule"
  return [](std::vector<LocalProgram>& ps) {
    for (LocalProgram& p : ps) p = schedule(std::move(p));
  };
}

}  // namespace

std::vector<std::string> pipeline_stages(const RankPipelineOptions& opts) {
  std::vector<std::string> names;
  for (const std::string& n : all_pipeline_stages())
    if (n != "schedule" || opts.reorder) names.push_back(n);
  return names;
}

const std::vector<std::string>& all_pipeline_stages() {
  static const std::vector<std::string> s{"lower", "decompose", "collective-matmul", "fuse", "schedule"};
  return s;
}

Result<std::vector<LocalProgram>> rank_programs(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh,
                                                const RankPipelineOptions& opts) {
  auto internal = [](Diag d) {
    d.internal = true;
    return d;
  };
  const bool verify = opts.verify_each || verify_each_from_env();
  std::vector<LocalProgram> ps;
  try {
    for (const std::string& name : pipeline_stages(opts)) {
      stage_fn(name, g, plan, mesh, opts)(ps);
      if (verify)
        if (Result<void> r = verify_programs(ps, mesh, name); !r.ok())
          return internal(with_context("--verify-each: the programs are broken ", r.error()));
      if (opts.after_stage) opts.after_stage(name, ps);
    }
  } catch (const DiagError& e) {
    return internal(e.diag);
  } catch (const std::logic_error& e) {
    return internal(Diag{"", {}, e.what()});
  }
  return ps;
}

Result<LocalProgram> rank_program(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank,
                                  const RankPipelineOptions& opts) {
  Result<std::vector<LocalProgram>> ps = rank_programs(g, plan, mesh, opts);
  if (!ps.ok()) return ps.error();
  return std::move(ps->at(static_cast<size_t>(rank)));
}

}  // namespace sf
