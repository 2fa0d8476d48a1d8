#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace epmoe {
namespace {

TEST(Check, PrintsBothOperands) {
  const int rows = 3, expected_rows = 4;
  try {
    EPMOE_CHECK_EQ(rows, expected_rows);
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rows == expected_rows"), std::string::npos) << what;
    EXPECT_NE(what.find("(3 vs 4)"), std::string::npos) << what;
    EXPECT_NE(what.find("error_test.cc"), std::string::npos) << what;
  }
}

TEST(Check, PassingChecksDoNothing) {
  EXPECT_NO_THROW(EPMOE_CHECK_LT(1, 2));
  EXPECT_NO_THROW(EPMOE_CHECK(true));
}

TEST(Errors, RecoverableFamilyIsSeparateFromBugs) {
  EXPECT_THROW(throw ConfigError("top_k=9: must be <= num_experts (8)"), Error);
  static_assert(!std::is_base_of_v<Error, InternalError>);
}

}  // namespace
}  // namespace epmoe
