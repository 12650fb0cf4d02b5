// The tensor-core matmul kernels as PTX, for the tests that read it
// (matmul_mma_test.cpp, matmul_wgmma_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "codegen/llvm/backend.h"
#include "tests/kernels/matmul_sim.h"

namespace sf::mma_sim {

struct Ptx {
  std::string text;
  LaunchShape launch;
};

// The matmul kernel of `g` under `c` for `arch`, as PTX (compile_to_ptx), and its launch.
inline Ptx emit_ptx(const Graph& g, const KernelConfig& c, const std::string& arch, bool allow_tf32 = false,
                    bool tma = false) {
  Ptx out;
  llvmb::Target t = llvmb::Target::nvptx(arch);
  KernelSpec spec = allow_tf32 ? tf32_spec(g) : spec_of(g);
  spec.tma = tma;
  Result<EmittedKernel> k = emit_matmul(spec, c, t);
  EXPECT_TRUE(k.ok()) << (k.ok() ? "" : k.error().str());
  if (!k) return out;
  out.launch = k->launch;
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  EXPECT_TRUE(ptx.ok()) << (ptx.ok() ? "" : ptx.error().str());
  if (ptx) out.text = *ptx;
  return out;
}

// The path the matmul of `g` takes under `c` on `arch` with its operands brought by
// TMA (sm_90a's default: KernelSpec::tma), as `explain` reports it.
inline Result<MatmulPath> tma_path(const Graph& g, const KernelConfig& c, const std::string& arch = "sm_90a") {
  KernelSpec spec = spec_of(g);
  spec.tma = true;
  return matmul_path(spec, c, arch);
}

// How often `what` occurs in `s`.
inline int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace sf::mma_sim
