// The one error shape (runtime/core/diag.h): Result<T>, Result<void> and SF_TRY.
#include <gtest/gtest.h>

#include <string>

#include "runtime/core/diag.h"

namespace sf {
namespace runtime_diag_test {

Result<int> parse_positive(int x) {
  if (x <= 0) return Diag{"in.sf", {3, 7}, std::to_string(x) + " is not positive"};
  return x;
}

Result<void> check_even(int x) {
  if (x % 2) return Diag{"", {}, std::to_string(x) + " is odd"};
  return {};
}

// Both shapes through SF_TRY: the first failure returns, naming its cause; success
// goes on to the next statement.
Result<void> both(int x, int* reached) {
  SF_TRY(parse_positive(x));
  *reached = 1;
  SF_TRY(check_even(x));
  *reached = 2;
  return {};
}

TEST(Diag, ResultVoidAndTryPropagateTheFirstFailure) {
  Result<void> ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_TRUE(static_cast<bool>(ok));
  int reached = 0;
  EXPECT_TRUE(both(4, &reached).ok());
  EXPECT_EQ(reached, 2);
  reached = 0;
  Result<void> odd = both(3, &reached);
  ASSERT_FALSE(odd);
  EXPECT_EQ(odd.error().message, "3 is odd");
  EXPECT_EQ(reached, 1);
  reached = 0;
  Result<void> neg = both(-1, &reached);
  ASSERT_FALSE(neg);
  EXPECT_EQ(neg.error().str(), "in.sf:3:7: error: -1 is not positive");
  EXPECT_EQ(reached, 0);
}

}  // namespace runtime_diag_test
}  // namespace sf
