// Helpers of the pointwise emitter's tests (pointwise_test.cpp, erfc_test.cpp): a
// group graph's kernel run on the host through the ORC JIT, or emitted for an NVPTX
// arch (verifier, compile_to_ptx and ptxas), and bf16 rounding written out here.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
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
