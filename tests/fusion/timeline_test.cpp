// The discrete-event timeline (codegen/fusion/timeline.h) on hand-built two-rank programs
// whose timelines are worked out by hand below, the α-β formulas, the system file
// reader, and the examples' programs as a sanity check.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "codegen/dist/lower.h"
#include "codegen/dist/schedule.h"
#include "codegen/fusion/timeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "runtime/io/trace.h"

namespace sf {
namespace fusion_timeline_test {

// A program over f32 vectors, built step by step. Kernel times are looked up by
// kernel name in `us` (per rank) by the model below.
struct Prog {
  LocalProgram p;
  explicit Prog(int rank) { p.rank = rank; }
  int value(const std::string& name, int64_t elems = 250) {  // 250 floats = 1000 bytes
    p.types.push_back(TensorType{DType::F32, {elems}});
    p.names.push_back(name);
    return static_cast<int>(p.types.size()) - 1;
  }
  int param(const std::string& name, int64_t elems = 250) {
    int v = value(name, elems);
    p.param_values.push_back(v);
    return v;
  }
  void kernel(const std::string& name, std::vector<int> in, std::vector<int> outs, int64_t flops = 0) {
    LocalKernel k;
    k.name = name;
    k.kind = KernelKind::Pointwise;
    k.flops = flops;
    k.bytes_read = 1000 * static_cast<int64_t>(in.size());
    k.bytes_written = 1000 * static_cast<int64_t>(outs.size());
    p.kernels.push_back(std::move(k));
    LocalStep s;
    s.kind = LocalStep::Kind::Kernel;
    s.kernel = static_cast<int>(p.kernels.size()) - 1;
    s.in = std::move(in);
    s.outs = std::move(outs);
    p.steps.push_back(std::move(s));
  }
  void start(CollectiveKind k, int in, int handle) {
    LocalStep s;
    s.kind = LocalStep::Kind::Start;
    s.collective = k;
    s.mesh_dim = 0;
    s.in = {in};
    s.handle = handle;
    p.steps.push_back(std::move(s));
    p.num_handles = std::max(p.num_handles, handle + 1);
  }
  void wait(int handle, int out) {
    LocalStep s;
    s.kind = LocalStep::Kind::Wait;
    s.handle = handle;
    s.out = out;
    p.steps.push_back(std::move(s));
  }
};

const DeviceMesh kTwo(Mesh{{MeshDim{"tp", 2}}});

// alpha 5 us per step, 0.1 GB/s = 100 bytes/us: an all_reduce of 1000 bytes over 2
// ranks is 2 steps * 5 + 1000 * 2(2-1)/2 / 100 = 10 + 10 = 20 us.
LinkSpec link(double sm_fraction = 0, double comm_slowdown = 0) {
  LinkSpec l;
  l.alpha_us = 5;
  l.bandwidth_GB_s = 0.1;
  l.sm_fraction = sm_fraction;
  l.comm_slowdown = comm_slowdown;
  return l;
}

TimelineModel model(std::vector<std::map<std::string, double>> us, LinkSpec l) {
  TimelineModel m;
  m.comm.gpus_per_node = 8;
  m.comm.intra = l;
  m.comm.inter = l;
  m.compute_us = [us = std::move(us)](const LocalProgram& p, size_t step) {
    const LocalStep& s = p.steps[step];
    return us[static_cast<size_t>(p.rank)].at(p.kernels[static_cast<size_t>(s.kernel)].name);
  };
  return m;
}

const TimelineEvent& event(const Timeline& t, int rank, const std::string& name) {
  for (const TimelineEvent& e : t.ranks[static_cast<size_t>(rank)].events)
    if (e.name == name) return e;
  throw std::runtime_error("no event " + name);
}

constexpr double kTol = 1e-9;

// A system file's GPU in the one performance model's units: its own fp32, 16-bit and
// HBM figures; TF32 scaled from the arch's table row as the file's 16-bit rate is to
// the table's; a file without a 16-bit rate prices 16-bit matmuls at fp32.
TEST(Timeline, TheSystemsGpuBecomesTheOneModelsRates) {
  GpuSpec g;
  g.arch = "sm_90a";
  g.fp32_tflops = 60;
  g.bf16_tflops = 900;
  g.hbm_GB_s = 4000;
  g.launch_us = 2;
  DeviceRates r = device_rates(g);
  EXPECT_DOUBLE_EQ(r.fp32_flops_s, 60e12);
  EXPECT_DOUBLE_EQ(r.hbm_bytes_s, 4000e9);
  EXPECT_DOUBLE_EQ(r.launch_s, 2e-6);
  const DeviceRates table = arch_rates("sm_90a").value();
  EXPECT_NEAR(r.tf32_flops_s, 900e12 * table.tf32_flops_s / table.tensor16_flops_s, 1e6);
  EXPECT_DOUBLE_EQ(r.matmul_flops_s(DType::BF16, false), 900e12);
  EXPECT_DOUBLE_EQ(r.matmul_flops_s(DType::F32, false), 60e12);
  EXPECT_DOUBLE_EQ(r.matmul_flops_s(DType::F32, true), r.tf32_flops_s);
  g.bf16_tflops = 0;
  g.arch = "sm_99";  // not in the table
  r = device_rates(g);
  EXPECT_DOUBLE_EQ(r.matmul_flops_s(DType::BF16, false), 60e12);
  EXPECT_DOUBLE_EQ(r.tf32_flops_s, 30e12);
}

TEST(Timeline, AlphaBetaFormulasAndBusFactors) {
  LinkSpec l = link();
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::AllReduce, 2, 1000, l), 20.0);
  // n = 8: all_reduce 14 steps and 2*7/8 of the bytes; all_gather 7 steps and 7/8.
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::AllReduce, 8, 8000, l), 14 * 5 + 8000 * 1.75 / 100);
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::AllGather, 8, 8000, l), 7 * 5 + 8000 * 0.875 / 100);
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::ReduceScatter, 8, 8000, l), 7 * 5 + 8000 * 0.875 / 100);
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::AllToAll, 8, 8000, l), 7 * 5 + 8000 * 0.875 / 100);
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::AllReduce, 1, 8000, l), 0.0);  // a group of one is free
  l.algorithm = CollAlgorithm::Tree;
  EXPECT_DOUBLE_EQ(collective_us(CollectiveKind::AllReduce, 8, 8000, l), 6 * 5 + 8000 * 1.75 / 100);
  EXPECT_DOUBLE_EQ(collective_steps(CollectiveKind::AllGather, 8, CollAlgorithm::Tree), 7.0);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllGather, 4), 0.75);
}

TEST(Timeline, CollectiveBytesAreNcclTestsSizes) {
  Prog g(0);
  int x = g.param("x", 6 * 10);  // f32[60]: treat as rows of 10 below
  g.p.types[static_cast<size_t>(x)].shape = {6, 10};
  g.start(CollectiveKind::AllGather, x, 0);
  g.p.steps.back().dim = 0;
  g.p.steps.back().sizes = {6, 6, 6, 5};  // uneven: NCCL gathers 4 equal blocks of 6 rows
  EXPECT_EQ(collective_bytes(g.p, 0, 4), 4 * 6 * 10 * 4);
  g.p.steps.back().collective = CollectiveKind::AllReduce;
  EXPECT_EQ(collective_bytes(g.p, 0, 4), 6 * 10 * 4);
  g.p.steps.back().collective = CollectiveKind::ReduceScatter;
  g.p.steps.back().sizes = {2, 2, 1, 1};  // the input's 6 rows kept 2, 2, 1, 1
  EXPECT_EQ(collective_bytes(g.p, 0, 4), 4 * 2 * 10 * 4);
  g.p.steps.back().sizes.clear();  // hand-built, no sizes: the operand
  EXPECT_EQ(collective_bytes(g.p, 0, 4), 6 * 10 * 4);
}

// (a) A collective hidden behind an independent kernel.
//   k0: x -> a (10 us); all_reduce a (20 us); k1: y -> b (30 us, independent);
//   wait -> c; k2: b, c -> d (5 us).
// Overlapped: k0 [0,10]; all_reduce [10,30]; k1 [10,40]; k2 [40,45]: 45 us.
// Serial: k0 [0,10]; all_reduce [10,30]; k1 [30,60]; k2 [60,65]: 65 us.
// T_compute 45; ECT overlapped 0, serial 20; E_overlap 1.
std::vector<LocalProgram> hidden_programs() {
  std::vector<LocalProgram> out;
  for (int r = 0; r < 2; ++r) {
    Prog g(r);
    int x = g.param("x"), y = g.param("y");
    int a = g.value("a"), b = g.value("b"), c = g.value("c"), d = g.value("d");
    g.kernel("k0", {x}, {a});
    g.start(CollectiveKind::AllReduce, a, 0);
    g.kernel("k1", {y}, {b});
    g.wait(0, c);
    g.kernel("k2", {b, c}, {d});
    out.push_back(g.p);
  }
  return out;
}

TEST(Timeline, OneCollectiveHiddenBehindAnIndependentKernel) {
  std::map<std::string, double> us = {{"k0", 10}, {"k1", 30}, {"k2", 5}};
  TimelineModel m = model({us, us}, link());
  Result<OverlapReport> r = simulate_overlap(hidden_programs(), kTwo, m);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_NEAR(r->overlapped.total_us, 45, kTol);
  EXPECT_NEAR(r->serial.total_us, 65, kTol);
  EXPECT_NEAR(r->t_compute, 45, kTol);
  EXPECT_NEAR(r->ect_overlapped, 0, kTol);
  EXPECT_NEAR(r->ect_serial, 20, kTol);
  EXPECT_NEAR(r->e_overlap, 1.0, kTol);
  EXPECT_TRUE(r->has_comm);
  for (int rank = 0; rank < 2; ++rank) {
    const TimelineEvent& ar = event(r->overlapped, rank, "all_reduce a");
    EXPECT_EQ(ar.stream, Stream::Comm);
    EXPECT_NEAR(ar.start_us, 10, kTol);
    EXPECT_NEAR(ar.end_us, 30, kTol);
    EXPECT_NEAR(ar.hidden_us, 20, kTol);  // k1 ran the whole time
    EXPECT_EQ(ar.bytes, 1000);
    EXPECT_EQ(ar.group, (std::vector<int>{0, 1}));
    EXPECT_EQ(ar.link, LinkClass::NvLink);
    EXPECT_NEAR(event(r->overlapped, rank, "k1").end_us, 40, kTol);
    EXPECT_NEAR(event(r->overlapped, rank, "k2").start_us, 40, kTol);
    // Serial: k1 waits for the all_reduce; nothing is hidden.
    EXPECT_NEAR(event(r->serial, rank, "k1").start_us, 30, kTol);
    EXPECT_NEAR(event(r->serial, rank, "all_reduce a").hidden_us, 0, kTol);
    EXPECT_EQ(r->overlapped.ranks[static_cast<size_t>(rank)].collectives, 1);
    EXPECT_NEAR(r->overlapped.ranks[static_cast<size_t>(rank)].hidden_us, 20, kTol);
  }
}

// (b) A chain that cannot overlap: k0: x -> a (10); all_reduce a (20); wait -> c;
// k1: c -> d (5). Both schedules: k0 [0,10], all_reduce [10,30], k1 [30,35].
TEST(Timeline, ADependentChainCannotOverlap) {
  std::vector<LocalProgram> programs;
  for (int r = 0; r < 2; ++r) {
    Prog g(r);
    int x = g.param("x");
    int a = g.value("a"), c = g.value("c"), d = g.value("d");
    g.kernel("k0", {x}, {a});
    g.start(CollectiveKind::AllReduce, a, 0);
    g.wait(0, c);
    g.kernel("k1", {c}, {d});
    programs.push_back(g.p);
  }
  std::map<std::string, double> us = {{"k0", 10}, {"k1", 5}};
  Result<OverlapReport> r = simulate_overlap(programs, kTwo, model({us, us}, link(0.5)));
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_NEAR(r->overlapped.total_us, 35, kTol);
  EXPECT_NEAR(r->serial.total_us, 35, kTol);
  EXPECT_NEAR(r->t_compute, 15, kTol);
  EXPECT_NEAR(r->ect_serial, 20, kTol);
  EXPECT_NEAR(r->ect_overlapped, 20, kTol);
  EXPECT_NEAR(r->e_overlap, 0.0, kTol);
  EXPECT_NEAR(event(r->overlapped, 0, "all_reduce a").hidden_us, 0, kTol);
}

// (c) The sign of E_overlap. Programs as in (a) with k1 = 10 us.
//
// With sm_fraction 0.5 alone, k1 runs at half speed beside the all_reduce [10,30]:
// it finishes at 30, k2 [30,35]. Serial: k0 [0,10], all_reduce [10,30], k1 [30,40],
// k2 [40,45]. T_compute 25, ECT 10 against 20: E_overlap 0.5. A kernel slowed by a
// collective still progresses, where the serial schedule would stand still, so
// sm_fraction alone cannot make overlapping worse than serial.
//
// When compute also slows the collective (comm_slowdown 0.6: it moves at 0.4 while
// a kernel runs), overlap can cost more than it hides: k1 runs [10,30] at half
// speed; the all_reduce moves 20 * 0.4 = 8 us of its 20 by then and the other 12
// at full speed, ending at 42; k2 [42,47]. ECT 22 against 20: E_overlap -0.1.
TEST(Timeline, OverlapEfficiencyIsNegativeWhenOverlapCostsMoreThanItHides) {
  std::map<std::string, double> us = {{"k0", 10}, {"k1", 10}, {"k2", 5}};
  Result<OverlapReport> gain = simulate_overlap(hidden_programs(), kTwo, model({us, us}, link(0.5)));
  ASSERT_TRUE(gain.ok()) << gain.error().str();
  EXPECT_NEAR(gain->serial.total_us, 45, kTol);
  EXPECT_NEAR(gain->overlapped.total_us, 35, kTol);
  EXPECT_NEAR(gain->e_overlap, 0.5, kTol);

  Result<OverlapReport> loss = simulate_overlap(hidden_programs(), kTwo, model({us, us}, link(0.5, 0.6)));
  ASSERT_TRUE(loss.ok()) << loss.error().str();
  EXPECT_NEAR(loss->serial.total_us, 45, kTol);  // nothing overlaps there: neither slowdown applies
  EXPECT_NEAR(loss->overlapped.total_us, 47, kTol);
  EXPECT_NEAR(event(loss->overlapped, 0, "k1").end_us, 30, kTol);
  EXPECT_NEAR(event(loss->overlapped, 0, "all_reduce a").end_us, 42, kTol);
  EXPECT_NEAR(loss->t_compute, 25, kTol);
  EXPECT_NEAR(loss->ect_serial, 20, kTol);
  EXPECT_NEAR(loss->ect_overlapped, 22, kTol);
  EXPECT_NEAR(loss->e_overlap, -0.1, kTol);
  EXPECT_LT(loss->e_overlap, 0);

  // The definition, including 0/0.
  EXPECT_DOUBLE_EQ(overlap_efficiency(0, 20), 1.0);
  EXPECT_DOUBLE_EQ(overlap_efficiency(20, 20), 0.0);
  EXPECT_DOUBLE_EQ(overlap_efficiency(30, 20), -0.5);
  EXPECT_DOUBLE_EQ(overlap_efficiency(0, 0), 0.0);
}

// (d) A kernel slowed only for the part of its run a collective overlaps, and
// (e) a collective that waits for its slowest member.
//   k0: x -> a (rank 0: 5 us, rank 1: 15 us); all_reduce a (20 us);
//   k1: y -> b (40 us on both, independent); wait -> c; k2: b, c -> d (5 us).
// The all_reduce starts when rank 1 has a, at 15, and runs to 35 on both ranks.
// sm_fraction 0.25: kernels go at 0.75 while it runs.
//   rank 0: k1 starts at 5; 10 us of work by 15; [15,35] at 0.75 does 15 more; the
//           last 15 at full speed: ends at 50 = 5 + 40 + 0.25 * 20. k2 [50,55].
//   rank 1: k1 starts at 15 with the all_reduce; 15 us of work by 35; 25 more: ends
//           at 60 = 15 + 40 + 0.25 * 20. k2 [60,65].
// Serial: rank 1 drains at 15, the all_reduce runs [15,35], k1 [35,75], k2 [75,80];
// rank 0 waits in the all_reduce the same way: k1 [35,75], k2 [75,80].
TEST(Timeline, PartialOverlapSlowsOnlyTheOverlappedPartAndCollectivesWaitForTheSlowestMember) {
  std::vector<LocalProgram> programs;
  for (int r = 0; r < 2; ++r) {
    Prog g(r);
    int x = g.param("x"), y = g.param("y");
    int a = g.value("a"), b = g.value("b"), c = g.value("c"), d = g.value("d");
    g.kernel("k0", {x}, {a});
    g.start(CollectiveKind::AllReduce, a, 0);
    g.kernel("k1", {y}, {b});
    g.wait(0, c);
    g.kernel("k2", {b, c}, {d});
    programs.push_back(g.p);
  }
  std::vector<std::map<std::string, double>> us = {{{"k0", 5}, {"k1", 40}, {"k2", 5}},
                                                   {{"k0", 15}, {"k1", 40}, {"k2", 5}}};
  Result<OverlapReport> r = simulate_overlap(programs, kTwo, model(us, link(0.25)));
  ASSERT_TRUE(r.ok()) << r.error().str();
  const Timeline& t = r->overlapped;

  // (e) both ranks start it together, when the later one is ready.
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NEAR(event(t, rank, "all_reduce a").start_us, 15, kTol);
    EXPECT_NEAR(event(t, rank, "all_reduce a").end_us, 35, kTol);
  }
  EXPECT_NEAR(event(t, 0, "all_reduce a").ready_us, 5, kTol);
  EXPECT_NEAR(event(t, 1, "all_reduce a").ready_us, 15, kTol);

  // (d) the slowdown applies to the overlapped 20 us only.
  EXPECT_NEAR(event(t, 0, "k1").start_us, 5, kTol);
  EXPECT_NEAR(event(t, 0, "k1").end_us, 50, kTol);
  EXPECT_NEAR(event(t, 0, "k1").work_us, 40, kTol);
  EXPECT_NEAR(event(t, 1, "k1").start_us, 15, kTol);
  EXPECT_NEAR(event(t, 1, "k1").end_us, 60, kTol);
  EXPECT_NEAR(event(t, 0, "k2").end_us, 55, kTol);
  EXPECT_NEAR(event(t, 1, "k2").end_us, 65, kTol);
  EXPECT_NEAR(t.ranks[0].finish_us, 55, kTol);
  EXPECT_NEAR(t.total_us, 65, kTol);
  EXPECT_NEAR(event(t, 0, "all_reduce a").hidden_us, 20, kTol);

  EXPECT_NEAR(r->serial.total_us, 80, kTol);
  EXPECT_NEAR(event(r->serial, 0, "k1").start_us, 35, kTol);
  EXPECT_NEAR(r->t_compute, 60, kTol);                // rank 1: 15 + 40 + 5
  EXPECT_NEAR(r->ect_serial, 20, kTol);
  EXPECT_NEAR(r->ect_overlapped, 5, kTol);
  EXPECT_NEAR(r->e_overlap, 0.75, kTol);
}

// Collectives on one comm stream run one after another, and a kernel overlapped by
// two back to back is slowed through both.
TEST(Timeline, CollectivesQueueOnTheCommStream) {
  std::vector<LocalProgram> programs;
  for (int r = 0; r < 2; ++r) {
    Prog g(r);
    int x = g.param("x"), y = g.param("y"), z = g.param("z");
    int a = g.value("a"), b = g.value("b"), c = g.value("c");
    g.start(CollectiveKind::AllReduce, x, 0);
    g.start(CollectiveKind::AllReduce, y, 1);
    g.kernel("k", {z}, {c});
    g.wait(0, a);
    g.wait(1, b);
    programs.push_back(g.p);
  }
  std::map<std::string, double> us = {{"k", 50}};
  Result<Timeline> t = simulate_timeline(programs, kTwo, model({us, us}, link(0.5)));
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_NEAR(event(*t, 0, "all_reduce x").end_us, 20, kTol);
  EXPECT_NEAR(event(*t, 0, "all_reduce y").start_us, 20, kTol);
  EXPECT_NEAR(event(*t, 0, "all_reduce y").end_us, 40, kTol);
  // 40 us at half speed do 20 us of work; the other 30 at full speed.
  EXPECT_NEAR(event(*t, 0, "k").end_us, 70, kTol);
}

TEST(Timeline, LinkClassFollowsTheNodes) {
  // Two ranks, one GPU per node: the group spans nodes and uses the inter-node link.
  std::map<std::string, double> us = {{"k0", 10}, {"k1", 5}, {"k2", 5}};
  TimelineModel m = model({us, us}, link());
  m.comm.gpus_per_node = 1;
  m.comm.inter.bandwidth_GB_s = 0.05;  // half as fast: 10 + 20 us
  Result<Timeline> t = simulate_timeline(hidden_programs(), kTwo, m);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(event(*t, 0, "all_reduce a").link, LinkClass::Ib);
  EXPECT_NEAR(event(*t, 0, "all_reduce a").dur_us(), 30, kTol);
}

TEST(Timeline, HostIssueTimeDelaysSteps) {
  std::map<std::string, double> us = {{"k0", 10}, {"k1", 30}, {"k2", 5}};
  TimelineModel m = model({us, us}, link());
  m.host_issue_us = 1;  // step i is on its stream at i + 1 us
  Result<Timeline> t = simulate_timeline(hidden_programs(), kTwo, m);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_NEAR(event(*t, 0, "k0").start_us, 1, kTol);
  EXPECT_NEAR(event(*t, 0, "all_reduce a").start_us, 11, kTol);  // issued at 2, operand at 11
  EXPECT_NEAR(event(*t, 0, "k1").start_us, 11, kTol);
}

TEST(Timeline, ProgramsThatDoNotFitTogetherAreAnError) {
  std::vector<LocalProgram> programs = hidden_programs();
  // Rank 1 never issues the all_reduce.
  std::vector<LocalStep>& steps = programs[1].steps;
  steps.erase(steps.begin() + 1);
  steps.erase(steps.begin() + 2);
  std::map<std::string, double> us = {{"k0", 10}, {"k1", 30}, {"k2", 5}};
  Result<Timeline> t = simulate_timeline(programs, kTwo, model({us, us}, link()));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("rank 1"), std::string::npos) << t.error().message;

  Result<Timeline> wrong = simulate_timeline(hidden_programs(), DeviceMesh(Mesh{{MeshDim{"tp", 4}}}), model({us, us}, link()));
  ASSERT_FALSE(wrong.ok());

  TimelineModel negative = model({us, us}, link());
  negative.compute_us = [](const LocalProgram&, size_t) { return -1.0; };
  EXPECT_FALSE(simulate_timeline(hidden_programs(), kTwo, negative).ok());
}

TEST(Timeline, NoCommunicationGivesZeroEfficiency) {
  std::vector<LocalProgram> programs;
  for (int r = 0; r < 2; ++r) {
    Prog g(r);
    int x = g.param("x"), a = g.value("a");
    g.kernel("k0", {x}, {a});
    programs.push_back(g.p);
  }
  std::map<std::string, double> us = {{"k0", 10}};
  Result<OverlapReport> r = simulate_overlap(programs, kTwo, model({us, us}, link()));
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_FALSE(r->has_comm);
  EXPECT_EQ(r->ect_serial, 0);
  EXPECT_EQ(r->e_overlap, 0);
  EXPECT_NEAR(r->overlapped.total_us, 10, kTol);
}

// Every example's (unfused) programs under a roofline on the shipped 8xH100 system:
// overlapping never loses without comm_slowdown, and E_overlap stays in [0, 1].
TEST(Timeline, ExamplesOverlapNoWorseThanSerial) {
  Result<SystemSpec> sys = load_system(std::string(SF_SOURCE_DIR) + "/examples/systems/h100x8_nvlink.json");
  ASSERT_TRUE(sys.ok()) << sys.error().str();
  for (const char* e : {"tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf", "transformer_block.sf", "fsdp_tp_2d.sf",
                        "fsdp_mlp.sf"}) {
    Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + e);
    ASSERT_TRUE(g.ok()) << g.error().str();
    DeviceMesh mesh(g->mesh());
    ShardingPlan plan = propagate(*g, mesh);
    std::vector<LocalProgram> programs;
    for (int r = 0; r < mesh.world(); ++r) programs.push_back(schedule(lower(*g, plan, mesh, r)));
    const DeviceRates rates = device_rates(sys->gpu);
    TimelineModel m = timeline_model(*sys, [&](const LocalProgram& p, size_t i) { return roofline_us(step_work(p, i), rates); });
    Result<OverlapReport> r = simulate_overlap(programs, mesh, m);
    ASSERT_TRUE(r.ok()) << e << ": " << r.error().str();
    EXPECT_LE(r->overlapped.total_us, r->serial.total_us + 1e-6) << e;
    EXPECT_GE(r->e_overlap, -1e-9) << e;
    EXPECT_LE(r->e_overlap, 1 + 1e-9) << e;
    EXPECT_TRUE(r->has_comm) << e;
    EXPECT_GT(r->t_compute, 0) << e;
  }
}

// --- the system file -----------------------------------------------------------------------

TEST(SystemFile, ShippedSystemsParse) {
  Result<SystemSpec> one = load_system(std::string(SF_SOURCE_DIR) + "/examples/systems/h100x8_nvlink.json");
  ASSERT_TRUE(one.ok()) << one.error().str();
  EXPECT_EQ(one->max_world(), 8);
  EXPECT_EQ(one->nvlink.bandwidth_GB_s, 450);
  EXPECT_EQ(one->gpu.arch, "sm_90a");
  EXPECT_FALSE(one->notes.empty());
  Result<SystemSpec> two = load_system(std::string(SF_SOURCE_DIR) + "/examples/systems/h100_2x8_ib.json");
  ASSERT_TRUE(two.ok()) << two.error().str();
  EXPECT_EQ(two->max_world(), 16);
  EXPECT_TRUE(two->has_ib);
  EXPECT_EQ(two->ib.bandwidth_GB_s, 50);
}

const char* kGood = R"({
  "format": "shardfuse-system", "version": 1, "name": "t",
  "gpu": {"name": "g", "arch": "sm_90a", "fp32_tflops": 1, "hbm_GB_s": 1, "launch_us": 0},
  "nodes": 1, "gpus_per_node": 2,
  "links": {
    "nvlink": {"bandwidth_GB_s": 1, "alpha_us": 0, "sm_fraction": 0.1}
  }
})";

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("no " + from);
  return s.replace(at, from.size(), to);
}

TEST(SystemFile, ErrorsNameTheFileTheFieldAndTheLine) {
  ASSERT_TRUE(parse_system(kGood, "s.json").ok()) << parse_system(kGood, "s.json").error().str();

  Result<SystemSpec> bad_json = parse_system(replaced(kGood, "\"nodes\": 1,", "\"nodes\": 1"), "s.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.error().file, "s.json");
  EXPECT_EQ(bad_json.error().loc.line, 4);
  EXPECT_NE(bad_json.error().message.find("not valid JSON"), std::string::npos);

  Result<SystemSpec> range = parse_system(replaced(kGood, "\"sm_fraction\": 0.1", "\"sm_fraction\": 1.5"), "s.json");
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.error().str().rfind("s.json:6:", 0), 0u) << range.error().str();
  EXPECT_NE(range.error().message.find("links.nvlink.sm_fraction"), std::string::npos) << range.error().message;

  Result<SystemSpec> type = parse_system(replaced(kGood, "\"hbm_GB_s\": 1", "\"hbm_GB_s\": \"fast\""), "s.json");
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.error().message.find("gpu.hbm_GB_s"), std::string::npos) << type.error().message;
  EXPECT_EQ(type.error().loc.line, 3);

  Result<SystemSpec> unknown = parse_system(replaced(kGood, "\"alpha_us\"", "\"alpha\""), "s.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("missing field \"alpha_us\""), std::string::npos) << unknown.error().message;

  Result<SystemSpec> extra = parse_system(replaced(kGood, "\"launch_us\": 0", "\"launch_us\": 0, \"hbm\": 2"), "s.json");
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.error().message.find("gpu.hbm: unknown field"), std::string::npos) << extra.error().message;

  Result<SystemSpec> nodes = parse_system(replaced(kGood, "\"nodes\": 1", "\"nodes\": 2"), "s.json");
  ASSERT_FALSE(nodes.ok());
  EXPECT_NE(nodes.error().message.find("\"ib\""), std::string::npos) << nodes.error().message;

  Result<SystemSpec> format = parse_system(replaced(kGood, "shardfuse-system", "plan"), "s.json");
  ASSERT_FALSE(format.ok());
  EXPECT_NE(format.error().message.find("format"), std::string::npos);

  Result<SystemSpec> missing = load_system("/nonexistent/system.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().file, "/nonexistent/system.json");
}

TEST(Roofline, MaxOfComputeAndMemoryPlusLaunch) {
  GpuSpec g;
  g.fp32_tflops = 10;  // 1e7 flop/us
  g.hbm_GB_s = 1000;   // 1e6 B/us
  g.launch_us = 2;
  EXPECT_DOUBLE_EQ(roofline_us(StepWork{100000000, 1000000}, device_rates(g)), 10 + 2);  // compute-bound
  EXPECT_DOUBLE_EQ(roofline_us(StepWork{1000000, 10000000}, device_rates(g)), 10 + 2);  // memory-bound
  EXPECT_DOUBLE_EQ(roofline_us(StepWork{0, 0}, device_rates(g)), 2);
  // Tensor-core flops at bf16_tflops, added to the SIMT time; at fp32 without it.
  EXPECT_DOUBLE_EQ(roofline_us(StepWork{0, 0, 100000000}, device_rates(g)), 10 + 2);
  g.bf16_tflops = 100;  // 1e8 flop/us
  EXPECT_DOUBLE_EQ(roofline_us(StepWork{0, 0, 100000000}, device_rates(g)), 1 + 2);
  EXPECT_DOUBLE_EQ(roofline_us(StepWork{10000000, 0, 100000000}, device_rates(g)), 1 + 1 + 2);
}

// A bf16 matmul kernel's multiply-adds are tensor flops, its epilogue's are not; an
// f32 matmul's are all SIMT flops.
TEST(Roofline, SixteenBitMatmulFlopsGoToTheTensorCores) {
  for (DType dt : {DType::BF16, DType::F32}) {
    GraphBuilder b("mm");
    Value x = b.param("x", dt, {64, 32});
    Value w = b.param("w", dt, {32, 16});
    b.ret(relu(matmul(x, w)));
    Result<Graph> g = b.finish();
    ASSERT_TRUE(g.ok());
    LocalProgram p;
    LocalKernel k;
    k.group = *g;
    k.flops = 2 * 64 * 16 * 32 + 64 * 16;
    p.kernels.push_back(k);
    LocalStep s;
    s.kind = LocalStep::Kind::Kernel;
    s.kernel = 0;
    p.steps.push_back(s);
    StepWork sw = step_work(p, 0);
    if (dt == DType::BF16) {
      EXPECT_EQ(sw.tensor_flops, 2 * 64 * 16 * 32);
      EXPECT_EQ(sw.flops, 64 * 16);
    } else {
      EXPECT_EQ(sw.tensor_flops, 0);
      EXPECT_EQ(sw.flops, 2 * 64 * 16 * 32 + 64 * 16);
    }
  }
}

TEST(Timeline, TraceEventsCarryBytesFlopsAndStep) {
  // One all_reduce between two kernels, on two ranks.
  std::vector<LocalProgram> programs;
  for (int r = 0; r < 2; ++r) {
    LocalProgram p;
    p.rank = r;
    p.types = {TensorType{DType::F32, {250}}, TensorType{DType::F32, {250}}, TensorType{DType::F32, {250}}};
    p.names = {"x", "a", "c"};
    p.param_values = {0};
    LocalKernel k;
    k.name = "k0";
    k.flops = 250;
    k.bytes_read = k.bytes_written = 1000;
    p.kernels = {k};
    LocalStep s0;
    s0.kind = LocalStep::Kind::Kernel;
    s0.kernel = 0;
    s0.in = {0};
    s0.outs = {1};
    LocalStep s1;
    s1.kind = LocalStep::Kind::Start;
    s1.collective = CollectiveKind::AllReduce;
    s1.in = {1};
    s1.handle = 0;
    LocalStep s2;
    s2.kind = LocalStep::Kind::Wait;
    s2.handle = 0;
    s2.out = 2;
    p.steps = {s0, s1, s2};
    p.num_handles = 1;
    programs.push_back(p);
  }
  TimelineModel m;
  m.comm.intra.bandwidth_GB_s = m.comm.inter.bandwidth_GB_s = 1;
  m.comm.intra.alpha_us = m.comm.inter.alpha_us = 1;
  m.compute_us = [](const LocalProgram&, size_t) { return 3.0; };
  Result<Timeline> t = simulate_timeline(programs, DeviceMesh(Mesh{{MeshDim{"tp", 2}}}), m);
  ASSERT_TRUE(t.ok()) << t.error().str();
  TraceWriter w;
  add_to_trace(*t, w);
  nlohmann::json j = w.to_json();
  std::set<std::pair<int, std::string>> seen;
  for (const nlohmann::json& e : j.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    seen.insert({e.at("pid").get<int>(), e.at("name").get<std::string>()});
    if (e.at("name") == "k0") {
      EXPECT_EQ(e.at("tid"), static_cast<int>(Stream::Compute));
      EXPECT_EQ(e.at("args").at("flops"), 250);
      EXPECT_EQ(e.at("args").at("bytes"), 2000);
      EXPECT_EQ(e.at("args").at("step"), 0);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 3);
    } else {
      EXPECT_EQ(e.at("name"), "all_reduce a");
      EXPECT_EQ(e.at("tid"), static_cast<int>(Stream::Comm));
      EXPECT_EQ(e.at("args").at("bytes"), 1000);
      EXPECT_EQ(e.at("args").at("step"), 1);
      EXPECT_EQ(e.at("args").at("link"), "nvlink");
      // 2 steps of 1 us + 1000 bytes at 1 GB/s (1000 B/us).
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 3);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 3);
    }
  }
  EXPECT_EQ(seen, (std::set<std::pair<int, std::string>>{{0, "k0"}, {0, "all_reduce a"}, {1, "k0"}, {1, "all_reduce a"}}));
}

}  // namespace fusion_timeline_test
}  // namespace sf
