// Helpers of the pointwise emitter's tests (pointwise_test.cpp, erfc_test.cpp): a
// group graph's kernel run on the host through the ORC JIT, or emitted for an NVPTX
// arch (verifier, compile_to_ptx and ptxas), and bf16 rounding written out here.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codegen/kernels/emitter.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/llvm/backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace sf::pointwise_util {

using kernel_test::have_ptxas;
using kernel_test::jit;
using kernel_test::module_text;
using kernel_test::ptxas_failure;

// ---- inputs (pointwise_test.cpp, precision_test.cpp) ---------------------------------
// How a parameter is filled: special values first (NaN, infinities, signed zeros,
// integer extremes, a value that double rounding gets wrong), then random ones.
enum class Fill {
  Mixed,     // floats: specials then uniform [-3, 3); ints: extremes then full range
  Small,     // floats uniform [-1, 1); ints uniform [-8, 8); no specials
  Exponent,  // ints in [0, 20) (integer pow), floats uniform [-3, 3)
};

inline Tensor make_tensor(DType t, const Shape& s, uint64_t seed, Fill f) {
  Tensor x(t, s);
  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1p-53; };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> fspecial = {std::nan(""), inf, -inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -2.5,
                                        1e-3, 100.0, -100.0, 3e4, 1e5, 3e38, -7.0, 16842753.0};
  const std::vector<int64_t> ispecial = {0, 1, -1, 2, -2, 2147483647, -2147483647 - 1, 7, -7, 16842753,
                                         (int64_t{1} << 40) + (int64_t{1} << 32) + 1,
                                         std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto u = static_cast<size_t>(i);
    if (t == DType::Bool) {
      x.set_int(i, static_cast<int64_t>(rng() >> 63));
    } else if (is_float(t)) {
      if (f == Fill::Mixed && u < fspecial.size()) x.set(i, fspecial[u]);
      else x.set(i, f == Fill::Small ? uniform(-1, 1) : uniform(-3, 3));
    } else if (f == Fill::Exponent) {
      x.set_int(i, static_cast<int64_t>(rng() % 20));
    } else if (f == Fill::Small) {
      x.set_int(i, static_cast<int64_t>(rng() % 16) - 8);
    } else {
      x.set_int(i, u < ispecial.size() ? ispecial[u] : static_cast<int64_t>(rng()));  // i32 wraps
    }
  }
  return x;
}

inline std::vector<Tensor> make_inputs(const Graph& g, uint64_t seed, const std::vector<Fill>& fills = {}) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const TensorType& t = g.node(g.params()[i]).type;
    in.push_back(make_tensor(t.dtype, t.shape, seed + 7919 * i, i < fills.size() ? fills[i] : Fill::Mixed));
  }
  return in;
}

inline KernelSpec spec_of(const Graph& g, std::string entry = "pw") {
  return KernelSpec{std::move(entry), KernelKind::Pointwise, g};
}

// Emits `g` for the host, JIT-compiles it and runs it on `inputs`.
inline Result<std::vector<Tensor>> run_host(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg = {},
                                            Precision precision = Precision::Eager) {
  KernelSpec spec = spec_of(g);
  spec.precision = precision;
  Result<EmittedKernel> k = emitter_for(KernelKind::Pointwise).emit(spec, cfg, llvmb::Target::host());
  if (!k) return k.error();
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  std::vector<Tensor> out;
  for (const Output& o : g.outputs()) out.emplace_back(g.node(o.value).type.dtype, g.node(o.value).type.shape);
  std::vector<void*> args;
  for (const Tensor& t : inputs) args.push_back(const_cast<std::byte*>(t.data()));
  for (Tensor& t : out) args.push_back(t.data());
  reinterpret_cast<void (*)(void**)>(*fn)(args.data());
  return out;
}

struct Ptx {
  std::string ir;   // the module as emitted
  std::string ptx;
  LaunchShape launch;
};

// Emits for `arch`, checks the verifier and ptxas, returns the texts.
inline Ptx emit_ptx(const Graph& g, const std::string& arch, const KernelConfig& cfg = {},
                    Precision precision = Precision::Fused) {
  KernelSpec spec = spec_of(g, "pw_kernel");
  spec.precision = precision;
  Result<EmittedKernel> k = emitter_for(KernelKind::Pointwise).emit(spec, cfg, llvmb::Target::nvptx(arch));
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return {};
  }
  Ptx out;
  out.launch = k->launch;
  std::optional<std::string> bad = llvmb::verify(*k->module);
  EXPECT_FALSE(bad) << *bad;
  out.ir = module_text(*k->module);
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  if (!ptx) {
    ADD_FAILURE() << ptx.error().str();
    return out;
  }
  out.ptx = *ptx;
  if (have_ptxas()) {
    std::string err = ptxas_failure(out.ptx, arch);
    EXPECT_EQ(err, "") << out.ptx;
  }
  return out;
}

// bf16 round to nearest even on the bits, written here (not the emitter's or the
// reference's) so that the expected values come from outside the code under test.
inline float bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace sf::pointwise_util
