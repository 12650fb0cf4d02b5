// An output that is a cast to f16/bf16 is rounded by its store alone
// (GroupValues::output_value): the bits of one rounding on the host, and in the PTX of
// pointwise, reduction and matmul-epilogue kernels no value rounded, widened back to
// f32 and rounded again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/reduction.h"
#include "tests/kernels/pointwise_util.h"

namespace sf {
namespace kernels_store_rounding_test {

using kernel_test::count_of;
using kernel_test::finish;
using pointwise_util::bf16_rne;
using pointwise_util::run_host;

// A cast to a 16-bit dtype that is an output is rounded by the store alone
// (GroupValues::output_value), once: the same bits as rounding the f32 value (by the
// compiler's own conversion here), including halfway cases, overflow to Inf and NaN;
// a second output reading the cast's value sees it rounded.
TEST(Precision, AStoredCastRoundsOnceAtTheStore) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    GraphBuilder b("cast_out");
    Value y = cast(b.param("x", DType::F32, {16}) * 3.0, dt);
    b.ret(y);
    b.ret(cast(y, DType::F32) * 2.0);
    Graph g = finish(b);
    const std::vector<float> xs = {1.0f, 1.0f / 3, 0x1.0101p0f / 3, 70000.0f, 1e38f, -1e38f, 21845.5f, -0.0f,
                                   std::nanf(""), std::numeric_limits<float>::infinity(), 1e-41f, 0x1.fffffep-2f,
                                   -7.5e-8f, 1.2e-38f, 65519.0f / 3, 0x1.7fp-120f};
    std::vector<Tensor> in = {Tensor(DType::F32, {16})};
    for (size_t i = 0; i < xs.size(); ++i) in[0].set(static_cast<int64_t>(i), xs[i]);
    Result<std::vector<Tensor>> got = run_host(g, in);
    ASSERT_TRUE(got.ok()) << got.error().str();
    for (size_t i = 0; i < xs.size(); ++i) {
      const float p = xs[i] * 3.0f;
      const float want = dt == DType::BF16 ? bf16_rne(p) : static_cast<float>(static_cast<_Float16>(p));
      const auto have = static_cast<float>((*got)[0].get(static_cast<int64_t>(i)));
      const auto twice = static_cast<float>((*got)[1].get(static_cast<int64_t>(i)));
      if (std::isnan(p)) {
        EXPECT_TRUE(std::isnan(have) && std::isnan(twice));
        continue;
      }
      EXPECT_EQ(have, want) << "x = " << xs[i];
      EXPECT_EQ(std::signbit(have), std::signbit(want)) << "x = " << xs[i];
      EXPECT_EQ(twice, want * 2.0f) << "x = " << xs[i];
    }
  }
}

// The PTX of a bf16 softmax and layer norm (reduction kernels, rows in registers,
// stores of 8 lanes): the vector stores convert pairs with cvt.rn.bf16x2.f32 straight
// from the f32 results; the only cvt.rn.bf16.f32 are the scalar path's, one for each
// 16-bit store; nothing is widened back (cvt.u32.u16) after a rounding.
TEST(ReductionNvptx, SixteenBitOutputsAreRoundedOnceByTheStore) {
  for (bool norm : {false, true}) {
    SCOPED_TRACE(norm ? "layer_norm" : "softmax");
    GraphBuilder b("red16");
    Value x = b.param("x", DType::BF16, {64, 4096});
    if (norm) {
      Value w = b.param("w", DType::F32, {4096});
      b.ret(layer_norm(x, w, b.param("bias", DType::F32, {4096}), 1e-5));
    } else {
      b.ret(softmax(x, -1));
    }
    KernelSpec spec{"red_kernel", KernelKind::Reduction, decompose(finish(b))};
    Result<EmittedKernel> k = reduction_emitter().emit(spec, {}, llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    const size_t pairs = count_of(*ptx, "cvt.rn.bf16x2.f32"), scalar = count_of(*ptx, "st.global.b16");
    EXPECT_GE(pairs, 4u) << *ptx;
    EXPECT_GE(scalar, 1u);
    EXPECT_EQ(count_of(*ptx, "cvt.rn.bf16.f32"), scalar);
    EXPECT_EQ(count_of(*ptx, "cvt.u32.u16"), 0u) << "a rounded value widened back to f32";
  }
}

}  // namespace kernels_store_rounding_test
}  // namespace sf
