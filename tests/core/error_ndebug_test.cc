// Single process, no ranks. This file is compiled with NDEBUG whatever the
// build type, so what turns the debug checks on here is the sanitizer
// detection of core/error.h alone: on in an ASan or TSan build, off otherwise.
#ifndef NDEBUG
#define NDEBUG 1
#endif

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace epmoe {
namespace {

TEST(DebugChecksUnderNdebug, OnExactlyInSanitizerBuilds) {
  const std::string sanitizer = EPMOE_TEST_SANITIZE;
  EXPECT_EQ(kDebugChecks, !sanitizer.empty()) << "sanitizer '" << sanitizer << "'";
  int evaluated = 0;
  auto one = [&] { return ++evaluated, 1; };
  if (!sanitizer.empty()) {
    EXPECT_THROW(EPMOE_DCHECK_EQ(one(), 2, "under ", sanitizer), InternalError);
    EXPECT_EQ(evaluated, 1);
  } else {
    EPMOE_DCHECK_EQ(one(), 2, "under no sanitizer");
    EXPECT_EQ(evaluated, 0);
  }
}

}  // namespace
}  // namespace epmoe
