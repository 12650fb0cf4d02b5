// erf for values rounded to 16 bits (element.h: ElementCodegen::erf_for_16bit,
// rounded_to_16bit; docs/kernels.md, "Dtypes").
#include "codegen/kernels/element.h"

#include <cmath>
#include <iterator>
#include <limits>
#include <numbers>
#include <span>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

namespace sf {
namespace kernels {

std::vector<bool> rounded_to_16bit(const Graph& g) {
  const size_t n = g.nodes().size();
  auto half = [](DType t) { return t == DType::BF16 || t == DType::F16; };
  std::vector<std::vector<ValueId>> users(n);
  for (size_t v = 0; v < n; ++v)
    for (ValueId u : g.node(static_cast<ValueId>(v)).inputs) users[static_cast<size_t>(u)].push_back(static_cast<ValueId>(v));
  std::vector<bool> output(n, false);
  for (const Output& o : g.outputs()) output[static_cast<size_t>(o.value)] = true;
  // Nodes are in topological order: a node's users come after it.
  std::vector<bool> r(n, false);
  for (size_t i = n; i-- > 0;) {
    const Node& node = g.node(static_cast<ValueId>(i));
    bool ok = !users[i].empty() || output[i];
    if (output[i] && !half(node.type.dtype)) ok = false;
    for (ValueId u : users[i]) {
      if (!ok) break;
      const Node& un = g.node(u);
      if (un.op == OpKind::Cast && half(un.type.dtype)) continue;  // rounded here
      const OpCategory cat = op_info(un.op).category;
      const bool arith = (cat == OpCategory::Unary || cat == OpCategory::Binary) && un.op != OpKind::Cast;
      const bool passes = arith || is_view(un.op) || (un.op == OpKind::Cast && un.type.dtype == DType::F32);
      ok = passes && r[static_cast<size_t>(u)];
    }
    r[i] = ok;
  }
  return r;
}

llvm::Value* ElementCodegen::erf_for_16bit(llvm::Value* x) {
  // erf is odd; with t = |x|:
  //   t < 1:  erf(t) = t * q(s), s = t^2, q a degree-5 polynomial in u = 2s - 1;
  //   t >= 1: erf(t) = 1 - 2^p(t), p a degree-7 polynomial in u = (t - 2.46) / 1.46
  //           fitted to log2(erfc(t)) on [1, 3.92] (erf rounds to 1 in f32 beyond).
  // Least-squares fits on Chebyshev nodes (scripts/fit-erf.py); the error against the
  // float64 erf is below 2e-7, absolute and relative (for normal results), for every
  // f32 input (ElementCodegen.ErfFor16BitIsWithin2e7OfErf sweeps it). About 29
  // instructions without a branch, mostly FMAs; __nv_erff is about 31 on sm_90a, 10 of
  // them selects on the ALU pipe, which a bf16 GELU kernel saturates.
  static constexpr float kLow[] = {9.654687643e-01f, -1.405360997e-01f, 1.985180564e-02f,
                                   -2.285419498e-03f, 2.193594555e-04f, -1.766908099e-05f};
  static constexpr float kHigh[] = {-1.095614052e+01f, -1.111559582e+01f, -2.898623705e+00f, -5.033903569e-02f,
                                    1.469597127e-02f,  -4.203715827e-03f, 1.230815426e-03f,  -2.816934430e-04f};
  llvm::Type* f32 = b_.getFloatTy();
  auto c = [&](float v) { return llvm::ConstantFP::get(f32, v); };
  auto fma = [&](llvm::Value* a, llvm::Value* m, llvm::Value* add) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fma, {f32}, {a, m, add});
  };
  auto horner = [&](std::span<const float> k, llvm::Value* u) {
    llvm::Value* r = c(k.back());
    for (size_t i = k.size() - 1; i-- > 0;) r = fma(r, u, c(k[i]));
    return r;
  };
  llvm::Value* t = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  llvm::Value* s = b_.CreateFMul(t, t);
  llvm::Value* low = b_.CreateFMul(t, horner(kLow, fma(s, c(2.0f), c(-1.0f))));
  // llvm.minimum propagates NaN (min.NaN.f32): erf(NaN) stays NaN through the high
  // branch; Inf clamps to 3.92 and gives 1.
  llvm::Value* tc = b_.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, t, c(3.92f));
  llvm::Value* p = horner(kHigh, fma(tc, c(1.0f / 1.46f), c(-2.46f / 1.46f)));
  // p lies in [-27, -2.5]: 2^p is a normal float, so the flushing ex2 is exact enough
  // (relative error 2^-22 of a value below 0.16).
  llvm::Value* e = target_.kind == llvmb::Target::Kind::NVPTX
                       ? b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {p})
                       : b_.CreateUnaryIntrinsic(llvm::Intrinsic::exp2, p);
  llvm::Value* high = b_.CreateFSub(c(1.0f), e);
  // olt is false for NaN: NaN takes the high branch, whose minimum kept it.
  llvm::Value* r = b_.CreateSelect(b_.CreateFCmpOLT(t, c(1.0f)), low, high);
  return b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, r, x);
}

namespace {

// The erfc fit (scripts/fit-erfc.py): with t >= 0 and s = 1 / (1 + t/2),
// erfc(t) = s * 2^(-t^2 log2(e) + p(s)), p(s) = sum kErfc[i] s^i, a fit of
// log2(erfc(t) / s) + t^2 log2(e), smooth over all s in (0, 1].
constexpr float kErfc[] = {-1.825748324e+00f, 1.442728519e+00f, 5.397118926e-01f, 1.395400167e-01f,
                           -2.683674693e-01f, 4.013319314e-01f, -1.636232376e+00f, 2.146085262e+00f,
                           -1.185420752e+00f, 2.463712394e-01f};

}  // namespace

llvm::Value* ElementCodegen::scaled_erfc(llvm::Value* a, double t_per_a, float inv_scale) {
  // erfc(t) / inv_scale for t = a * t_per_a (a >= 0, inv_scale a power of two): the
  // reciprocal is taken of (1 + t/2) * inv_scale, which is exact scaling, so it is
  // s / inv_scale, and the coefficients are scaled by inv_scale^i to give p(s) bit
  // for bit. a = +Inf: s = 0 and the exponent -Inf, so 0; NaN stays NaN.
  llvm::Type* f32 = b_.getFloatTy();
  auto c = [&](double v) { return llvm::ConstantFP::get(f32, static_cast<float>(v)); };
  auto fma = [&](llvm::Value* x, llvm::Value* m, llvm::Value* add) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fma, {f32}, {x, m, add});
  };
  const bool nvptx = target_.kind == llvmb::Target::Kind::NVPTX;
  llvm::Value* d = fma(a, c(0.5 * t_per_a * inv_scale), c(inv_scale));
  // rcp.approx (1 ulp; ftz: s is normal for every t below 2^126, and 0 past it).
  llvm::Value* s = nvptx ? b_.CreateIntrinsic(llvm::Intrinsic::nvvm_rcp_approx_ftz_f, {}, {d}) : b_.CreateFDiv(c(1.0), d);
  const size_t n = std::size(kErfc);
  llvm::Value* p = c(double{kErfc[n - 1]} * std::pow(double{inv_scale}, static_cast<double>(n - 1)));
  for (size_t i = n - 1; i-- > 0;) p = fma(p, s, c(double{kErfc[i]} * std::pow(double{inv_scale}, static_cast<double>(i))));
  // -t^2 log2(e) + p(s) <= p(s) < 0.25; below -126 (t past 9.3) the flushing ex2
  // gives 0, as erfc's f32 value is a denormal or 0 there.
  llvm::Value* q = fma(b_.CreateFMul(a, c(-std::numbers::log2e * t_per_a * t_per_a)), a, p);
  llvm::Value* e2 = nvptx ? b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {q})
                          : b_.CreateUnaryIntrinsic(llvm::Intrinsic::exp2, q);
  return b_.CreateFMul(s, e2);
}

Elem ElementCodegen::one_plus_erf_for_16bit(Elem z, DType result) {
  // With t = |z|: 1 + erf(z) = erfc(-z) = z < 0 ? erfc(t) : 2 - erfc(t), erfc from
  // scaled_erfc. The fit is within 1.1e-7; the f32 evaluation within 1e-6 relative
  // for t < 3, and within 6e-6 out to t = 9 (the exponent's own rounding: an f32 near
  // -110 is 4e-6 coarse), past which erfc leaves f32's normal range and the flushing
  // ex2 gives 0. No cancellation: where erf(z) nears -1, 1 + erf(z) computed as such
  // loses its relative precision (f32's spacing near -1 is 6e-8; at z = -3 the sum is
  // 2.2e-5), erfc keeps it.
  llvm::Type* f32 = b_.getFloatTy();
  llvm::Value* x = to_compute(z, result);
  llvm::Value* erfc = scaled_erfc(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x), 1.0, 1.0f);
  // olt is false for NaN: 2 - NaN stays NaN.
  llvm::Value* v = b_.CreateSelect(b_.CreateFCmpOLT(x, llvm::ConstantFP::get(f32, 0.0)), erfc,
                                   b_.CreateFSub(llvm::ConstantFP::get(f32, 2.0), erfc));
  return Elem{node_result(result, v), result};
}

Elem ElementCodegen::gelu_for_16bit(Elem xe, DType result) {
  // GELU(x) = x/2 (1 + erf(x / sqrt 2)) = x/2 erfc(-x / sqrt 2). With a = |x| and
  // h = erfc(a / sqrt 2) / 2:
  //   x >= 0: x (1 - h) = x - a h;   x < 0: x h = -a h;   so GELU(x) = max(x, 0) - a h,
  // which needs no select, no separate x/2 and no x / sqrt 2 (scaled_erfc takes a
  // and folds the halving into its reciprocal). Neither branch cancels: a h <= x/2
  // where x >= 0, and -a h keeps erfc's relative precision where x < 0.
  llvm::Type* f32 = b_.getFloatTy();
  llvm::Value* x = to_compute(xe, result);
  // +Inf would form Inf * 0 in the last fma: clamped to the largest float, where h is
  // 0 and max(x, 0) = Inf stays. -Inf is not clamped: -Inf * 0 is NaN, as the
  // decomposed x/2 (1 + erf) gives (-Inf times 0) and torch does. llvm.minimum and
  // llvm.maximum propagate NaN (min.NaN.f32, max.NaN.f32).
  llvm::Value* xc = b_.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, x,
                                             llvm::ConstantFP::get(f32, std::numeric_limits<float>::max()));
  llvm::Value* a = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, xc);
  llvm::Value* h = scaled_erfc(a, 1.0 / std::numbers::sqrt2, 2.0f);
  llvm::Value* relu = b_.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, x, llvm::ConstantFP::get(f32, 0.0));
  llvm::Value* v = b_.CreateIntrinsic(llvm::Intrinsic::fma, {f32}, {b_.CreateFNeg(a), h, relu});
  return Elem{node_result(result, v), result};
}

}  // namespace kernels
}  // namespace sf
