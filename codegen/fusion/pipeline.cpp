#include "codegen/fusion/pipeline.h"

#include "codegen/dist/schedule.h"
#include "codegen/fusion/decompose_program.h"
#include "codegen/fusion/verify_programs.h"
#include "codegen/ir/printer.h"

#include <map>

namespace sf {

std::vector<LocalProgram> rank_programs(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh,
                                        const RankPipelineOptions& opts) {
  const bool verify = opts.verify_each || verify_each_from_env();
  // false when `stage` left a broken program (reported as pipeline.h says).
  auto verified = [&](const std::vector<LocalProgram>& ps, std::string_view stage) {
    if (!verify) return true;
    std::optional<Diag> d = verify_programs(ps, mesh, stage);
    if (!d) return true;
    d->message = "--verify-each: the programs are broken " + d->message;
    if (!opts.verify_failure) throw DiagError{*d};
    *opts.verify_failure = std::move(d);
    return false;
  };
  std::vector<LocalProgram> unfused;
  for (int r = 0; r < mesh.world(); ++r) unfused.push_back(lower(g, plan, mesh, r));
  if (!verified(unfused, "lower")) return unfused;
  for (LocalProgram& p : unfused) p = decompose_program(std::move(p));
  if (!verified(unfused, "decompose")) return unfused;
  std::vector<DecomposeDecision> decisions = decompose_collective_matmuls(unfused, mesh, opts.decompose);
  if (opts.decisions) *opts.decisions = std::move(decisions);
  if (!verified(unfused, "collective-matmul")) return unfused;
  FusionOptions fo;
  fo.enabled = opts.fuse;
  std::vector<LocalProgram> ps = fuse_all(unfused, fo);
  if (opts.can_emit && opts.fuse) {
    // Kernels are alike on every rank but for shapes: a kernel that fails on any
    // rank has its steps isolated on all.
    std::map<std::string, bool> verdict;
    for (const LocalProgram& p : ps)
      for (const LocalKernel& k : p.kernels) {
        if (k.steps.size() < 2) continue;
        std::string key = k.kind + "\n" + print_graph(k.group);
        auto it = verdict.find(key);
        if (it == verdict.end()) it = verdict.emplace(key, opts.can_emit(k)).first;
        if (!it->second) fo.isolate.insert(k.steps.begin(), k.steps.end());
      }
    if (!fo.isolate.empty()) ps = fuse_all(std::move(unfused), fo);
  }
  if (!verified(ps, "fuse")) return ps;
  if (opts.reorder) {
    for (LocalProgram& p : ps) p = schedule(std::move(p));
    if (!verified(ps, "schedule")) return ps;
  }
  return ps;
}

LocalProgram rank_program(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank,
                          const RankPipelineOptions& opts) {
  return std::move(rank_programs(g, plan, mesh, opts)[static_cast<size_t>(rank)]);
}

}  // namespace sf
