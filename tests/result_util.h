// gtest checks of a Result<void>, which is true on success (runtime/core/diag.h):
// ASSERT_TRUE(succeeded(f())) passes when f succeeded and prints its Diag when not.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <utility>

#include "runtime/core/diag.h"

namespace sf {

inline ::testing::AssertionResult succeeded(const Result<void>& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.error().str();
}
template <class T>
::testing::AssertionResult succeeded(const Result<T>& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.error().str();
}

// The value of a Result the test needs: a failed one throws its Diag's text, which
// gtest reports as the test's failure ("C++ exception ... thrown in the test body").
template <class T>
T ok_value(Result<T> r) {
  if (!r.ok()) throw std::runtime_error(r.error().str());
  return std::move(r).value();
}

}  // namespace sf
