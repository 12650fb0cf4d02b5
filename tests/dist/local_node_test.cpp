// local_node worked out by hand: the node a rank runs for its block of a global node
// (codegen/dist/strategy.h). Attributes that depend on where the block lies move with
// it (tril's diagonal, arange's bounds, mean's global count); shape attributes take
// the block's shape; everything else stays. Moved from strategy_test.cpp; the index
// ops', dropout's and attention's cases are in their own strategy tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "codegen/dist/strategy.h"

namespace sf {
namespace dist_local_node_test {

TEST(LocalNode, MeanOverAChunkDividesByTheGlobalCount) {
  Node n;
  n.op = OpKind::Mean;
  n.attrs = normalize_attrs(OpKind::Mean, {}, {{"dims", std::vector<int64_t>{0, 1}}});
  n.type = {DType::F32, {}};
  // Rank 1 of 4 holding rows 2..3 of 7 (x: [7, 3]): 2 * 3 of 21 elements.
  Node l = local_node(n, RankShards{LocalShard{{}, {}}, {LocalShard{{2, 3}, {2, 0}}}, {Shape{7, 3}}});
  EXPECT_EQ(l.attrs.get_int("count"), 21);
  // The whole dim on this rank: its own count is the global one, nothing to set.
  EXPECT_EQ(local_node(n, RankShards{LocalShard{{}, {}}, {LocalShard{{7, 3}, {0, 0}}}, {Shape{7, 3}}})
                .attrs.get_int("count"),
            0);
}

// The rank's block at rows r0, columns c0 sees j - i = j_l - i_l + c0 - r0.
TEST(LocalNode, ShiftsTheDiagonalByTheBlocksOffsets) {
  Node n;
  n.op = OpKind::Tril;
  n.attrs = normalize_attrs(OpKind::Tril, {}, {{"diagonal", int64_t{1}}});
  n.type = {DType::F32, {3, 5, 7}};
  n.inputs = {0};
  LocalShard block{{3, 2, 3}, {0, 2, 4}};
  Node l = local_node(n, RankShards{block, {block}});
  EXPECT_EQ(l.attrs.get_int("diagonal"), 1 + 2 - 4);
  EXPECT_EQ(l.type.shape, (Shape{3, 2, 3}));
  EXPECT_EQ(local_node(n, RankShards{LocalShard{{1, 5, 7}, {2, 0, 0}}, {}}).attrs, n.attrs);  // a batch shard
  // Diagonals at the ends of int64 saturate instead of wrapping.
  Node big = n;
  big.attrs = normalize_attrs(OpKind::Tril, {}, {{"diagonal", std::numeric_limits<int64_t>::max()}});
  EXPECT_EQ(local_node(big, RankShards{block, {block}}).attrs.get_int("diagonal"), (int64_t{1} << 62) - 2);
  big.attrs = normalize_attrs(OpKind::Tril, {}, {{"diagonal", std::numeric_limits<int64_t>::min()}});
  EXPECT_EQ(local_node(big, RankShards{block, {block}}).attrs.get_int("diagonal"), -(int64_t{1} << 62) - 2);
}

TEST(LocalNode, MovesArangeToTheChunksValues) {
  Node n;
  n.op = OpKind::Arange;
  n.attrs = normalize_attrs(OpKind::Arange, {}, {{"end", int64_t{10}}, {"start", int64_t{3}}, {"step", int64_t{2}}});
  n.type = {DType::I64, {4}};  // 3, 5, 7, 9
  auto chunk = [&](int64_t off, int64_t len) {
    Node l = local_node(n, RankShards{LocalShard{{len}, {off}}, {}});
    return std::make_pair(l.attrs.get_int("start"), l.attrs.get_int("end"));
  };
  EXPECT_EQ(chunk(0, 2), std::make_pair(int64_t{3}, int64_t{7}));
  EXPECT_EQ(chunk(1, 2), std::make_pair(int64_t{5}, int64_t{9}));
  EXPECT_EQ(chunk(3, 1), std::make_pair(int64_t{9}, int64_t{10}));  // the last chunk ends at the end
  EXPECT_EQ(chunk(4, 0), std::make_pair(int64_t{3}, int64_t{3}));    // an empty chunk
  // Next to INT64_MAX an empty chunk's "first value" would overflow; it is not used.
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  n.attrs = normalize_attrs(OpKind::Arange, {}, {{"end", kMax}, {"start", kMax - 10}, {"step", int64_t{7}}});
  n.type = {DType::I64, {2}};
  EXPECT_EQ(chunk(1, 1), std::make_pair(kMax - 3, kMax));
  EXPECT_EQ(chunk(2, 0), std::make_pair(kMax - 10, kMax - 10));
}

TEST(LocalNode, RewritesShapeAttributesOnly) {
  Node n;
  n.op = OpKind::Reshape;
  n.attrs = normalize_attrs(OpKind::Reshape, {}, {{"shape", std::vector<int64_t>{-1, 4}}});
  n.type = {DType::F32, {8, 4}};
  n.inputs = {0};
  Node l = local_node(n, RankShards{LocalShard{{2, 4}, {2, 0}}, {}});
  EXPECT_EQ(l.type, (TensorType{DType::F32, {2, 4}}));
  EXPECT_EQ(l.attrs.get_ints("shape"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(l.inputs, n.inputs);

  Node s;
  s.op = OpKind::Sum;
  s.attrs = normalize_attrs(OpKind::Sum, {}, {{"dims", std::vector<int64_t>{0}}});
  s.type = {DType::F32, {4}};
  Node ls = local_node(s, RankShards{LocalShard{{1}, {3}}, {}});
  EXPECT_EQ(ls.attrs, s.attrs);
  EXPECT_EQ(ls.type.shape, (Shape{1}));
}

}  // namespace dist_local_node_test
}  // namespace sf
