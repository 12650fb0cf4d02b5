// DeviceMesh coordinates and groups, torch.chunk shard sizes, and host
// shard/unshard, with expected values worked out by hand.
#include <gtest/gtest.h>

#include "runtime/core/device_mesh.h"
#include "runtime/core/shard.h"

namespace sf {
namespace dist_device_mesh_test {

DeviceMesh mesh_1d(int64_t n) { return DeviceMesh(Mesh{{{"tp", n}}}); }
DeviceMesh mesh_2x2() { return DeviceMesh(Mesh{{{"dp", 2}, {"tp", 2}}}); }

TEST(Chunk, FollowsTorchChunk) {
  // torch.chunk(torch.arange(20), 3) -> sizes 7, 7, 6
  EXPECT_EQ(chunk_of(20, 3, 0).size, 7);
  EXPECT_EQ(chunk_of(20, 3, 1).offset, 7);
  EXPECT_EQ(chunk_of(20, 3, 2).size, 6);
  EXPECT_EQ(chunk_of(20, 3, 2).offset, 14);
  // 5 on 4: 2, 2, 1 and an empty fourth chunk
  EXPECT_EQ(chunk_of(5, 4, 2).size, 1);
  EXPECT_EQ(chunk_of(5, 4, 3).size, 0);
  EXPECT_EQ(chunk_of(5, 4, 3).offset, 5);
  // 2 on 4: 1, 1, 0, 0
  EXPECT_EQ(chunk_of(2, 4, 1).size, 1);
  EXPECT_EQ(chunk_of(2, 4, 2).size, 0);
  EXPECT_EQ(chunk_of(0, 4, 0).size, 0);
}

TEST(DeviceMesh, CoordinatesAndGroupsAreRowMajor) {
  DeviceMesh m = mesh_2x2();
  EXPECT_EQ(m.world(), 4);
  EXPECT_EQ(m.coord(2), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(m.rank_of({0, 1}), 1);
  EXPECT_EQ(m.group(3, 0), (std::vector<int>{1, 3}));  // along dp
  EXPECT_EQ(m.group(3, 1), (std::vector<int>{2, 3}));  // along tp
  EXPECT_EQ(m.groups(1), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(m.groups(0), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(DeviceMesh(Mesh{}).world(), 1);
}

TEST(LocalShard, NestedShardingChunksInMeshDimOrder) {
  DeviceMesh m = mesh_2x2();
  PlacementSpec s00{{Placement::shard(0), Placement::shard(0)}};
  // dim 10: dp chunks 5 | 5; tp chunks each 5 into 3 | 2.
  LocalShard r1 = local_shard({10, 4}, s00, m, 1);  // (0, 1)
  EXPECT_EQ(r1.shape, (Shape{2, 4}));
  EXPECT_EQ(r1.offset, (std::vector<int64_t>{3, 0}));
  LocalShard r2 = local_shard({10, 4}, s00, m, 2);  // (1, 0)
  EXPECT_EQ(r2.shape, (Shape{3, 4}));
  EXPECT_EQ(r2.offset, (std::vector<int64_t>{5, 0}));
  PlacementSpec s_neg{{Placement::replicate(), Placement::shard(-1)}};
  LocalShard r3 = local_shard({10, 5}, s_neg, m, 3);
  EXPECT_EQ(r3.shape, (Shape{10, 2}));
  EXPECT_EQ(r3.offset, (std::vector<int64_t>{0, 3}));
}

Tensor iota(DType t, Shape s) {
  Tensor x(t, std::move(s));
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i));
  return x;
}

TEST(ShardTensor, TakesTheRanksBlock) {
  DeviceMesh m = mesh_1d(3);
  Tensor x = iota(DType::F32, {5, 2});  // rows [0 1] [2 3] [4 5] [6 7] [8 9]
  Tensor r2 = shard_tensor(x, PlacementSpec{{Placement::shard(0)}}, m, 2);  // 5 on 3: 2, 2, 1
  ASSERT_EQ(r2.shape(), (Shape{1, 2}));
  EXPECT_EQ(r2.get(0), 8);
  EXPECT_EQ(r2.get(1), 9);
  Tensor c1 = shard_tensor(x, PlacementSpec{{Placement::shard(1)}}, m, 1);  // 2 on 3: 1, 1, 0
  ASSERT_EQ(c1.shape(), (Shape{5, 1}));
  EXPECT_EQ(c1.get(4), 9);
  EXPECT_EQ(shard_tensor(x, PlacementSpec{{Placement::shard(1)}}, m, 2).numel(), 0);
  Tensor p1 = shard_tensor(x, PlacementSpec{{Placement::partial()}}, m, 1);
  EXPECT_EQ(p1.get(3), 0);  // sum-partial: only coordinate 0 holds the value
  Tensor p0 = shard_tensor(x, PlacementSpec{{Placement::partial()}}, m, 0);
  EXPECT_EQ(p0.get(3), 3);
  Tensor pm = shard_tensor(x, PlacementSpec{{Placement::partial(ReduceOp::Max)}}, m, 2);
  EXPECT_EQ(pm.get(3), 3);
}

TEST(UnshardTensor, ReducesPartialsAndPlacesShards) {
  DeviceMesh m = mesh_2x2();
  TensorType t{DType::F32, {3}};
  // dp: P(sum), tp: S(0): tp chunks 2 | 1. Rank values by hand:
  PlacementSpec spec{{Placement::partial(), Placement::shard(0)}};
  std::vector<Tensor> locals;
  const double vals[4][2] = {{1, 2}, {10, 0}, {100, 200}, {1000, 0}};
  for (int r = 0; r < 4; ++r) {
    LocalShard ls = local_shard(t.shape, spec, m, r);
    Tensor l(DType::F32, ls.shape);
    for (int64_t i = 0; i < l.numel(); ++i) l.set(i, vals[r][i]);
    locals.push_back(l);
  }
  Result<Tensor> g = unshard_tensor(locals, t, spec, m);
  ASSERT_TRUE(g.ok()) << g.error().str();
  EXPECT_EQ(g->get(0), 101);   // rank 0 [1 2] + rank 2 [100 200] at offset 0
  EXPECT_EQ(g->get(1), 202);
  EXPECT_EQ(g->get(2), 1010);  // rank 1 [10] + rank 3 [1000] at offset 2

  locals[1] = Tensor(DType::F32, {2});
  Result<Tensor> bad = unshard_tensor(locals, t, spec, m);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("rank 1 holds f32[2], expected f32[1]"), std::string::npos);
}

TEST(UnshardTensor, IntegerAverageDivides) {
  DeviceMesh m = mesh_1d(4);
  Tensor x(DType::I64, {2});
  x.set_int(0, 12);
  x.set_int(1, -8);
  PlacementSpec avg{{Placement::partial(ReduceOp::Avg)}};
  std::vector<Tensor> locals;
  for (int r = 0; r < 4; ++r) locals.push_back(shard_tensor(x, avg, m, r));
  Result<Tensor> back = unshard_tensor(locals, x.type(), avg, m);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->get_int(0), 12);  // (4 * 12) / 4, not 48
  EXPECT_EQ(back->get_int(1), -8);
}

// Found by fuzz_pipeline: a bool returned as {dp: P(avg), tp: P} came back false.
// The members are summed in a wide accumulator, as the runtime's collectives do:
// in bool storage true + true saturates to true, and the average then truncates
// 1 / 2 to false.
TEST(UnshardTensor, BoolPartialsAccumulateWideBeforeTheAverage) {
  DeviceMesh m = mesh_2x2();
  Tensor x(DType::Bool, {2});
  x.set_int(0, 1);
  x.set_int(1, 0);
  PlacementSpec spec{{Placement::partial(ReduceOp::Avg), Placement::partial(ReduceOp::Sum)}};
  std::vector<Tensor> locals;
  for (int r = 0; r < 4; ++r) locals.push_back(shard_tensor(x, spec, m, r));
  Result<Tensor> back = unshard_tensor(locals, x.type(), spec, m);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->get_int(0), 1);
  EXPECT_EQ(back->get_int(1), 0);
  // A true on one member of two averages to 1 / 2, which truncates to false
  // (runtime/comm/comm.cpp's from_wire: true only if every member is).
  PlacementSpec avg{{Placement::partial(ReduceOp::Avg), Placement::replicate()}};
  std::vector<Tensor> mixed;
  for (int r = 0; r < 4; ++r) {
    Tensor t(DType::Bool, {2});
    t.set_int(0, m.coord(r)[0] == 0 ? 1 : 0);
    t.set_int(1, 1);
    mixed.push_back(t);
  }
  Result<Tensor> half = unshard_tensor(mixed, x.type(), avg, m);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(half->get_int(0), 0);
  EXPECT_EQ(half->get_int(1), 1);
}

// f32 partial sums are rounded once, after the whole group is added in double.
TEST(UnshardTensor, FloatPartialsRoundOnce) {
  DeviceMesh m = mesh_1d(3);
  PlacementSpec sum{{Placement::partial(ReduceOp::Sum)}};
  std::vector<Tensor> locals;
  const float parts[3] = {1.0f, 0x1p-24f, 0x1p-24f};  // 1 + 2^-24 rounds back to 1 in f32; 1 + 2^-23 does not
  for (float v : parts) {
    Tensor t(DType::F32, {1});
    t.set(0, v);
    locals.push_back(t);
  }
  Result<Tensor> back = unshard_tensor(locals, TensorType{DType::F32, {1}}, sum, m);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->get(0), 1.0 + 0x1p-23);
}

TEST(ShardTensor, EverySpecRoundTripsOnBothMeshes) {
  const Placement ps[] = {Placement::replicate(), Placement::shard(0), Placement::shard(1), Placement::shard(-1),
                          Placement::partial(), Placement::partial(ReduceOp::Max), Placement::partial(ReduceOp::Avg)};
  for (const Shape& shape : {Shape{4, 6}, Shape{5, 3}, Shape{1, 2}, Shape{0, 3}}) {
    Tensor x = iota(DType::F32, shape);
    for (const DeviceMesh& m : {mesh_1d(4), mesh_2x2(), mesh_1d(3)}) {
      std::vector<PlacementSpec> specs;
      for (const Placement& a : ps) {
        if (m.ndim() == 1) specs.push_back(PlacementSpec{{a}});
        else
          for (const Placement& b : ps) specs.push_back(PlacementSpec{{a, b}});
      }
      for (const PlacementSpec& s : specs) {
        std::vector<Tensor> locals;
        for (int r = 0; r < m.world(); ++r) locals.push_back(shard_tensor(x, s, m, r));
        Result<Tensor> back = unshard_tensor(locals, x.type(), s, m);
        ASSERT_TRUE(back.ok()) << back.error().str();
        for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(back->get(i), x.get(i)) << s.str(m.mesh()) << " at " << i;
      }
    }
  }
}

TEST(PlacementSpecText, ParsesWhatStrPrintsAndNothingElse) {
  const Mesh m{{{"dp", 2}, {"tp", 4}}};
  const Placement S0 = Placement::shard(0), R = Placement::replicate();
  // Every spec str() prints reads back as itself, an all-R spec and the 1-rank mesh's too.
  for (const PlacementSpec& s :
       {PlacementSpec{{S0, R}}, PlacementSpec{{R, Placement::shard(-1)}}, PlacementSpec{{Placement::partial(), S0}},
        PlacementSpec{{Placement::partial(ReduceOp::Max), R}}, PlacementSpec{{R, R}}}) {
    std::optional<PlacementSpec> back = parse_placement_spec(s.str(m), m);
    ASSERT_TRUE(back) << s.str(m);
    EXPECT_EQ(*back, s) << s.str(m);
  }
  std::optional<PlacementSpec> one = parse_placement_spec("{}", Mesh{});
  ASSERT_TRUE(one);
  EXPECT_TRUE(one->per_dim.empty());
  // A dim left out is R; spaces are free.
  std::optional<PlacementSpec> loose = parse_placement_spec(" { tp :S( 1 ) } ", m);
  ASSERT_TRUE(loose);
  EXPECT_EQ(*loose, (PlacementSpec{{R, Placement::shard(1)}}));
  // Hostile text (a Plan's placements are read from plan.json) is refused.
  for (const char* bad : {"", "{", "tp: R", "{tp: R", "{pp: R}", "{tp: R, tp: S(0)}", "{tp: S()}", "{tp: S(x)}",
                          "{tp: S(99999999999999999999)}", "{tp: P(mul)}", "{tp: Q}", "{tp: R} x", "{tp R}",
                          "{tp: R,}", "{, tp: R}"})
    EXPECT_FALSE(parse_placement_spec(bad, m)) << "'" << bad << "'";
}

}  // namespace dist_device_mesh_test
}  // namespace sf
