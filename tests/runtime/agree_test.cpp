// Rank agreement over the comm backend: what the autotuner uses so that every rank
// runs rank 0's configs, whatever each rank would have chosen alone.
#include "runtime/comm/agree.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "tests/result_util.h"

namespace sf {
namespace runtime_agree_test {

DeviceMesh mesh_of(std::vector<MeshDim> dims) { return DeviceMesh(Mesh{std::move(dims)}); }

// Each rank starts from its own table (as if it had tuned alone, with different
// timing noise); after broadcast_text every rank holds rank 0's.
void expect_broadcast(const DeviceMesh& mesh) {
  std::mutex mu;
  std::vector<std::string> got(static_cast<size_t>(mesh.world()));
  Result<void> err = on_rank_threads(mesh, std::chrono::seconds(30), [&](Comm& c) -> Result<void> {
    std::string mine = "table of rank " + std::to_string(c.rank()) + std::string(static_cast<size_t>(c.rank()) * 3, 'x');
    Result<std::string> r = broadcast_text(c, mine);
    if (!r) return r.error();
    std::lock_guard<std::mutex> lock(mu);
    got[static_cast<size_t>(c.rank())] = *r;
    return {};
  });
  ASSERT_TRUE(succeeded(err));
  for (int r = 0; r < mesh.world(); ++r) EXPECT_EQ(got[static_cast<size_t>(r)], "table of rank 0") << "rank " << r;
}

TEST(Agree, BroadcastGivesRankZerosTextOnA1DMesh) { expect_broadcast(mesh_of({{"tp", 4}})); }
TEST(Agree, BroadcastGivesRankZerosTextOnA2DMesh) { expect_broadcast(mesh_of({{"dp", 2}, {"tp", 3}})); }
TEST(Agree, BroadcastOnOneRankIsTheIdentity) { expect_broadcast(mesh_of({})); }

TEST(Agree, LargeAndEmptyTextsSurvive) {
  DeviceMesh mesh = mesh_of({{"tp", 3}});
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  for (const std::string& text : {std::string(), big}) {
    std::mutex mu;
    std::vector<std::string> got(3);
    Result<void> err = on_rank_threads(mesh, std::chrono::seconds(30), [&](Comm& c) -> Result<void> {
      Result<std::string> r = broadcast_text(c, c.rank() == 0 ? text : std::string("other"));
      if (!r) return r.error();
      std::lock_guard<std::mutex> lock(mu);
      got[static_cast<size_t>(c.rank())] = *r;
      return {};
    });
    ASSERT_TRUE(succeeded(err));
    for (const std::string& g : got) EXPECT_EQ(g, text);
  }
}

TEST(Agree, AllGatherTextReturnsEveryRanksTextInRankOrder) {
  DeviceMesh mesh = mesh_of({{"dp", 2}, {"tp", 2}});
  std::mutex mu;
  std::vector<std::vector<std::string>> got(4);
  Result<void> err = on_rank_threads(mesh, std::chrono::seconds(30), [&](Comm& c) -> Result<void> {
    // Texts with spaces and digits: the packing must not be confused by them.
    Result<std::vector<std::string>> r = all_gather_text(c, "r" + std::to_string(c.rank()) + " 12 x");
    if (!r) return r.error();
    std::lock_guard<std::mutex> lock(mu);
    got[static_cast<size_t>(c.rank())] = *r;
    return {};
  });
  ASSERT_TRUE(succeeded(err));
  std::vector<std::string> want = {"r0 12 x", "r1 12 x", "r2 12 x", "r3 12 x"};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want) << "rank " << r;
}

TEST(Agree, AFailingRankEndsEveryRankWithItsReason) {
  DeviceMesh mesh = mesh_of({{"tp", 4}});
  auto t0 = std::chrono::steady_clock::now();
  // 60 s against a bound of 30 (tests/runtime/comm_test.cpp, kAtOnce).
  Result<void> err = on_rank_threads(mesh, std::chrono::seconds(60), [&](Comm& c) -> Result<void> {
    if (c.rank() == 0) return Diag{"", {}, "rank 0 could not tune"};
    Result<std::string> r = broadcast_text(c, "");
    if (!r) return r.error();
    return {};
  });
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().message, "rank 0 could not tune");
  // The peers were aborted, not left to time out.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST(Agree, TheRootCauseIsReportedBeforeAPeersEchoOfIt) {
  // Rank 1 returns at once with what a rank sees when another aborted (NCCL's
  // ncclRemoteError); rank 0, the one that failed, returns later, as a rank does
  // that timed out, aborted, then unwound. The caller must hear rank 0.
  DeviceMesh mesh = mesh_of({{"tp", 3}});
  Result<void> err = on_rank_threads(mesh, std::chrono::seconds(20), [&](Comm& c) -> Result<void> {
    if (c.rank() == 1) {
      Diag echo{"", {}, "rank 1: all_reduce failed: ncclRemoteError"};
      echo.from_peer = true;
      return echo;
    }
    if (c.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return Diag{"", {}, "rank 0: all_reduce timed out after 500 ms"};
    }
    return {};
  });
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().message, "rank 0: all_reduce timed out after 500 ms");
  EXPECT_FALSE(err.error().from_peer);
}

TEST(Agree, AnEchoIsReportedWhenNoRankSaysMore) {
  DeviceMesh mesh = mesh_of({{"tp", 2}});
  Result<void> err = on_rank_threads(mesh, std::chrono::seconds(20), [&](Comm& c) -> Result<void> {
    if (c.rank() != 1) return {};
    Diag echo{"", {}, "rank 1: aborted: rank 7 of another job failed"};
    echo.from_peer = true;
    return echo;
  });
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().message, "rank 1: aborted: rank 7 of another job failed");
}

}  // namespace runtime_agree_test
}  // namespace sf
