// A whole program run on generated host kernels: propagated, lowered and fused on
// every rank, run in lockstep with HostKernelRunner (each fused kernel emitted and
// JIT-compiled for the host), and every output gathered and compared with the
// reference evaluator on the global graph. No kernel may fall back to the reference.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "codegen/kernels/host_runner.h"
#include "tests/dist/pipeline_util.h"

namespace sf::kernel_test {

inline HostKernelRunner& host_runner() {
  static std::unique_ptr<HostKernelRunner> r = [] {
    auto x = HostKernelRunner::create();
    if (!x.ok()) throw std::runtime_error(x.error().message);
    return std::move(x).value();
  }();
  return *r;
}

// Runs `g` with seeded inputs as above (tests/dist/pipeline_util.h's run_and_check
// with generated host kernels); returns every rank's program (for checks of what was
// fused).
inline std::vector<LocalProgram> check_on_host_kernels(const Graph& g, uint64_t seed, const std::string& what) {
  HostKernelRunner& runner = host_runner();
  const int fallbacks_before = runner.stats().fallbacks;
  dist_test::Ran ran = dist_test::run_and_check(g, seed, what, /*fused=*/true, runner);
  EXPECT_EQ(runner.stats().fallbacks, fallbacks_before) << what << ": a kernel ran on the reference: " << [&] {
    std::string s;
    for (const auto& [k, why] : runner.stats().fallback_reasons) s += k + ": " + why + "; ";
    return s;
  }();
  return std::move(ran.programs);
}

}  // namespace sf::kernel_test
