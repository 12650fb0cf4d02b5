#include "codegen/fusion/pipeline.h"

#include "codegen/dist/schedule.h"
#include "codegen/fusion/decompose_program.h"

namespace sf {

std::vector<LocalProgram> rank_programs(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh,
                                        const RankPipelineOptions& opts) {
  std::vector<LocalProgram> ps;
  for (int r = 0; r < mesh.world(); ++r) ps.push_back(decompose_program(lower(g, plan, mesh, r)));
  FusionOptions fo;
  fo.enabled = opts.fuse;
  ps = fuse_all(std::move(ps), fo);
  if (opts.reorder)
    for (LocalProgram& p : ps) p = schedule(std::move(p));
  return ps;
}

LocalProgram rank_program(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, int rank,
                          const RankPipelineOptions& opts) {
  return std::move(rank_programs(g, plan, mesh, opts)[static_cast<size_t>(rank)]);
}

}  // namespace sf
