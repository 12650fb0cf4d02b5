// scaled_dot_product_attention in whole programs on generated host kernels, against
// the reference evaluator: GQA with fewer kv heads than the chunks line up for (q
// head-sharded unevenly over 3 ranks, k and v replicated, each rank reading the kv
// heads of its global query heads), and causal attention with the query rows sharded
// unevenly (each rank masking by the global row). Each also checks the strategy
// propagation chose and the per-rank attributes local_node gives, worked out by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/dist/propagate.h"
#include "codegen/dist/strategy.h"
#include "codegen/ir/parser.h"
#include "tests/kernels/host_program_check.h"

namespace sf {
namespace kernels_attention_test {

struct Checked {
  Graph g;
  ValueId attn = -1;
};

Checked parse(const std::string& text) {
  Result<Graph> g = parse_graph(text, "attn.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  Checked c{std::move(g).value()};
  for (size_t i = 0; i < c.g.nodes().size(); ++i)
    if (c.g.nodes()[i].op == OpKind::ScaledDotProductAttention) c.attn = static_cast<ValueId>(i);
  return c;
}

// The attention node as each rank runs it under the plan propagation chose.
std::vector<Node> local_nodes(const Checked& c, const ShardingPlan& plan) {
  const Node& n = c.g.node(c.attn);
  const NodeSharding& ns = plan.nodes[static_cast<size_t>(c.attn)];
  std::vector<Shape> in;
  for (ValueId u : n.inputs) in.push_back(c.g.node(u).type.shape);
  DeviceMesh mesh(c.g.mesh());
  std::vector<Node> out;
  for (int r = 0; r < mesh.world(); ++r)
    out.push_back(local_node(n, rank_shards(n.type.shape, ns.output, in, ns.inputs, mesh, r)));
  return out;
}

// 8 query heads over 2 kv heads (groups of 4) on 3 ranks: the query heads split 3, 3,
// 2 and the kv heads would split 1, 1, 0; rank 1's query heads 3, 4, 5 read kv heads
// 0, 1, 1 but it would hold kv head 1 only, so k and v stay whole. Rank r's first
// global query head is 0, 3, 6: head_offset 0, 3, 6 with gqa_group 4, and its local
// heads read kv heads (off + h) / 4: rank 1 reads 0, 1, 1, rank 2 reads 1, 1.
TEST(AttentionPrograms, GqaWithReplicatedKvAndUnevenQueryHeadsOnThreeRanks) {
  Checked c = parse(
      "mesh tp=3\n"
      "graph g(q: f32[2, 8, 3, 2] {tp: S(1)}, k: f32[2, 2, 4, 2], v: f32[2, 2, 4, 3]) {\n"
      "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n"
      "  return out {tp: S(1)}\n}\n");
  DeviceMesh mesh(c.g.mesh());
  ShardingPlan plan = propagate(c.g, mesh);
  const NodeSharding& ns = plan.nodes[static_cast<size_t>(c.attn)];
  EXPECT_EQ(ns.inputs[0].str(c.g.mesh()), "{tp: S(1)}");
  EXPECT_EQ(ns.inputs[1].str(c.g.mesh()), "{tp: R}");
  EXPECT_EQ(ns.inputs[2].str(c.g.mesh()), "{tp: R}");
  std::vector<Node> local = local_nodes(c, plan);
  ASSERT_EQ(local.size(), 3u);
  const int64_t offsets[] = {0, 3, 6};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(local[static_cast<size_t>(r)].attrs.get_int("head_offset"), offsets[r]) << "rank " << r;
    EXPECT_EQ(local[static_cast<size_t>(r)].attrs.get_int("gqa_group"), 4) << "rank " << r;
  }
  kernel_test::check_on_host_kernels(c.g, 11, "gqa, kv replicated, 3 ranks");
}

// Causal attention with the 7 query rows split 3, 3, 1 over 3 ranks (k, v whole):
// rank r's rows start at global row 0, 3, 6, so its causal mask keeps key j for local
// row i when j <= i + 0, 3, 6.
TEST(AttentionPrograms, CausalQueryRowsShardedUnevenly) {
  Checked c = parse(
      "mesh tp=3\n"
      "graph g(q: f32[2, 7, 2] {tp: S(1)}, k: f32[2, 9, 2], v: f32[2, 9, 2]) {\n"
      "  out = scaled_dot_product_attention(q, k, v, is_causal=true)\n"
      "  return out {tp: S(1)}\n}\n");
  DeviceMesh mesh(c.g.mesh());
  ShardingPlan plan = propagate(c.g, mesh);
  const NodeSharding& ns = plan.nodes[static_cast<size_t>(c.attn)];
  EXPECT_EQ(ns.inputs[0].str(c.g.mesh()), "{tp: S(1)}");
  EXPECT_EQ(ns.inputs[1].str(c.g.mesh()), "{tp: R}");
  std::vector<Node> local = local_nodes(c, plan);
  ASSERT_EQ(local.size(), 3u);
  const int64_t offsets[] = {0, 3, 6};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(local[static_cast<size_t>(r)].attrs.get_int("query_offset"), offsets[r]) << "rank " << r;
    EXPECT_EQ(local[static_cast<size_t>(r)].attrs.get_int("gqa_group"), 0) << "rank " << r << ": heads not cut";
  }
  kernel_test::check_on_host_kernels(c.g, 12, "causal, query rows on 3 ranks");
}

// Tensor-parallel attention with the heads of q, k and v cut alike: 4 query heads in
// groups of 2 over 2 kv heads on 2 ranks line up (2 query heads and their kv head per
// rank), so every rank's head_offset is 0 (2 - 2 * 1 on rank 1) with the global group
// 2 made explicit; bf16, so the scores' matmuls take the tensor-core path.
TEST(AttentionPrograms, HeadParallelGqaWhenTheChunksLineUp) {
  Checked c = parse(
      "mesh tp=2\n"
      "graph g(q: bf16[1, 4, 5, 8] {tp: S(1)}, k: bf16[1, 2, 5, 8] {tp: S(1)}, v: bf16[1, 2, 5, 8] {tp: S(1)}) {\n"
      "  out = scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)\n"
      "  return out {tp: S(1)}\n}\n");
  DeviceMesh mesh(c.g.mesh());
  ShardingPlan plan = propagate(c.g, mesh);
  const NodeSharding& ns = plan.nodes[static_cast<size_t>(c.attn)];
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ns.inputs[i].str(c.g.mesh()), "{tp: S(1)}") << i;
  for (const Node& l : local_nodes(c, plan)) {
    EXPECT_EQ(l.attrs.get_int("head_offset"), 0);
    EXPECT_EQ(l.attrs.get_int("gqa_group"), 2);
  }
  kernel_test::check_on_host_kernels(c.g, 13, "head-parallel gqa, 2 ranks");
}

}  // namespace kernels_attention_test
}  // namespace sf
