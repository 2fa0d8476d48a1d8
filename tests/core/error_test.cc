// Single process, no ranks: the checks' texts, the error families, and where
// the debug checks are on (kDebugChecks against the build kind CMake passes in
// as EPMOE_TEST_BUILD_TYPE and EPMOE_TEST_SANITIZE).
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace epmoe {
namespace {

std::string what_of(void (*fail)()) {
  try {
    fail();
  } catch (const InternalError& e) {
    return e.what();
  }
  return "(no throw)";
}

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
    // Without a message the text ends at the operands, as before.
    EXPECT_EQ(what.substr(what.size() - 8), "(3 vs 4)") << what;
  }
}

TEST(Check, MessageFollowsTheOperands) {
  const int rows = 3, expected_rows = 4, chunk = 2;
  try {
    EPMOE_CHECK_EQ(rows, expected_rows, "rows of chunk ", chunk, " after dedup");
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("check failed: rows == expected_rows (3 vs 4): rows of chunk 2 after dedup"), std::string::npos)
        << what;
  }
  const int free_slots = 0;
  try {
    EPMOE_CHECK(free_slots > 0, "slot ", 7, " has no room");
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("check failed: free_slots > 0: slot 7 has no room"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(what_of([] { EPMOE_CHECK(1 + 1 == 3); }).find("check failed: 1 + 1 == 3"), std::string::npos);
}

TEST(Check, EveryComparisonTakesAMessage) {
  EXPECT_NE(what_of([] { EPMOE_CHECK_NE(5, 5, "ne"); }).find("5 != 5 (5 vs 5): ne"), std::string::npos);
  EXPECT_NE(what_of([] { EPMOE_CHECK_LT(6, 5, "lt"); }).find("6 < 5 (6 vs 5): lt"), std::string::npos);
  EXPECT_NE(what_of([] { EPMOE_CHECK_LE(6, 5, "le"); }).find("6 <= 5 (6 vs 5): le"), std::string::npos);
  EXPECT_NE(what_of([] { EPMOE_CHECK_GT(5, 6, "gt"); }).find("5 > 6 (5 vs 6): gt"), std::string::npos);
  EXPECT_NE(what_of([] { EPMOE_CHECK_GE(5, 6, "ge"); }).find("5 >= 6 (5 vs 6): ge"), std::string::npos);
}

TEST(Check, PassingChecksDoNothingAndSkipTheMessage) {
  EXPECT_NO_THROW(EPMOE_CHECK_LT(1, 2));
  EXPECT_NO_THROW(EPMOE_CHECK(true));
  int message_built = 0;
  auto piece = [&] { return ++message_built; };
  EPMOE_CHECK_EQ(2, 2, "piece ", piece());
  EPMOE_CHECK(true, piece());
  EXPECT_EQ(message_built, 0);
}

TEST(Errors, RecoverableFamilyIsSeparateFromBugs) {
  EXPECT_THROW(throw ConfigError("top_k=9: must be <= num_experts (8)"), Error);
  static_assert(!std::is_base_of_v<Error, InternalError>);
}

TEST(DebugChecks, MatchTheBuildKind) {
  const std::string build_type = EPMOE_TEST_BUILD_TYPE, sanitizer = EPMOE_TEST_SANITIZE;
#ifdef NDEBUG
  const bool ndebug = true;
#else
  const bool ndebug = false;
#endif
  EXPECT_EQ(kDebugChecks, !ndebug || !sanitizer.empty()) << build_type << ", sanitizer '" << sanitizer << "'";
  if (build_type == "Debug" || !sanitizer.empty()) {
    EXPECT_TRUE(kDebugChecks) << build_type;
  }
  if (build_type == "Release" && sanitizer.empty()) {
    EXPECT_FALSE(kDebugChecks) << "a Release build checks DCHECKs";
  }
}

TEST(DebugChecks, FireWhereOnAndAreNeverEvaluatedElsewhere) {
  int evaluated = 0;
  auto one = [&] { return ++evaluated, 1; };
  if constexpr (kDebugChecks) {
    try {
      EPMOE_DCHECK_EQ(one(), 2, "slot ", 3);
      FAIL() << "no throw";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("one() == 2 (1 vs 2): slot 3"), std::string::npos) << e.what();
    }
    EXPECT_THROW(EPMOE_DCHECK(one() == 2), InternalError);
    EXPECT_THROW(EPMOE_DCHECK_NE(one(), 1), InternalError);
    EXPECT_THROW(EPMOE_DCHECK_LT(one(), 1), InternalError);
    EXPECT_THROW(EPMOE_DCHECK_LE(one(), 0), InternalError);
    EXPECT_THROW(EPMOE_DCHECK_GT(one(), 1), InternalError);
    EXPECT_THROW(EPMOE_DCHECK_GE(one(), 2, "ge"), InternalError);
    EXPECT_EQ(evaluated, 7);
  } else {
    EPMOE_DCHECK_EQ(one(), 2, "slot ", 3);
    EPMOE_DCHECK(one() == 2);
    EPMOE_DCHECK_NE(one(), 1);
    EPMOE_DCHECK_LT(one(), 1);
    EPMOE_DCHECK_LE(one(), 0);
    EPMOE_DCHECK_GT(one(), 1);
    EPMOE_DCHECK_GE(one(), 2, "ge");
    EXPECT_EQ(evaluated, 0);
  }
}

}  // namespace
}  // namespace epmoe
