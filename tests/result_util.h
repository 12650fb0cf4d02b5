// gtest checks of a Result<void>, which is true on success (runtime/core/diag.h):
// ASSERT_TRUE(succeeded(f())) passes when f succeeded and prints its Diag when not.
#pragma once

#include <gtest/gtest.h>

#include "runtime/core/diag.h"

namespace sf {

inline ::testing::AssertionResult succeeded(const Result<void>& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.error().str();
}

}  // namespace sf
