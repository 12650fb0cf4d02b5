// Where f16/bf16 values are rounded in a fused kernel: `--precision fused` (f32 inside,
// one rounding at the store, Inductor's default) against `eager` (every op's result
// rounded, as eager PyTorch), the 16-bit erf, and the packed conversions' lanes. Host
// kernels against the reference, and NVPTX through compile_to_ptx. No GPU is needed.
// (Split from pointwise_test.cpp, which keeps the emitter's other checks.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/pointwise_util.h"

namespace sf {
namespace kernels_precision_test {

using kernel_test::finish;
using kernel_test::have_ptxas;
using kernel_test::jit;
using kernel_test::module_text;
using kernel_test::ptxas_failure;
using pointwise_util::bf16_rne;
using pointwise_util::emit_ptx;
using pointwise_util::Fill;
using pointwise_util::make_inputs;
using pointwise_util::Ptx;
using pointwise_util::run_host;
using pointwise_util::spec_of;

// ---- precision: where f16/bf16 values are rounded ---------------------------------------------

// y = ((x * 3 + 1) * 0.1 - x) / 7 over bf16 x, the host kernel under both precisions:
// Eager rounds every op's result to bf16 (what eager PyTorch and the reference give),
// Fused computes in f32 and rounds once at the store (Inductor's default), which is
// closer to the exact result.
TEST(Precision, FusedRoundsOnceAtTheStoreEagerAtEveryOp) {
  GraphBuilder b("chain");
  Value x = b.param("x", DType::BF16, {4096});
  b.ret(((x * 3.0 + 1.0) * 0.1 - x) / 7.0);
  Graph g = finish(b);
  std::vector<Tensor> in = make_inputs(g, 7);
  const float c01 = 0.1f, c7 = 7.0f;  // a weak literal keeps its f32 value (PyTorch's op-math)
  double err_fused = 0, err_eager = 0;
  int differ = 0;
  std::map<Precision, std::vector<Tensor>> got;
  for (Precision p : {Precision::Fused, Precision::Eager}) {
    KernelSpec spec = spec_of(g);
    spec.precision = p;
    Result<std::vector<Tensor>> r = kernel_test::run_emitted(emitter_for(KernelKind::Pointwise).emit(spec, {}, llvmb::Target::host()), g, in);
    ASSERT_TRUE(r.ok()) << r.error().str();
    got[p] = std::move(r).value();
  }
  for (int64_t i = 0; i < 4096; ++i) {
    const auto xv = static_cast<float>(in[0].get(i));
    if (!std::isfinite(xv)) {  // the inputs include NaN and infinities: the same in both
      EXPECT_EQ(std::isnan(got[Precision::Eager][0].get(i)), std::isnan(got[Precision::Fused][0].get(i)));
      continue;
    }
    const float eager = bf16_rne(bf16_rne(bf16_rne(bf16_rne(bf16_rne(xv * 3.0f) + 1.0f) * c01) - xv) / c7);
    const float fused = bf16_rne((((xv * 3.0f) + 1.0f) * c01 - xv) / c7);
    ASSERT_EQ(static_cast<float>(got[Precision::Eager][0].get(i)), eager) << "x = " << xv;
    ASSERT_EQ(static_cast<float>(got[Precision::Fused][0].get(i)), fused) << "x = " << xv;
    const double exact = ((double(xv) * 3 + 1) * double(c01) - xv) / 7;
    if (!std::isfinite(fused) || !std::isfinite(eager)) continue;  // overflowed (x near bf16's largest)
    err_fused += std::abs(fused - exact);
    err_eager += std::abs(eager - exact);
    differ += fused != eager;
  }
  EXPECT_GT(differ, 100) << "the two precisions should differ on this chain";
  EXPECT_LT(err_fused, err_eager) << "one rounding should be closer to the exact result than five";
}

// A fused kernel keeps exp(x) of f16 x in f32 where the reference rounds it to f16,
// so the f32 product differs from the reference by f16's rounding: more than f32's
// tolerance allows, within what check_tolerance gives (f16's, the least precise
// dtype the output is computed from). Eager meets f32's own tolerance.
TEST(Precision, ChecksAllowForTheLeastPreciseDtypeAnOutputIsComputedFrom) {
  GraphBuilder b("mixed");
  Value x = b.param("x", DType::F16, {64, 33});
  Value y = b.param("y", DType::F32, {33});
  Value a = exp(x) * y;  // f32 from an f16 exp
  b.ret(a);
  b.ret(cast(x, DType::I32));
  Graph g = finish(b);
  EXPECT_EQ(check_tolerance(g, g.outputs()[0].value).rtol, default_tolerance(DType::F16).rtol);
  EXPECT_EQ(check_tolerance(g, g.outputs()[1].value).rtol, 0.0) << "integers stay exact";
  EXPECT_EQ(check_tolerance(g, y.id).rtol, default_tolerance(DType::F32).rtol);
  std::vector<Tensor> in = make_inputs(g, 12, {Fill::Small, Fill::Small});
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok());
  Result<std::vector<Tensor>> fused = run_host(g, in, {}, Precision::Fused);
  Result<std::vector<Tensor>> eager = run_host(g, in, {}, Precision::Eager);
  ASSERT_TRUE(fused.ok() && eager.ok());
  EXPECT_FALSE(compare((*fused)[0], (*want)[0], default_tolerance(DType::F32)).ok());
  EXPECT_TRUE(compare((*fused)[0], (*want)[0], check_tolerance(g, g.outputs()[0].value)).ok());
  EXPECT_TRUE(compare((*eager)[0], (*want)[0], default_tolerance(DType::F32)).ok());
}

// erf_for_16bit, built for the host as `float f(float)` and swept over the f32
// inputs (every 61st bit pattern from 0 to 6.0, plus the specials) against the float64
// erf. The bound it documents (2e-7 absolute, and relative where erf is a normal
// float; a subnormal result has fewer bits than that) is under 3 f32 ulps near 1 and
// a twenty-thousandth of a bf16 ulp: the kernels that use it round to 16 bits.
TEST(ElementCodegen, ErfFor16BitIsWithin2e7OfErf) {
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto m = std::make_unique<llvm::Module>("erf16", *ctx);
  const llvmb::Target target = llvmb::Target::host();
  llvmb::prepare_module(*m, target);
  llvm::IRBuilder<> b(*ctx);
  auto* fty = llvm::FunctionType::get(b.getFloatTy(), {b.getFloatTy()}, false);
  llvm::Function* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, "erf16", *m);
  b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", fn));
  kernels::ElementCodegen cg(b, *m, target);
  b.CreateRet(cg.erf_for_16bit(fn->getArg(0)));
  std::optional<std::string> bad = llvmb::verify(*m);
  ASSERT_FALSE(bad) << *bad;
  Result<void*> sym = jit().add(std::move(m), std::move(ctx), "erf16");
  ASSERT_TRUE(sym.ok()) << sym.error().str();
  auto erf16 = reinterpret_cast<float (*)(float)>(*sym);
  double worst_abs = 0, worst_rel = 0;
  float at_abs = 0, at_rel = 0;
  for (uint32_t bits = 0; bits <= 0x40C00000u; bits += 61) {
    float x;
    std::memcpy(&x, &bits, 4);
    const double want = std::erf(static_cast<double>(x));
    for (float sx : {x, -x}) {
      const double got = erf16(sx), w = sx < 0 ? -want : want;
      const double a = std::abs(got - w);
      const double r = std::abs(w) >= std::numeric_limits<float>::min() ? a / std::abs(w) : 0;
      if (a > worst_abs) worst_abs = a, at_abs = sx;
      if (r > worst_rel) worst_rel = r, at_rel = sx;
    }
  }
  EXPECT_LT(worst_abs, 2e-7) << "at x = " << at_abs;
  EXPECT_LT(worst_rel, 2e-7) << "at x = " << at_rel;
  EXPECT_GT(worst_abs, 0) << "not libm's erff either";
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(erf16(inf), 1.0f);
  EXPECT_EQ(erf16(-inf), -1.0f);
  EXPECT_EQ(erf16(100.0f), 1.0f);
  EXPECT_TRUE(std::isnan(erf16(std::nanf(""))));
  EXPECT_TRUE(std::signbit(erf16(-0.0f)));
  EXPECT_EQ(erf16(-0.0f), 0.0f);
  EXPECT_EQ(erf16(1e-30f), static_cast<float>(std::erf(1e-30)));  // t * q(0): no cancellation
}

// A bf16 erf under Fused precision stores what rounding libm's erff to bf16 stores,
// but at the odd rounding boundary: over 65536 inputs (every positive bf16 from 2^-31
// to 2^96, the same negated, then uniform ones in [-1, 1)), at most a handful differ,
// each by one bf16 ulp.
TEST(Precision, SixteenBitErfRoundsLikeLibmsErff) {
  GraphBuilder b("erf");
  Value x = b.param("x", DType::BF16, {65536});
  b.ret(unary(OpKind::Erf, x));
  Graph g = finish(b);
  std::vector<Tensor> in = make_inputs(g, 5, {Fill::Small});
  for (int64_t i = 0; i < 32768; ++i) {
    uint32_t bits = static_cast<uint32_t>(i % 16384 + 0x3000) << 16;  // 2^-31 .. 2^96
    float f;
    std::memcpy(&f, &bits, 4);
    in[0].set(i, i < 16384 ? f : -f);
  }
  Result<std::vector<Tensor>> got = run_host(g, in, {}, Precision::Fused);
  ASSERT_TRUE(got.ok()) << got.error().str();
  int differ = 0;
  for (int64_t i = 0; i < 65536; ++i) {
    const auto xv = static_cast<float>(in[0].get(i));
    const float want = bf16_rne(std::erf(xv));
    const auto have = static_cast<float>((*got)[0].get(i));
    if (have == want) continue;
    ++differ;
    EXPECT_LE(std::abs(have - want), std::abs(want) * 0x1p-7f) << "x = " << xv;  // one bf16 ulp
  }
  EXPECT_LE(differ, 8);
}

// Which erf each kernel calls: a bf16 or f16 node under Fused precision takes
// erf_for_16bit (no libdevice call, one ex2.approx.ftz); f32, and any dtype under
// Eager (bit-exact with eager PyTorch), keep __nv_erff. So does the f32 erf inside a
// decomposed bf16 GELU (f32 inside, cast back to bf16 at the end), unless its f32
// value also leaves the kernel.
TEST(PointwiseNvptx, SixteenBitErfUnderFusedPrecisionSkipsLibdevice) {
  auto fast = [](const Ptx& p) {
    const bool lib = p.ir.find("@__nv_erff") != std::string::npos;
    const bool ex2 = p.ptx.find("ex2.approx.ftz.f32") != std::string::npos;
    EXPECT_TRUE(lib || ex2) << p.ptx;
    return !lib;
  };
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (Precision pr : {Precision::Fused, Precision::Eager}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (pr == Precision::Fused ? " fused" : " eager"));
      GraphBuilder b("gelu");
      Value x = b.param("x", dt, {4096});
      b.ret(unary(OpKind::Erf, (x + b.param("bias", dt, {4096})) * 0.7071067811865476));
      EXPECT_EQ(fast(emit_ptx(finish(b), "sm_90a", {}, pr)), dt != DType::F32 && pr == Precision::Fused);
      GraphBuilder b2("bias_gelu");
      Value h = b2.param("h", dt, {4096});
      b2.ret(gelu(h + b2.param("bias", dt, {4096})));
      EXPECT_EQ(fast(emit_ptx(decompose(finish(b2)), "sm_90a", {}, pr)), dt != DType::F32 && pr == Precision::Fused);
    }
  }
}

// rounded_to_16bit on a decomposed bf16 GELU and its variations: the f32 erf is
// rounded on every way out, until an f32 output, a comparison or a cast to an integer
// sees it.
TEST(ElementCodegen, RoundedTo16BitFollowsEveryPathToTheOutputs) {
  auto erf_rounded = [](const Graph& g) {
    std::vector<bool> r = kernels::rounded_to_16bit(g);
    for (size_t i = 0; i < g.nodes().size(); ++i)
      if (g.node(static_cast<ValueId>(i)).op == OpKind::Erf) return static_cast<bool>(r[i]);
    ADD_FAILURE() << "no erf";
    return false;
  };
  auto make = [](int variant) {
    GraphBuilder b("g");
    Value x = b.param("x", DType::BF16, {64});
    Value e = unary(OpKind::Erf, cast(x, DType::F32) * 0.7071067811865476);
    Value y = cast(cast(x, DType::F32) * 0.5 * (e + 1.0), DType::BF16);
    b.ret(y);
    if (variant == 1) b.ret(e * 2.0);                          // an f32 output
    if (variant == 2) b.ret(cast(e, DType::I32));              // a cast to an integer
    if (variant == 3) b.ret(binary(OpKind::Gt, e, 0.5));       // a comparison
    if (variant == 4) b.ret(cast(reshape(e * 3.0, {8, 8}), DType::F16));  // a view, then f16
    return finish(b);
  };
  EXPECT_TRUE(erf_rounded(make(0)));
  EXPECT_FALSE(erf_rounded(make(1)));
  EXPECT_FALSE(erf_rounded(make(2)));
  EXPECT_FALSE(erf_rounded(make(3)));
  EXPECT_TRUE(erf_rounded(make(4)));
}

// Packed conversions for wide f16/bf16 stores: `cvt.rn.bf16x2.f32 d, a, b` puts a's
// conversion in d's upper half and b's in its lower half (PTX ISA, "cvt"), and the
// lower half is the element at the lower address. So the lane stored first must be
// the instruction's second operand. Checked on a function whose lanes are its two
// parameters, read back from the PTX's register names.
TEST(PointwiseNvptx, PackedConversionsPutLaneZeroInTheLowerHalf) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    llvm::LLVMContext ctx;
    llvm::Module m("pair", ctx);
    const llvmb::Target target = llvmb::Target::nvptx("sm_90a");
    llvmb::prepare_module(m, target);
    llvm::IRBuilder<> b(ctx);
    auto* fty = llvm::FunctionType::get(b.getVoidTy(), {b.getFloatTy(), b.getFloatTy(), llvm::PointerType::get(ctx, 1)}, false);
    llvm::Function* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, "pair", m);
    llvmb::mark_kernel(*fn, 1);
    b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
    kernels::ElementCodegen cg(b, m, target);
    b.CreateAlignedStore(cg.narrow_vector(dt, {fn->getArg(0), fn->getArg(1)}), fn->getArg(2), llvm::Align(4));
    b.CreateRetVoid();
    Result<std::string> ptx = llvmb::compile_to_ptx(m, "sm_90a");
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    auto reg_of = [&](const std::string& param) {  // "ld.param.f32 %f1, [pair_param_0];" -> "%f1"
      size_t at = ptx->find("[pair_param_" + param + "]");
      if (at == std::string::npos) return std::string();
      size_t line = ptx->rfind('\n', at) + 1;
      size_t r = ptx->find('%', line);
      return ptx->substr(r, ptx->find(',', r) - r);
    };
    const std::string lane0 = reg_of("0"), lane1 = reg_of("1");
    ASSERT_FALSE(lane0.empty()) << *ptx;
    ASSERT_FALSE(lane1.empty()) << *ptx;
    const std::string cvt = dt == DType::BF16 ? "cvt.rn.bf16x2.f32" : "cvt.rn.f16x2.f32";
    size_t at = ptx->find(cvt);
    ASSERT_NE(at, std::string::npos) << *ptx;
    std::string line = ptx->substr(at, ptx->find('\n', at) - at);
    EXPECT_NE(line.find(", " + lane1 + ", " + lane0 + ";"), std::string::npos) << line << "\n" << *ptx;
  }
}

}  // namespace kernels_precision_test
}  // namespace sf
