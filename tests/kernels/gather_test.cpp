// The gather (embedding) emitter: host JIT results against the reference evaluator,
// and PTX that ptxas accepts.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "codegen/ir/builder.h"
#include "codegen/kernels/gather.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_gather_test {

Graph embedding_group(DType idx, DType w, Shape ishape, int64_t rows, int64_t cols) {
  GraphBuilder b("g");
  Value i = b.param("in0", idx, ishape);
  Value wt = b.param("in1", w, {rows, cols});
  b.ret(embedding(i, wt));
  Result<Graph> g = b.finish();
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

TEST(Gather, HostMatchesTheReferenceForEveryIndexAndWeightDtype) {
  int n = 0;
  for (DType idt : {DType::I32, DType::I64})
    for (DType wdt : {DType::F32, DType::BF16, DType::F16, DType::I64}) {
      Graph g = embedding_group(idt, wdt, {3, 5}, 7, 9);
      std::vector<Tensor> in = random_inputs(g, 5);  // indices drawn in [0, 7)
      auto want = evaluate(g, in);
      ASSERT_TRUE(want.ok());
      std::string entry = "sf_gather_" + std::to_string(n++);
      auto e = emit_gather(KernelSpec{entry, KernelKind::Gather, g}, {}, llvmb::Target::host());
      ASSERT_TRUE(e.ok()) << e.error().message;
      auto fn = kernel_test::jit().add(std::move(e->module), std::move(e->context), e->entry);
      ASSERT_TRUE(fn.ok()) << fn.error().message;
      Tensor out(wdt, {3, 5, 9});
      void* args[] = {in[0].data(), in[1].data(), out.data()};
      reinterpret_cast<void (*)(void**)>(*fn)(args);
      ASSERT_EQ(std::memcmp(out.data(), (*want)[0].data(), out.nbytes()), 0) << dtype_name(idt) << " " << dtype_name(wdt);
    }
}

TEST(Gather, OutOfRangeIndicesGiveZeros) {
  Graph g = embedding_group(DType::I64, DType::F32, {3}, 2, 2);
  auto e = emit_gather(KernelSpec{"sf_gather_oob", KernelKind::Gather, g}, {}, llvmb::Target::host());
  ASSERT_TRUE(e.ok());
  auto fn = kernel_test::jit().add(std::move(e->module), std::move(e->context), e->entry);
  ASSERT_TRUE(fn.ok());
  Tensor idx(DType::I64, {3}), w(DType::F32, {2, 2}), out(DType::F32, {3, 2});
  idx.set_int(0, 1), idx.set_int(1, -1), idx.set_int(2, 5);
  for (int k = 0; k < 4; ++k) w.set(k, k + 1);  // rows [1 2] [3 4]
  void* args[] = {idx.data(), w.data(), out.data()};
  reinterpret_cast<void (*)(void**)>(*fn)(args);
  const double want[] = {3, 4, 0, 0, 0, 0};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(out.get(k), want[k]) << k;
}

TEST(Gather, PtxForSm90aPassesPtxas) {
  Graph g = embedding_group(DType::I32, DType::BF16, {4, 128}, 1000, 64);
  auto e = emit_gather(KernelSpec{"sf_gather_ptx", KernelKind::Gather, g}, {}, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->launch.block[0], 256);
  EXPECT_EQ(e->launch.grid[0], 4 * 128 * 64 / 256);
  auto ptx = llvmb::compile_to_ptx(*e->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().message;
  EXPECT_NE(ptx->find(".entry sf_gather_ptx"), std::string::npos);
  if (!kernel_test::have_ptxas()) GTEST_SKIP() << "ptxas not found";
  EXPECT_EQ(kernel_test::ptxas_failure(*ptx, "sm_90a"), "");
}

TEST(Gather, OtherGroupsAreDiags) {
  GraphBuilder b("g");
  Value x = b.param("x", DType::F32, {4});
  b.ret(relu(x));
  Result<Graph> g = b.finish();
  ASSERT_TRUE(g.ok());
  auto e = emit_gather(KernelSpec{"sf_x", KernelKind::Gather, *g}, {}, llvmb::Target::host());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("one embedding"), std::string::npos);
}

}  // namespace kernels_gather_test
}  // namespace sf
