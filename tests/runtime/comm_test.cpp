#include "runtime/comm/comm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <latch>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace sf {
namespace runtime_comm_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- helpers ------------------------------------------------------------------------

// Runs fn(rank) on `world` threads, one per rank, and joins them.
void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : ts) t.join();
}

std::unique_ptr<Comm> connect(const std::shared_ptr<Rendezvous>& rv, int rank, int world,
                              const std::vector<std::vector<int>>& groups, milliseconds timeout = milliseconds(20000)) {
  CommOptions o;
  o.timeout = timeout;
  Result<std::unique_ptr<Comm>> c = Comm::create(rv, rank, world, groups, o);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  if (!c.ok()) return nullptr;
  return std::move(c).value();
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A tensor whose element at multi-index idx is f(idx), stored with set_int (exact
// for integers; the values chosen for floats are exactly representable).
Tensor make(DType t, const Shape& s, const std::function<int64_t(const std::vector<int64_t>&)>& f) {
  Tensor x(t, s);
  std::vector<int64_t> idx(s.size(), 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rem = i;
    for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % s[static_cast<size_t>(d)];
      rem /= s[static_cast<size_t>(d)];
    }
    x.set_int(i, f(idx));
  }
  return x;
}

// The value of the global test tensor at idx, per dtype: i64 values lie beyond 2^53
// (a double would round them), bf16 values are small integers (exact), bool cycles.
int64_t global_value(DType t, const std::vector<int64_t>& idx) {
  int64_t lin = 0;
  for (int64_t v : idx) lin = lin * 31 + v;
  switch (t) {
    case DType::I64: return (int64_t{1} << 60) + lin * 7 + 1;
    case DType::Bool: return lin % 3 == 0;
    case DType::BF16: return lin % 200 - 100;
    default: return lin * 3 - 50;
  }
}

// The block [off, off + size) along `dim` of the global tensor of shape `global`.
Tensor global_block(DType t, Shape global, int dim, int64_t off, int64_t size) {
  global[static_cast<size_t>(dim)] = size;
  return make(t, global, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> g = idx;
    g[static_cast<size_t>(dim)] += off;
    return global_value(t, g);
  });
}

// torch.chunk's extents of `extent` over `parts` (7 over 4 is 2, 2, 2, 1; 5 over 4
// is 2, 2, 1, 0), worked out here so test_runtime needs no sf_dist.
std::vector<int64_t> chunks(int64_t extent, int64_t parts) {
  int64_t c = (extent + parts - 1) / parts;
  std::vector<int64_t> out;
  for (int64_t k = 0; k < parts; ++k) out.push_back(std::max<int64_t>(0, std::min(c, extent - k * c)));
  return out;
}

int64_t offset_of(const std::vector<int64_t>& sizes, int k) {
  int64_t o = 0;
  for (int i = 0; i < k; ++i) o += sizes[static_cast<size_t>(i)];
  return o;
}

// Bit-identical tensors (same type, same bytes).
::testing::AssertionResult same(const Tensor& a, const Tensor& b) {
  if (!(a.type() == b.type())) return ::testing::AssertionFailure() << a.type().str() << " vs " << b.type().str();
  if (a.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) != 0) {
    for (int64_t i = 0; i < a.numel(); ++i)
      if (a.get_int(i) != b.get_int(i) || (a.get(i) != b.get(i) && !(std::isnan(a.get(i)) && std::isnan(b.get(i)))))
        return ::testing::AssertionFailure() << a.type().str() << " differs at flat index " << i << ": " << a.get(i)
                                             << " vs " << b.get(i);
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

Result<Tensor> wait_ok(Work& w) {
  Result<Tensor> r = w.wait();
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r;
}

const std::vector<std::vector<int>> kOneGroupOf4 = {{0, 1, 2, 3}};

// ---- all_gather -----------------------------------------------------------------------

TEST(CommAllGather, EvenUnevenAndEmptyExtentsAlongEveryDimForEveryDtype) {
  auto rv = Rendezvous::in_process();
  const std::vector<int64_t> extents = {20, 7, 5, 3, 0};  // 5x4 | 2,2,2,1 | 2,2,1,0 | 1,1,1,0 | 0x4
  const std::vector<DType> dtypes = {DType::F32, DType::BF16, DType::I64, DType::Bool};
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4);
    ASSERT_TRUE(comm);
    struct Case {
      Tensor expected;
      Work work;
      std::string what;
    };
    std::vector<Case> cases;
    // Issue everything first, then wait: the comm thread runs them in order.
    for (DType t : dtypes)
      for (int dim = 0; dim < 3; ++dim)
        for (int64_t e : extents) {
          Shape global = {2, 3, 4};
          global[static_cast<size_t>(dim)] = e;
          std::vector<int64_t> sizes = chunks(e, 4);
          Tensor local = global_block(t, global, dim, offset_of(sizes, rank), sizes[static_cast<size_t>(rank)]);
          Case c{global_block(t, global, dim, 0, e), {}, ""};
          c.what = std::string(dtype_name(t)) + " dim " + std::to_string(dim) + " extent " + std::to_string(e);
          // A negative dim counts from the end, as in torch.
          c.work = comm->all_gather(0, std::move(local), dim == 2 ? -1 : dim, sizes);
          cases.push_back(std::move(c));
        }
    for (Case& c : cases) {
      Result<Tensor> r = wait_ok(c.work);
      if (r.ok()) { EXPECT_TRUE(same(r.value(), c.expected)) << "rank " << rank << ": " << c.what; }
    }
  });
}

// ---- all_reduce -----------------------------------------------------------------------

TEST(CommAllReduce, SumMaxMinAvgOverEveryDtype) {
  auto rv = Rendezvous::in_process();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t big = int64_t{1} << 55;
  const int64_t i64max = std::numeric_limits<int64_t>::max();
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4);
    ASSERT_TRUE(comm);
    auto f32 = [](std::vector<double> v) {
      Tensor t(DType::F32, {static_cast<int64_t>(v.size())});
      for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
      return t;
    };
    auto typed = [](DType d, std::vector<int64_t> v) {
      Tensor t(d, {static_cast<int64_t>(v.size())});
      for (size_t i = 0; i < v.size(); ++i) t.set_int(static_cast<int64_t>(i), v[i]);
      return t;
    };
    const double r = rank;
    // Members' f32 values per element: [2^24, 1, 1, 0] reduce to 2^24 + 2 only when
    // summed exactly and rounded once (adding 1 to 2^24 in f32 is lost each time).
    Tensor x = f32({r == 0 ? 16777216.0 : (r < 3 ? 1.0 : 0.0), r + 1, -r, r == 1 ? nan : r});
    Work sum = comm->all_reduce(0, x, ReduceOp::Sum);
    Work mx = comm->all_reduce(0, x, ReduceOp::Max);
    Work mn = comm->all_reduce(0, x, ReduceOp::Min);
    Work avg = comm->all_reduce(0, x, ReduceOp::Avg);
    // bf16 near 256 has spacing 2: 256 + 1 + 1 rounds to 256 stepwise, 258 at once.
    Tensor b(DType::BF16, {2});
    b.set(0, rank == 0 ? 256.0 : (rank < 3 ? 1.0 : 0.0));
    b.set(1, 0.5 * (rank + 1));
    Work bsum = comm->all_reduce(0, b, ReduceOp::Sum);
    Work bavg = comm->all_reduce(0, b, ReduceOp::Avg);
    // i64 beyond 2^53, wrap-around, truncating avg.
    Tensor i = typed(DType::I64, {big + rank, rank == 0 ? i64max : (rank == 1 ? 1 : 0), -(rank + 1) - (rank == 3),
                                  (rank == 2 ? std::numeric_limits<int64_t>::min() : big * rank)});
    Work isum = comm->all_reduce(0, i, ReduceOp::Sum);
    Work imax = comm->all_reduce(0, i, ReduceOp::Max);
    Work imin = comm->all_reduce(0, i, ReduceOp::Min);
    Work iavg = comm->all_reduce(0, i, ReduceOp::Avg);
    Tensor bo = typed(DType::Bool, {rank < 2, 1, 0, rank == 3});
    Work bosum = comm->all_reduce(0, bo, ReduceOp::Sum);
    Work bomax = comm->all_reduce(0, bo, ReduceOp::Max);
    Work bomin = comm->all_reduce(0, bo, ReduceOp::Min);
    Work boavg = comm->all_reduce(0, bo, ReduceOp::Avg);
    Work empty = comm->all_reduce(0, Tensor(DType::F32, {0, 3}), ReduceOp::Sum);

    auto check_f = [&](Work& w, std::vector<double> want, const char* what) {
      Result<Tensor> res = wait_ok(w);
      if (!res.ok()) return;
      ASSERT_EQ(res->numel(), static_cast<int64_t>(want.size())) << what;
      for (size_t k = 0; k < want.size(); ++k) {
        double got = res->get(static_cast<int64_t>(k));
        if (std::isnan(want[k])) {
          EXPECT_TRUE(std::isnan(got)) << what << "[" << k << "] = " << got;
        } else {
          EXPECT_EQ(got, want[k]) << what << "[" << k << "]";
        }
      }
    };
    auto check_i = [&](Work& w, DType d, std::vector<int64_t> want, const char* what) {
      Result<Tensor> res = wait_ok(w);
      if (!res.ok()) return;
      EXPECT_EQ(res->dtype(), d) << what;
      ASSERT_EQ(res->numel(), static_cast<int64_t>(want.size())) << what;
      for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(res->get_int(static_cast<int64_t>(k)), want[k]) << what << "[" << k << "]";
    };
    check_f(sum, {16777218.0, 10, -6, nan}, "f32 sum");
    check_f(mx, {16777216.0, 4, 0, nan}, "f32 max");
    check_f(mn, {0, 1, -3, nan}, "f32 min");
    check_f(avg, {static_cast<double>(static_cast<float>(16777218.0 / 4)), 2.5, -1.5, nan}, "f32 avg");
    check_f(bsum, {258, 5}, "bf16 sum");
    check_f(bavg, {64.5, 1.25}, "bf16 avg");
    const int64_t wrapped = std::numeric_limits<int64_t>::min();  // INT64_MAX + 1
    // column 3: big*0 + big*1 + INT64_MIN + big*3 = INT64_MIN + 4*big (no wrap needed)
    check_i(isum, DType::I64, {4 * big + 6, wrapped, -11, wrapped + 4 * big}, "i64 sum");
    check_i(imax, DType::I64, {big + 3, i64max, -1, 3 * big}, "i64 max");
    check_i(imin, DType::I64, {big, 0, -5, wrapped}, "i64 min");
    // avg truncates toward zero: -11 / 4 = -2.
    check_i(iavg, DType::I64, {big + 1, wrapped / 4, -2, (wrapped + 4 * big) / 4}, "i64 avg");
    check_i(bosum, DType::Bool, {1, 1, 0, 1}, "bool sum");
    check_i(bomax, DType::Bool, {1, 1, 0, 1}, "bool max");
    check_i(bomin, DType::Bool, {0, 1, 0, 0}, "bool min");
    check_i(boavg, DType::Bool, {0, 1, 0, 0}, "bool avg");  // sums 2, 4, 0, 1 over 4: true only if all are
    Result<Tensor> e = wait_ok(empty);
    if (e.ok()) { EXPECT_EQ(e->shape(), (Shape{0, 3})); }
  });
}

// ---- reduce_scatter -------------------------------------------------------------------

TEST(CommReduceScatter, UnevenChunksAlongDim0AndDim1) {
  auto rv = Rendezvous::in_process();
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4);
    ASSERT_TRUE(comm);
    for (int dim = 0; dim < 2; ++dim)
      for (int64_t e : {int64_t{7}, int64_t{5}, int64_t{8}}) {
        Shape s = {3, 3};
        s[static_cast<size_t>(dim)] = e;
        std::vector<int64_t> sizes = chunks(e, 4);
        // Member k holds G + k, so the sum is 4 G + 6 and the max G + 3.
        auto g = [](const std::vector<int64_t>& idx) { return idx[0] * 10 + idx[1]; };
        Tensor local = make(DType::F32, s, [&](const std::vector<int64_t>& idx) { return g(idx) + rank; });
        Tensor li = make(DType::I64, s, [&](const std::vector<int64_t>& idx) { return (int64_t{1} << 58) * (idx[0] % 2) + g(idx) + rank; });
        Work ws = comm->reduce_scatter(0, local, dim, sizes, ReduceOp::Sum);
        Work wm = comm->reduce_scatter(0, local, dim, sizes, ReduceOp::Max);
        Work wi = comm->reduce_scatter(0, li, dim, sizes, ReduceOp::Sum);
        Shape cs = s;
        cs[static_cast<size_t>(dim)] = sizes[static_cast<size_t>(rank)];
        const int64_t off = offset_of(sizes, rank);
        auto at = [&](const std::vector<int64_t>& idx) {
          std::vector<int64_t> gi = idx;
          gi[static_cast<size_t>(dim)] += off;
          return gi;
        };
        Tensor want_s = make(DType::F32, cs, [&](const std::vector<int64_t>& idx) { return 4 * g(at(idx)) + 6; });
        Tensor want_m = make(DType::F32, cs, [&](const std::vector<int64_t>& idx) { return g(at(idx)) + 3; });
        Tensor want_i = make(DType::I64, cs, [&](const std::vector<int64_t>& idx) {
          std::vector<int64_t> gi = at(idx);
          return (int64_t{1} << 60) * (gi[0] % 2) + 4 * g(gi) + 6;
        });
        std::string what = "dim " + std::to_string(dim) + " extent " + std::to_string(e);
        Result<Tensor> rs = wait_ok(ws), rm = wait_ok(wm), ri = wait_ok(wi);
        if (rs.ok()) { EXPECT_TRUE(same(rs.value(), want_s)) << what; }
        if (rm.ok()) { EXPECT_TRUE(same(rm.value(), want_m)) << what; }
        if (ri.ok()) { EXPECT_TRUE(same(ri.value(), want_i)) << what; }
      }
  });
}

// ---- all_to_all -----------------------------------------------------------------------

// S(concat_dim) -> S(split_dim) of a global tensor, the way DTensor redistributes:
// every member holds its torch.chunk along concat_dim and ends with its chunk along
// split_dim.
TEST(CommAllToAll, UnevenSplitAndConcatDims) {
  auto rv = Rendezvous::in_process();
  struct Case {
    Shape global;
    int split_dim, concat_dim;
    DType t;
  };
  const std::vector<Case> cases = {
      {{10, 7}, 1, 0, DType::F32},     // rows 3,3,3,1 -> columns 2,2,2,1
      {{10, 7}, 0, 1, DType::I64},     // columns -> rows
      {{5, 3}, 1, 0, DType::BF16},     // rows 2,2,1,0 -> columns 1,1,1,0
      {{2, 6, 5}, 2, 1, DType::Bool},  // inner dims: both sides need packing
      {{3, 9, 4}, 0, 2, DType::F32},   // 3 over 4 is 1,1,1,0
      {{0, 4}, 1, 0, DType::F32},      // nothing to move
  };
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4);
    ASSERT_TRUE(comm);
    std::vector<Work> works;
    std::vector<Tensor> wants;
    for (const Case& c : cases) {
      std::vector<int64_t> recv = chunks(c.global[static_cast<size_t>(c.concat_dim)], 4);
      std::vector<int64_t> send = chunks(c.global[static_cast<size_t>(c.split_dim)], 4);
      Tensor local = global_block(c.t, c.global, c.concat_dim, offset_of(recv, rank), recv[static_cast<size_t>(rank)]);
      wants.push_back(global_block(c.t, c.global, c.split_dim, offset_of(send, rank), send[static_cast<size_t>(rank)]));
      works.push_back(comm->all_to_all(0, std::move(local), c.split_dim, send, c.concat_dim, recv));
    }
    // split_dim == concat_dim: chunks only change owners (all_to_all_single with
    // split sizes). Member k holds rows 2k, 2k + 1 of a [8, 3] tensor and sends the
    // first to member 0 and the second to member 1, so members 0 and 1 receive one
    // row from everyone (rows m, 2 + m, 4 + m, 6 + m) and members 2 and 3 nothing.
    const DType t = DType::I64;
    Tensor mine = make(t, {2, 3}, [&](const std::vector<int64_t>& idx) { return global_value(t, {2 * rank + idx[0], idx[1]}); });
    std::vector<int64_t> from = rank < 2 ? std::vector<int64_t>{1, 1, 1, 1} : std::vector<int64_t>{0, 0, 0, 0};
    works.push_back(comm->all_to_all(0, std::move(mine), 0, {1, 1, 0, 0}, 0, from));
    wants.push_back(make(t, {rank < 2 ? 4 : 0, 3}, [&](const std::vector<int64_t>& idx) {
      return global_value(t, {2 * idx[0] + rank, idx[1]});
    }));
    for (size_t k = 0; k < works.size(); ++k) {
      Result<Tensor> r = wait_ok(works[k]);
      if (r.ok()) { EXPECT_TRUE(same(r.value(), wants[k])) << "rank " << rank << " case " << k; }
    }
  });
}

// ---- a 2x2 mesh: two groups per rank, interleaved and asynchronous ------------------------

TEST(CommMesh2x2, InterleavedAsyncCollectivesOnBothMeshDims) {
  auto rv = Rendezvous::in_process();
  run_ranks(4, [&](int rank) {
    // Row-major 2x2: rank = 2 * c0 + c1. Along mesh dim 0 the group varies c0
    // ({0, 2}, {1, 3}); along mesh dim 1 it varies c1 ({0, 1}, {2, 3}).
    const int c0 = rank / 2, c1 = rank % 2;
    std::vector<std::vector<int>> groups = {{c1, 2 + c1}, {2 * c0, 2 * c0 + 1}};
    auto comm = connect(rv, rank, 4, groups);
    ASSERT_TRUE(comm);
    EXPECT_EQ(comm->group(0), groups[0]);
    std::vector<Work> works;
    std::vector<Tensor> wants;
    for (int round = 0; round < 6; ++round) {
      // all_reduce over dim 0: the sum of rank + round over {c1, 2 + c1}.
      Tensor x(DType::F32, {3});
      for (int64_t i = 0; i < 3; ++i) x.set(i, rank * 10 + i + round);
      works.push_back(comm->all_reduce(0, x, ReduceOp::Sum));
      Tensor want(DType::F32, {3});
      for (int64_t i = 0; i < 3; ++i) want.set(i, (c1 * 10 + i + round) + ((2 + c1) * 10 + i + round));
      wants.push_back(want);
      // all_gather over dim 1 along tensor dim 1, uneven (3 = 2 + 1).
      std::vector<int64_t> sizes = {2, 1};
      Tensor g = make(DType::I64, {2, sizes[static_cast<size_t>(c1)]}, [&](const std::vector<int64_t>& idx) {
        return (int64_t{1} << 54) + 1000 * c0 + 100 * round + 10 * idx[0] + idx[1] + (c1 == 1 ? 2 : 0);
      });
      works.push_back(comm->all_gather(1, g, 1, sizes));
      wants.push_back(make(DType::I64, {2, 3}, [&](const std::vector<int64_t>& idx) {
        return (int64_t{1} << 54) + 1000 * c0 + 100 * round + 10 * idx[0] + idx[1];
      }));
      // all_to_all over dim 0 (rows -> columns of a [4, 4] block per column of the mesh).
      Tensor a = make(DType::F32, {2, 4}, [&](const std::vector<int64_t>& idx) {
        return 100 * c1 + 10 * (2 * c0 + idx[0]) + idx[1] + round;
      });
      works.push_back(comm->all_to_all(0, a, 1, {2, 2}, 0, {2, 2}));
      wants.push_back(make(DType::F32, {4, 2}, [&](const std::vector<int64_t>& idx) {
        return 100 * c1 + 10 * idx[0] + (2 * c0 + idx[1]) + round;
      }));
      // reduce_scatter over dim 1.
      Tensor rsx = make(DType::F32, {3, 2}, [&](const std::vector<int64_t>& idx) { return rank + idx[0] * 2 + idx[1]; });
      works.push_back(comm->reduce_scatter(1, rsx, 0, {2, 1}, ReduceOp::Max));
      Tensor rsw = make(DType::F32, {c1 == 0 ? 2 : 1, 2}, [&](const std::vector<int64_t>& idx) {
        return (2 * c0 + 1) + (idx[0] + (c1 == 0 ? 0 : 2)) * 2 + idx[1];
      });
      wants.push_back(rsw);
    }
    // Wait newest first: a result must not depend on waiting in order.
    for (size_t k = works.size(); k-- > 0;) {
      Result<Tensor> r = wait_ok(works[k]);
      if (r.ok()) { EXPECT_TRUE(same(r.value(), wants[k])) << "rank " << rank << " op " << k; }
    }
  });
}

// ---- rendezvous through a directory ---------------------------------------------------

fs::path fresh_dir(const std::string& name) {
  std::string tmpl = (fs::temp_directory_path() / ("sf-" + name + "-XXXXXX")).string();
  char* p = ::mkdtemp(tmpl.data());
  EXPECT_NE(p, nullptr);
  return fs::path(tmpl);
}

TEST(CommFileStore, RankThreadsWithSeparateRendezvousObjectsMeetThroughADirectory) {
  fs::path dir = fresh_dir("comm-threads");
  run_ranks(4, [&](int rank) {
    auto rv = Rendezvous::file(dir.string());  // one object per rank, like one per process
    auto comm = connect(rv, rank, 4, {{0, 1, 2, 3}, {rank}});
    ASSERT_TRUE(comm);
    Tensor x(DType::F32, {2});
    x.set(0, rank);
    x.set(1, 1);
    Work w = comm->all_reduce(0, x, ReduceOp::Sum);
    Work g = comm->all_gather(0, Tensor(DType::I64, {rank == 3 ? 0 : 1}), 0, {1, 1, 1, 0});
    Work id = comm->all_reduce(1, x, ReduceOp::Avg);  // a group of one: the identity
    Result<Tensor> r = wait_ok(w);
    if (r.ok()) {
      EXPECT_EQ(r->get(0), 6.0);
      EXPECT_EQ(r->get(1), 4.0);
    }
    Result<Tensor> rg = wait_ok(g);
    if (rg.ok()) { EXPECT_EQ(rg->shape(), (Shape{3})); }
    Result<Tensor> ri = wait_ok(id);
    if (ri.ok()) { EXPECT_TRUE(same(ri.value(), x)); }
  });
  fs::remove_all(dir);
}

// Separate processes, the way a multi-process run meets: each child builds its own
// Rendezvous::file on the shared directory and exits 0 only if its result is right.
TEST(CommFileStore, ForkedProcessesMeetThroughADirectory) {
  fs::path dir = fresh_dir("comm-procs");
  constexpr int kWorld = 3;
  std::vector<pid_t> kids;
  for (int rank = 0; rank < kWorld; ++rank) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 1;
      {
        CommOptions o;
        o.timeout = milliseconds(10000);
        auto c = Comm::create(Rendezvous::file(dir.string()), rank, kWorld, {{0, 1, 2}}, o);
        if (c.ok()) {
          Tensor x(DType::I64, {1});
          x.set_int(0, (int64_t{1} << 60) + rank);
          Result<Tensor> r = c.value()->all_reduce(0, x, ReduceOp::Sum).wait();
          if (r.ok() && r->get_int(0) == 3 * (int64_t{1} << 60) + 3) code = 0;
        }
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << pid << " status " << status;
  }
  fs::remove_all(dir);
}

// ---- faults ---------------------------------------------------------------------------

// Tests of "ends at once, not after the timeout" give their Comms kLongTimeout and
// bound the time by kAtOnce, half of it. The two outcomes are then 30 s apart: a
// loaded 2-core machine under ASan slows connecting and aborting by seconds (the
// bounds were 2-4 s against a 10 s timeout), never by 30, and a broken abort still
// fails (it waits the whole minute).
constexpr milliseconds kLongTimeout(60000);
constexpr double kAtOnce = 30.0;

TEST(CommFaults, ARankThatNeverCallsTheCollectiveMakesTheOthersTimeOut) {
  auto rv = Rendezvous::in_process();
  const milliseconds timeout(1000);
  std::latch others_done(3);
  std::atomic<double> slowest_wait{0}, slowest_destroy{0};
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4, timeout);
    ASSERT_TRUE(comm);
    if (rank == 3) {
      others_done.wait();  // alive, connected, but silent
    } else {
      auto t0 = Clock::now();
      Work w = comm->all_gather(0, Tensor(DType::F32, {2, 2}), 0, {2, 2, 2, 2});
      Result<Tensor> r = w.wait();
      double waited = seconds_since(t0);
      double prev = slowest_wait.load();
      while (waited > prev && !slowest_wait.compare_exchange_weak(prev, waited)) {}
      ASSERT_FALSE(r.ok());
      EXPECT_THAT(r.error().message, StartsWith("rank " + std::to_string(rank) + ": all_gather over group 0 (ranks 0 1 2 3)"));
      EXPECT_THAT(r.error().message, HasSubstr("timed out after 1 s"));
      EXPECT_EQ(r.error().file, "");
      // The group is unusable now; later ops say so at once.
      Result<Tensor> later = comm->all_reduce(0, Tensor(DType::F32, {1}), ReduceOp::Sum).wait();
      ASSERT_FALSE(later.ok());
      EXPECT_THAT(later.error().message, HasSubstr("timed out"));
      others_done.count_down();
    }
    auto t1 = Clock::now();
    comm.reset();
    double d = seconds_since(t1);
    double prev = slowest_destroy.load();
    while (d > prev && !slowest_destroy.compare_exchange_weak(prev, d)) {}
  });
  EXPECT_GE(slowest_wait.load(), 0.9);
  EXPECT_LT(slowest_wait.load(), 3.0);  // timeout + 2 s
  EXPECT_LT(slowest_destroy.load(), 1.0);
}

TEST(CommFaults, AbortFromOneRankEndsEveryPendingWaitAtOnce) {
  auto rv = Rendezvous::in_process();
  const milliseconds timeout(kLongTimeout);  // the waits must end long before this
  std::atomic<double> slowest_wait{0};
  auto t_start = Clock::now();
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4, timeout);
    ASSERT_TRUE(comm);
    if (rank == 1) {
      std::this_thread::sleep_for(milliseconds(200));  // let the others block in Gloo
      comm->abort("rank 1 failed: boom");
    } else {
      auto t0 = Clock::now();
      Work a = comm->all_gather(0, Tensor(DType::F32, {2}), 0, {2, 2, 2, 2});
      Work b = comm->all_reduce(0, Tensor(DType::F32, {2}), ReduceOp::Sum);  // queued behind a
      for (Work* w : {&a, &b}) {
        Result<Tensor> r = w->wait();
        ASSERT_FALSE(r.ok());
        EXPECT_THAT(r.error().message, StartsWith("rank " + std::to_string(rank) + ": "));
        EXPECT_THAT(r.error().message, HasSubstr("over group 0 (ranks 0 1 2 3) aborted: rank 1 failed: boom"));
      }
      double waited = seconds_since(t0);
      double prev = slowest_wait.load();
      while (waited > prev && !slowest_wait.compare_exchange_weak(prev, waited)) {}
    }
    // Later collectives fail at once too.
    Result<Tensor> later = comm->all_reduce(0, Tensor(DType::F32, {1}), ReduceOp::Sum).wait();
    ASSERT_FALSE(later.ok());
    EXPECT_THAT(later.error().message, HasSubstr("rank 1 failed: boom"));
  });  // destructors run here: they must not wait for the 10 s timeout
  EXPECT_LT(slowest_wait.load(), kAtOnce);
  EXPECT_LT(seconds_since(t_start), kAtOnce);
  EXPECT_EQ(rv->aborted(), std::optional<std::string>("rank 1 failed: boom"));
}

TEST(CommFaults, AbortBeforeOrWhileConnectingFailsCreate) {
  auto rv = Rendezvous::in_process();
  auto t0 = Clock::now();
  run_ranks(2, [&](int rank) {
    if (rank == 0) {
      CommOptions o;
      o.timeout = kLongTimeout;
      // Rank 1 never joins group {0, 1} but aborts the rendezvous instead.
      Result<std::unique_ptr<Comm>> c = Comm::create(rv, 0, 2, {{0, 1}}, o);
      ASSERT_FALSE(c.ok());
      EXPECT_THAT(c.error().message, HasSubstr("aborted: rank 1 gave up"));
    } else {
      auto solo = connect(rv, 1, 2, {{1}});
      ASSERT_TRUE(solo);
      std::this_thread::sleep_for(milliseconds(200));
      solo->abort("rank 1 gave up");
    }
  });
  EXPECT_LT(seconds_since(t0), kAtOnce);
  Result<std::unique_ptr<Comm>> again = Comm::create(rv, 0, 2, {{0, 1}}, {});
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.error().message, HasSubstr("rank 1 gave up"));
}

// The executor's pattern: a rank fails (and aborts) right after its own create,
// while the others are still connecting, some not even started. Nobody may be left
// in Gloo's pair connect (5 x the timeout, and not interruptible) by a peer that
// gave up half way.
TEST(CommFaults, AbortWhileOthersAreStillConnectingStrandsNobody) {
  for (int late : {0, 2, 3}) {
    for (int delay_ms : {0, 30, 150}) {
      auto rv = Rendezvous::in_process();
      auto t0 = Clock::now();
      run_ranks(4, [&](int rank) {
        if (rank == late) std::this_thread::sleep_for(milliseconds(delay_ms));
        CommOptions o;
        o.timeout = kLongTimeout;
        Result<std::unique_ptr<Comm>> c = Comm::create(rv, rank, 4, {{0, 1, 2, 3}, {rank}}, o);
        if (rank == 1) {
          ASSERT_TRUE(c.ok()) << c.error().message;
          (*c)->abort("rank 1 failed early");
          return;
        }
        if (!c.ok()) {
          EXPECT_THAT(c.error().message, HasSubstr("rank 1 failed early"));
          return;
        }
        Result<Tensor> r = (*c)->all_reduce(0, Tensor(DType::F32, {1}), ReduceOp::Sum).wait();
        ASSERT_FALSE(r.ok());
        EXPECT_THAT(r.error().message, HasSubstr("rank 1 failed early"));
      });
      EXPECT_LT(seconds_since(t0), kAtOnce) << "late rank " << late << " by " << delay_ms << " ms";
    }
  }
}

TEST(CommFaults, ConnectingTimesOutWhenARankNeverJoins) {
  auto rv = Rendezvous::in_process();
  auto t0 = Clock::now();
  run_ranks(2, [&](int rank) {
    CommOptions o;
    o.timeout = milliseconds(1000);
    Result<std::unique_ptr<Comm>> c = Comm::create(rv, rank, 3, {{0, 1, 2}}, o);  // rank 2 never comes
    ASSERT_FALSE(c.ok());
    EXPECT_THAT(c.error().message,
                StartsWith("rank " + std::to_string(rank) + ": connecting group 0 (ranks 0 1 2) timed out after 1 s"));
  });
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(CommFaults, MembersThatDisagreeGetADiagAtOnceNotAHang) {
  auto rv = Rendezvous::in_process();
  auto t0 = Clock::now();
  run_ranks(4, [&](int rank) {
    auto comm = connect(rv, rank, 4, kOneGroupOf4, kLongTimeout);
    ASSERT_TRUE(comm);
    // Collective #0: everyone agrees. #1: rank 2 reduces a longer tensor.
    // #2 (never reached on a healthy group): rank 0 gathers where others reduce.
    Result<Tensor> ok = comm->all_reduce(0, Tensor(DType::F32, {4}), ReduceOp::Sum).wait();
    EXPECT_TRUE(ok.ok());
    Result<Tensor> bad = comm->all_reduce(0, Tensor(DType::F32, {rank == 2 ? 5 : 4}), ReduceOp::Sum).wait();
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(bad.error().message, HasSubstr("the members disagree"));
    EXPECT_THAT(bad.error().message, HasSubstr(rank == 2 ? "rank 0's shape, dims or sizes do not match this rank's f32[5]"
                                                         : "rank 2's shape, dims or sizes do not match this rank's f32[4]"));
  });
  auto rv2 = Rendezvous::in_process();
  run_ranks(2, [&](int rank) {
    auto comm = connect(rv2, rank, 2, {{0, 1}}, kLongTimeout);
    ASSERT_TRUE(comm);
    Result<Tensor> r = rank == 0 ? comm->all_gather(0, Tensor(DType::I64, {3}), 0, {3, 3}).wait()
                                 : comm->all_reduce(0, Tensor(DType::I64, {3}), ReduceOp::Max).wait();
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message,
                HasSubstr(rank == 0 ? "rank 1 issued all_reduce on i64 (max) as collective #0 on this group, while this "
                                      "rank issued all_gather on i64"
                                    : "rank 0 issued all_gather on i64 as collective #0"));
  });
  EXPECT_LT(seconds_since(t0), kAtOnce);  // far from the timeout
}

TEST(CommFaults, ARankWithBadArgumentsFailsItsPeersAtOnce) {
  for (bool linger : {true, false}) {
    auto rv = Rendezvous::in_process();
    auto t0 = Clock::now();
    std::latch first_done(4), checked(4);
    run_ranks(4, [&](int rank) {
      auto comm = connect(rv, rank, 4, kOneGroupOf4, kLongTimeout);
      ASSERT_TRUE(comm);
      EXPECT_TRUE(comm->all_gather(0, Tensor(DType::F32, {2}), 0, {2, 2, 2, 2}).wait().ok());
      first_done.arrive_and_wait();
      // Rank 0 passes three sizes for a group of four. Its Work fails at once;
      // the peers' fail as soon as rank 0's comm thread gets there (linger), or
      // when rank 0 destroys its Comm right away (the cause is recorded either way).
      std::vector<int64_t> sizes = rank == 0 ? std::vector<int64_t>{2, 2, 2} : std::vector<int64_t>{2, 2, 2, 2};
      Result<Tensor> bad = comm->all_gather(0, Tensor(DType::F32, {2}), 0, sizes).wait();
      ASSERT_FALSE(bad.ok());
      EXPECT_THAT(bad.error().message, StartsWith("rank " + std::to_string(rank) + ": all_gather"));
      EXPECT_THAT(bad.error().message,
                  HasSubstr("rank 0: all_gather over group 0 (ranks 0 1 2 3): sizes [2, 2, 2] has 3 entries"));
      if (rank == 0 && !linger) comm.reset();
      checked.arrive_and_wait();
    });
    EXPECT_LT(seconds_since(t0), kAtOnce);  // not the timeout
  }
}

// Processes learn of another's abort when its connections reset; DIR/sf-abort says why.
TEST(CommFaults, AbortReachesRanksWithTheirOwnDirectoryRendezvous) {
  fs::path dir = fresh_dir("comm-abort");
  std::atomic<double> slowest{0};
  auto t0 = Clock::now();
  run_ranks(4, [&](int rank) {
    auto rv = Rendezvous::file(dir.string());
    auto comm = connect(rv, rank, 4, kOneGroupOf4, kLongTimeout);
    ASSERT_TRUE(comm);
    if (rank == 1) {
      std::this_thread::sleep_for(milliseconds(200));
      comm->abort("rank 1 failed: boom");
      return;
    }
    auto t1 = Clock::now();
    Work a = comm->all_gather(0, Tensor(DType::F32, {2}), 0, {2, 2, 2, 2});
    Work b = comm->all_reduce(0, Tensor(DType::F32, {2}), ReduceOp::Sum);
    for (Work* w : {&a, &b}) {
      Result<Tensor> r = w->wait();
      ASSERT_FALSE(r.ok());
      EXPECT_THAT(r.error().message, HasSubstr("over group 0 (ranks 0 1 2 3) aborted: rank 1 failed: boom"));
    }
    double waited = seconds_since(t1);
    double prev = slowest.load();
    while (waited > prev && !slowest.compare_exchange_weak(prev, waited)) {}
    EXPECT_EQ(rv->aborted(), std::optional<std::string>("rank 1 failed: boom"));
  });
  EXPECT_LT(slowest.load(), kAtOnce);
  EXPECT_LT(seconds_since(t0), kAtOnce);
  fs::remove_all(dir);
}

// ---- arguments and trivial groups -----------------------------------------------------

TEST(CommArguments, BadArgumentsAreDiagsWithoutCommunicating) {
  auto rv = Rendezvous::in_process();
  EXPECT_FALSE(Comm::create(rv, 2, 2, {{0, 1}}, {}).ok());
  EXPECT_THAT(Comm::create(rv, 0, 2, {{1}}, {}).error().message, HasSubstr("does not hold rank 0"));
  EXPECT_THAT(Comm::create(rv, 0, 2, {{0, 0}}, {}).error().message, HasSubstr("does not hold rank 0 once"));
  EXPECT_THAT(Comm::create(rv, 0, 2, {{0, 5}}, {}).error().message, HasSubstr("outside the world"));

  auto comm = connect(rv, 0, 1, {{0}});
  ASSERT_TRUE(comm);
  Tensor x(DType::F32, {4, 2});
  auto err = [](Work w) {
    Result<Tensor> r = w.wait();
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.error().message;
  };
  EXPECT_THAT(err(comm->all_reduce(3, x, ReduceOp::Sum)), HasSubstr("rank 0: all_reduce over group 3: no group 3"));
  EXPECT_THAT(err(comm->all_gather(0, x, 2, {4})), HasSubstr("dim 2 is out of range for f32[4, 2]"));
  EXPECT_THAT(err(comm->all_gather(0, x, 0, {4, 1})), HasSubstr("has 2 entries for a group of 1"));
  EXPECT_THAT(err(comm->all_gather(0, x, 0, {3})), HasSubstr("extent 3 along dim 0"));
  EXPECT_THAT(err(comm->reduce_scatter(0, x, 1, {3}, ReduceOp::Sum)), HasSubstr("sum to 3"));
  EXPECT_THAT(err(comm->all_to_all(0, x, 0, {4}, 1, {1})), HasSubstr("recv_sizes"));
  EXPECT_THAT(err(comm->all_gather(0, x, 0, {-4})), HasSubstr("invalid extent"));

  // A group of one is the identity.
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.25 * static_cast<double>(i));
  Work a = comm->all_reduce(0, x, ReduceOp::Avg);
  Work g = comm->all_gather(0, x, 1, {2});
  Work rs = comm->reduce_scatter(0, x, 0, {4}, ReduceOp::Sum);
  Work t = comm->all_to_all(0, x, 0, {4}, 1, {2});
  for (Work* w : {&a, &g, &rs, &t}) {
    Result<Tensor> r = wait_ok(*w);
    if (r.ok()) { EXPECT_TRUE(same(r.value(), x)); }
  }
  // wait() hands the result over once.
  Result<Tensor> twice = a.wait();
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.error().message, HasSubstr("wait() called twice"));
  EXPECT_FALSE(Work().wait().ok());
}

TEST(CommArguments, ASecondCommOnTheSameRendezvousMeetsItsOwnPeers) {
  auto rv = Rendezvous::in_process();
  for (int gen = 0; gen < 2; ++gen)
    run_ranks(2, [&](int rank) {
      auto comm = connect(rv, rank, 2, {{0, 1}});
      ASSERT_TRUE(comm);
      Tensor x(DType::I64, {1});
      x.set_int(0, rank + 10 * gen);
      Result<Tensor> r = comm->all_reduce(0, x, ReduceOp::Sum).wait();
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r->get_int(0), 1 + 20 * gen);
    });
}

}  // namespace runtime_comm_test
}  // namespace sf
