// The along-dim emitter (codegen/kernels/along.h): cumsum, argmax and argmin as host
// kernels against values worked out by hand, the f32 running sum of 16-bit inputs,
// the first index on ties and NaN winning, and the NVPTX kernels through ptxas for
// sm_80 and sm_90a.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include <limits>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/kernels/along.h"

namespace sf {
namespace kernels_scan_test {

using kernel_test::finish;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor tensor(DType t, Shape s, const std::vector<double>& v) {
  Tensor x(t, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) x.set(static_cast<int64_t>(i), v[i]);
  return x;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get(i));
  return v;
}

std::vector<int64_t> ivalues(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_int(i));
  return v;
}

// One along-dim op of a param of type `t`, run as its host kernel.
Tensor run_one(DType dt, Shape shape, const std::vector<double>& in, const std::function<Value(Value)>& op) {
  GraphBuilder b("along");
  b.ret(op(b.param("x", dt, shape)));
  Graph g = finish(b);
  Result<std::vector<Tensor>> got = kernel_test::run_emitted(
      emitter_for(KernelKind::Gather).emit(KernelSpec{"sf_along", KernelKind::Gather, g}, {}, llvmb::Target::host()), g,
      {tensor(dt, std::move(shape), in)});
  EXPECT_TRUE(got.ok()) << got.error().str();
  return got.ok() ? (*got)[0] : Tensor(DType::F32, {0});
}

TEST(AlongHost, CumsumAlongEachDim) {
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(values(run_one(DType::F32, {2, 3}, x, [](Value v) { return cumsum(v, 0); })),
            (std::vector<double>{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(values(run_one(DType::F32, {2, 3}, x, [](Value v) { return cumsum(v, 1); })),
            (std::vector<double>{1, 3, 6, 4, 9, 15}));
  // The middle dim of [2, 2, 2]: rows start at 0, 1, 4, 5 and step by 2.
  EXPECT_EQ(values(run_one(DType::F32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, [](Value v) { return cumsum(v, 1); })),
            (std::vector<double>{1, 2, 4, 6, 5, 6, 12, 14}));
}

TEST(AlongHost, CumsumOfIntegersIsI64AndOf16BitsRunsInF32) {
  Tensor i = run_one(DType::I32, {3}, {2147483647, 1, -5}, [](Value v) { return cumsum(v, 0); });
  EXPECT_EQ(i.dtype(), DType::I64);
  EXPECT_EQ(ivalues(i), (std::vector<int64_t>{2147483647, 2147483648, 2147483643}));
  EXPECT_EQ(ivalues(run_one(DType::Bool, {4}, {1, 0, 1, 1}, [](Value v) { return cumsum(v, 0); })),
            (std::vector<int64_t>{1, 1, 2, 3}));
  // An f16 running sum would stay at 2048 (2048 + 1 rounds back to it); the f32 one
  // reaches 2050 at the third element, as torch's GPU kernel does.
  EXPECT_EQ(values(run_one(DType::F16, {3}, {2048, 1, 1}, [](Value v) { return cumsum(v, 0); })),
            (std::vector<double>{2048, 2048, 2050}));
  EXPECT_EQ(values(run_one(DType::BF16, {3}, {256, 1, 1}, [](Value v) { return cumsum(v, 0); })),
            (std::vector<double>{256, 256, 258}));
}

TEST(AlongHost, ArgmaxArgminFirstIndexOnTiesAndNaNWins) {
  const std::vector<double> x = {1, 5, 5, 0,  kNaN, 2, kNaN, -1,  -2, -2, 7, -2};
  Tensor mx = run_one(DType::F32, {3, 4}, x, [](Value v) { return argmax(v, 1); });
  EXPECT_EQ(mx.dtype(), DType::I64);
  EXPECT_EQ(ivalues(mx), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(ivalues(run_one(DType::F32, {3, 4}, x, [](Value v) { return argmin(v, 1); })),
            (std::vector<int64_t>{3, 0, 0}));
  Tensor k = run_one(DType::F32, {3, 4}, x, [](Value v) { return argmax(v, 0, true); });
  EXPECT_EQ(k.shape(), (Shape{1, 4}));
  EXPECT_EQ(ivalues(k), (std::vector<int64_t>{1, 0, 1, 0}));
  // A NaN after the max still wins; one before it is never replaced.
  EXPECT_EQ(ivalues(run_one(DType::BF16, {2, 3}, {1, 9, kNaN, kNaN, 9, 1}, [](Value v) { return argmax(v, 1); })),
            (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(ivalues(run_one(DType::I32, {2, 3, 2}, {4, 9, 1, 9, 3, -9, 0, 0, 0, 0, -1, 0},
                            [](Value v) { return argmin(v, 1); })),
            (std::vector<int64_t>{1, 2, 2, 0}));
}

TEST(AlongHost, BadConfigsAndGroupsAreErrors) {
  GraphBuilder b("along");
  Value x = b.param("x", DType::F32, {4});
  b.ret(cumsum(x, 0));
  Graph g = finish(b);
  KernelConfig small;
  small.block = 16;
  Result<EmittedKernel> k = emit_along(KernelSpec{"sf_a", KernelKind::Gather, g}, small, llvmb::Target::nvptx("sm_80"));
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().str().find("block must be 32..1024"), std::string::npos) << k.error().str();
  GraphBuilder two("two");
  Value y = two.param("y", DType::F32, {4});
  two.ret(cumsum(exp(y), 0));
  Graph g2 = finish(two);
  Result<EmittedKernel> e = emit_along(KernelSpec{"sf_b", KernelKind::Gather, g2}, {}, llvmb::Target::host());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().str().find("one cumsum, argmax or argmin of a param"), std::string::npos) << e.error().str();
}

TEST(AlongNvptx, KernelsAssembleForSm80AndSm90a) {
  GraphBuilder c("scan16");
  c.ret(cumsum(c.param("x", DType::F16, {5, 7, 3}), 1));
  GraphBuilder i("scan_i32");
  i.ret(cumsum(i.param("x", DType::I32, {9, 4}), 0));
  GraphBuilder a("argmax_f32");
  a.ret(argmax(a.param("x", DType::F32, {6, 33}), 1));
  GraphBuilder m("argmin_bf16");
  m.ret(argmin(m.param("x", DType::BF16, {4, 6}), 0, true));
  const Graph graphs[] = {finish(c), finish(i), finish(a), finish(m)};
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const Graph& g : graphs) {
      SCOPED_TRACE(std::string(arch) + " " + g.name());
      Result<EmittedKernel> k =
          emitter_for(KernelKind::Gather).emit(KernelSpec{g.name(), KernelKind::Gather, g}, {}, llvmb::Target::nvptx(arch));
      ASSERT_TRUE(k.ok()) << k.error().str();
      Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      EXPECT_EQ(ptx->find("call"), std::string::npos) << "a call is left in the PTX";
      EXPECT_EQ(ptx->find(".local"), std::string::npos) << "the running value was not promoted to registers";
      EXPECT_NE(ptx->find("ld.global"), std::string::npos);
      EXPECT_NE(ptx->find("st.global"), std::string::npos);
      if (kernel_test::have_ptxas()) {
        EXPECT_EQ(kernel_test::ptxas_failure(*ptx, arch), "");
      }
    }
}

}  // namespace kernels_scan_test
}  // namespace sf
