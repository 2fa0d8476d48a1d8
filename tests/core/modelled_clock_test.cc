// The modelled clock's checked arithmetic (core/modelled_clock.h): times are
// int64 picoseconds, so a conversion or a sum past INT64_MAX (~9.2e6 s) must
// be refused with a ConfigError naming what overflowed, never wrap around
// (issue 28 N8: link_latency_us=1e15 reported a 1.09e-8 s step).
#include "core/modelled_clock.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"

namespace epmoe {
namespace {

constexpr Picoseconds kMax = std::numeric_limits<Picoseconds>::max();

// The ConfigError's text, or "" when `f` does not throw one.
template <typename F>
std::string config_error_of(F f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelledClockArithmetic, ConvertsExactlyWithinTheRange) {
  EXPECT_EQ(seconds_to_picoseconds(0.0, "zero"), 0);
  EXPECT_EQ(seconds_to_picoseconds(1.5e-12, "half up"), 2);  // rounds half away from zero, as llround
  EXPECT_EQ(seconds_to_picoseconds(1.0, "one second"), kPicosecondsPerSecond);
  // A day and a million seconds: well inside the range, exact.
  EXPECT_EQ(seconds_to_picoseconds(86400.0, "a day"), 86400 * kPicosecondsPerSecond);
  EXPECT_EQ(seconds_to_picoseconds(9e6, "9e6 s"), 9'000'000 * kPicosecondsPerSecond);
}

TEST(ModelledClockArithmetic, RefusesADurationBeyondTheRangeNamingIt) {
  for (const double seconds : {kMaxModelledSeconds * 1.0001, 1e9, 1e300, std::numeric_limits<double>::infinity()}) {
    const std::string error = config_error_of([&] { seconds_to_picoseconds(seconds, "the link latency (x)"); });
    EXPECT_NE(error.find("the link latency (x)"), std::string::npos) << seconds << ": " << error;
    EXPECT_NE(error.find("beyond the modelled clock's range"), std::string::npos) << error;
  }
  // Either side of the end (9.2234e6 s).
  EXPECT_GT(seconds_to_picoseconds(9.2233e6, "just below"), 0);
  EXPECT_NE(config_error_of([] { seconds_to_picoseconds(9.2234e6, "just above"); }), "");
}

TEST(ModelledClockArithmetic, NegativeOrNanDurationsAreBugs) {
  EXPECT_THROW(seconds_to_picoseconds(-1.0, "negative"), InternalError);
  EXPECT_THROW(seconds_to_picoseconds(std::numeric_limits<double>::quiet_NaN(), "nan"), InternalError);
}

TEST(ModelledClockArithmetic, SumsRefuseToWrapAround) {
  EXPECT_EQ(add_picoseconds(kMax - 5, 5, "sum"), kMax);
  EXPECT_EQ(add_picoseconds(-3, 3, "sum"), 0);
  const std::string error = config_error_of([] { add_picoseconds(kMax - 5, 6, "a rank's modelled clock"); });
  EXPECT_NE(error.find("a rank's modelled clock"), std::string::npos) << error;
  EXPECT_NE(error.find("beyond the modelled clock's range"), std::string::npos) << error;
  EXPECT_NE(config_error_of([] { add_picoseconds(kMax, kMax, "both at the end"); }), "");
}

}  // namespace
}  // namespace epmoe
