// Every kernel kind at 2^24 elements or more, in each float storage dtype, on the
// host JIT against the reference evaluator: index arithmetic and loop bounds past
// the sizes the other tests use. (The matmul has K = 1 so that its 2^24 outputs
// cost the reference little.) In the sanitizer build, the test build CI runs, each kind
// runs in f32 and one 16-bit dtype (the two share the kernels' index arithmetic): the
// float64 reference and the 16-bit conversions around it are most of the time there.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/emitter.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/sanitized.h"

namespace sf {
namespace kernels_large_test {

constexpr int64_t k24 = int64_t{1} << 24;

Graph must(Result<Graph> g) {
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

void run_and_compare(KernelKind kind, const Graph& g, const std::string& what) {
  static int n = 0;
  std::string entry = "sf_large_" + std::to_string(n++);
  auto e = emitter_for(kind).emit(KernelSpec{entry, kind, g}, {}, llvmb::Target::host());
  ASSERT_TRUE(e.ok()) << what << ": " << e.error().message;
  auto fn = kernel_test::jit().add(std::move(e->module), std::move(e->context), e->entry);
  ASSERT_TRUE(fn.ok()) << what << ": " << fn.error().message;
  std::vector<Tensor> in = random_inputs(g, 9);
  std::vector<Tensor> out = kernel_test::output_tensors(g);
  kernel_test::ArgArray args = kernel_test::arg_array(in, out);
  reinterpret_cast<void (*)(void**)>(*fn)(args.data());
  auto want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << what;
  for (size_t o = 0; o < out.size(); ++o) {
    Comparison c = compare(out[o], (*want)[o], default_tolerance(out[o].dtype()));
    EXPECT_TRUE(c.ok()) << what << ": " << c.mismatches << " mismatches, first at " << c.first_mismatch
                        << ", max_abs_err " << c.max_abs_err;
  }
}

class Large : public ::testing::TestWithParam<DType> {
 protected:
  // Whether this build leaves `skipped` out (the sanitizer build's sample, above).
  bool sampled_out(DType skipped) const { return test::kSanitized && GetParam() == skipped; }
};

TEST_P(Large, PointwiseOver2To24Elements) {
  if (sampled_out(DType::BF16)) GTEST_SKIP() << "the sanitizer build's sample: f32 and f16 (tests/sanitized.h)";
  GraphBuilder b("pw");
  Value x = b.param("x", GetParam(), {k24 + 3});
  b.ret(sigmoid(x * 2.0) - x);
  run_and_compare(KernelKind::Pointwise, must(b.finish()), "pointwise");
}

TEST_P(Large, ReductionOverOneRowOf2To24) {
  if (sampled_out(DType::F16)) GTEST_SKIP() << "the sanitizer build's sample: f32 and bf16 (tests/sanitized.h)";
  GraphBuilder b("red");
  Value x = b.param("x", GetParam(), {k24});
  b.ret(sum(x * 0.5));
  run_and_compare(KernelKind::Reduction, must(b.finish()), "reduction");
}

TEST_P(Large, MatmulWith2To24Outputs) {
  if (sampled_out(DType::F16)) GTEST_SKIP() << "the sanitizer build's sample: f32 and bf16 (tests/sanitized.h)";
  GraphBuilder b("mm");
  Value x = b.param("x", GetParam(), {4096, 1});
  Value w = b.param("w", GetParam(), {1, 4097});
  b.ret(relu(matmul(x, w)));
  run_and_compare(KernelKind::Matmul, must(b.finish()), "matmul");
}

INSTANTIATE_TEST_SUITE_P(FloatDtypes, Large, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace kernels_large_test
}  // namespace sf
