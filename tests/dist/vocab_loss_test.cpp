// The vocabulary-parallel cross entropy: logits sharded on the class dim are never
// gathered. cross_entropy is decomposed before propagation (decompose_for_sharding),
// and propagation places its max as P(max), its sum of exps as P(sum) and the picked
// logit as a masked gather's P(sum); the lowered programs move only [N]-sized row
// statistics (and the scalar loss). Each plan is also run and checked against the
// reference (C = 10 on 3 ranks: 4, 4, 2 classes).
#include <gtest/gtest.h>

#include "codegen/dist/lower.h"
#include "codegen/dist/strategy.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "tests/dist/pipeline_util.h"

namespace sf {
namespace dist_vocab_loss_test {

using dist_test::run_and_check;

// logits [shape] {tp: S(1)} (C = shape[1]), target replicated, on `world` ranks.
Graph loss_graph(int world, Shape logits, const std::string& reduction, DType dt = DType::F32) {
  GraphBuilder b("g", Mesh{{{"tp", world}}});
  Value x = b.param("x", dt, logits, b.spec({{"tp", Placement::shard(1)}}));
  Shape ts = logits;
  ts.erase(ts.begin() + 1);
  Value t = b.param("t", DType::I64, ts);
  b.ret(cross_entropy(x, t, reduction, 3), b.spec({}));
  Result<Graph> g = b.finish();
  EXPECT_TRUE(g.ok()) << g.error().str();
  return std::move(g).value();
}

struct Moved {
  CollectiveKind kind;
  ReduceOp op;
  Shape shape;  // of the value sent
};

// The collectives of rank `rank`'s lowered program.
std::vector<Moved> collectives(const Graph& gs, const ShardingPlan& plan, const DeviceMesh& mesh, int rank) {
  LocalProgram p = lower(gs, plan, mesh, rank);
  std::vector<Moved> out;
  for (const LocalStep& s : p.steps)
    if (s.kind == LocalStep::Kind::Start)
      out.push_back({s.collective, s.op, p.types[static_cast<size_t>(s.in[0])].shape});
  return out;
}

const NodeSharding& first(const Graph& gs, const ShardingPlan& plan, OpKind k) {
  for (size_t i = 0; i < gs.nodes().size(); ++i)
    if (gs.nodes()[i].op == k) return plan.nodes[i];
  ADD_FAILURE() << "no " << op_name(k);
  return plan.nodes[0];
}

TEST(VocabParallelLoss, OnlyRowStatisticsTravel) {
  for (const char* reduction : {"mean", "sum", "none"}) {
    SCOPED_TRACE(reduction);
    Graph g = loss_graph(3, {8, 10}, reduction);
    Graph gs = decompose_for_sharding(g);
    DeviceMesh mesh(gs.mesh());
    ShardingPlan plan = propagate(gs, mesh);
    // The max over the sharded classes is a P(max); the picked logit a masked P(sum)
    // read from the logits as they are (S(1)) with the target whole.
    EXPECT_EQ(first(gs, plan, OpKind::Max).output.per_dim[0], Placement::partial(ReduceOp::Max));
    const NodeSharding& picked = first(gs, plan, OpKind::Gather);
    EXPECT_EQ(picked.inputs[0].per_dim[0], Placement::shard(1));
    EXPECT_EQ(picked.inputs[1].per_dim[0], Placement::replicate());
    EXPECT_EQ(picked.output.per_dim[0], Placement::partial(ReduceOp::Sum));
    for (int r = 0; r < 3; ++r) {
      std::vector<Moved> moved = collectives(gs, plan, mesh, r);
      // The max, the sum of exps and the picked logit, at least; each [8, 1] or
      // smaller (the [8] losses at most), never the [8, 10] logits or a chunk of them.
      EXPECT_GE(moved.size(), 3u);
      int maxes = 0;
      for (const Moved& m : moved) {
        EXPECT_NE(m.kind, CollectiveKind::AllToAll) << "rank " << r;
        EXPECT_LE(numel(m.shape), 8) << "rank " << r << ": a collective of " << shape_str(m.shape);
        maxes += m.op == ReduceOp::Max;
      }
      EXPECT_EQ(maxes, 1) << "the row max is reduced once and reused";
    }
    run_and_check(g, 5, std::string("cross_entropy ") + reduction);
  }
}

TEST(VocabParallelLoss, SpatialDimsAndHalfLogits) {
  // [N, C, d] logits: the statistics are [N, 1, d]; bf16 logits read as f32. 10
  // classes on 4 ranks: 3, 3, 3, 1.
  for (DType dt : {DType::F32, DType::BF16}) {
    Graph g = loss_graph(4, {2, 10, 3}, "none", dt);
    Graph gs = decompose_for_sharding(g);
    DeviceMesh mesh(gs.mesh());
    ShardingPlan plan = propagate(gs, mesh);
    for (const Moved& m : collectives(gs, plan, mesh, 1)) EXPECT_LE(numel(m.shape), 6) << shape_str(m.shape);
    run_and_check(g, 6, "cross_entropy [2, 10, 3]");
  }
}

TEST(VocabParallelLoss, EachRankPicksFromItsOwnClasses) {
  // 10 classes on 3 ranks: [0, 4), [4, 8), [8, 10). local_node gives each rank's
  // gather its first class as the offset.
  Graph gs = decompose_for_sharding(loss_graph(3, {8, 10}, "mean"));
  DeviceMesh mesh(gs.mesh());
  ShardingPlan plan = propagate(gs, mesh);
  const int64_t want[] = {0, 4, 8};
  for (int r = 0; r < 3; ++r) {
    LocalProgram p = lower(gs, plan, mesh, r);
    int gathers = 0;
    for (const LocalStep& s : p.steps)
      if (s.kind == LocalStep::Kind::Compute && s.node.op == OpKind::Gather) {
        EXPECT_EQ(s.node.attrs.get_int("offset"), want[r]) << "rank " << r;
        ++gathers;
      }
    EXPECT_EQ(gathers, 1);
  }
}

}  // namespace dist_vocab_loss_test
}  // namespace sf
