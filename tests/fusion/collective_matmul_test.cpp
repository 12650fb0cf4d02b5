// Collective-matmul decomposition: the ring steps it writes (which shard each
// rank computes at each step, what it sends where), that decomposed programs give
// the reference result on even and uneven shards, in lockstep and over Gloo, and
// that `auto` decides from the estimates.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "codegen/dist/explain.h"
#include "runtime/core/shard.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "codegen/dist/lockstep.h"
#include "tests/result_util.h"

namespace sf {
namespace fusion_collective_matmul_test {

Graph parse(const std::string& text) {
  Result<Graph> g = parse_graph(text, "t.sf");
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

Graph example(const std::string& name, int64_t world = 0) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + name);
  if (!g.ok()) throw std::runtime_error(g.error().str());
  if (world == 0) return std::move(g).value();
  Mesh m = g->mesh();
  m.dims[0].size = world;
  Result<Graph> r = remesh(*g, m);
  if (!r.ok()) throw std::runtime_error(r.error().str());
  return std::move(r).value();
}

std::vector<LocalProgram> programs(const Graph& g, DecomposeMode mode, bool fuse = true,
                                   std::vector<DecomposeDecision>* decisions = nullptr,
                                   std::optional<DeviceRates> rates = std::nullopt) {
  DeviceMesh mesh(g.mesh());
  RankPipelineOptions o;
  o.fuse = fuse;
  o.decompose.mode = mode;
  o.decompose.rates = rates;
  o.decisions = decisions;
  return ok_value(rank_programs(g, propagate(g, mesh), mesh, o));
}

std::vector<const LocalStep*> ring_shifts(const LocalProgram& p) {
  std::vector<const LocalStep*> out;
  for (const LocalStep& s : p.steps)
    if (s.kind == LocalStep::Kind::Start && s.ring_steps > 0) out.push_back(&s);
  return out;
}

// Runs the programs (lockstep, and as threads over Gloo) and compares every output
// with the reference evaluator on the global graph.
void check_against_reference(const Graph& g, const std::vector<LocalProgram>& ps, const std::string& what) {
  DeviceMesh mesh(g.mesh());
  ShardingPlan plan = propagate(g, mesh);
  std::vector<Tensor> global = random_inputs(g, 7);
  std::vector<std::vector<Tensor>> inputs;
  for (int r = 0; r < mesh.world(); ++r) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < g.params().size(); ++i)
      in.push_back(shard_tensor(global[i], plan.nodes[static_cast<size_t>(g.params()[i])].output, mesh, r));
    inputs.push_back(in);
  }
  Result<std::vector<Tensor>> want = evaluate(g, global);
  ASSERT_TRUE(want.ok()) << what;
  auto compare_all = [&](const std::vector<std::vector<Tensor>>& out, const std::string& how) {
    for (size_t o = 0; o < g.outputs().size(); ++o) {
      std::vector<Tensor> locals;
      for (int r = 0; r < mesh.world(); ++r) locals.push_back(out[static_cast<size_t>(r)][o]);
      Result<Tensor> got = unshard_tensor(locals, g.node(g.outputs()[o].value).type, plan.outputs[o], mesh);
      ASSERT_TRUE(got.ok()) << what << " " << how << ": " << got.error().str();
      Comparison c = compare(*got, (*want)[o], default_tolerance(got->dtype()));
      EXPECT_TRUE(c.ok()) << what << " " << how << ": max_abs_err " << c.max_abs_err;
    }
  };
  Result<std::vector<std::vector<Tensor>>> lock = simulate(ps, mesh, inputs);
  ASSERT_TRUE(lock.ok()) << what << ": " << lock.error().str();
  compare_all(*lock, "lockstep");
  // The same ring steps over Gloo, through the Plan executor, are checked by
  // tests/tools/exec_cpu_cli_test.cpp (ExecCpu.UnevenShardsAndDecomposedCollectiveMatmuls).
}

TEST(CollectiveMatmul, AllGatherMatmulBecomesARingStartingWithTheRanksOwnShard) {
  const Graph g = example("seq_parallel_mlp.sf");  // tp=4, x S(1) all-gathered into the colwise matmul
  std::vector<DecomposeDecision> decisions;
  std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, /*fuse=*/false, &decisions);
  ASSERT_EQ(decisions.size(), 2u);
  EXPECT_TRUE(decisions[0].decomposed);
  EXPECT_EQ(decisions[0].what.rfind("all_gather x", 0), 0u) << decisions[0].what;
  EXPECT_TRUE(decisions[1].decomposed);
  EXPECT_NE(decisions[1].what.find("reduce_scatter"), std::string::npos);
  const int n = 4;
  for (const LocalProgram& p : ps) {
    // No whole all_gather or reduce_scatter is left; 3 + 3 shifts.
    for (const LocalStep& s : p.steps) {
      if (s.kind == LocalStep::Kind::Start) {
        EXPECT_GT(s.ring_steps, 0) << step_line(p, s, DeviceMesh(g.mesh()));
      }
    }
    std::vector<const LocalStep*> shifts = ring_shifts(p);
    ASSERT_EQ(shifts.size(), 6u);
    for (size_t i = 0; i < shifts.size(); ++i) {
      const LocalStep* s = shifts[i];
      EXPECT_EQ(s->collective, CollectiveKind::AllToAll);
      // The all-gather ring passes each shard on to the previous rank and takes the
      // next one's. The reduce-scatter's step t sends the partial chunk of rank
      // (rank + t) to that rank, and takes its own chunk from rank (rank - t).
      const int t = s->ring_step;
      const int to = i < 3 ? (p.rank + n - 1) % n : (p.rank + t) % n;
      const int from = i < 3 ? (p.rank + 1) % n : (p.rank + n - t) % n;
      for (int k = 0; k < n; ++k) {
        EXPECT_EQ(s->sizes[static_cast<size_t>(k)] > 0, k == to) << "rank " << p.rank << " shift " << i << " sends only to " << to;
        EXPECT_EQ(s->sizes2[static_cast<size_t>(k)] > 0, k == from)
            << "rank " << p.rank << " shift " << i << " receives only from " << from;
      }
    }
    // The all-gather half: the matmul steps take shards (rank + s) mod n in order;
    // their results are named after the shard they hold.
    // (Unfused: one kernel per op.)
    std::vector<std::string> matmul_outs, matmul_ins;
    for (const LocalStep& s : p.steps)
      if (s.kind == LocalStep::Kind::Kernel && p.kernels[static_cast<size_t>(s.kernel)].ops ==
                                                   std::vector<std::string>{"matmul"}) {
        matmul_outs.push_back(p.names[static_cast<size_t>(s.outs[0])]);
        matmul_ins.push_back(p.names[static_cast<size_t>(s.in[0])]);
      }
    ASSERT_EQ(matmul_outs.size(), 8u);
    for (int s = 0; s < n; ++s)
      EXPECT_EQ(matmul_outs[static_cast<size_t>(s)], "h_s" + std::to_string((p.rank + s) % n))
          << "rank " << p.rank << " step " << s;
    // The reduce-scatter half ends with the rank's own chunk: (rank + s + 1) mod n.
    // Its chunks are the gather's shards, so each chunk's matmul reads the gather
    // half's result for that shard, a_s<j>: the shards are never concatenated into
    // a and sliced out of it again.
    for (int s = 0; s < n; ++s) {
      const std::string j = std::to_string((p.rank + s + 1) % n);
      EXPECT_EQ(matmul_outs[static_cast<size_t>(n + s)], "v11_c" + j) << "rank " << p.rank << " step " << s;
      EXPECT_EQ(matmul_ins[static_cast<size_t>(n + s)], "a_s" + j) << "rank " << p.rank << " step " << s;
    }
    for (const LocalStep& s : p.steps) {
      EXPECT_NE(s.kind, LocalStep::Kind::Concat) << "rank " << p.rank;
      EXPECT_NE(s.kind, LocalStep::Kind::Slice) << "rank " << p.rank;
    }
  }
}

TEST(CollectiveMatmul, DecomposedProgramsMatchTheReferenceOnEvenAndUnevenShards) {
  // seq 8 over 2 to 6 ranks: 3, 5 and 6 give uneven shards (5: one empty, 6: two,
  // which ranks meet at different steps of their rotation).
  for (int64_t world : {2, 3, 4, 5, 6})
    for (bool fuse : {false, true}) {
      const Graph g = example("seq_parallel_mlp.sf", world);
      std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, fuse);
      ASSERT_EQ(ring_shifts(ps[0]).size(), static_cast<size_t>(2 * (world - 1)));
      check_against_reference(g, ps, "world " + std::to_string(world) + (fuse ? " fused" : " unfused"));
    }
}

TEST(CollectiveMatmul, AGatheredValueFeedingSeveralMatmulsRunsEveryBranchPerShard) {
  // tp_attention: the sequence all-gather feeds the q, k and v projections.
  for (int64_t world : {2, 4}) {
    const Graph g = example("tp_attention.sf", world);
    std::vector<DecomposeDecision> d;
    std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, /*fuse=*/false, &d);
    // The gather into q, k and v, and the o projection's all_reduce.
    ASSERT_EQ(d.size(), 2u);
    EXPECT_TRUE(d[0].decomposed);
    EXPECT_NE(d[0].what.find("matmuls"), std::string::npos) << d[0].what;
    EXPECT_TRUE(d[1].decomposed);
    EXPECT_NE(d[1].what.find("-> all_reduce"), std::string::npos) << d[1].what;
    for (const LocalProgram& p : ps) {
      EXPECT_EQ(ring_shifts(p).size(), static_cast<size_t>(2 * (world - 1)));
      int concats = 0, matmuls = 0;
      for (const LocalStep& s : p.steps) {
        concats += s.kind == LocalStep::Kind::Concat;
        if (s.kind == LocalStep::Kind::Kernel)
          for (const std::string& op : p.kernels[static_cast<size_t>(s.kernel)].ops) matmuls += op == "matmul";
      }
      EXPECT_EQ(concats, 3) << "one per projection";
      // 3 projections per shard, then scores and context, then the o projection
      // per chunk of rows.
      EXPECT_EQ(matmuls, 3 * world + 2 + world) << "rank " << p.rank;
    }
    check_against_reference(g, ps, "tp_attention world " + std::to_string(world));
    check_against_reference(g, programs(g, DecomposeMode::Always), "tp_attention fused, world " + std::to_string(world));
  }
}

TEST(CollectiveMatmul, BranchesThatMeetEndBeforeTheStepTheyShare) {
  // SwiGLU: the gathered x feeds two matmuls whose one user is the same mul. Each
  // branch ends at its own steps (matmul + silu, matmul), so the mul runs once, after
  // both branches are joined (it was copied into both branches per shard, each copy
  // reading the other branch's result before it existed: examples/llama_block.sf).
  const Graph g = parse(
      "mesh tp=3\n"
      "graph g(x: f32[7, 6] {tp: S(0)}, w1: f32[6, 5], w3: f32[6, 5]) {\n"
      "  xr = redistribute(x, {tp: R})\n"
      "  y = mul(silu(matmul(xr, w1)), matmul(xr, w3))\n  return y {tp: R}\n}\n");
  std::vector<DecomposeDecision> d;
  std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, /*fuse=*/false, &d);
  ASSERT_FALSE(d.empty());
  EXPECT_TRUE(d[0].decomposed) << d[0].what << ": " << d[0].why;
  for (const LocalProgram& p : ps) {
    int concats = 0, muls = 0;
    for (const LocalStep& s : p.steps) {
      concats += s.kind == LocalStep::Kind::Concat;
      if (s.kind == LocalStep::Kind::Kernel)
        for (const std::string& op : p.kernels[static_cast<size_t>(s.kernel)].ops) muls += op == "mul";
    }
    EXPECT_EQ(concats, 2) << "one per branch";
    EXPECT_EQ(muls, 1) << "the shared mul once, rank " << p.rank;
  }
  check_against_reference(g, ps, "swiglu unfused");
  check_against_reference(g, programs(g, DecomposeMode::Always), "swiglu fused");
}

TEST(CollectiveMatmul, AnAllReduceAfterAMatmulBecomesARingReduceScatterThenAnAllGather) {
  // tp_mlp's rowwise linear: 20 rows over 2, 3 (7, 7, 6), 4 and 6 ranks (4 x 5, then
  // an empty chunk).
  for (int64_t world : {2, 3, 4, 6}) {
    const Graph g = example("tp_mlp.sf", world);
    const DeviceMesh mesh(g.mesh());
    std::vector<DecomposeDecision> d;
    std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, /*fuse=*/false, &d);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_TRUE(d[0].decomposed);
    EXPECT_EQ(d[0].what, "matmul v10 -> all_reduce");
    const int n = static_cast<int>(world);
    for (const LocalProgram& p : ps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(p.rank));
      int all_reduces = 0, gathers = 0;
      for (const LocalStep& s : p.steps) {
        if (s.kind != LocalStep::Kind::Start) continue;
        all_reduces += s.collective == CollectiveKind::AllReduce;
        if (s.collective == CollectiveKind::AllGather && s.ring_steps == 0) {
          ++gathers;
          // The reduced chunks, torch.chunk's split of the 20 rows, gathered along them.
          EXPECT_EQ(s.dim, 0);
          ASSERT_EQ(s.sizes.size(), static_cast<size_t>(n));
          for (int k = 0; k < n; ++k) EXPECT_EQ(s.sizes[static_cast<size_t>(k)], chunk_of(20, n, k).size) << k;
          EXPECT_EQ(p.types[static_cast<size_t>(s.in[0])].shape, (Shape{chunk_of(20, n, p.rank).size, 10}));
        }
      }
      EXPECT_EQ(all_reduces, 0);
      EXPECT_EQ(gathers, 1);
      EXPECT_EQ(ring_shifts(p).size(), static_cast<size_t>(n - 1));
      // The chunks' matmuls in ring order, ending with the rank's own chunk.
      std::vector<std::string> matmul_outs;
      for (const LocalStep& s : p.steps)
        if (s.kind == LocalStep::Kind::Kernel &&
            p.kernels[static_cast<size_t>(s.kernel)].ops == std::vector<std::string>{"matmul"})
          matmul_outs.push_back(p.names[static_cast<size_t>(s.outs[0])]);
      ASSERT_EQ(matmul_outs.size(), static_cast<size_t>(1 + n));  // the colwise matmul, then the chunks
      for (int s = 0; s < n; ++s)
        EXPECT_EQ(matmul_outs[static_cast<size_t>(1 + s)], "v10_c" + std::to_string((p.rank + s + 1) % n)) << s;
    }
    check_against_reference(g, ps, "tp_mlp world " + std::to_string(world) + " unfused");
    check_against_reference(g, programs(g, DecomposeMode::Always), "tp_mlp world " + std::to_string(world) + " fused");
  }
}

TEST(CollectiveMatmul, TermsAddedToTheMatmulsPartialSumsAreAddedChunkByChunk) {
  // reduce_scatter(r + (matmul + b)) with r and b Partial (DTensor adds a replicated
  // residual or bias to partial sums this way): each chunk adds its rows of r, and
  // all of b, which broadcasts along the rows. 7 rows over 2, 3 (3, 3, 1) and 4 ranks.
  for (int world : {2, 3, 4}) {
    const Graph g = parse(
        "mesh tp=" + std::to_string(world) + "\n"
        "graph g(a: f32[7, 12] {tp: S(1)}, w: f32[10, 12] {tp: S(1)}, r: f32[7, 10] {tp: P}, b: f32[10] {tp: P}) {\n"
        "  y = add(r, add(matmul(a, transpose(w, 0, 1)), b)) {tp: S(0)}\n"
        "  return y {tp: S(0)}\n}\n");
    std::vector<DecomposeDecision> d;
    std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, /*fuse=*/false, &d);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_TRUE(d[0].decomposed) << d[0].why;
    EXPECT_NE(d[0].what.find("-> reduce_scatter"), std::string::npos) << d[0].what;
    for (const LocalProgram& p : ps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(p.rank));
      int r_slices = 0, b_slices = 0, adds = 0;
      for (const LocalStep& st : p.steps) {
        if (st.kind == LocalStep::Kind::Slice) {
          r_slices += p.names[static_cast<size_t>(st.in[0])] == "r";
          b_slices += p.names[static_cast<size_t>(st.in[0])] == "b";
        }
        if (st.kind == LocalStep::Kind::Kernel)
          adds += p.kernels[static_cast<size_t>(st.kernel)].ops == std::vector<std::string>{"add"};
        EXPECT_FALSE(st.kind == LocalStep::Kind::Start && st.collective == CollectiveKind::ReduceScatter);
      }
      EXPECT_EQ(r_slices, world) << "one slice of r per chunk";
      EXPECT_EQ(b_slices, 0) << "b broadcasts along the rows: added whole";
      EXPECT_EQ(adds, 2 * world + (world - 1)) << "both terms per chunk, and the ring's adds";
    }
    check_against_reference(g, ps, "terms, world " + std::to_string(world) + " unfused");
    check_against_reference(g, programs(g, DecomposeMode::Always), "terms, world " + std::to_string(world) + " fused");
  }
  // transformer_block.sf: its last all_reduce sums the feed-forward matmul, the
  // residual h (a partial sum itself: cut per chunk) and the output bias ff_b2,
  // replicated and partialised by DTensor's rule (ff_b2 on one rank, zeros on the
  // others). The bias's sum over the ranks is ff_b2 itself, so every rank adds it
  // once, to its own chunk (in that chunk's matmul's epilogue, where the final sum
  // starts), and the partialisation is gone.
  for (int64_t world : {2, 3, 4}) {
    SCOPED_TRACE("transformer_block, world " + std::to_string(world));
    const Graph g = example("transformer_block.sf", world);
    std::vector<DecomposeDecision> d;
    std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, true, &d);
    bool found = false;
    for (const DecomposeDecision& x : d)
      found = found || (x.what.find("-> all_reduce") != std::string::npos && x.decomposed);
    EXPECT_TRUE(found) << "the block's all_reduce of matmul + bias + residual";
    for (const LocalProgram& p : ps) {
      int readers = 0, h_slices = 0;
      size_t reader = 0, last_matmul = 0;
      for (size_t i = 0; i < p.steps.size(); ++i) {
        const LocalStep& s = p.steps[i];
        EXPECT_FALSE(s.kind == LocalStep::Kind::Partialize && p.names[static_cast<size_t>(s.in[0])] == "ff_b2")
            << "rank " << p.rank << ": ff_b2 is still partialised";
        h_slices += s.kind == LocalStep::Kind::Slice && p.names[static_cast<size_t>(s.in[0])] == "h";
        if (s.kind != LocalStep::Kind::Kernel) continue;
        const std::vector<std::string>& ops = p.kernels[static_cast<size_t>(s.kernel)].ops;
        if (std::count(ops.begin(), ops.end(), "matmul")) last_matmul = i;
        for (int v : s.in)
          if (p.names[static_cast<size_t>(v)] == "ff_b2") {
            ++readers;
            reader = i;
          }
      }
      EXPECT_EQ(readers, 1) << "rank " << p.rank;
      EXPECT_EQ(reader, last_matmul) << "rank " << p.rank << ": read by the own chunk's matmul, the block's last";
      EXPECT_EQ(h_slices, world) << "rank " << p.rank << ": the partial residual is cut per chunk";
    }
    check_against_reference(g, ps, "transformer_block world " + std::to_string(world));
  }
}

TEST(CollectiveMatmul, EachChunkTravelsWhileTheNextChunksMatmulRunsAndTheSumIsFusedIn) {
  // Fused and scheduled, the reduce-scatter half of tp_mlp's rowwise matmul must
  // start sending chunk t (t = 1 .. n-1) as soon as its matmul is done, and wait for
  // what it receives only after the later chunks' matmuls: chunks 1 .. n-2 arrive
  // while the other chunks are computed and are added in the epilogue of the
  // rank's own chunk's matmul, which comes last; chunk n-1, sent as that matmul
  // starts, travels while it runs and is added by a one-add kernel after it.
  // Fusing the last chunk into the matmul, or waiting for any chunk early, would
  // leave a transfer nothing to hide behind.
  for (int64_t world : {3, 4}) {
    const Graph g = example("tp_mlp.sf", world);
    const int n = static_cast<int>(world);
    std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always);
    for (const LocalProgram& p : ps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(p.rank));
      auto count = [&](const LocalStep& s, const char* op) {
        if (s.kind != LocalStep::Kind::Kernel) return 0L;
        const std::vector<std::string>& ops = p.kernels[static_cast<size_t>(s.kernel)].ops;
        return static_cast<long>(std::count(ops.begin(), ops.end(), op));
      };
      // The chunks' matmul kernels in order (not the colwise layer's, which makes a);
      // the last, the rank's own chunk, carries the adds of the chunks that arrived.
      std::vector<size_t> matmuls;
      for (size_t i = 0; i < p.steps.size(); ++i)
        if (count(p.steps[i], "matmul") && p.steps[i].in.size() >= 2 && p.names[static_cast<size_t>(p.steps[i].outs[0])] != "a")
          matmuls.push_back(i);
      ASSERT_EQ(matmuls.size(), static_cast<size_t>(n));
      const size_t own = matmuls.back();
      EXPECT_EQ(count(p.steps[own], "add"), n - 2) << "chunks 1 .. n-2 added in the own chunk's epilogue";
      for (size_t k = 0; k + 1 < matmuls.size(); ++k) EXPECT_EQ(count(p.steps[matmuls[k]], "add"), 0);
      std::map<int, size_t> start_at;  // shift handle -> its start's index
      std::map<int, int> step_of;      // received value -> its shift's step
      size_t last_wait = 0;
      for (size_t i = 0; i < p.steps.size(); ++i) {
        const LocalStep& s = p.steps[i];
        if (s.kind == LocalStep::Kind::Start && s.ring_steps > 0) {
          start_at[s.handle] = i;
          ASSERT_GT(i, 0u);
          EXPECT_EQ(matmuls[static_cast<size_t>(s.ring_step - 1)], i - 1) << "shift " << s.ring_step << " right after its chunk's matmul";
        }
        if (s.kind != LocalStep::Kind::Wait || !start_at.count(s.handle)) continue;
        const int t = p.steps[start_at[s.handle]].ring_step;
        int between = 0;
        for (size_t m : matmuls) between += m > start_at[s.handle] && m < i;
        EXPECT_EQ(between, t < n - 1 ? n - 1 - t : 1) << "shift " << t << ": the later chunks' matmuls in flight";
        step_of[s.out] = t;
        last_wait = std::max(last_wait, i);
      }
      EXPECT_EQ(step_of.size(), static_cast<size_t>(n - 1));
      for (int v : p.steps[own].in) {
        if (step_of.count(v)) {
          EXPECT_LT(step_of[v], n - 1) << "the own chunk's matmul does not wait for the last transfer";
        }
      }
      size_t next = last_wait + 1;
      while (next < p.steps.size() && p.steps[next].kind != LocalStep::Kind::Kernel) ++next;
      ASSERT_LT(next, p.steps.size());
      const LocalStep& k = p.steps[next];
      EXPECT_EQ(p.kernels[static_cast<size_t>(k.kernel)].ops, std::vector<std::string>{"add"});
      ASSERT_EQ(k.in.size(), 2u);
      EXPECT_TRUE(std::find(k.in.begin(), k.in.end(), p.steps[own].outs[0]) != k.in.end());
      EXPECT_TRUE(std::any_of(k.in.begin(), k.in.end(), [&](int v) { return step_of.count(v) && step_of[v] == n - 1; }))
          << "the last chunk received";
    }
    check_against_reference(g, ps, "tp_mlp world " + std::to_string(world) + " scheduled");
  }
}

TEST(CollectiveMatmul, AutoSplitsAnAllReduceOnlyWhenTheRingIsEstimatedFaster) {
  std::vector<DecomposeDecision> small;
  std::vector<LocalProgram> ps = programs(example("tp_mlp.sf"), DecomposeMode::Auto, true, &small);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_FALSE(small[0].decomposed) << small[0].why;
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  // Megatron's MLP at 16384 tokens, hidden 4096, on 4 ranks: the rowwise matmul
  // takes milliseconds per chunk, enough to hide the reduce-scatter half.
  Graph big = parse(
      "mesh tp=4\n"
      "graph g(x: f32[16384, 4096], w1: f32[16384, 4096] {tp: S(0)}, w2: f32[4096, 16384] {tp: S(1)}) {\n"
      "  h = relu(matmul(x, transpose(w1, 0, 1)))\n"
      "  y = matmul(h, transpose(w2, 0, 1))\n"
      "  return y {tp: R}\n}\n");
  std::vector<DecomposeDecision> large;
  ps = programs(big, DecomposeMode::Auto, true, &large);
  ASSERT_EQ(large.size(), 1u);
  EXPECT_TRUE(large[0].decomposed) << large[0].why;
  EXPECT_NE(large[0].why.find("as a reduce_scatter in 4 ring steps and an all_gather"), std::string::npos)
      << large[0].why;
  EXPECT_EQ(ring_shifts(ps[0]).size(), 3u);
  std::vector<DecomposeDecision> never;
  ps = programs(big, DecomposeMode::Never, true, &never);
  ASSERT_EQ(never.size(), 1u);
  EXPECT_FALSE(never[0].decomposed);
  bool all_reduce = false;
  for (const LocalStep& s : ps[0].steps) all_reduce = all_reduce || (s.kind == LocalStep::Kind::Start && s.collective == CollectiveKind::AllReduce);
  EXPECT_TRUE(all_reduce) << "never leaves the all_reduce whole";
}

TEST(CollectiveMatmul, EveryExampleStillMatchesWhenDecomposedEverywherePossible) {
  for (const char* ex : {"tp_mlp.sf", "tp_attention.sf", "transformer_block.sf", "fsdp_tp_2d.sf", "fsdp_mlp.sf",
                         "causal_attention.sf", "llama_block.sf"}) {
    const Graph g = example(ex);
    check_against_reference(g, programs(g, DecomposeMode::Always), ex);
  }
}

TEST(CollectiveMatmul, AContractedShardDimIsNotDecomposed) {
  // Gathered along the contracted dim: the partial products would need a sum.
  Graph contracted = parse(
      "mesh tp=2\n"
      "graph g(x: f32[4, 8] {tp: S(1)}, w: f32[8, 6]) {\n"
      "  xr = redistribute(x, {tp: R})\n  y = matmul(xr, w)\n  return y {tp: R}\n}\n");
  std::vector<DecomposeDecision> d;
  std::vector<LocalProgram> ps = programs(contracted, DecomposeMode::Always, false, &d);
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  check_against_reference(contracted, ps, "contracted");
  // A right operand gathered along its rows (K) is contracted too.
  Graph rhs = parse(
      "mesh tp=2\n"
      "graph g(x: f32[4, 8], w: f32[8, 6] {tp: S(0)}) {\n"
      "  wr = redistribute(w, {tp: R})\n  y = matmul(x, wr)\n  return y {tp: R}\n}\n");
  ps = programs(rhs, DecomposeMode::Always, false);
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  check_against_reference(rhs, ps, "right operand gathered along K");
}

TEST(CollectiveMatmul, AnOperandVaryingAlongTheShardDimIsSlicedPerShard) {
  // Row-gathered, with an operand r after the matmul that varies along the rows:
  // each shard adds its own rows of r, inside the shard's kernel, so the epilogue
  // stays fused and nothing is left to run after the concat. 5 rows over 2 and 3
  // ranks (3, 2 and 2, 2, 1).
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Graph rows = parse(
        "mesh tp=" + std::to_string(world) + "\n"
        "graph g(x: f32[5, 8] {tp: S(0)}, w: f32[8, 6], r: f32[5, 6]) {\n"
        "  xr = redistribute(x, {tp: R})\n  y = add(relu(matmul(xr, w)), r)\n  return y {tp: R}\n}\n");
    std::vector<LocalProgram> ps = programs(rows, DecomposeMode::Always);
    for (const LocalProgram& p : ps) {
      ASSERT_EQ(ring_shifts(p).size(), static_cast<size_t>(world - 1));
      std::vector<std::pair<int64_t, int64_t>> r_rows;  // (offset, extent) of each slice of r
      bool seen_concat = false;
      for (const LocalStep& s : p.steps) {
        if (s.kind == LocalStep::Kind::Slice && p.names[static_cast<size_t>(s.in[0])] == "r")
          r_rows.push_back({s.offset[0], s.shape[0]});
        if (s.kind == LocalStep::Kind::Kernel) {
          const std::vector<std::string>& ops = p.kernels[static_cast<size_t>(s.kernel)].ops;
          EXPECT_FALSE(seen_concat) << "nothing runs after the concat";
          if (std::count(ops.begin(), ops.end(), "matmul")) {
            EXPECT_EQ(std::count(ops.begin(), ops.end(), "add"), 1) << "the add fuses into each shard's matmul";
          }
        }
        seen_concat = seen_concat || s.kind == LocalStep::Kind::Concat;
      }
      // One slice per shard, in ring order from the rank's own: torch.chunk's rows.
      ASSERT_EQ(r_rows.size(), static_cast<size_t>(world));
      for (int s = 0; s < world; ++s) {
        const Chunk c = chunk_of(5, world, (p.rank + s) % world);
        EXPECT_EQ(r_rows[static_cast<size_t>(s)], std::make_pair(c.offset, c.size)) << "rank " << p.rank << " step " << s;
      }
    }
    check_against_reference(rows, ps, "row-varying epilogue, world " + std::to_string(world));
    check_against_reference(rows, programs(rows, DecomposeMode::Always, false), "unfused");
  }
}

TEST(CollectiveMatmul, AWeightGatheredIntoTheRightOperandComputesColumnBlocks) {
  // FSDP: each weight is all-gathered along its out-features, which its transpose
  // makes the matmul's N dim. Step s multiplies the batch rows by weight shard
  // (rank + s) mod n, the shard held at that step: the rank's own first, then each
  // one the ring brings (w1_ag_r1, w1_ag_r2, ...). The bias, which varies along N,
  // is sliced per shard; the column blocks are concatenated along the last dim.
  // w1: 16 rows over 2, 3 (6, 5, 5), 4 and 5 (4, 4, 4, 4, 0) ranks; w2: 10 rows.
  for (int64_t world : {2, 3, 4, 5}) {
    const Graph g = example("fsdp_mlp.sf", world);
    const int n = static_cast<int>(world);
    std::vector<DecomposeDecision> d;
    std::vector<LocalProgram> ps = programs(g, DecomposeMode::Always, /*fuse=*/true, &d);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].what, "all_gather w1 -> matmul -> a");
    EXPECT_EQ(d[1].what, "all_gather w2 -> matmul -> y");
    EXPECT_TRUE(d[0].decomposed && d[1].decomposed);
    for (const LocalProgram& p : ps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(p.rank));
      EXPECT_EQ(ring_shifts(p).size(), static_cast<size_t>(2 * (n - 1)));
      for (const LocalStep& s : p.steps)
        EXPECT_FALSE(s.kind == LocalStep::Kind::Start && s.collective == CollectiveKind::AllGather &&
                     (p.names[static_cast<size_t>(s.in[0])] == "w1" || p.names[static_cast<size_t>(s.in[0])] == "w2"))
            << "no whole weight gather is left";
      // The first layer's kernels, in program order: which weight value each reads,
      // which shard its result holds, and its slice of b1.
      std::vector<std::string> weights, outs, biases;
      for (const LocalStep& s : p.steps) {
        if (s.kind != LocalStep::Kind::Kernel) continue;
        const std::string out = p.names[static_cast<size_t>(s.outs[0])];
        if (out.rfind("a_s", 0) != 0) continue;
        outs.push_back(out);
        for (int v : s.in) {
          const std::string& name = p.names[static_cast<size_t>(v)];
          if (name.rfind("w1", 0) == 0) weights.push_back(name);
          if (name.rfind("b1", 0) == 0) biases.push_back(name);
        }
      }
      ASSERT_EQ(outs.size(), static_cast<size_t>(n));
      ASSERT_EQ(weights.size(), static_cast<size_t>(n));
      ASSERT_EQ(biases.size(), static_cast<size_t>(n));
      for (int s = 0; s < n; ++s) {
        const int j = (p.rank + s) % n;
        EXPECT_EQ(weights[static_cast<size_t>(s)], s == 0 ? "w1" : "w1_ag_r" + std::to_string(s)) << s;
        EXPECT_EQ(outs[static_cast<size_t>(s)], "a_s" + std::to_string(j)) << s;
        EXPECT_EQ(biases[static_cast<size_t>(s)], "b1_ag_c" + std::to_string(j)) << s;
      }
      int concats = 0;
      for (const LocalStep& s : p.steps) {
        if (s.kind == LocalStep::Kind::Slice && p.names[static_cast<size_t>(s.in[0])] == "b1_ag") {
          const int j = std::stoi(p.names[static_cast<size_t>(s.out)].substr(std::string("b1_ag_c").size()));
          EXPECT_EQ(s.offset[0], chunk_of(16, n, j).offset);
          EXPECT_EQ(s.shape[0], chunk_of(16, n, j).size);
        }
        if (s.kind != LocalStep::Kind::Concat) continue;
        ++concats;
        EXPECT_EQ(s.dim, 1) << "column blocks";
        ASSERT_EQ(s.in.size(), static_cast<size_t>(n));
        for (int j = 0; j < n; ++j)
          EXPECT_EQ(p.types[static_cast<size_t>(s.in[static_cast<size_t>(j)])].shape[1],
                    chunk_of(p.names[static_cast<size_t>(s.out)] == "a" ? 16 : 10, n, j).size)
              << "shard " << j << " in its place";
      }
      EXPECT_EQ(concats, 2);
    }
    check_against_reference(g, ps, "fsdp_mlp world " + std::to_string(world) + " fused");
    check_against_reference(g, programs(g, DecomposeMode::Always, false), "fsdp_mlp world " + std::to_string(world) + " unfused");
  }
  // auto at real size (8 x 2048 tokens, hidden 4096 -> 16384, dp=4): nothing comes
  // before the first weight's gather to hide it, so its ring pays; the second
  // gather hides behind the first layer's matmuls, so it stays whole.
  {
    Result<Graph> full = parse_file(std::string(SF_SOURCE_DIR) + "/bench/graphs/overlap/full/fsdp_mlp.sf");
    ASSERT_TRUE(full.ok()) << full.error().str();
    Mesh m = full->mesh();
    m.dims[0].size = 4;
    Result<Graph> g4 = remesh(*full, m);
    ASSERT_TRUE(g4.ok()) << g4.error().str();
    std::vector<DecomposeDecision> d;
    std::vector<LocalProgram> ps = programs(*g4, DecomposeMode::Auto, true, &d);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_TRUE(d[0].decomposed) << d[0].why;
    EXPECT_FALSE(d[1].decomposed) << d[1].why;
    EXPECT_EQ(ring_shifts(ps[0]).size(), 3u);
  }
  // Gathered along a batch dim of a batched right operand: not decomposed.
  Graph batch = parse(
      "mesh tp=2\n"
      "graph g(x: f32[2, 4, 8], w: f32[2, 8, 6] {tp: S(0)}) {\n"
      "  wr = redistribute(w, {tp: R})\n  y = matmul(x, wr)\n  return y {tp: R}\n}\n");
  std::vector<LocalProgram> ps = programs(batch, DecomposeMode::Always, false);
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  check_against_reference(batch, ps, "batch-gathered right operand");
}

TEST(CollectiveMatmul, AutoDecomposesOnlyWhenTheRingIsEstimatedFaster) {
  // The example's shapes are tiny: the ring's extra latency outweighs what it hides.
  std::vector<DecomposeDecision> small;
  std::vector<LocalProgram> ps = programs(example("seq_parallel_mlp.sf"), DecomposeMode::Auto, true, &small);
  ASSERT_EQ(small.size(), 2u);
  EXPECT_FALSE(small[0].decomposed) << small[0].why;
  EXPECT_FALSE(small[1].decomposed) << small[1].why;
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  // Real sizes (8 x 2048 tokens, hidden 4096 -> 16384 on 4 ranks): the collectives
  // take milliseconds and the matmuls can hide them shard by shard.
  Graph big = parse(
      "mesh tp=4\n"
      "graph g(x: f32[8, 2048, 4096] {tp: S(1)}, w1: f32[16384, 4096] {tp: S(0)},\n"
      "        w2: f32[4096, 16384] {tp: S(1)}) {\n"
      "  xr = redistribute(x, {tp: R})\n"
      "  h = relu(matmul(xr, transpose(w1, 0, 1))) {tp: S(2)}\n"
      "  y = matmul(h, transpose(w2, 0, 1))\n"
      "  return y {tp: S(1)}\n}\n");
  std::vector<DecomposeDecision> large;
  ps = programs(big, DecomposeMode::Auto, true, &large);
  ASSERT_EQ(large.size(), 2u);
  EXPECT_TRUE(large[0].decomposed) << large[0].why;
  EXPECT_TRUE(large[1].decomposed) << large[1].why;
  EXPECT_EQ(ring_shifts(ps[0]).size(), 6u);
  // The estimate is the one performance model's (autotune/perf_model.h): unset rates
  // are sm_90a's table row, and a device whose compute is nearly free has nothing to
  // hide the ring behind, so the same graph stays whole there.
  std::vector<DecomposeDecision> h100;
  programs(big, DecomposeMode::Auto, true, &h100, arch_rates("sm_90a").value());
  ASSERT_EQ(h100.size(), 2u);
  EXPECT_EQ(h100[0].why, large[0].why);
  DeviceRates instant = default_device_rates();
  instant.fp32_flops_s = instant.tensor16_flops_s = instant.hbm_bytes_s = 1e21;
  std::vector<DecomposeDecision> fast;
  ps = programs(big, DecomposeMode::Auto, true, &fast, instant);
  ASSERT_EQ(fast.size(), 2u);
  EXPECT_FALSE(fast[0].decomposed) << fast[0].why;
  EXPECT_FALSE(fast[1].decomposed) << fast[1].why;
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  // And never means never.
  std::vector<DecomposeDecision> never;
  ps = programs(big, DecomposeMode::Never, true, &never);
  EXPECT_TRUE(ring_shifts(ps[0]).empty());
  ASSERT_EQ(never.size(), 2u);
  EXPECT_FALSE(never[0].decomposed);
}

}  // namespace fusion_collective_matmul_test
}  // namespace sf
