// The sharding propagation stage (codegen/dist/propagate.h) on the Megatron MLPs,
// against what PyTorch DTensor's ColwiseParallel / RowwiseParallel give the same
// layers: a column-parallel first Linear keeps its output sharded on the hidden dim,
// the row-parallel second one produces a Partial sum, and the return's placement
// decides how that partial is resolved (all-reduce to Replicate, or reduce-scatter
// to the sequence shard).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/dist/propagate.h"
#include "codegen/ir/builder.h"
#include "tests/dist/pipeline_util.h"

namespace sf {
namespace dist_propagate_test {

using namespace dist_test;

struct Propagated {
  Graph g;
  ShardingPlan plan;
  // The placement propagation chose for the node's output, as explain prints it.
  std::string output(ValueId v) const { return plan.nodes[static_cast<size_t>(v)].output.str(g.mesh()); }
  std::string value(ValueId v) const { return plan.nodes[static_cast<size_t>(v)].value.str(g.mesh()); }
  ValueId named(const std::string& name) const {
    for (size_t i = 0; i < g.nodes().size(); ++i)
      if (g.nodes()[i].name == name) return static_cast<ValueId>(i);
    ADD_FAILURE() << "no node " << name;
    return 0;
  }
  std::vector<ValueId> of(OpKind op) const {
    std::vector<ValueId> out;
    for (size_t i = 0; i < g.nodes().size(); ++i)
      if (g.nodes()[i].op == op) out.push_back(static_cast<ValueId>(i));
    return out;
  }
};

Propagated propagated(const std::string& file) {
  Propagated p{example(file), {}};
  p.plan = propagate(p.g, DeviceMesh(p.g.mesh()));
  return p;
}

TEST(Propagate, MegatronMlpIsColumnThenRowParallelAndAllReducesThePartial) {
  Propagated p = propagated("tp_mlp.sf");
  // Undeclared params are replicated; declared ones stay as declared.
  EXPECT_EQ(p.output(p.named("x")), "{tp: R}");
  EXPECT_EQ(p.output(p.named("b2")), "{tp: R}");
  EXPECT_EQ(p.output(p.named("w1")), "{tp: S(0)}");
  const std::vector<ValueId> mm = p.of(OpKind::Matmul);
  ASSERT_EQ(mm.size(), 2u);
  // x @ w1^T with w1 sharded on its out dim: the hidden dim stays sharded, no comm.
  EXPECT_EQ(p.output(mm[0]), "{tp: S(1)}");
  EXPECT_EQ(p.output(p.named("a")), "{tp: S(1)}") << "the bias add and relu keep the shard";
  EXPECT_EQ(p.plan.nodes[static_cast<size_t>(mm[0])].cost, 0.0);
  // a @ w2^T contracts the sharded dim: each rank holds a partial sum...
  EXPECT_EQ(p.output(mm[1]), "{tp: P}");
  // ...and the replicated return resolves it (one all_reduce, as DTensor's RowwiseParallel).
  ASSERT_EQ(p.plan.outputs.size(), 1u);
  EXPECT_EQ(p.plan.outputs[0].str(p.g.mesh()), "{tp: R}");
}

TEST(Propagate, SequenceParallelMlpGathersTheInputAndReduceScattersTheOutput) {
  Propagated p = propagated("seq_parallel_mlp.sf");
  EXPECT_EQ(p.output(p.named("x")), "{tp: S(1)}") << "the sequence shard, as declared";
  EXPECT_EQ(p.output(p.named("xr")), "{tp: R}") << "the explicit redistribute gathers it";
  EXPECT_EQ(p.output(p.named("h")), "{tp: S(2)}");
  const std::vector<ValueId> mm = p.of(OpKind::Matmul);
  ASSERT_EQ(mm.size(), 2u);
  EXPECT_EQ(p.output(mm[1]), "{tp: P}");
  // The return asks for the sequence shard: the partial is reduce-scattered along dim 1.
  ASSERT_EQ(p.plan.outputs.size(), 1u);
  EXPECT_EQ(p.plan.outputs[0].str(p.g.mesh()), "{tp: S(1)}");
}

TEST(Propagate, AConstraintFixesTheValueWhateverTheOpProduced) {
  // Row-sharded x @ replicated w gives row shards; the constraint asks for columns.
  GraphBuilder b("g", Mesh{{{"tp", 2}}});
  Value x = b.param("x", DType::F32, {4, 3}, b.spec({{"tp", Placement::shard(0)}}));
  Value w = b.param("w", DType::F32, {3, 2});
  Value h = matmul(x, w);
  b.constrain(h, b.spec({{"tp", Placement::shard(1)}}));
  b.ret(h);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  const ShardingPlan plan = propagate(*g, DeviceMesh(g->mesh()));
  const NodeSharding& n = plan.nodes[static_cast<size_t>(h.id)];
  EXPECT_EQ(n.output.str(g->mesh()), "{tp: S(0)}") << "what the matmul strategy produces without comm";
  EXPECT_EQ(n.value.str(g->mesh()), "{tp: S(1)}") << "what the value is after its constraint";
}

}  // namespace dist_propagate_test
}  // namespace sf
