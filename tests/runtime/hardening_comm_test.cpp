// Issue 14, class 4: ranks that disagree. A collective's header names both sides'
// shapes and dims (not only byte counts, which can be equal for different shapes),
// and agree_on_run fails every rank alike, naming the rank and the parts that differ.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/agree.h"
#include "runtime/comm/comm.h"
#include "tests/result_util.h"

namespace sf {
namespace runtime_hardening_comm_test {

using ::testing::HasSubstr;
using ::testing::Not;

void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : ts) t.join();
}

std::unique_ptr<Comm> connect(const std::shared_ptr<Rendezvous>& rv, int rank, int world) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  Result<std::unique_ptr<Comm>> c = Comm::create(rv, rank, world, {all}, o);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  if (!c.ok()) return nullptr;
  return std::move(c).value();
}

// Before: "rank 1's shape, dims or sizes do not match this rank's f32[6, 3] (it
// would send 36 bytes, this rank expects 36)": equal counts, nothing to go on.
TEST(HardeningCommHeader, AShapeMismatchWithEqualByteCountsNamesBothShapes) {
  auto rv = Rendezvous::in_process();
  run_ranks(2, [&](int rank) {
    auto comm = connect(rv, rank, 2);
    ASSERT_TRUE(comm);
    Shape s = rank == 0 ? Shape{6, 3} : Shape{3, 6};
    Result<Tensor> r = comm->all_reduce(0, Tensor(DType::F32, s), ReduceOp::Sum).wait();
    ASSERT_FALSE(r.ok());
    const std::string peer = rank == 0 ? "rank 1" : "rank 0";
    const std::string mine = rank == 0 ? "f32[6, 3]" : "f32[3, 6]", theirs = rank == 0 ? "f32[3, 6]" : "f32[6, 3]";
    EXPECT_THAT(r.error().message,
                HasSubstr(peer + " issued all_reduce on " + theirs + ", this rank all_reduce on " + mine));
    EXPECT_THAT(r.error().message, Not(HasSubstr("bytes")));
  });
}

TEST(HardeningCommHeader, ADimMismatchWithEqualByteCountsNamesBothDims) {
  auto rv = Rendezvous::in_process();
  run_ranks(2, [&](int rank) {
    auto comm = connect(rv, rank, 2);
    ASSERT_TRUE(comm);
    // Both gather f32[2, 2] chunks (16 bytes each way), along different dims.
    Result<Tensor> r = comm->all_gather(0, Tensor(DType::F32, {2, 2}), rank, {2, 2}).wait();
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message,
                HasSubstr(rank == 0 ? "rank 1 issued all_gather on f32[2, 2] along dim 1, this rank all_gather on "
                                      "f32[2, 2] along dim 0"
                                    : "rank 0 issued all_gather on f32[2, 2] along dim 0, this rank all_gather on "
                                      "f32[2, 2] along dim 1"));
  });
}

TEST(HardeningAgree, EveryRankFailsAndNamesWhatDiffers) {
  auto rv = Rendezvous::in_process();
  std::vector<std::string> msgs(3);
  run_ranks(3, [&](int rank) {
    auto comm = connect(rv, rank, 3);
    ASSERT_TRUE(comm);
    RunDigest d;
    d.add("graph", rank == 2 ? std::string(300, 'b') : std::string(300, 'a'));  // long: a digest
    d.add("options", rank == 1 ? "fuse=no" : "fuse=yes");                       // short: shown
    d.add("inputs", Digest().update("same"));
    Result<void> e = agree_on_run(*comm, d);
    ASSERT_FALSE(e.ok()) << "rank " << rank;
    msgs[static_cast<size_t>(rank)] = e.error().message;
  });
  for (int r = 0; r < 3; ++r) {
    const std::string& m = msgs[static_cast<size_t>(r)];
    EXPECT_THAT(m, HasSubstr("rank " + std::to_string(r) + ": the ranks disagree on what to run")) << m;
    // The lowest rank that differs, the same on every rank.
    EXPECT_THAT(m, HasSubstr("rank 1's options 'fuse=no' differs from rank 0's 'fuse=yes'")) << m;
    EXPECT_THAT(m, Not(HasSubstr("'s graph"))) << m;  // equal on ranks 0 and 1
    EXPECT_THAT(m, Not(HasSubstr("'s inputs"))) << m;
  }
}

TEST(HardeningAgree, RanksThatAgreeGoOn) {
  auto rv = Rendezvous::in_process();
  run_ranks(2, [&](int rank) {
    auto comm = connect(rv, rank, 2);
    ASSERT_TRUE(comm);
    RunDigest d;
    d.add("graph", std::string(500, 'g'));
    d.add("options", "x");
    EXPECT_TRUE(succeeded(agree_on_run(*comm, d)));
    // The comm is still usable afterwards.
    EXPECT_TRUE(comm->all_reduce(0, Tensor(DType::F32, {2}), ReduceOp::Sum).wait().ok());
  });
}

TEST(HardeningAgree, DigestsDifferForDifferentBytes) {
  EXPECT_NE(Digest().update("abc").hex(), Digest().update("abd").hex());
  EXPECT_EQ(Digest().update("ab").update("c").hex(), Digest().update("abc").hex());
}

// --timeout bounds set-up and connecting together (the CLI passes its start plus
// the timeout as connect_deadline): a deadline already spent fails at once, saying
// so, instead of waiting the whole timeout again.
TEST(HardeningConnect, ADeadlineSpentBeforeConnectingFailsAtOnceAndSaysWhy) {
  auto rv = Rendezvous::in_process();
  CommOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  o.connect_deadline = std::chrono::steady_clock::now() - std::chrono::milliseconds(1);
  Result<std::unique_ptr<Comm>> c = Comm::create(rv, 0, 2, {{0, 1}}, o);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("the 60 s timeout was spent before it began"));
  EXPECT_THAT(c.error().message, HasSubstr("bounds set-up and connecting together"));
}

// A member that never calls Comm::create is named (the first one found missing).
TEST(HardeningConnect, AMemberThatNeverJoinsIsNamed) {
  auto rv = Rendezvous::in_process();
  CommOptions o;
  o.timeout = std::chrono::milliseconds(300);
  std::vector<std::string> errors(3);
  run_ranks(3, [&](int r) {
    if (r == 1) return;  // never joins
    Result<std::unique_ptr<Comm>> c = Comm::create(rv, r, 3, {{0, 1, 2}}, o);
    errors[static_cast<size_t>(r)] = c.ok() ? "connected" : c.error().message;
  });
  for (int r : {0, 2}) EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("rank 1 never joined")) << r;
}

}  // namespace runtime_hardening_comm_test
}  // namespace sf
