// The GPU executor's NCCL path (runtime/plan/plan_exec.h) on the stand-in driver and
// NCCL (tests/fake_cuda, tests/fake_nccl): device memory is host memory and the
// fake NCCL really moves it, so a Plan made only of collectives, slices and
// concats gives real numbers here, and they are checked against the host oracle
// (runtime/core/host_collectives.h). That covers the packing and unpacking
// around every NCCL call (uneven shards, gathers along inner dims, all_to_all
// between dims). What the fake cannot show is timing: it runs work at once.
//
// Environment (set below, before main): SHARDFUSE_LIBCUDA and SHARDFUSE_LIBNCCL
// name the fakes, FAKE_CUDA_DEVICES=4.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>


#include "runtime/core/host_collectives.h"
#include "runtime/core/shard.h"
#include "runtime/comm/agree.h"
#include "runtime/plan/plan_exec.h"
#include "tests/result_util.h"
#include "tests/runtime_fake/call_log.h"

namespace sf {
namespace runtime_fake_plan_nccl_fake_test {

// Before main, so before the runtime opens either library (once per process).
const bool kFakes = [] {
  ::setenv("SHARDFUSE_LIBCUDA", FAKE_CUDA_LIB, 1);
  ::setenv("SHARDFUSE_LIBNCCL", FAKE_NCCL_LIB, 1);
  ::setenv("FAKE_CUDA_DEVICES", "4", 1);
  return true;
}();

Tensor filled(const Shape& shape, int seed) {
  Tensor t(DType::F32, shape);
  uint32_t x = 2654435761u * static_cast<uint32_t>(seed + 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.set(i, static_cast<double>(x >> 9) / static_cast<double>(1u << 23) - 0.5 + seed);
  }
  return t;
}

// One collective (or local step) per rank: in buffer 0 (the param), out buffer 1.
struct OneStep {
  std::string op;
  std::vector<Shape> in, out;  // per rank
  int dim = 0, dim2 = 0;
  std::vector<int64_t> sizes, sizes2, offset;
  std::string reduce_op;
  // Per rank, when the ranks' sizes differ (a ring shift): replaces sizes/sizes2.
  std::vector<std::vector<int64_t>> rank_sizes, rank_sizes2;
};

OneStep mk(std::string op, std::vector<Shape> in, std::vector<Shape> out, int dim = 0, int dim2 = 0,
           std::vector<int64_t> sizes = {}, std::vector<int64_t> sizes2 = {}) {
  OneStep c;
  c.op = std::move(op);
  c.in = std::move(in);
  c.out = std::move(out);
  c.dim = dim;
  c.dim2 = dim2;
  c.sizes = std::move(sizes);
  c.sizes2 = std::move(sizes2);
  return c;
}

PlanSource plan_of(const OneStep& c) {
  const int n = static_cast<int>(c.in.size());
  Plan p;
  p.graph = "t";
  p.mesh = "tp=" + std::to_string(n);
  p.world = n;
  p.arch = "sm_90a";
  p.params = {"x"};
  p.outputs = {"y"};
  for (int r = 0; r < n; ++r) {
    PlanRank pr;
    pr.rank = r;
    pr.buffers = {{"x", DType::F32, c.in[static_cast<size_t>(r)]}, {"y", DType::F32, c.out[static_cast<size_t>(r)]}};
    pr.inputs = {0};
    pr.input_specs = {"S(0)"};
    pr.outputs = {1};
    pr.output_specs = {"R"};
    PlanStep s;
    s.op = c.op;
    s.in = {0};
    s.dim = c.dim;
    s.dim2 = c.dim2;
    s.sizes = c.rank_sizes.empty() ? c.sizes : c.rank_sizes[static_cast<size_t>(r)];
    s.sizes2 = c.rank_sizes2.empty() ? c.sizes2 : c.rank_sizes2[static_cast<size_t>(r)];
    s.offset = c.offset;
    s.reduce_op = c.reduce_op;
    s.mesh_dim = "tp";
    if (c.op == "slice") {
      s.out = {1};
      s.stream = "compute";
      pr.steps.push_back(s);
    } else {
      s.stream = "comm";
      s.handle = 0;
      for (int k = 0; k < n; ++k) s.group.push_back(k);
      PlanStep w;
      w.op = "wait";
      w.stream = "compute";
      w.out = {1};
      w.handle = 0;
      w.mesh_dim = "tp";
      pr.steps.push_back(s);
      pr.steps.push_back(w);
    }
    p.ranks.push_back(std::move(pr));
  }
  return PlanSource{std::move(p), {}, ""};
}

std::vector<std::vector<Tensor>> inputs_of(const OneStep& c) {
  std::vector<std::vector<Tensor>> in;
  for (size_t r = 0; r < c.in.size(); ++r) in.push_back({filled(c.in[r], static_cast<int>(r))});
  return in;
}

GpuRunOptions nccl_options() {
  GpuRunOptions o;
  o.gpus = 4;
  o.collectives = GpuCollectives::Nccl;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

// Runs the step through NCCL and through the host, and checks both against want.
void expect_both_paths(const OneStep& c, const std::vector<Tensor>& want) {
  const PlanSource src = plan_of(c);
  for (GpuCollectives how : {GpuCollectives::Nccl, GpuCollectives::Host}) {
    SCOPED_TRACE(how == GpuCollectives::Nccl ? "nccl" : "host");
    GpuRunOptions o = nccl_options();
    o.collectives = how;
    GpuRunStats stats;
    Result<std::vector<std::vector<Tensor>>> out = run_plan_on_gpu(src, inputs_of(c), o, &stats);
    ASSERT_TRUE(out.ok()) << out.error().str();
    if (how == GpuCollectives::Nccl && c.op != "slice") {
      EXPECT_EQ(stats.nccl_ops, static_cast<int64_t>(c.in.size()));
      EXPECT_NE(stats.collectives.find("NCCL"), std::string::npos) << stats.collectives;
    }
    ASSERT_EQ(out->size(), want.size());
    for (size_t r = 0; r < want.size(); ++r) {
      const Tensor& got = (*out)[r].at(0);
      ASSERT_EQ(got.shape(), want[r].shape()) << "rank " << r;
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_NEAR(got.get(i), want[r].get(i), 1e-5 * (1 + std::abs(want[r].get(i))))
            << "rank " << r << ", element " << i;
    }
  }
}

std::vector<Tensor> locals_of(const OneStep& c) {
  std::vector<Tensor> l;
  for (auto& v : inputs_of(c)) l.push_back(v[0]);
  return l;
}

TEST(PlanNcclFake, AllGatherAlongDimZeroEvenGoesStraightIntoTheOutput) {
  OneStep c = mk("all_gather", {{2, 3}, {2, 3}, {2, 3}, {2, 3}}, {{8, 3}, {8, 3}, {8, 3}, {8, 3}}, 0, 0, {2, 2, 2, 2});
  expect_both_paths(c, host_all_gather(locals_of(c), 0));
}

TEST(PlanNcclFake, AllGatherAlongAnInnerDimIsUnpackedByStridedCopies) {
  OneStep c = mk("all_gather", {{5, 2, 3}, {5, 2, 3}, {5, 2, 3}}, {{5, 6, 3}, {5, 6, 3}, {5, 6, 3}}, 1, 0, {2, 2, 2});
  expect_both_paths(c, host_all_gather(locals_of(c), 1));
}

TEST(PlanNcclFake, AllGatherOfUnevenAndEmptyShardsAlongAnInnerDim) {
  OneStep c = mk("all_gather", {{4, 3, 2}, {4, 0, 2}, {4, 1, 2}, {4, 2, 2}},
            {{4, 6, 2}, {4, 6, 2}, {4, 6, 2}, {4, 6, 2}}, 1, 0, {3, 0, 1, 2});
  expect_both_paths(c, host_all_gather(locals_of(c), 1));
}

TEST(PlanNcclFake, AllGatherOfUnevenShardsAlongDimZero) {
  OneStep c = mk("all_gather", {{3, 4}, {2, 4}, {2, 4}}, {{7, 4}, {7, 4}, {7, 4}}, 0, 0, {3, 2, 2});
  expect_both_paths(c, host_all_gather(locals_of(c), 0));
}

TEST(PlanNcclFake, AllReduceSumAvgAndMax) {
  for (const char* op : {"sum", "avg", "max"}) {
    SCOPED_TRACE(op);
    OneStep c = mk("all_reduce", {{3, 5}, {3, 5}, {3, 5}}, {{3, 5}, {3, 5}, {3, 5}});
    c.reduce_op = op;
    expect_both_paths(c, host_all_reduce(locals_of(c), *parse_reduce_op(op)));
  }
}

TEST(PlanNcclFake, ReduceScatterEvenAlongDimZeroAndInnerDim) {
  OneStep a = mk("reduce_scatter", {{4, 3}, {4, 3}}, {{2, 3}, {2, 3}}, 0, 0, {2, 2});
  a.reduce_op = "sum";
  expect_both_paths(a, host_reduce_scatter(locals_of(a), 0, a.sizes, ReduceOp::Sum));
  OneStep b = mk("reduce_scatter", {{3, 4, 2}, {3, 4, 2}}, {{3, 2, 2}, {3, 2, 2}}, 1, 0, {2, 2});
  b.reduce_op = "sum";
  expect_both_paths(b, host_reduce_scatter(locals_of(b), 1, b.sizes, ReduceOp::Sum));
}

TEST(PlanNcclFake, ReduceScatterOfUnevenPartsIsPaddedAndTrimmed) {
  OneStep c = mk("reduce_scatter", {{3, 6, 2}, {3, 6, 2}, {3, 6, 2}, {3, 6, 2}},
            {{3, 3, 2}, {3, 0, 2}, {3, 2, 2}, {3, 1, 2}}, 1, 0, {3, 0, 2, 1});
  c.reduce_op = "avg";
  expect_both_paths(c, host_reduce_scatter(locals_of(c), 1, c.sizes, ReduceOp::Avg));
}

TEST(PlanNcclFake, AllToAllFromColumnShardsToRowShards) {
  // S(1) -> S(0) of a [6, 5] tensor over 3 ranks (columns 2, 2, 1), rows cut 3, 2, 1.
  OneStep c = mk("all_to_all", {{6, 2}, {6, 2}, {6, 1}}, {{3, 5}, {2, 5}, {1, 5}}, 0, 1, {3, 2, 1}, {2, 2, 1});
  std::vector<std::vector<int64_t>> send(3, c.sizes);
  expect_both_paths(c, host_all_to_all(locals_of(c), 0, send, 1));
}

TEST(PlanNcclFake, AllToAllFromRowShardsToColumnShards) {
  OneStep c = mk("all_to_all", {{2, 5}, {2, 5}, {1, 5}}, {{5, 2}, {5, 2}, {5, 1}}, 1, 0, {2, 2, 1}, {2, 2, 1});
  std::vector<std::vector<int64_t>> send(3, c.sizes);
  expect_both_paths(c, host_all_to_all(locals_of(c), 1, send, 0));
}

// A decomposed collective matmul's ring shift along an inner dim (a sequence
// shard [2, e, 3], e = 3, 2, 1 on 3 ranks): an all_to_all whose one non-empty chunk
// is the whole shard, sent to the previous member while the next one's arrives.
OneStep ring_shift() {
  const std::vector<int64_t> e = {3, 2, 1};
  OneStep c = mk("all_to_all", {{2, 3, 3}, {2, 2, 3}, {2, 1, 3}}, {{2, 2, 3}, {2, 1, 3}, {2, 3, 3}}, 1, 1);
  for (int r = 0; r < 3; ++r) {
    std::vector<int64_t> send(3, 0), recv(3, 0);
    send[static_cast<size_t>((r + 2) % 3)] = e[static_cast<size_t>(r)];
    recv[static_cast<size_t>((r + 1) % 3)] = e[static_cast<size_t>((r + 1) % 3)];
    c.rank_sizes.push_back(send);
    c.rank_sizes2.push_back(recv);
  }
  return c;
}

TEST(PlanNcclFake, ARingShiftSendsTheWholeShardWithoutPackingIt) {
  // Its one chunk is contiguous however many dims lie outside the shard dim, so
  // it goes straight from the input to the next member's output: no strided copy
  // through scratch on either side (the model's shift_us counts no copies either).
  const OneStep c = ring_shift();
  std::vector<std::string> lines, copies;
  Result<std::vector<std::vector<Tensor>>> out = [&] {
    CallLog log("sf-ring-shift");
    auto r = run_plan_on_gpu(plan_of(c), inputs_of(c), nccl_options());
    lines = log.lines();
    copies = log.lines("copy2d");
    return r;
  }();
  ASSERT_TRUE(out.ok()) << out.error().str();
  const std::vector<std::vector<Tensor>> in = inputs_of(c);
  for (size_t r = 0; r < 3; ++r) {
    const Tensor& got = (*out)[r].at(0);
    const Tensor& want = in[(r + 1) % 3][0];
    ASSERT_EQ(got.shape(), want.shape()) << "rank " << r;
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.get(i), want.get(i)) << "rank " << r << ", element " << i;
  }
  EXPECT_FALSE(lines.empty()) << "the fake logged nothing: is FAKE_CUDA_LOG read?";
  EXPECT_TRUE(copies.empty()) << "the shift was packed or unpacked through scratch: " << copies.size() << " copies";
}

TEST(PlanNcclFake, SliceAlongOneDimIsAStridedDeviceCopy) {
  OneStep c = mk("slice", {{4, 6, 3}, {4, 6, 3}}, {{4, 2, 3}, {4, 2, 3}});
  c.offset = {0, 3, 0};
  std::vector<Tensor> want;
  for (const Tensor& t : locals_of(c)) want.push_back(slice_block(t, c.offset, {4, 2, 3}));
  expect_both_paths(c, want);
}

TEST(PlanNcclFake, ConcatJoinsPartsAlongAnInnerDim) {
  // Two params concatenated along dim 1 on each of 2 ranks.
  Plan p;
  p.graph = "t";
  p.mesh = "tp=2";
  p.world = 2;
  p.arch = "sm_90a";
  p.params = {"a", "b"};
  p.outputs = {"y"};
  for (int r = 0; r < 2; ++r) {
    PlanRank pr;
    pr.rank = r;
    pr.buffers = {{"a", DType::F32, {3, 2, 2}}, {"b", DType::F32, {3, 1, 2}}, {"y", DType::F32, {3, 3, 2}}};
    pr.inputs = {0, 1};
    pr.input_specs = {"R", "R"};
    pr.outputs = {2};
    pr.output_specs = {"R"};
    PlanStep s;
    s.op = "concat";
    s.stream = "compute";
    s.in = {0, 1};
    s.out = {2};
    s.dim = 1;
    pr.steps.push_back(s);
    p.ranks.push_back(std::move(pr));
  }
  std::vector<std::vector<Tensor>> in = {{filled({3, 2, 2}, 0), filled({3, 1, 2}, 1)},
                                         {filled({3, 2, 2}, 2), filled({3, 1, 2}, 3)}};
  Result<std::vector<std::vector<Tensor>>> out = run_plan_on_gpu(PlanSource{p, {}, ""}, in, nccl_options());
  ASSERT_TRUE(out.ok()) << out.error().str();
  for (int r = 0; r < 2; ++r) {
    Tensor want = concat({in[static_cast<size_t>(r)][0], in[static_cast<size_t>(r)][1]}, 1);
    const Tensor& got = (*out)[static_cast<size_t>(r)][0];
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.get(i), want.get(i)) << "rank " << r << " element " << i;
  }
}

// Runs `c` with its ranks as threads; how many device allocations (from the
// driver or the allocator's cache) the ranks made just before and just after the
// run (every rank has taken its communicators by then).
std::pair<long long, long long> allocations_around_run(const OneStep& c) {
  const PlanSource src = plan_of(c);
  const std::vector<std::vector<Tensor>> in = inputs_of(c);
  const int n = static_cast<int>(c.in.size());
  GpuRunOptions opts = nccl_options();
  std::vector<std::shared_ptr<GpuPlan>> loaded;
  for (int g = 0; g < n; ++g) {
    Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(g);
    Result<std::shared_ptr<GpuPlan>> p = ctx ? GpuPlan::load(*ctx, src) : Result<std::shared_ptr<GpuPlan>>(ctx.error());
    EXPECT_TRUE(p.ok()) << p.error().str();
    if (!p) return {-1, -1};
    loaded.push_back(*p);
  }
  std::barrier sync(n);
  auto allocations = [&] {
    long long a = 0;
    for (const auto& p : loaded) {
      const cuda::DeviceAllocator::Stats st = p->context().allocator().stats();
      a += st.driver_allocs + st.cache_hits;
    }
    return a;
  };
  long long before = -1, after = -1;
  Result<void> failed =
      on_rank_threads(DeviceMesh(loaded[0]->mesh()), opts.timeout, [&](Comm& comm) -> Result<void> {
        const int r = comm.rank();
        Result<void> err;
        Result<std::unique_ptr<RankExec>> rank = RankExec::create_cuda(loaded[static_cast<size_t>(r)], r, opts);
        Result<std::unique_ptr<nccl::NcclComm>> nc = nccl::NcclComm::create(comm, 0, r, opts.nccl);
        if (!rank) err = rank.error();
        else if (!nc) err = nc.error();
        if (err.ok()) {
          std::vector<std::unique_ptr<nccl::NcclComm>> comms;
          comms.push_back(std::move(nc).value());
          err = (*rank)->use_nccl(std::move(comms));
        }
        if (err.ok()) err = (*rank)->upload_inputs(in[static_cast<size_t>(r)]);
        // Every rank meets every barrier, failed or not.
        sync.arrive_and_wait();
        if (r == 0) before = allocations();
        sync.arrive_and_wait();
        if (err.ok()) err = (*rank)->run(&comm);
        sync.arrive_and_wait();
        if (r == 0) after = allocations();
        return err;
      });
  EXPECT_TRUE(succeeded(failed));
  return {before, after};
}

TEST(PlanNcclFake, ScratchIsAllocatedBeforeAnyCollectiveRuns) {
  std::vector<OneStep> cases = {
      // uneven along an inner dim: packed and padded, then trimmed (two scratch buffers)
      mk("reduce_scatter", {{3, 6, 2}, {3, 6, 2}}, {{3, 4, 2}, {3, 2, 2}}, 1, 0, {4, 2}),
      // even along an inner dim: packed (one)
      mk("reduce_scatter", {{3, 4, 2}, {3, 4, 2}}, {{3, 2, 2}, {3, 2, 2}}, 1, 0, {2, 2}),
      // gathered along an inner dim, uneven: unpacked
      mk("all_gather", {{4, 3, 2}, {4, 1, 2}}, {{4, 4, 2}, {4, 4, 2}}, 1, 0, {3, 1}),
      // columns to rows: packed on the way out
      mk("all_to_all", {{6, 2}, {6, 2}, {6, 1}}, {{3, 5}, {2, 5}, {1, 5}}, 0, 1, {3, 2, 1}, {2, 2, 1}),
      // rows to columns: unpacked on the way in
      mk("all_to_all", {{2, 5}, {2, 5}, {1, 5}}, {{5, 2}, {5, 2}, {5, 1}}, 1, 0, {2, 2, 1}, {2, 2, 1}),
      // a ring shift: neither
      ring_shift(),
  };
  for (OneStep& c : cases) {
    SCOPED_TRACE(c.op + " along dim " + std::to_string(c.dim));
    c.reduce_op = "sum";
    auto [before, after] = allocations_around_run(c);
    ASSERT_GE(before, 0);
    EXPECT_EQ(after, before) << "the run allocated device memory";
  }
}

TEST(PlanNcclFake, NcclNeedsAGpuPerRank) {
  OneStep c = mk("all_reduce", {{2}, {2}, {2}}, {{2}, {2}, {2}});
  GpuRunOptions o = nccl_options();
  o.gpus = 2;
  Result<std::vector<std::vector<Tensor>>> out = run_plan_on_gpu(plan_of(c), inputs_of(c), o);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("NCCL needs a GPU per rank: world 3 on 2 GPU(s)"), std::string::npos)
      << out.error().message;
}

TEST(PlanNcclFake, ARankThatNeverJoinsEndsEveryRankWithinTheTimeout) {
  OneStep c = mk("all_reduce", {{4}, {4}, {4}}, {{4}, {4}, {4}});
  PlanSource src = plan_of(c);
  src.plan.ranks[2].steps.clear();  // rank 2 never reaches the all_reduce
  GpuRunOptions o = nccl_options();
  // Long enough that connecting the ranks (Gloo, then NCCL) never runs into it on
  // a loaded 2-core machine under ASan; only the all_reduce should.
  o.timeout = std::chrono::milliseconds(2000);
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<std::vector<Tensor>>> out = run_plan_on_gpu(src, inputs_of(c), o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(out.ok());
  // The rank that timed out is reported, not one that saw its abort (ncclRemoteError)
  // and happened to unwind first.
  EXPECT_NE(out.error().message.find("timed out after 2 s"), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("all_reduce"), std::string::npos) << out.error().message;
  EXPECT_FALSE(out.error().from_peer) << out.error().message;
  EXPECT_LT(s, 15.0) << "every rank should end soon after the 2 s timeout";
}

TEST(PlanNcclFake, RanksThatDisagreeOnACollectiveFailWithTheMismatch) {
  OneStep c = mk("all_reduce", {{4}, {4}}, {{4}, {4}});
  PlanSource src = plan_of(c);
  src.plan.ranks[1].buffers[0].shape = {6};  // rank 1 reduces 6 elements, rank 0 4
  src.plan.ranks[1].buffers[1].shape = {6};
  std::vector<std::vector<Tensor>> in = {{filled({4}, 0)}, {filled({6}, 1)}};
  GpuRunOptions o = nccl_options();
  o.timeout = std::chrono::milliseconds(2000);
  Result<std::vector<std::vector<Tensor>>> out = run_plan_on_gpu(src, in, o);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("all_reduce"), std::string::npos) << out.error().message;
}

}  // namespace runtime_fake_plan_nccl_fake_test
}  // namespace sf
