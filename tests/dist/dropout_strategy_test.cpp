// dropout's sharding worked out by hand: the strategies offered (every dim, every
// Partial) and the local node a rank runs (its block's origin in the global tensor).
// The strategy sweep in strategy_test.cpp runs every offered strategy against the
// global op.
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/dist/strategy.h"
#include "runtime/core/device_mesh.h"

namespace sf {
namespace dist_dropout_strategy_test {

DeviceMesh mesh_1d(int64_t n) { return DeviceMesh(Mesh{{{"tp", n}}}); }
DeviceMesh mesh_2x2() { return DeviceMesh(Mesh{{{"dp", 2}, {"tp", 2}}}); }
Placement S(int64_t d) { return Placement::shard(d); }
Placement P(ReduceOp op) { return Placement::partial(op); }
PlacementSpec sp(std::initializer_list<Placement> p) { return PlacementSpec{std::vector<Placement>(p)}; }
Operand F(Shape s) { return {{DType::F32, std::move(s)}, false}; }

std::vector<OpStrategy> strategies(std::vector<Operand> in, const std::vector<std::pair<std::string, AttrValue>>& named,
                                   const DeviceMesh& mesh) {
  Attrs attrs = normalize_attrs(OpKind::Dropout, {}, named);
  TensorType out = infer_type(OpKind::Dropout, in, attrs, mesh.mesh());
  return op_strategies(OpKind::Dropout, in, attrs, out, mesh);
}

bool has(const std::vector<OpStrategy>& all, std::vector<PlacementSpec> in, PlacementSpec out) {
  return std::find(all.begin(), all.end(), OpStrategy{std::move(in), std::move(out)}) != all.end();
}

TEST(OpStrategies, DropoutShardsEveryDimAndPassesPartials) {
  auto t = strategies({F({2, 5, 7})}, {{"p", 0.5}, {"seed", int64_t{1}}}, mesh_1d(4));
  for (int d = 0; d < 3; ++d) EXPECT_TRUE(has(t, {sp({S(d)})}, sp({S(d)}))) << d;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    EXPECT_TRUE(has(t, {sp({P(op)})}, sp({P(op)}))) << reduce_op_name(op);
  EXPECT_FALSE(has(t, {sp({S(1)})}, sp({S(2)})));
  EXPECT_TRUE(has(strategies({F({5, 7})}, {{"seed", int64_t{1}}}, mesh_2x2()), {sp({S(1), S(1)})},
                  sp({S(1), S(1)})));  // columns chunked twice
}

// A rank's block of a dropout draws its mask at its origin in the global tensor.
TEST(LocalNode, GivesDropoutTheBlocksOriginAndTheGlobalShape) {
  Node n;
  n.op = OpKind::Dropout;
  n.attrs = normalize_attrs(OpKind::Dropout, {}, {{"p", 0.5}, {"seed", int64_t{4}}});
  n.type = {DType::F32, {3, 5, 7}};
  n.inputs = {0};
  LocalShard block{{3, 2, 3}, {0, 2, 4}};
  Node l = local_node(n, RankShards{block, {block}});
  EXPECT_EQ(l.attrs.get_ints("origin"), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(l.attrs.get_ints("global_shape"), (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(l.attrs.get_int("seed"), 4);
  EXPECT_EQ(l.type.shape, (Shape{3, 2, 3}));
  // The whole tensor (R or a Partial) keeps the node's attributes.
  LocalShard whole{{3, 5, 7}, {0, 0, 0}};
  EXPECT_EQ(local_node(n, RankShards{whole, {whole}}).attrs, n.attrs);
  // A node that is itself a block of a larger tensor: the origins add up.
  Node inner = n;
  inner.attrs = normalize_attrs(OpKind::Dropout, {}, {{"seed", int64_t{4}}, {"origin", std::vector<int64_t>{1, 0, 2}},
                                                      {"global_shape", std::vector<int64_t>{9, 5, 9}}});
  Node li = local_node(inner, RankShards{block, {block}});
  EXPECT_EQ(li.attrs.get_ints("origin"), (std::vector<int64_t>{1, 2, 6}));
  EXPECT_EQ(li.attrs.get_ints("global_shape"), (std::vector<int64_t>{9, 5, 9}));
}

}  // namespace dist_dropout_strategy_test
}  // namespace sf
