// Strategies of the index ops worked out by hand (the converter sweep of
// strategy_test.cpp runs each of them against the global op), and local_node's row
// offset of a vocabulary-parallel lookup.
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/dist/strategy.h"
#include "runtime/core/device_mesh.h"

namespace sf {
namespace dist_strategy_index_test {

DeviceMesh mesh_1d(int64_t n) { return DeviceMesh(Mesh{{{"tp", n}}}); }
Placement R() { return Placement::replicate(); }
Placement S(int64_t d) { return Placement::shard(d); }
Placement P(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }
PlacementSpec sp(std::initializer_list<Placement> p) { return PlacementSpec{std::vector<Placement>(p)}; }
Operand T(DType t, Shape s) { return {{t, std::move(s)}, false}; }
using Named = std::vector<std::pair<std::string, AttrValue>>;

std::vector<OpStrategy> strategies(OpKind k, std::vector<Operand> in, const Named& named) {
  DeviceMesh mesh = mesh_1d(4);
  Attrs attrs = normalize_attrs(k, {}, named);
  return op_strategies(k, in, attrs, infer_type(k, in, attrs, mesh.mesh()), mesh);
}
bool has(const std::vector<OpStrategy>& all, std::vector<PlacementSpec> in, PlacementSpec out) {
  return std::find(all.begin(), all.end(), OpStrategy{std::move(in), std::move(out)}) != all.end();
}

TEST(IndexStrategies, GatherShardsAlikeOrTheIndexAlongDim) {
  const Named d1{{"dim", int64_t{1}}};
  // x [6, 5], index [6, 3] along dim 1: dim 0 has one size, so both may shard it.
  auto g = strategies(OpKind::Gather, {T(DType::F32, {6, 5}), T(DType::I64, {6, 3})}, d1);
  EXPECT_TRUE(has(g, {sp({S(0)}), sp({S(0)})}, sp({S(0)})));
  EXPECT_TRUE(has(g, {sp({R()}), sp({S(1)})}, sp({S(1)})));  // the gathered dim, x whole
  // The index sharded on another dim over a whole x: rank r's rows would read x's rows
  // 0.. instead of its own block's.
  EXPECT_FALSE(has(g, {sp({R()}), sp({S(0)})}, sp({S(0)})));
  EXPECT_FALSE(has(g, {sp({S(1)}), sp({S(1)})}, sp({S(1)})));  // x's gathered dim never sharded
  EXPECT_TRUE(has(g, {sp({P(ReduceOp::Max)}), sp({R()})}, sp({P(ReduceOp::Max)})));
  // index [4, 3] against x [6, 5]: dim 0 differs in size, so its chunks would not line up.
  auto small = strategies(OpKind::Gather, {T(DType::F32, {6, 5}), T(DType::I64, {4, 3})}, d1);
  EXPECT_FALSE(has(small, {sp({S(0)}), sp({S(0)})}, sp({S(0)})));
}

TEST(IndexStrategies, IndexSelectOnItsDimIsVocabularyParallel) {
  auto s = strategies(OpKind::IndexSelect, {T(DType::F32, {10, 6}), T(DType::I32, {7})}, {{"dim", int64_t{0}}});
  EXPECT_TRUE(has(s, {sp({S(1)}), sp({R()})}, sp({S(1)})));
  EXPECT_TRUE(has(s, {sp({R()}), sp({S(0)})}, sp({S(0)})));
  EXPECT_TRUE(has(s, {sp({S(0)}), sp({R()})}, sp({P()})));  // masked rows, summed
  EXPECT_FALSE(has(s, {sp({S(0)}), sp({R()})}, sp({S(0)})));
  EXPECT_TRUE(has(s, {sp({P()}), sp({R()})}, sp({P()})));
}

TEST(IndexStrategies, ScatterAddShardsAllThreeAlikeAndIsLinear) {
  auto s = strategies(OpKind::ScatterAdd, {T(DType::F32, {5, 6}), T(DType::I64, {3, 6}), T(DType::F32, {3, 6})},
                      {{"dim", int64_t{0}}});
  EXPECT_TRUE(has(s, {sp({S(1)}), sp({S(1)}), sp({S(1)})}, sp({S(1)})));
  EXPECT_FALSE(has(s, {sp({S(0)}), sp({S(0)}), sp({S(0)})}, sp({S(0)})));  // the scattered dim
  EXPECT_TRUE(has(s, {sp({P()}), sp({R()}), sp({P()})}, sp({P()})));
  EXPECT_TRUE(has(s, {sp({P(ReduceOp::Avg)}), sp({R()}), sp({P(ReduceOp::Avg)})}, sp({P(ReduceOp::Avg)})));
  EXPECT_FALSE(has(s, {sp({P(ReduceOp::Max)}), sp({R()}), sp({P(ReduceOp::Max)})}, sp({P(ReduceOp::Max)})));
  // src narrower than x on dim 1: that dim is not sharded.
  auto narrow = strategies(OpKind::ScatterAdd, {T(DType::F32, {5, 6}), T(DType::I64, {3, 4}), T(DType::F32, {3, 4})},
                           {{"dim", int64_t{0}}});
  EXPECT_EQ(narrow.size(), 3u);  // all R, and Partial sum and avg of x and src
}

TEST(LocalNode, GivesALookupTheRanksFirstRow) {
  Node e;
  e.op = OpKind::Embedding;
  e.attrs = normalize_attrs(OpKind::Embedding, {}, {});
  e.type = {DType::F32, {4, 6}};
  e.inputs = {0, 1};
  // 10 rows on 4 ranks: 3, 3, 3, 1; rank 2 holds rows 6..8.
  LocalShard idx{{4}, {0}}, rows{{3, 6}, {6, 0}};
  EXPECT_EQ(local_node(e, RankShards{LocalShard{{4, 6}, {0, 0}}, {idx, rows}}).attrs.get_int("offset"), 6);
  // Columns sharded: no row offset, the lookup is unchanged.
  LocalShard cols{{10, 2}, {0, 4}};
  EXPECT_EQ(local_node(e, RankShards{LocalShard{{4, 2}, {0, 4}}, {idx, cols}}).attrs.get_int("offset"), 0);

  Node s;
  s.op = OpKind::IndexSelect;
  s.attrs = normalize_attrs(OpKind::IndexSelect, {}, {{"dim", int64_t{-1}}, {"offset", int64_t{-2}}});
  s.type = {DType::F32, {3, 7}};
  s.inputs = {0, 1};
  LocalShard x{{3, 2}, {0, 4}};  // columns 4..5 of x [3, 6] along the selected dim
  EXPECT_EQ(local_node(s, RankShards{LocalShard{{3, 7}, {0, 0}}, {x, LocalShard{{7}, {0}}}}).attrs.get_int("offset"), 2);
}

}  // namespace dist_strategy_index_test
}  // namespace sf
