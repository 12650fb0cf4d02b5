// The NCCL loader and communicators. Without a GPU (CI): the loader's answer, the
// Diag every rank gets when it tries to make a communicator (through a real Gloo
// exchange, no hang), and the pure parts (sizes, bus factors, configs, split keys).
// With GPUs: a one-rank communicator's collectives, and the timeout paths (a member
// that never joins; with two GPUs, a member that never issues).
#include "runtime/comm/nccl.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "runtime/comm/comm.h"
#include "tests/result_util.h"

namespace sf {
namespace runtime_nccl_test {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : ts) t.join();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// GPUs the driver sees; 0 without a driver.
int gpu_count() {
  Result<const cuda::Driver*> d = cuda::driver();
  if (!d) return 0;
  int n = 0;
  if ((*d)->DeviceGetCount(&n) != CUDA_SUCCESS) return 0;
  return n;
}

// Skips unless NCCL loads and at least `gpus` GPUs are there. A stand-in driver
// ($SHARDFUSE_LIBCUDA, tests/fake_cuda) is not one: NCCL's CUDA runtime, linked into
// libnccl, always opens the system's libcuda.so.1.
#define REQUIRE_NCCL_AND_GPUS(gpus)                                                                         \
  do {                                                                                                      \
    Result<const nccl::Library*> lib_ = nccl::library();                                                    \
    if (!lib_) GTEST_SKIP() << lib_.error().message;                                                        \
    if (const char* fake_ = std::getenv("SHARDFUSE_LIBCUDA"); fake_ && *fake_)                              \
      GTEST_SKIP() << "$SHARDFUSE_LIBCUDA names " << fake_ << ", which NCCL does not use";                 \
    if (gpu_count() < (gpus))                                                                               \
      GTEST_SKIP() << "needs " << (gpus) << " GPU(s), the driver sees " << gpu_count() << " ("               \
                   << (cuda::driver() ? "" : cuda::driver().error().message) << ")";                        \
  } while (0)

// ---- the loader ---------------------------------------------------------------------

TEST(NcclLibrary, EitherLoadsOrSaysNcclNotAvailable) {
  Result<const nccl::Library*> lib = nccl::library();
  if (!lib) {
    EXPECT_THAT(lib.error().message, StartsWith("NCCL not available: "));
    EXPECT_GT(lib.error().message.size(), std::string("NCCL not available: ").size() + 10) << "it says why";
    GTEST_SKIP() << lib.error().message;
  }
  EXPECT_FALSE((*lib)->file.empty());
  EXPECT_GE((*lib)->version, 21800);
  EXPECT_THAT((*lib)->version_str(), StartsWith("2."));
  EXPECT_EQ(nccl::library().value(), *lib) << "opened once";
  // Every entry point of the table is there.
#define SF_NCCL_CHECK(member, name) EXPECT_NE((*lib)->member, nullptr) << #name;
  SF_NCCL_ENTRY_POINTS(SF_NCCL_CHECK)
#undef SF_NCCL_CHECK
  EXPECT_THAT((*lib)->error(ncclInvalidArgument), StartsWith("ncclInvalidArgument"));
}

TEST(NcclLibrary, AMissingFileIsNcclNotAvailableNamingIt) {
  Result<std::shared_ptr<const nccl::Library>> lib = nccl::open_library("/nonexistent/libnccl.so.2");
  ASSERT_FALSE(lib);
  EXPECT_THAT(lib.error().message, StartsWith("NCCL not available: cannot load /nonexistent/libnccl.so.2 ("));
}

TEST(NcclLibrary, ALibraryWithoutTheEntryPointsNamesThem) {
  Result<std::shared_ptr<const nccl::Library>> lib = nccl::open_library("libm.so.6");
  ASSERT_FALSE(lib);
  EXPECT_THAT(lib.error().message,
              AllOf(StartsWith("NCCL not available: libm.so.6 lacks ncclGetVersion, ncclGetUniqueId"),
                    HasSubstr("ncclGroupEnd (we need NCCL 2.18.0 or newer)")));
}

TEST(NcclLibrary, DtypesAndReduceOps) {
  EXPECT_EQ(nccl::data_type(DType::F32).value(), ncclFloat32);
  EXPECT_EQ(nccl::data_type(DType::BF16).value(), ncclBfloat16);
  EXPECT_EQ(nccl::data_type(DType::F16).value(), ncclFloat16);
  EXPECT_EQ(nccl::data_type(DType::I64).value(), ncclInt64);
  EXPECT_EQ(nccl::data_type(DType::Bool).value(), ncclUint8);
  EXPECT_EQ(nccl::reduce_op(ReduceOp::Avg, DType::F32).value(), ncclAvg);
  EXPECT_EQ(nccl::reduce_op(ReduceOp::Max, DType::Bool).value(), ncclMax);
  Result<ncclRedOp_t> bool_sum = nccl::reduce_op(ReduceOp::Sum, DType::Bool);
  ASSERT_FALSE(bool_sum);
  EXPECT_THAT(bool_sum.error().message, HasSubstr("saturate"));
}

// ---- sizes and bandwidths: hand-computed values ----------------------------------------

TEST(NcclBandwidth, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllReduce, 2), 1.0);     // 2 * 1/2
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllReduce, 4), 1.5);     // 2 * 3/4
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllReduce, 8), 1.75);    // 2 * 7/8
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllGather, 2), 0.5);     // 1/2
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllGather, 4), 0.75);    // 3/4
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::ReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllToAll, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllToAll, 3), 2.0 / 3.0);
  for (CollectiveKind c : kAllCollectives) EXPECT_EQ(bus_factor(c, 1), 0.0) << collective_name(c);
}

TEST(NcclBandwidth, AlgbwIsSizeOverTimeAndBusbwScalesIt) {
  // 1 GB in 0.5 s: 2 GB/s; an all_reduce on 4 ranks moves 1.5x that per link.
  EXPECT_DOUBLE_EQ(nccl::algbw_GBps(1'000'000'000, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(nccl::busbw_GBps(CollectiveKind::AllReduce, 4, 1'000'000'000, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(nccl::busbw_GBps(CollectiveKind::AllGather, 4, 1'000'000'000, 0.5), 1.5);
  // 16 MiB all_gather in 2 ms on 2 ranks: 8.388608 GB/s algbw, half that busbw.
  EXPECT_DOUBLE_EQ(nccl::algbw_GBps(16 << 20, 0.002), 8.388608);
  EXPECT_DOUBLE_EQ(nccl::busbw_GBps(CollectiveKind::AllGather, 2, 16 << 20, 0.002), 4.194304);
  EXPECT_EQ(nccl::algbw_GBps(100, 0.0), 0.0) << "no time measured, no bandwidth";
}

TEST(NcclBandwidth, SizesFollowNcclTestsConventions) {
  // 1 MiB of f32 on 4 ranks.
  nccl::CollectiveSize s = nccl::collective_size(CollectiveKind::AllReduce, 1 << 20, 4, 4);
  EXPECT_EQ(s.send_count, 262144);
  EXPECT_EQ(s.recv_count, 262144);
  EXPECT_EQ(s.bytes, 1 << 20);
  s = nccl::collective_size(CollectiveKind::AllGather, 1 << 20, 4, 4);  // size = the gathered output
  EXPECT_EQ(s.send_count, 65536);
  EXPECT_EQ(s.recv_count, 262144);
  EXPECT_EQ(s.bytes, 1 << 20);
  s = nccl::collective_size(CollectiveKind::ReduceScatter, 1 << 20, 4, 4);  // size = the input
  EXPECT_EQ(s.send_count, 262144);
  EXPECT_EQ(s.recv_count, 65536);
  EXPECT_EQ(s.bytes, 1 << 20);
  s = nccl::collective_size(CollectiveKind::AllToAll, 1 << 20, 4, 4);  // 4 blocks of 64 Ki
  EXPECT_EQ(s.send_count, 262144);
  EXPECT_EQ(s.recv_count, 262144);
  EXPECT_EQ(s.bytes, 1 << 20);
  // 1000 B of f32 on 3 ranks: 250 elements, cut in 3 blocks of 83 (249 elements run).
  s = nccl::collective_size(CollectiveKind::AllGather, 1000, 4, 3);
  EXPECT_EQ(s.send_count, 83);
  EXPECT_EQ(s.recv_count, 249);
  EXPECT_EQ(s.bytes, 996);
  EXPECT_EQ(nccl::collective_size(CollectiveKind::AllReduce, 1000, 4, 3).bytes, 1000) << "no cut: all 250 elements";
  // 8 B of f32 on 4 ranks: 2 elements do not cut in 4; one element per rank runs.
  s = nccl::collective_size(CollectiveKind::ReduceScatter, 8, 4, 4);
  EXPECT_EQ(s.send_count, 4);
  EXPECT_EQ(s.recv_count, 1);
  EXPECT_EQ(s.bytes, 16);
  EXPECT_EQ(nccl::collective_size(CollectiveKind::AllReduce, 8, 4, 4).bytes, 8);
}

// ---- options and split keys --------------------------------------------------------------

TEST(NcclOptions, ConfigCarriesMaxCtasAndNonblocking) {
  nccl::Options o;
  ncclConfig_t c = nccl::make_config(o);
  EXPECT_EQ(c.size, sizeof(ncclConfig_t));
  EXPECT_EQ(c.blocking, 0) << "nonblocking by default, so creating and enqueueing can time out";
  EXPECT_EQ(c.maxCTAs, NCCL_CONFIG_UNDEF_INT) << "NCCL's default unless asked";
  EXPECT_EQ(c.minCTAs, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(c.commName, nullptr);
  o.max_ctas = 8;
  o.min_ctas = 2;
  o.nonblocking = false;
  o.name = "tp";
  c = nccl::make_config(o);
  EXPECT_EQ(c.maxCTAs, 8);
  EXPECT_EQ(c.minCTAs, 2);
  EXPECT_EQ(c.blocking, 1);
  EXPECT_STREQ(c.commName, "tp");
  EXPECT_TRUE(succeeded(nccl::check_options(o)));
  o.min_ctas = 16;
  ASSERT_FALSE(nccl::check_options(o).ok());
  EXPECT_THAT(nccl::check_options(o).error().message, HasSubstr("min_ctas 16 exceeds max_ctas 8"));
  o = {};
  o.timeout = milliseconds(0);
  EXPECT_FALSE(nccl::check_options(o).ok());
}

TEST(NcclSplit, ColorIsTheGroupIndexAndKeyThePosition) {
  DeviceMesh mesh(Mesh{{{"dp", 2}, {"tp", 2}}});  // rank = 2 * dp + tp
  // dim 0 (dp): groups {0, 2} and {1, 3}; dim 1 (tp): {0, 1} and {2, 3}.
  auto key = [&](int rank, int dim) {
    nccl::SplitKey k = nccl::mesh_split_key(mesh, rank, dim);
    return std::pair(k.color, k.key);
  };
  EXPECT_EQ(key(0, 0), std::pair(0, 0));
  EXPECT_EQ(key(2, 0), std::pair(0, 1));
  EXPECT_EQ(key(1, 0), std::pair(1, 0));
  EXPECT_EQ(key(3, 0), std::pair(1, 1));
  EXPECT_EQ(key(0, 1), std::pair(0, 0));
  EXPECT_EQ(key(1, 1), std::pair(0, 1));
  EXPECT_EQ(key(2, 1), std::pair(1, 0));
  EXPECT_EQ(key(3, 1), std::pair(1, 1));
  DeviceMesh line(Mesh{{{"tp", 3}}});
  EXPECT_EQ(nccl::mesh_split_key(line, 2, 0).color, 0);
  EXPECT_EQ(nccl::mesh_split_key(line, 2, 0).key, 2);
  nccl::Group g{1, {2, 3}, 3};
  EXPECT_EQ(g.member(), 1);
  EXPECT_EQ(g.str(), "group 1 (ranks 2 3)");
}

// ---- communicators without a GPU ---------------------------------------------------------

TEST(NcclComm, WithoutAGpuEveryRankGetsADiagAndNobodyHangs) {
  if (gpu_count() > 0) GTEST_SKIP() << "there is a GPU: the tests below cover communicators";
  auto rv = Rendezvous::in_process();
  std::vector<std::string> errors(2);
  const auto t0 = Clock::now();
  run_ranks(2, [&](int rank) {
    CommOptions co;
    co.timeout = milliseconds(20000);
    Result<std::unique_ptr<Comm>> gloo = Comm::create(rv, rank, 2, {{0, 1}}, co);
    ASSERT_TRUE(gloo) << gloo.error().message;
    Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(**gloo, 0, rank);
    ASSERT_FALSE(c);
    errors[static_cast<size_t>(rank)] = c.error().message;
  });
  for (int r = 0; r < 2; ++r) {
    const std::string& m = errors[static_cast<size_t>(r)];
    EXPECT_THAT(m, StartsWith("rank " + std::to_string(r) + ": creating the NCCL communicator over group 0 (ranks 0 1): "));
    // This machine: NCCL loads (its CUDA runtime is static) but there is no driver.
    EXPECT_TRUE(m.find("no CUDA device: ") != std::string::npos || m.find("NCCL not available: ") != std::string::npos)
        << m;
  }
  EXPECT_LT(seconds_since(t0), 15.0) << "the readiness exchange ends it at once";
}

TEST(NcclComm, InitWithoutAGpuSaysNoCudaDevice) {
  if (gpu_count() > 0) GTEST_SKIP() << "there is a GPU";
  ncclUniqueId id{};
  Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::init(id, nccl::Group{0, {0}, 0}, 0);
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error().message, StartsWith("rank 0: creating the NCCL communicator over group 0 (ranks 0)"));
  EXPECT_TRUE(c.error().message.find("no CUDA device: ") != std::string::npos ||
              c.error().message.find("NCCL not available: ") != std::string::npos)
      << c.error().message;
}

TEST(NcclComm, ArgumentErrorsAreDiags) {
  auto rv = Rendezvous::in_process();
  Result<std::unique_ptr<Comm>> gloo = Comm::create(rv, 0, 1, {{0}});
  ASSERT_TRUE(gloo) << gloo.error().message;
  Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(**gloo, 3, 0);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message, "rank 0: NCCL communicator: no group 3 (the Gloo Comm has 1)");
  ncclUniqueId id{};
  c = nccl::NcclComm::init(id, nccl::Group{0, {1, 2}, 0}, 0);
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error().message, HasSubstr("this rank is not a member"));
  nccl::Options bad;
  bad.max_ctas = -1;
  c = nccl::NcclComm::init(id, nccl::Group{0, {0}, 0}, 0, bad);
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error().message, HasSubstr("CTA counts must be >= 0"));
}

// ---- with GPUs -------------------------------------------------------------------------------

struct Device {
  std::shared_ptr<cuda::Context> ctx;
  cuda::Stream stream;
};

Device device(int ordinal) {
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(ordinal);
  EXPECT_TRUE(ctx) << ctx.error().message;
  Result<cuda::Stream> s = cuda::Stream::create(**ctx);
  EXPECT_TRUE(s) << s.error().message;
  return {*ctx, std::move(s).value()};
}

cuda::Buffer upload(cuda::Context& ctx, const std::vector<float>& v) {
  Result<cuda::Buffer> b = cuda::Buffer::allocate(ctx, v.size() * sizeof(float));
  EXPECT_TRUE(b) << b.error().message;
  EXPECT_TRUE(
      succeeded(cuda::check(ctx.drv().MemcpyHtoD(b->ptr(), v.data(), v.size() * sizeof(float)), "cuMemcpyHtoD")));
  return std::move(b).value();
}

std::vector<float> download(cuda::Context& ctx, const cuda::Buffer& b, size_t n) {
  std::vector<float> v(n);
  EXPECT_TRUE(succeeded(cuda::check(ctx.drv().MemcpyDtoH(v.data(), b.ptr(), n * sizeof(float)), "cuMemcpyDtoH")));
  return v;
}

TEST(NcclGpu, OneRankCollectivesAreTheIdentity) {
  REQUIRE_NCCL_AND_GPUS(1);
  const nccl::Library* lib = nccl::library().value();
  Device d = device(0);
  ASSERT_TRUE(succeeded(d.ctx->make_current()));
  ncclUniqueId id{};
  ASSERT_EQ(lib->GetUniqueId(&id), ncclSuccess);
  nccl::Options o;
  o.max_ctas = 4;
  o.timeout = milliseconds(30000);
  Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::init(id, nccl::Group{0, {0}, 0}, 0, o);
  ASSERT_TRUE(c) << c.error().message;
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  cuda::Buffer in = upload(*d.ctx, x), out = upload(*d.ctx, std::vector<float>(x.size(), 0.0f));
  ASSERT_TRUE(succeeded((*c)->all_reduce(in.ptr(), out.ptr(), x.size(), DType::F32, ReduceOp::Sum, d.stream.get())));
  ASSERT_TRUE(succeeded((*c)->wait_with_timeout(d.stream.get())));
  EXPECT_EQ(download(*d.ctx, out, x.size()), x);
  for (CollectiveKind k : {CollectiveKind::AllGather, CollectiveKind::ReduceScatter, CollectiveKind::AllToAll}) {
    cuda::Buffer o2 = upload(*d.ctx, std::vector<float>(x.size(), 0.0f));
    Result<void> e;
    if (k == CollectiveKind::AllGather) e = (*c)->all_gather(in.ptr(), o2.ptr(), x.size(), DType::F32, d.stream.get());
    if (k == CollectiveKind::ReduceScatter)
      e = (*c)->reduce_scatter(in.ptr(), o2.ptr(), x.size(), DType::F32, ReduceOp::Max, d.stream.get());
    if (k == CollectiveKind::AllToAll) e = (*c)->all_to_all(in.ptr(), o2.ptr(), x.size(), DType::F32, d.stream.get());
    ASSERT_TRUE(succeeded(e));
    ASSERT_TRUE(succeeded((*c)->wait_with_timeout(d.stream.get()))) << collective_name(k);
    EXPECT_EQ(download(*d.ctx, o2, x.size()), x) << collective_name(k);
  }
}

TEST(NcclGpu, AMemberThatNeverJoinsTimesOutAndAborts) {
  REQUIRE_NCCL_AND_GPUS(1);
  const nccl::Library* lib = nccl::library().value();
  Device d = device(0);
  ASSERT_TRUE(succeeded(d.ctx->make_current()));
  ncclUniqueId id{};
  ASSERT_EQ(lib->GetUniqueId(&id), ncclSuccess);
  nccl::Options o;
  o.timeout = milliseconds(2000);
  const auto t0 = Clock::now();
  // Member 1 of the two never calls init.
  Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::init(id, nccl::Group{0, {0, 1}, 0}, 0, o);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message,
            "rank 0: creating the NCCL communicator over group 0 (ranks 0 1) timed out after 2 s (not every member "
            "joined); the NCCL communicator was aborted");
  EXPECT_LT(seconds_since(t0), 20.0);
}

TEST(NcclGpu, TwoRanksAllReduceThenASilentPeerTimesOutEveryRank) {
  REQUIRE_NCCL_AND_GPUS(2);
  auto rv = Rendezvous::in_process();
  std::vector<std::string> errors(2);
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  const auto t0 = Clock::now();
  run_ranks(2, [&](int rank) {
    Device d = device(rank);
    Result<std::unique_ptr<Comm>> gloo = Comm::create(rv, rank, 2, {{0, 1}});
    ASSERT_TRUE(gloo) << gloo.error().message;
    nccl::Options o;
    o.timeout = milliseconds(3000);
    o.max_ctas = 2;
    Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(**gloo, 0, rank, o);
    ASSERT_TRUE(c) << c.error().message;
    std::vector<float> x(4096, static_cast<float>(rank + 1));
    cuda::Buffer in = upload(*d.ctx, x), out = upload(*d.ctx, std::vector<float>(x.size(), 0.0f));
    ASSERT_TRUE(succeeded((*c)->all_reduce(in.ptr(), out.ptr(), x.size(), DType::F32, ReduceOp::Sum, d.stream.get())));
    ASSERT_TRUE(succeeded((*c)->wait_with_timeout(d.stream.get())));
    EXPECT_EQ(download(*d.ctx, out, x.size()), std::vector<float>(x.size(), 3.0f));
    // Rank 1 goes silent: rank 0's next all_reduce must time out and abort.
    if (rank == 0) {
      Result<void> e = (*c)->all_reduce(in.ptr(), out.ptr(), x.size(), DType::F32, ReduceOp::Sum, d.stream.get());
      if (e.ok()) e = (*c)->wait_with_timeout(d.stream.get(), milliseconds(1000));
      ASSERT_FALSE(e.ok());
      errors[0] = e.error().message;
      rank0_done.set_value();
    } else {
      done.wait();
      // Its peer aborted: destroying its own communicator must not hang either.
    }
  });
  EXPECT_THAT(errors[0], AllOf(StartsWith("rank 0: all_reduce of 16384 B (f32, sum) over group 0 (ranks 0 1) "),
                               HasSubstr("timed out after 1 s"), HasSubstr("the NCCL communicator was aborted")));
  EXPECT_LT(seconds_since(t0), 60.0);
}

TEST(NcclGpu, SplitPerMeshDim) {
  REQUIRE_NCCL_AND_GPUS(2);
  // dp=2 tp=1: dim 0 is both ranks, dim 1 one rank each.
  DeviceMesh mesh(Mesh{{{"dp", 2}, {"tp", 1}}});
  auto rv = Rendezvous::in_process();
  run_ranks(2, [&](int rank) {
    Device d = device(rank);
    Result<std::unique_ptr<Comm>> gloo = Comm::create(rv, rank, 2, {{0, 1}});
    ASSERT_TRUE(gloo) << gloo.error().message;
    Result<std::unique_ptr<nccl::NcclComm>> world = nccl::NcclComm::create(**gloo, 0, rank);
    ASSERT_TRUE(world) << world.error().message;
    Result<std::vector<std::unique_ptr<nccl::NcclComm>>> dims = nccl::split_mesh(**world, mesh);
    ASSERT_TRUE(dims) << dims.error().message;
    ASSERT_EQ(dims->size(), 2u);
    EXPECT_EQ((*dims)[0]->size(), 2);
    EXPECT_EQ((*dims)[0]->member(), rank);
    EXPECT_EQ((*dims)[1]->size(), 1);
    std::vector<float> x(256, static_cast<float>(rank + 1));
    cuda::Buffer in = upload(*d.ctx, x), out = upload(*d.ctx, std::vector<float>(x.size(), 0.0f));
    ASSERT_TRUE(
        succeeded((*dims)[0]->all_reduce(in.ptr(), out.ptr(), x.size(), DType::F32, ReduceOp::Sum, d.stream.get())));
    ASSERT_TRUE(succeeded((*dims)[0]->wait_with_timeout(d.stream.get())));
    EXPECT_EQ(download(*d.ctx, out, x.size()), std::vector<float>(x.size(), 3.0f));
  });
}

}  // namespace runtime_nccl_test
}  // namespace sf
