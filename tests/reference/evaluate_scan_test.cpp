// The reference semantics of cumsum, argmax, argmin and mean's count, value by value,
// against values worked out by hand (torch.cumsum, torch.argmax, torch.argmin).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/reference/test_util.h"

namespace sf {
namespace reference_evaluate_scan_test {

using test::finish;
using test::itensor;
using test::ivalues;
using test::run;
using test::tensor;
using test::values;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();

TEST(EvaluateScan, CumsumAlongEachDimOfAMatrix) {
  GraphBuilder b("c");
  Value x = b.param("x", DType::F32, {2, 3});
  b.ret(cumsum(x, 0));
  b.ret(cumsum(x, -1));
  auto out = run(finish(b), {tensor(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6})});
  EXPECT_EQ(values(out[0]), (std::vector<double>{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(values(out[1]), (std::vector<double>{1, 3, 6, 4, 9, 15}));
}

TEST(EvaluateScan, CumsumOfIntegersAndBoolsIsI64AndWraps) {
  GraphBuilder b("c");
  Value i = b.param("i", DType::I32, {3});
  Value f = b.param("f", DType::Bool, {4});
  Value l = b.param("l", DType::I64, {2});
  b.ret(cumsum(i, 0));
  b.ret(cumsum(f, 0));
  b.ret(cumsum(l, 0));
  auto out = run(finish(b), {itensor(DType::I32, {3}, {2147483647, 1, -5}), itensor(DType::Bool, {4}, {1, 0, 1, 1}),
                             itensor(DType::I64, {2}, {kMax, 2})});
  EXPECT_EQ(out[0].dtype(), DType::I64);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{2147483647, 2147483648, 2147483643}));  // no i32 wrap
  EXPECT_EQ(ivalues(out[1]), (std::vector<int64_t>{1, 1, 2, 3}));
  EXPECT_EQ(ivalues(out[2]), (std::vector<int64_t>{kMax, kMin + 1}));  // int64 wraps, as torch
}

TEST(EvaluateScan, CumsumOfF16RoundsEachPrefixOnce) {
  // 2048 + 1 + 1: f16 holds 2048 and 2050 but not 2049; accumulated in float64 and
  // rounded per element, the prefixes are 2048, 2049 -> 2048 (ties to even), 2050.
  GraphBuilder b("c");
  b.ret(cumsum(b.param("h", DType::F16, {3}), 0));
  auto out = run(finish(b), {tensor(DType::F16, {3}, {2048, 1, 1})});
  EXPECT_EQ(values(out[0]), (std::vector<double>{2048, 2048, 2050}));
}

TEST(EvaluateScan, ArgmaxArgminTakeTheFirstIndexOnTiesAndNaNWins) {
  GraphBuilder b("a");
  Value x = b.param("x", DType::F32, {3, 4});
  b.ret(argmax(x, 1));
  b.ret(argmin(x, 1));
  b.ret(argmax(x, 0, true));
  auto out = run(finish(b), {tensor(DType::F32, {3, 4}, {1, 5, 5, 0,       // max tie: 1; min: 3
                                                      kNaN, 2, kNaN, -1,  // the first NaN: 0 for both
                                                      -2, -2, 7, -2})});  // min tie: 0
  EXPECT_EQ(out[0].dtype(), DType::I64);
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(ivalues(out[1]), (std::vector<int64_t>{3, 0, 0}));
  EXPECT_EQ(out[2].shape(), (Shape{1, 4}));
  EXPECT_EQ(ivalues(out[2]), (std::vector<int64_t>{1, 0, 1, 0}));  // columns 0 and 2: the NaN of row 1; 3: 0 > -1 > -2
}

TEST(EvaluateScan, ArgmaxOfIntegersAlongTheMiddleDim) {
  GraphBuilder b("a");
  b.ret(argmin(b.param("i", DType::I32, {2, 3, 2}), 1));
  auto out = run(finish(b), {itensor(DType::I32, {2, 3, 2}, {4, 9, 1, 9, 3, -9,  //
                                                             0, 0, 0, 0, -1, 0})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(ivalues(out[0]), (std::vector<int64_t>{1, 2, 2, 0}));
}

TEST(EvaluateScan, MeanWithACountDividesTheSumByIt) {
  // What a rank holding 2 of 7 rows computes: its rows' sum over the global count.
  GraphBuilder b("m");
  Value x = b.param("x", DType::F32, {2, 2});
  b.ret(b.op(OpKind::Mean, {x}, {}, {{"dims", AttrValue(std::vector<int64_t>{0})}, {"count", AttrValue(int64_t{7})}}));
  b.ret(mean(x, {0}));
  auto out = run(finish(b), {tensor(DType::F32, {2, 2}, {1, 2, 6, 12})});
  EXPECT_EQ(values(out[0]), (std::vector<double>{1, 2}));
  EXPECT_EQ(values(out[1]), (std::vector<double>{3.5, 7}));
}

}  // namespace reference_evaluate_scan_test
}  // namespace sf
