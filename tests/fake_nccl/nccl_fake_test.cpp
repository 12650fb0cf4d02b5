// runtime/comm/nccl.h's communicators and collectives on the fake NCCL and the fake
// CUDA driver (tests/fake_nccl/README.md): ranks are threads of this process, each
// with its own fake GPU, meeting through an in-process Gloo Comm as in a real run.
// Numbers are checked against the host oracle (runtime/core/host_collectives.h),
// so a wrong layout, member order or reduction in the runtime or the fake fails;
// the failure paths (a rank that never arrives, an abort, members that disagree)
// must end every rank with a Diag, never a hang.
#include <dlfcn.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/host_collectives.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/nccl.h"
#include "tests/result_util.h"

namespace sf {
namespace fake_nccl_nccl_fake_test {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Transfer = nccl::NcclComm::Transfer;

// This binary tests the fakes, whatever the environment says (CMake sets the same
// variables): the loaders read them on first use, long after this runs.
const bool kUseFakes = [] {
  ::setenv("SHARDFUSE_LIBCUDA", FAKE_CUDA_LIB, 1);
  ::setenv("SHARDFUSE_LIBNCCL", FAKE_NCCL_LIB, 1);
  ::setenv("FAKE_CUDA_DEVICES", "4", 1);
  return true;
}();

// fake_nccl_stat (fake_libnccl.cpp, the end), once the runtime loaded the library.
long long stat(const char* name) {
  static long long (*fn)(const char*) = [] {
    (void)kUseFakes;
    if (!nccl::library()) return static_cast<long long (*)(const char*)>(nullptr);
    void* lib = ::dlopen(std::getenv("SHARDFUSE_LIBNCCL"), RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<long long (*)(const char*)>(::dlsym(lib, "fake_nccl_stat")) : nullptr;
  }();
  return fn ? fn(name) : -2;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

DeviceMesh line(int n) { return DeviceMesh(Mesh{{{"tp", n}}}); }

// One rank's device, stream and NCCL communicator (over Gloo group 0).
struct Rank {
  std::shared_ptr<cuda::Context> ctx;
  cuda::Stream stream;
  std::unique_ptr<nccl::NcclComm> comm;
};

Diag diag(std::string m) { return Diag{"", {}, std::move(m)}; }

// Device = rank: the fake has four GPUs.
Result<Rank> setup(Comm& gloo, const nccl::Options& opts = {}) {
  Rank r;
  Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(gloo.rank());
  if (!ctx) return ctx.error();
  r.ctx = *ctx;
  SF_TRY(r.ctx->make_current());
  Result<cuda::Stream> s = cuda::Stream::create(*r.ctx);
  if (!s) return s.error();
  r.stream = std::move(s).value();
  Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(gloo, 0, gloo.rank(), opts);
  if (!c) return c.error();
  r.comm = std::move(c).value();
  return r;
}

Result<cuda::Buffer> upload(Rank& r, const Tensor& t, size_t bytes = 0) {
  bytes = std::max({bytes, t.nbytes(), size_t{4}});
  Result<cuda::Buffer> b = cuda::Buffer::allocate(*r.ctx, bytes);
  if (!b) return b.error();
  if (t.nbytes())
    if (CUresult e = r.ctx->drv().MemcpyHtoD(b->ptr(), t.data(), t.nbytes()); e != CUDA_SUCCESS)
      return diag("cuMemcpyHtoD: " + r.ctx->drv().error(e));
  return b;
}

Result<Tensor> download(Rank& r, const cuda::Buffer& b, DType dt, int64_t n) {
  Tensor t(dt, {n});
  if (t.nbytes())
    if (CUresult e = r.ctx->drv().MemcpyDtoH(t.data(), b.ptr(), t.nbytes()); e != CUDA_SUCCESS)
      return diag("cuMemcpyDtoH: " + r.ctx->drv().error(e));
  return t;
}

// Distinct values per rank and element, with fractions that make rounding matter
// (sums of bf16 values are rarely bf16 values).
Tensor local(DType dt, int64_t n, int rank, int salt = 0) {
  Tensor t(dt, {n});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = ((rank + 1) * 7 + i * 5 + salt * 3) % 23 - 11;
    if (is_float(dt)) {
      t.set(i, static_cast<double>(v) * 0.3719 + 0.0173 * rank);
    } else {
      t.set_int(i, v * 1000 + rank);
    }
  }
  return t;
}

// Every element equal. Exact for bf16 and f16 too: the fake reduces in double and
// rounds once to nearest even, as the oracle does, so one unit in the last place
// off is a rounding bug (a real NCCL, reducing in the element type, needs a
// tolerance here).
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (!is_float(got.dtype())) {
      ASSERT_EQ(got.get_int(i), want.get_int(i)) << what << " element " << i;
    } else {
      ASSERT_EQ(got.get(i), want.get(i)) << what << " element " << i;
    }
  }
}

// Runs fn on every rank of `mesh`; fails on the first rank's Diag and checks that
// every communicator the fake handed out was given back.
void run(const DeviceMesh& mesh, const std::function<Result<void>(Comm&)>& fn) {
  const long long comms = stat("comms");
  ASSERT_GE(comms, 0) << "fake_nccl_stat not found: " << (nccl::library() ? "" : nccl::library().error().message);
  Result<void> d = on_rank_threads(mesh, std::chrono::seconds(30), fn);
  EXPECT_TRUE(succeeded(d));
  EXPECT_EQ(stat("comms"), comms) << "a communicator was neither destroyed nor aborted";
}

// Per-rank results, filled by the rank threads and read after they joined.
template <class T>
struct PerRank {
  explicit PerRank(int n) : v(static_cast<size_t>(n)) {}
  void set(int rank, T x) {
    std::lock_guard<std::mutex> lock(mu);
    v[static_cast<size_t>(rank)] = std::move(x);
  }
  std::mutex mu;
  std::vector<T> v;
};

// ---- the library itself ----------------------------------------------------------------

TEST(NcclFake, LoadsAsNccl2289WithEveryEntryPoint) {
  Result<const nccl::Library*> lib = nccl::library();
  ASSERT_TRUE(lib) << lib.error().message;
  EXPECT_EQ((*lib)->file, FAKE_NCCL_LIB);
  EXPECT_EQ((*lib)->version, 22809);
  EXPECT_EQ((*lib)->version_str(), "2.28.9");
  EXPECT_EQ(stat("entry_points"), 18);
  EXPECT_EQ(stat("no such stat"), -1);
  // (Then ": " and this thread's last error, if an earlier test left one.)
  EXPECT_THAT((*lib)->error(ncclRemoteError),
              StartsWith("ncclRemoteError (remote process exited or there was a network error)"));
}

TEST(NcclFake, BadArgumentsAreErrorsNotCrashes) {
  Result<const nccl::Library*> lib = nccl::library();
  ASSERT_TRUE(lib) << lib.error().message;
  const nccl::Library& l = **lib;
  float x = 0;
  EXPECT_EQ(l.AllReduce(&x, &x, 1, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_THAT(l.GetLastError(nullptr), HasSubstr("comm is NULL"));
  ncclResult_t st = ncclSuccess;
  EXPECT_EQ(l.CommGetAsyncError(nullptr, &st), ncclInvalidArgument);
  EXPECT_EQ(l.Send(&x, 1, ncclFloat32, 0, nullptr, nullptr), ncclInvalidArgument);
  // A handle that was never handed out (or was freed) is caught, not dereferenced.
  auto* stale = reinterpret_cast<ncclComm_t>(uintptr_t{0x1234});
  EXPECT_EQ(l.AllGather(&x, &x, 1, ncclFloat32, stale, nullptr), ncclInvalidArgument);
  EXPECT_THAT(l.GetLastError(nullptr), HasSubstr("0x1234 is not a live communicator"));
  EXPECT_EQ(l.CommDestroy(nullptr), ncclSuccess) << "as NCCL";
  EXPECT_EQ(l.CommAbort(nullptr), ncclSuccess) << "as NCCL";
  EXPECT_EQ(l.GroupEnd(), ncclInvalidUsage) << "no group is open";

  // Unique ids differ; one this process did not make is refused at once rather
  // than waited on.
  ncclUniqueId a{}, b{};
  ASSERT_EQ(l.GetUniqueId(&a), ncclSuccess);
  ASSERT_EQ(l.GetUniqueId(&b), ncclSuccess);
  EXPECT_NE(std::string(a.internal, sizeof a.internal), std::string(b.internal, sizeof b.internal));
  ncclUniqueId zero{};
  ncclComm_t c = nullptr;
  EXPECT_EQ(l.CommInitRank(&c, 2, zero, 0), ncclInvalidArgument);
  EXPECT_THAT(l.GetLastError(nullptr), HasSubstr("not made by ncclGetUniqueId"));
  EXPECT_EQ(l.CommInitRank(&c, 2, a, 2), ncclInvalidArgument) << "rank 2 of 2";

  // A one-member communicator: a collective inside a group is refused, and an
  // unsupported reduction is an invalid argument.
  ASSERT_EQ(l.CommInitRank(&c, 1, a, 0), ncclSuccess);
  EXPECT_EQ(stat("max_ctas"), -1) << "no config";
  EXPECT_EQ(l.AllReduce(&x, &x, 1, ncclFloat8e4m3, ncclSum, c, nullptr), ncclInvalidArgument);
  EXPECT_EQ(l.AllReduce(&x, &x, 1, ncclFloat32, static_cast<ncclRedOp_t>(17), c, nullptr), ncclInvalidArgument);
  ASSERT_EQ(l.GroupStart(), ncclSuccess);
  EXPECT_EQ(l.AllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, nullptr), ncclInvalidUsage);
  EXPECT_EQ(l.GroupEnd(), ncclSuccess);
  x = 2.5f;
  EXPECT_EQ(l.AllReduce(&x, &x, 1, ncclFloat32, ncclProd, c, nullptr), ncclSuccess);
  EXPECT_EQ(x, 2.5f);
  EXPECT_EQ(l.CommFinalize(c), ncclSuccess);
  EXPECT_EQ(l.CommDestroy(c), ncclSuccess);
  EXPECT_EQ(l.CommDestroy(c), ncclInvalidArgument) << "destroyed twice";
}

// ---- collectives against the host oracle -------------------------------------------------

class NcclFakeRanks : public ::testing::TestWithParam<int> {};

TEST_P(NcclFakeRanks, AllReduceMatchesTheHostOracle) {
  const int n = GetParam();
  struct Case {
    DType dt;
    ReduceOp op;
    bool in_place;
  };
  const std::vector<Case> cases = {{DType::F32, ReduceOp::Sum, true},
                                   {DType::F32, ReduceOp::Avg, false},
                                   {DType::I32, ReduceOp::Max, false},
                                   {DType::BF16, ReduceOp::Sum, false},
                                   {DType::F16, ReduceOp::Avg, true}};
  constexpr int64_t kCount = 37;
  PerRank<std::vector<Tensor>> got(n);
  const long long ops = stat("ops");
  run(line(n), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    std::vector<Tensor> out;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      Result<cuda::Buffer> send = upload(*r, local(c.dt, kCount, gloo.rank(), static_cast<int>(i)));
      Result<cuda::Buffer> recv = upload(*r, Tensor(c.dt, {kCount}));
      if (!send) return send.error();
      if (!recv) return recv.error();
      const CUdeviceptr dst = c.in_place ? send->ptr() : recv->ptr();
      SF_TRY(r->comm->all_reduce(send->ptr(), dst, kCount, c.dt, c.op, r->stream.get()));
      SF_TRY(r->comm->wait_with_timeout(r->stream.get()));
      Result<Tensor> t = download(*r, c.in_place ? *send : *recv, c.dt, kCount);
      if (!t) return t.error();
      out.push_back(std::move(t).value());
    }
    got.set(gloo.rank(), std::move(out));
    return {};
  });
  EXPECT_EQ(stat("ops") - ops, static_cast<long long>(cases.size())) << "each all_reduce runs once, for every member";
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<Tensor> locals;
    for (int k = 0; k < n; ++k) locals.push_back(local(cases[i].dt, kCount, k, static_cast<int>(i)));
    const std::vector<Tensor> want = host_all_reduce(locals, cases[i].op);
    for (int k = 0; k < n; ++k) {
      ASSERT_EQ(got.v[static_cast<size_t>(k)].size(), cases.size()) << "rank " << k;
      expect_same(got.v[static_cast<size_t>(k)][i], want[static_cast<size_t>(k)],
                  "rank " + std::to_string(k) + " " + std::string(dtype_name(cases[i].dt)) + " " +
                      std::string(reduce_op_name(cases[i].op)));
    }
  }
}

TEST_P(NcclFakeRanks, AllGatherAndReduceScatterMatchTheHostOracle) {
  const int n = GetParam();
  constexpr int64_t kBlock = 5;
  PerRank<std::vector<Tensor>> got(n);
  run(line(n), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    const int rank = gloo.rank();
    Result<cuda::Buffer> ag_send = upload(*r, local(DType::F32, kBlock, rank));
    Result<cuda::Buffer> ag_recv = upload(*r, Tensor(DType::F32, {n * kBlock}));
    Result<cuda::Buffer> rs_send = upload(*r, local(DType::I32, n * kBlock, rank, 1));
    Result<cuda::Buffer> rs_recv = upload(*r, Tensor(DType::I32, {kBlock}));
    for (auto* b : {&ag_send, &ag_recv, &rs_send, &rs_recv})
      if (!*b) return b->error();
    SF_TRY(r->comm->all_gather(ag_send->ptr(), ag_recv->ptr(), kBlock, DType::F32, r->stream.get()));
    SF_TRY(r->comm->reduce_scatter(rs_send->ptr(), rs_recv->ptr(), kBlock, DType::I32, ReduceOp::Sum,
                                   r->stream.get()));
    SF_TRY(r->comm->wait_with_timeout(r->stream.get()));
    Result<Tensor> ag = download(*r, *ag_recv, DType::F32, n * kBlock);
    Result<Tensor> rs = download(*r, *rs_recv, DType::I32, kBlock);
    if (!ag) return ag.error();
    if (!rs) return rs.error();
    got.set(rank, {std::move(ag).value(), std::move(rs).value()});
    return {};
  });
  std::vector<Tensor> ag_locals, rs_locals;
  for (int k = 0; k < n; ++k) {
    ag_locals.push_back(local(DType::F32, kBlock, k));
    rs_locals.push_back(local(DType::I32, n * kBlock, k, 1));
  }
  const std::vector<Tensor> ag = host_all_gather(ag_locals, 0);
  const std::vector<Tensor> rs =
      host_reduce_scatter(rs_locals, 0, std::vector<int64_t>(static_cast<size_t>(n), kBlock), ReduceOp::Sum);
  for (int k = 0; k < n; ++k) {
    ASSERT_EQ(got.v[static_cast<size_t>(k)].size(), 2u) << "rank " << k;
    expect_same(got.v[static_cast<size_t>(k)][0], ag[static_cast<size_t>(k)], "all_gather rank " + std::to_string(k));
    expect_same(got.v[static_cast<size_t>(k)][1], rs[static_cast<size_t>(k)], "reduce_scatter rank " + std::to_string(k));
  }
}

INSTANTIATE_TEST_SUITE_P(NcclFake, NcclFakeRanks, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

TEST(NcclFake, AllToAllAndUnevenSendRecvMatchTheHostOracle) {
  constexpr int n = 4;
  constexpr int64_t kCount = 3;
  // counts[j][k]: what member j sends to member k. Zeros (which the runtime skips),
  // transfers to self, and member 3 idle: it takes part in no transfer, so only
  // its peers may wait for each other (as in NCCL, p2p synchronises peers only).
  const std::vector<std::vector<int64_t>> counts = {{2, 0, 3, 0}, {1, 4, 0, 0}, {0, 2, 1, 0}, {0, 0, 0, 0}};
  auto sent = [&](int j) {
    int64_t s = 0;
    for (int64_t c : counts[static_cast<size_t>(j)]) s += c;
    return s;
  };
  auto received = [&](int k) {
    int64_t s = 0;
    for (int j = 0; j < n; ++j) s += counts[static_cast<size_t>(j)][static_cast<size_t>(k)];
    return s;
  };
  PerRank<std::vector<Tensor>> got(n);
  run(line(n), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    const int me = gloo.rank();
    Result<cuda::Buffer> a2a_send = upload(*r, local(DType::F32, n * kCount, me));
    Result<cuda::Buffer> a2a_recv = upload(*r, Tensor(DType::F32, {n * kCount}));
    Result<cuda::Buffer> p2p_send = upload(*r, local(DType::I32, sent(me), me, 2));
    Result<cuda::Buffer> p2p_recv = upload(*r, Tensor(DType::I32, {received(me)}));
    for (auto* b : {&a2a_send, &a2a_recv, &p2p_send, &p2p_recv})
      if (!*b) return b->error();
    SF_TRY(r->comm->all_to_all(a2a_send->ptr(), a2a_recv->ptr(), kCount, DType::F32, r->stream.get()));
    std::vector<Transfer> sends, recvs;
    int64_t send_at = 0, recv_at = 0;
    for (int k = 0; k < n; ++k) {
      const int64_t out = counts[static_cast<size_t>(me)][static_cast<size_t>(k)];
      const int64_t in = counts[static_cast<size_t>(k)][static_cast<size_t>(me)];
      sends.push_back({k, p2p_send->ptr() + static_cast<CUdeviceptr>(send_at * 4), static_cast<size_t>(out)});
      recvs.push_back({k, p2p_recv->ptr() + static_cast<CUdeviceptr>(recv_at * 4), static_cast<size_t>(in)});
      send_at += out;
      recv_at += in;
    }
    SF_TRY(r->comm->send_recv(sends, recvs, DType::I32, r->stream.get()));
    SF_TRY(r->comm->wait_with_timeout(r->stream.get()));
    Result<Tensor> a2a = download(*r, *a2a_recv, DType::F32, n * kCount);
    Result<Tensor> p2p = download(*r, *p2p_recv, DType::I32, received(me));
    if (!a2a) return a2a.error();
    if (!p2p) return p2p.error();
    got.set(me, {std::move(a2a).value(), std::move(p2p).value()});
    return {};
  });
  std::vector<Tensor> a2a_locals, p2p_locals;
  for (int k = 0; k < n; ++k) {
    a2a_locals.push_back(local(DType::F32, n * kCount, k));
    p2p_locals.push_back(local(DType::I32, sent(k), k, 2));
  }
  const std::vector<Tensor> a2a = host_all_to_all(
      a2a_locals, 0, std::vector<std::vector<int64_t>>(n, std::vector<int64_t>(n, kCount)), 0);
  const std::vector<Tensor> p2p = host_all_to_all(p2p_locals, 0, counts, 0);
  for (int k = 0; k < n; ++k) {
    ASSERT_EQ(got.v[static_cast<size_t>(k)].size(), 2u) << "rank " << k;
    expect_same(got.v[static_cast<size_t>(k)][0], a2a[static_cast<size_t>(k)], "all_to_all rank " + std::to_string(k));
    expect_same(got.v[static_cast<size_t>(k)][1], p2p[static_cast<size_t>(k)], "send_recv rank " + std::to_string(k));
  }
}

// ---- split ----------------------------------------------------------------------------------

class NcclFakeSplit : public ::testing::TestWithParam<bool> {};

TEST_P(NcclFakeSplit, SplitMeshGivesEachDimItsGroup) {
  const DeviceMesh mesh(Mesh{{{"dp", 2}, {"tp", 2}}});
  constexpr int64_t kCount = 6;
  nccl::Options opts;
  opts.nonblocking = GetParam();
  PerRank<std::vector<Tensor>> got(4);
  PerRank<std::vector<int>> members(4);
  // The world communicator meets through a 4-rank Gloo group; split_mesh then cuts
  // it per dim of the 2x2 mesh.
  run(line(4), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo, opts);
    if (!r) return r.error();
    const int rank = gloo.rank();
    Result<std::vector<std::unique_ptr<nccl::NcclComm>>> dims = nccl::split_mesh(*r->comm, mesh);
    if (!dims) return dims.error();
    if (dims->size() != 2) return diag("split_mesh gave " + std::to_string(dims->size()) + " communicators");
    std::vector<Tensor> out;
    std::vector<int> ms;
    for (int d = 0; d < 2; ++d) {
      nccl::NcclComm& c = *(*dims)[static_cast<size_t>(d)];
      ms.push_back(c.member());
      Result<cuda::Buffer> b = upload(*r, local(DType::F32, kCount, rank, d));
      if (!b) return b.error();
      SF_TRY(c.all_reduce(b->ptr(), b->ptr(), kCount, DType::F32, ReduceOp::Sum, r->stream.get()));
      SF_TRY(c.wait_with_timeout(r->stream.get()));
      Result<Tensor> t = download(*r, *b, DType::F32, kCount);
      if (!t) return t.error();
      out.push_back(std::move(t).value());
    }
    got.set(rank, std::move(out));
    members.set(rank, std::move(ms));
    return {};
  });
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_EQ(got.v[static_cast<size_t>(rank)].size(), 2u) << "rank " << rank;
    for (int d = 0; d < 2; ++d) {
      const std::vector<int> group = mesh.group(rank, d);
      std::vector<Tensor> locals;
      for (int k : group) locals.push_back(local(DType::F32, kCount, k, d));
      expect_same(got.v[static_cast<size_t>(rank)][static_cast<size_t>(d)], host_all_reduce(locals, ReduceOp::Sum)[0],
                  "rank " + std::to_string(rank) + " dim " + std::to_string(d));
      const auto pos = std::find(group.begin(), group.end(), rank) - group.begin();
      EXPECT_EQ(members.v[static_cast<size_t>(rank)][static_cast<size_t>(d)], pos) << "rank " << rank << " dim " << d;
    }
  }
}

TEST(NcclFake, SplitOrdersMembersByKey) {
  // Keys reverse the parent's order: member 0 of the child is rank 2.
  PerRank<std::optional<Tensor>> got(3);
  PerRank<int> members(3);
  run(line(3), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    const int rank = gloo.rank();
    nccl::Group g{1, {2, 1, 0}, rank};
    Result<std::unique_ptr<nccl::NcclComm>> c = r->comm->split(/*color=*/0, /*key=*/2 - rank, g);
    if (!c) return c.error();
    Tensor mine(DType::I32, {1});
    mine.set_int(0, rank);
    Result<cuda::Buffer> send = upload(*r, mine);
    Result<cuda::Buffer> recv = upload(*r, Tensor(DType::I32, {3}));
    if (!send) return send.error();
    if (!recv) return recv.error();
    SF_TRY((*c)->all_gather(send->ptr(), recv->ptr(), 1, DType::I32, r->stream.get()));
    SF_TRY((*c)->wait_with_timeout(r->stream.get()));
    Result<Tensor> t = download(*r, *recv, DType::I32, 3);
    if (!t) return t.error();
    got.set(rank, std::move(t).value());
    members.set(rank, (*c)->member());
    return {};
  });
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(got.v[static_cast<size_t>(k)]) << "rank " << k;
    const Tensor& t = *got.v[static_cast<size_t>(k)];
    EXPECT_EQ((std::vector<int64_t>{t.get_int(0), t.get_int(1), t.get_int(2)}), (std::vector<int64_t>{2, 1, 0}))
        << "rank " << k;
    EXPECT_EQ(members.v[static_cast<size_t>(k)], 2 - k);
  }
}

INSTANTIATE_TEST_SUITE_P(NcclFake, NcclFakeSplit, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Nonblocking" : "Blocking"; });

// ---- failures end every rank -------------------------------------------------------------

TEST(NcclFake, ARankThatNeverPostsTimesOutTheOthers) {
  nccl::Options opts;
  opts.timeout = milliseconds(300);
  PerRank<Result<void>> diags(3);
  PerRank<double> seconds(3);
  std::atomic<int> done{0};
  run(line(3), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo, opts);
    if (!r) return r.error();
    Result<cuda::Buffer> b = upload(*r, local(DType::F32, 8, gloo.rank()));
    if (!b) return b.error();
    const auto t0 = Clock::now();
    Result<void> e;
    if (gloo.rank() < 2) {
      e = r->comm->all_reduce(b->ptr(), b->ptr(), 8, DType::F32, ReduceOp::Sum, r->stream.get());
      if (e.ok()) e = r->comm->wait_with_timeout(r->stream.get());
      ++done;
    } else {
      // Rank 2 is busy elsewhere until the others gave up; its communicator was
      // aborted under it by then.
      while (done < 2 && seconds_since(t0) < 20) std::this_thread::sleep_for(milliseconds(5));
      e = r->comm->all_reduce(b->ptr(), b->ptr(), 8, DType::F32, ReduceOp::Sum, r->stream.get());
    }
    seconds.set(gloo.rank(), seconds_since(t0));
    diags.set(gloo.rank(), e);
    return {};
  });
  int timed_out = 0;
  for (int k = 0; k < 2; ++k) {
    const Result<void>& d = diags.v[static_cast<size_t>(k)];
    ASSERT_FALSE(d.ok()) << "rank " << k << " returned no error";
    // The first to time out aborts; the other may see the abort (ncclRemoteError)
    // just before its own deadline.
    EXPECT_THAT(d.error().message, AllOf(HasSubstr("rank " + std::to_string(k) + ": all_reduce of 32 B (f32, sum)"),
                                         AnyOf(HasSubstr("timed out after 300 ms"), HasSubstr("ncclRemoteError"))));
    timed_out += d.error().message.find("timed out after 300 ms") != std::string::npos;
    // Only the echo of the other's abort is marked as one, so a runner of several
    // ranks reports the timeout (on_rank_threads).
    EXPECT_EQ(d.error().from_peer, d.error().message.find("ncclRemoteError") != std::string::npos) << d.error().message;
    EXPECT_LT(seconds.v[static_cast<size_t>(k)], 3.0) << "rank " << k;
  }
  EXPECT_GE(timed_out, 1);
  ASSERT_FALSE(diags.v[2].ok()) << "rank 2 posted on an aborted communicator and got no error";
  EXPECT_THAT(diags.v[2].error().message, AllOf(HasSubstr("ncclRemoteError"), HasSubstr("called ncclCommAbort")));
  EXPECT_TRUE(diags.v[2].error().from_peer) << "an enqueue that met a peer's abort is an echo of that failure";
}

TEST(NcclFake, AnAbortReleasesBlockedMembers) {
  nccl::Options opts;
  opts.nonblocking = false;  // ncclAllReduce itself waits for the others
  PerRank<Result<void>> diags(3);
  PerRank<double> seconds(3);
  run(line(3), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo, opts);
    if (!r) return r.error();
    Result<cuda::Buffer> b = upload(*r, local(DType::F32, 8, gloo.rank()));
    if (!b) return b.error();
    const auto t0 = Clock::now();
    if (gloo.rank() < 2) {
      diags.set(gloo.rank(), r->comm->all_reduce(b->ptr(), b->ptr(), 8, DType::F32, ReduceOp::Sum, r->stream.get()));
    } else {
      std::this_thread::sleep_for(milliseconds(200));
      r->comm->abort("rank 2 gives up");
    }
    seconds.set(gloo.rank(), seconds_since(t0));
    return {};
  });
  for (int k = 0; k < 2; ++k) {
    const Result<void>& d = diags.v[static_cast<size_t>(k)];
    ASSERT_FALSE(d.ok()) << "rank " << k;
    EXPECT_THAT(d.error().message, AllOf(HasSubstr("all_reduce of 32 B (f32, sum) over group 0 (ranks 0 1 2) failed: ncclRemoteError"),
                                         HasSubstr("member 2 called ncclCommAbort")));
    EXPECT_GE(seconds.v[static_cast<size_t>(k)], 0.15) << "it waited for rank 2";
    EXPECT_LT(seconds.v[static_cast<size_t>(k)], 5.0);
  }
}

TEST(NcclFake, BlockingCallsEndAtTheFakeDeadline) {
  // Read at each blocking call; 2 s leaves the ranks time to meet first.
  ::setenv("FAKE_NCCL_TIMEOUT_MS", "2000", 1);
  nccl::Options opts;
  opts.nonblocking = false;
  PerRank<Result<void>> diags(2);
  std::atomic<bool> done{false};
  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo, opts);
    if (!r) return r.error();
    Result<cuda::Buffer> b = upload(*r, local(DType::F32, 4, gloo.rank()));
    if (!b) return b.error();
    if (gloo.rank() == 0) {
      diags.set(0, r->comm->all_reduce(b->ptr(), b->ptr(), 4, DType::F32, ReduceOp::Sum, r->stream.get()));
      done = true;
    } else {
      const auto t0 = Clock::now();
      while (!done && seconds_since(t0) < 20) std::this_thread::sleep_for(milliseconds(5));
    }
    return {};
  });
  ::unsetenv("FAKE_NCCL_TIMEOUT_MS");
  ASSERT_FALSE(diags.v[0].ok());
  EXPECT_THAT(diags.v[0].error().message,
              AllOf(HasSubstr("failed: ncclSystemError"), HasSubstr("timed out after 2000 ms"),
                    HasSubstr("members 1 never arrived")));
}

TEST(NcclFake, MismatchedCountsFailEveryMember) {
  PerRank<Result<void>> diags(2);
  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    const size_t count = gloo.rank() == 0 ? 8 : 16;
    Result<cuda::Buffer> b = upload(*r, local(DType::F32, 16, gloo.rank()));
    if (!b) return b.error();
    diags.set(gloo.rank(), r->comm->all_reduce(b->ptr(), b->ptr(), count, DType::F32, ReduceOp::Sum, r->stream.get()));
    return {};
  });
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(diags.v[static_cast<size_t>(k)].ok()) << "rank " << k;
    EXPECT_THAT(diags.v[static_cast<size_t>(k)].error().message,
                AllOf(HasSubstr("ncclInvalidUsage"), HasSubstr("all_reduce count 8 on member 0, 16 on member 1")))
        << "rank " << k;
  }
}

TEST(NcclFake, MismatchedSendAndReceiveFailBothSides) {
  PerRank<Result<void>> diags(2);
  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    Result<cuda::Buffer> b = upload(*r, local(DType::I32, 8, gloo.rank()));
    if (!b) return b.error();
    // Member 0 sends 3 to member 1, which expects 4.
    std::vector<Transfer> sends, recvs;
    if (gloo.rank() == 0) sends.push_back({1, b->ptr(), 3});
    if (gloo.rank() == 1) recvs.push_back({0, b->ptr(), 4});
    diags.set(gloo.rank(), r->comm->send_recv(sends, recvs, DType::I32, r->stream.get()));
    return {};
  });
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(diags.v[static_cast<size_t>(k)].ok()) << "rank " << k;
    EXPECT_THAT(diags.v[static_cast<size_t>(k)].error().message,
                HasSubstr("member 0 sends 3 i32 to member 1, which receives 4 i32 from it"))
        << "rank " << k;
  }
}

// ---- options, waiting, logs ------------------------------------------------------------------

TEST(NcclFake, CtaLimitsReachNccl) {
  nccl::Options opts;
  opts.max_ctas = 4;
  opts.min_ctas = 2;
  PerRank<std::vector<long long>> seen(2);
  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo, opts);
    if (!r) return r.error();
    // The ranks meet (through Gloo) between reading and splitting, so both read
    // after both inits and after both splits.
    auto barrier = [&] { return !!gloo.all_reduce(0, Tensor(DType::I32, {1}), ReduceOp::Sum).wait(); };
    std::vector<long long> v = {stat("max_ctas"), stat("min_ctas")};
    if (!barrier()) return diag("gloo barrier failed");
    // A split with its own options passes them on.
    nccl::Options more = opts;
    more.max_ctas = 8;
    nccl::Group g = r->comm->group();
    Result<std::unique_ptr<nccl::NcclComm>> c = r->comm->split(0, gloo.rank(), g, &more);
    if (!c) return c.error();
    if (!barrier()) return diag("gloo barrier failed");
    v.push_back(stat("max_ctas"));
    seen.set(gloo.rank(), v);
    return {};
  });
  for (int k = 0; k < 2; ++k) EXPECT_EQ(seen.v[static_cast<size_t>(k)], (std::vector<long long>{4, 2, 8})) << "rank " << k;

  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);  // NCCL's defaults
    if (!r) return r.error();
    seen.set(gloo.rank(), {stat("max_ctas"), stat("min_ctas")});
    return {};
  });
  for (int k = 0; k < 2; ++k) EXPECT_EQ(seen.v[static_cast<size_t>(k)], (std::vector<long long>{-1, -1})) << "rank " << k;
}

TEST(NcclFake, WaitWithTimeoutAfterCollectivesIsClean) {
  PerRank<std::vector<Result<void>>> waits(2);
  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    Result<cuda::Buffer> b = upload(*r, Tensor(DType::F32, {8}));
    if (!b) return b.error();
    std::vector<Result<void>> w;
    w.push_back(r->comm->wait_with_timeout(r->stream.get()));  // nothing enqueued yet
    for (int i = 0; i < 3; ++i)
      SF_TRY(r->comm->all_reduce(b->ptr(), b->ptr(), 8, DType::F32, ReduceOp::Max, r->stream.get()));
    w.push_back(r->comm->wait_with_timeout(r->stream.get(), milliseconds(50)));
    SF_TRY(r->comm->all_gather(b->ptr(), b->ptr() + 16, 4, DType::F32, r->stream.get()));
    w.push_back(r->comm->wait_with_timeout(r->stream.get()));
    waits.set(gloo.rank(), std::move(w));
    return {};
  });
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(waits.v[static_cast<size_t>(k)].size(), 3u);
    for (const Result<void>& w : waits.v[static_cast<size_t>(k)]) EXPECT_TRUE(succeeded(w));
  }
}

TEST(NcclFake, TheLogNamesEachCollectiveWithItsStream) {
  char path[] = "/tmp/sf_fake_nccl_logXXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ::setenv("FAKE_CUDA_LOG", path, 1);
  PerRank<std::string> streams(2);
  run(line(2), [&](Comm& gloo) -> Result<void> {
    Result<Rank> r = setup(gloo);
    if (!r) return r.error();
    Result<cuda::Buffer> send = upload(*r, local(DType::F32, 4, gloo.rank()));
    Result<cuda::Buffer> recv = upload(*r, Tensor(DType::F32, {8}));
    if (!send) return send.error();
    if (!recv) return recv.error();
    streams.set(gloo.rank(), hex(reinterpret_cast<uintptr_t>(r->stream.get())));
    SF_TRY(r->comm->all_gather(send->ptr(), recv->ptr(), 4, DType::F32, r->stream.get()));
    return r->comm->wait_with_timeout(r->stream.get());
  });
  ::unsetenv("FAKE_CUDA_LOG");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string log = ss.str();
  std::remove(path);
  EXPECT_THAT(log, HasSubstr("nccl init member=0/2 comm=0x"));
  EXPECT_THAT(log, HasSubstr("htod 16"));  // the fake driver writes to the same file
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(streams.v[static_cast<size_t>(k)].empty());
    EXPECT_THAT(log, HasSubstr("nccl all_gather count=4 type=f32 member=" + std::to_string(k) + "/2 stream=" +
                               streams.v[static_cast<size_t>(k)] + " comm=0x"))
        << log;
  }
}

}  // namespace fake_nccl_nccl_fake_test
}  // namespace sf
