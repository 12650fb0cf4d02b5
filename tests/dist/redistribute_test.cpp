// Redistribution: every (source, target) spec pair on meshes [4], [3] and [2,2],
// with even and uneven (torch.chunk) shards, run through lowering and the lockstep
// simulator and compared with the global tensor; plus the collectives chosen for
// the common transitions, by hand.
#include <gtest/gtest.h>

#include "codegen/dist/lower.h"
#include "codegen/dist/propagate.h"
#include "codegen/dist/redistribute.h"
#include "runtime/core/shard.h"
#include "codegen/ir/builder.h"
#include "codegen/dist/lockstep.h"

namespace sf {
namespace dist_redistribute_test {

std::vector<Placement> choices() {
  return {Placement::replicate(), Placement::shard(0), Placement::shard(1), Placement::partial(),
          Placement::partial(ReduceOp::Max)};
}

std::vector<PlacementSpec> all_specs(const DeviceMesh& m) {
  std::vector<PlacementSpec> out;
  if (m.ndim() == 1) {
    for (const Placement& a : choices()) out.push_back(PlacementSpec{{a}});
  } else {
    for (const Placement& a : choices())
      for (const Placement& b : choices()) out.push_back(PlacementSpec{{a, b}});
  }
  return out;
}

Tensor iota(DType t, Shape s) {
  Tensor x(t, std::move(s));
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i % 97) - 40.0);
  return x;
}

// Places x as `from`, returns it as `to`, runs every rank, and checks each rank's
// local equals what shard_tensor says it should hold (for Shard/Replicate targets)
// and that the gathered value is x.
void check_pair(const DeviceMesh& m, const Tensor& x, const PlacementSpec& from, const PlacementSpec& to) {
  GraphBuilder b("redist", m.mesh());
  Value v = b.param("x", x.dtype(), x.shape(), from);
  b.ret(v, to);
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok()) << g.error().str();
  ShardingPlan plan = propagate(*g, m);
  std::vector<LocalProgram> progs;
  std::vector<std::vector<Tensor>> inputs;
  for (int r = 0; r < m.world(); ++r) {
    progs.push_back(lower(*g, plan, m, r));
    inputs.push_back({shard_tensor(x, from, m, r)});
  }
  auto out = simulate(progs, m, inputs);
  ASSERT_TRUE(out.ok()) << out.error().str();
  std::string what = from.str(m.mesh()) + " -> " + to.str(m.mesh()) + " on " + m.mesh().str() + " for " + x.type().str();
  std::vector<Tensor> locals;
  for (int r = 0; r < m.world(); ++r) locals.push_back((*out)[static_cast<size_t>(r)][0]);
  bool partial_target = false;
  for (const Placement& p : to.per_dim) partial_target |= p.is_partial();
  if (!partial_target) {
    for (int r = 0; r < m.world(); ++r) {
      Tensor want = shard_tensor(x, to, m, r);
      ASSERT_EQ(locals[static_cast<size_t>(r)].shape(), want.shape()) << what << " rank " << r;
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_EQ(locals[static_cast<size_t>(r)].get(i), want.get(i)) << what << " rank " << r << " at " << i;
    }
  }
  Result<Tensor> back = unshard_tensor(locals, x.type(), to, m);
  ASSERT_TRUE(back.ok()) << what << ": " << back.error().str();
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(back->get(i), x.get(i)) << what << " at " << i;
}

TEST(Redistribute, EveryPairOnEveryMesh) {
  const DeviceMesh meshes[] = {DeviceMesh(Mesh{{{"tp", 4}}}), DeviceMesh(Mesh{{{"tp", 3}}}),
                               DeviceMesh(Mesh{{{"dp", 2}, {"tp", 2}}})};
  for (const DeviceMesh& m : meshes)
    for (const Shape& s : {Shape{8, 4}, Shape{5, 7}, Shape{1, 2}})
      for (const PlacementSpec& from : all_specs(m))
        for (const PlacementSpec& to : all_specs(m)) {
          check_pair(m, iota(DType::F32, s), from, to);
          if (HasFatalFailure()) return;
        }
}

TEST(Redistribute, IntegerValuesStayExact) {
  DeviceMesh m(Mesh{{{"dp", 2}, {"tp", 2}}});
  Tensor x(DType::I64, {5, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.set_int(i, (int64_t{1} << 60) + i);
  for (const PlacementSpec& from : all_specs(m))
    for (const PlacementSpec& to : all_specs(m)) check_pair(m, x, from, to);
}

std::vector<std::string> kinds(const PlacementSpec& from, const PlacementSpec& to, const DeviceMesh& m, Shape s) {
  std::vector<std::string> k;
  for (const RedistStep& st : plan_redistribute(from, to, TensorType{DType::F32, s}, m)) k.push_back(step_str(st, m));
  return k;
}

TEST(Redistribute, ChoosesTheExpectedCollectives) {
  DeviceMesh m1(Mesh{{{"tp", 4}}});
  auto S = [](int64_t d) { return Placement::shard(d); };
  auto R = Placement::replicate();
  auto P = Placement::partial();
  using V = std::vector<std::string>;
  EXPECT_EQ(kinds({{S(0)}}, {{R}}, m1, {8, 4}), (V{"all_gather(tp, dim 0)"}));
  EXPECT_EQ(kinds({{P}}, {{R}}, m1, {8, 4}), (V{"all_reduce(tp, sum)"}));
  EXPECT_EQ(kinds({{P}}, {{S(1)}}, m1, {8, 4}), (V{"reduce_scatter(tp, dim 1, sum)"}));
  EXPECT_EQ(kinds({{S(0)}}, {{S(1)}}, m1, {8, 4}), (V{"all_to_all(tp, split 1, concat 0)"}));
  EXPECT_EQ(kinds({{R}}, {{S(-1)}}, m1, {8, 4}), (V{"slice(tp, dim 1)"}));
  EXPECT_EQ(kinds({{S(1)}}, {{S(-1)}}, m1, {8, 4}), V{});
  DeviceMesh m2(Mesh{{{"dp", 2}, {"tp", 2}}});
  // Nested: tp's shard subdivides dp's chunk, so it is gathered first.
  EXPECT_EQ(kinds({{S(0), S(0)}}, {{R, R}}, m2, {8, 4}), (V{"all_gather(tp, dim 0)", "all_gather(dp, dim 0)"}));
  // Changing only the outer shard still regathers the inner one and re-slices it.
  EXPECT_EQ(kinds({{S(0), S(0)}}, {{S(1), S(0)}}, m2, {8, 4}),
            (V{"all_gather(tp, dim 0)", "all_gather(dp, dim 0)", "slice(dp, dim 1)", "slice(tp, dim 0)"}));
  EXPECT_EQ(kinds({{P, S(1)}}, {{R, S(1)}}, m2, {8, 4}), (V{"all_reduce(dp, sum)"}));
}

TEST(Redistribute, CostFollowsTheBusFactors) {
  DeviceMesh m(Mesh{{{"tp", 4}}});
  TensorType t{DType::F32, {1000, 1000}};  // 4 MB
  CommRates cm;
  cm.intra = LinkSpec{1.0, 0.0, 0, 0, CollAlgorithm::Ring};  // 1 GB/s, no latency
  double ag = redistribute_cost(plan_redistribute({{Placement::shard(0)}}, {{Placement::replicate()}}, t, m), t, m, cm);
  double ar = redistribute_cost(plan_redistribute({{Placement::partial()}}, {{Placement::replicate()}}, t, m), t, m, cm);
  double rs = redistribute_cost(plan_redistribute({{Placement::partial()}}, {{Placement::shard(0)}}, t, m), t, m, cm);
  EXPECT_DOUBLE_EQ(ag, 0.75 * 4e6 / 1e9);  // (n-1)/n of the gathered 4 MB
  EXPECT_DOUBLE_EQ(ar, 2 * 0.75 * 4e6 / 1e9);
  EXPECT_DOUBLE_EQ(rs, 0.75 * 4e6 / 1e9);
  EXPECT_DOUBLE_EQ(redistribute_cost({}, t, m, cm), 0.0);
  // Latency per ring step, as the timeline counts it: n-1 for an all_gather, 2(n-1)
  // for an all_reduce.
  cm.intra.alpha_us = 10;
  EXPECT_DOUBLE_EQ(redistribute_cost(plan_redistribute({{Placement::shard(0)}}, {{Placement::replicate()}}, t, m), t, m, cm),
                   3 * 10e-6 + 0.75 * 4e6 / 1e9);
  EXPECT_DOUBLE_EQ(redistribute_cost(plan_redistribute({{Placement::partial()}}, {{Placement::replicate()}}, t, m), t, m, cm),
                   6 * 10e-6 + 2 * 0.75 * 4e6 / 1e9);
}

TEST(Redistribute, EachMeshDimIsPricedOnTheLinkItsGroupsCross) {
  // dp=2 x tp=4 over nodes of 4 GPUs: tp's groups (ranks 0-3, 4-7) stay in a node,
  // dp's (0 and 4, ...) span the two.
  DeviceMesh m(Mesh{{{"dp", 2}, {"tp", 4}}});
  CommRates cm;
  cm.gpus_per_node = 4;
  cm.intra = LinkSpec{100.0, 0, 0, 0, CollAlgorithm::Ring};
  cm.inter = LinkSpec{10.0, 0, 0, 0, CollAlgorithm::Ring};
  EXPECT_EQ(cm.link_class(m, 1), LinkClass::NvLink);
  EXPECT_EQ(cm.link_class(m, 0), LinkClass::Ib);
  TensorType t{DType::F32, {800, 1000}};  // 3.2 MB
  const Placement R = Placement::replicate(), P = Placement::partial();
  double over_tp = redistribute_cost(plan_redistribute({{R, P}}, {{R, R}}, t, m), t, m, cm);
  double over_dp = redistribute_cost(plan_redistribute({{P, R}}, {{R, R}}, t, m), t, m, cm);
  EXPECT_DOUBLE_EQ(over_tp, 2 * 0.75 * 3.2e6 / 100e9);
  EXPECT_DOUBLE_EQ(over_dp, 2 * 0.5 * 3.2e6 / 10e9);
  // With 8 GPUs a node, both stay on NVLink.
  cm.gpus_per_node = 8;
  EXPECT_EQ(cm.link_class(m, 0), LinkClass::NvLink);
  EXPECT_DOUBLE_EQ(redistribute_cost(plan_redistribute({{P, R}}, {{R, R}}, t, m), t, m, cm), 2 * 0.5 * 3.2e6 / 100e9);
}

}  // namespace dist_redistribute_test
}  // namespace sf
