// Whether this test binary is the sanitizer build's (cmake -DSHARDFUSE_SANITIZE=ON), and
// the sample of a sweep that runs there. The sanitizer build is the one CI tests in
// (scripts/test); a sweep over many kernel configs or shapes runs whole in the optimized
// build (`ctest --test-dir build`), and under ASan + UBSan (about 3x slower, and the
// float64 reference with it) every `every`-th case, chosen so that each config and each
// shape kind still appears (docs/testing.md, "CI time").
// What ASan checks in such a sweep is our code around the JIT-compiled kernels (the
// emitter, the reference, the simulations), which the sample exercises on every path;
// the kernels' own index arithmetic is LLVM's output, which ASan does not instrument.
#pragma once

#include <cstddef>

namespace sf::test {

#ifdef SF_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// Whether case `i` of a sweep runs in this build: always in the optimized one; in the
// sanitizer one, when i is a multiple of `every`.
inline bool in_sample(size_t i, size_t every = 2) { return !kSanitized || i % every == 0; }

}  // namespace sf::test
