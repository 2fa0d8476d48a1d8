// Topology: single thread, no ranks. Every one of the 256 fp8 e4m3 codes and
// 65536 bf16 codes is enumerated; rounding is checked against a brute-force
// nearest-value search over the code table, midpoints against ties-to-even.
#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace epmoe {
namespace {

std::uint8_t fp8(float value) { return float_to_fp8_e4m3(value).bits; }
float fp8_value(int code) { return fp8_e4m3_to_float(fp8_e4m3_t{static_cast<std::uint8_t>(code)}); }
bool is_fp8_nan(std::uint8_t code) { return (code & 0x7f) == 0x7f; }
constexpr int kFp8MaxFiniteCode = 0x7e;

// Nearest positive finite e4m3 value by exhaustive search, ties to the even
// code (the code's last bit is the mantissa's last bit), beyond 448 -> 448.
std::uint8_t nearest_fp8_code(double magnitude) {
  int best = 0;
  for (int code = 1; code <= kFp8MaxFiniteCode; ++code) {
    const double best_dist = std::abs(fp8_value(best) - magnitude);
    const double dist = std::abs(fp8_value(code) - magnitude);
    if (dist < best_dist || (dist == best_dist && code % 2 == 0)) best = code;
  }
  return static_cast<std::uint8_t>(best);
}

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float value = fp8_value(code);
    if (is_fp8_nan(static_cast<std::uint8_t>(code))) {
      EXPECT_TRUE(std::isnan(value)) << code;
      EXPECT_TRUE(is_fp8_nan(fp8(value))) << code;
    } else {
      EXPECT_FALSE(std::isnan(value)) << code;
      EXPECT_EQ(fp8(value), code) << "value " << value;
    }
  }
}

TEST(Fp8E4m3, CodeTableLandmarks) {
  EXPECT_EQ(fp8_value(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_value(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_value(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_value(0x38), 1.0f);
  EXPECT_EQ(fp8_value(0x7e), 448.0f);
  EXPECT_EQ(fp8_value(0xfe), -448.0f);
  EXPECT_TRUE(std::signbit(fp8_value(0x80)) && fp8_value(0x80) == 0.0f);
  for (int code = 1; code <= kFp8MaxFiniteCode; ++code)
    EXPECT_LT(fp8_value(code - 1), fp8_value(code)) << "not monotonic at " << code;
}

TEST(Fp8E4m3, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (int code = 0; code < kFp8MaxFiniteCode; ++code) {
    const float low = fp8_value(code), high = fp8_value(code + 1);
    const float mid = (low + high) / 2;  // exact: fewer than 24 significant bits
    const int even = code % 2 == 0 ? code : code + 1;
    EXPECT_EQ(fp8(mid), even) << "midpoint " << mid;
    EXPECT_EQ(fp8(-mid), 0x80 | even) << "midpoint " << -mid;
    EXPECT_EQ(fp8(std::nextafter(mid, 0.0f)), code) << mid;
    EXPECT_EQ(fp8(std::nextafter(mid, 1000.0f)), code + 1) << mid;
  }
}

TEST(Fp8E4m3, MatchesExhaustiveNearestOnRandomValues) {
  Rng rng(7);
  for (int i = 0; i < 20000; ++i) {
    // Log-uniform magnitudes from 2^-12 (below every subnormal) to 2^9.5 (saturating).
    const float magnitude = std::exp2(rng.uniform(-12.0f, 9.5f));
    const std::uint8_t expected = nearest_fp8_code(magnitude);
    ASSERT_EQ(fp8(magnitude), expected) << magnitude;
    ASSERT_EQ(fp8(-magnitude), 0x80 | expected) << -magnitude;
  }
}

TEST(Fp8E4m3, SaturatesBeyondMax) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float value : {448.0f, 449.0f, 464.0f, 480.0f, 1e30f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(fp8(value), 0x7e) << value;
    EXPECT_EQ(fp8(-value), 0xfe) << -value;
  }
}

TEST(Fp8E4m3, NanStaysNanAndSignedZeroKeepsSign) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  const float signalling = std::bit_cast<float>(0x7f800001u);
  for (float nan : {quiet, -quiet, signalling}) EXPECT_TRUE(is_fp8_nan(fp8(nan)));
  EXPECT_EQ(fp8(0.0f), 0x00);
  EXPECT_EQ(fp8(-0.0f), 0x80);
  EXPECT_EQ(fp8(-1e-10f), 0x80);                // underflow keeps the sign
  EXPECT_EQ(fp8(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(fp8(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(fp8(std::ldexp(1.0f, -140)), 0x00);  // float subnormal input
}

std::uint16_t bf16(float value) { return float_to_bf16(value).bits; }

TEST(Bf16, EveryNonNanCodeRoundTrips) {
  for (std::uint32_t code = 0; code < 65536; ++code) {
    const float value = bf16_to_float(bf16_t{static_cast<std::uint16_t>(code)});
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value)))) << code;
    } else {
      ASSERT_EQ(bf16(value), code);
    }
  }
}

TEST(Bf16, MidpointsRoundToEven) {
  EXPECT_EQ(bf16(1.0f + std::ldexp(1.0f, -8)), bf16(1.0f));                             // down to even
  EXPECT_EQ(bf16(1.0f + 3 * std::ldexp(1.0f, -8)), bf16(1.0f + std::ldexp(1.0f, -6)));  // up to even
  Rng rng(3);
  for (int i = 0; i < 20000; ++i) {
    // A random finite bf16 below the largest (so that code + 1 is finite).
    const auto code = static_cast<std::uint32_t>(rng.uniform_int(0x7f7f));
    const std::uint32_t mid_bits = (code << 16) | 0x8000u;
    const std::uint32_t even = (code % 2 == 0) ? code : code + 1;
    ASSERT_EQ(bf16(std::bit_cast<float>(mid_bits)), even);
    ASSERT_EQ(bf16(std::bit_cast<float>(mid_bits - 1)), code);
    ASSERT_EQ(bf16(std::bit_cast<float>(mid_bits + 1)), code + 1);
    ASSERT_EQ(bf16(std::bit_cast<float>(mid_bits | 0x80000000u)), even | 0x8000u);
  }
}

TEST(Bf16, InfinityAndNan) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16(kInf), 0x7f80);
  EXPECT_EQ(bf16(-kInf), 0xff80);
  EXPECT_EQ(bf16(std::numeric_limits<float>::max()), 0x7f80);  // RNE overflow to inf
  // A signalling NaN whose payload sits only in the dropped bits must not
  // become infinity; the result is a quiet NaN with the sign kept.
  for (std::uint32_t nan_bits : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu}) {
    const std::uint16_t code = bf16(std::bit_cast<float>(nan_bits));
    EXPECT_TRUE(std::isnan(bf16_to_float(bf16_t{code}))) << std::hex << nan_bits;
    EXPECT_TRUE(code & 0x0040) << "not quiet: " << std::hex << code;
    EXPECT_EQ(code & 0x8000, (nan_bits >> 16) & 0x8000);
  }
}

TEST(Convert, ArraysMatchScalarsAndCheckSizes) {
  Rng rng(11);
  std::vector<float> values(200003);  // above the parallel grain, odd size
  for (float& v : values) v = rng.uniform(-600.0f, 600.0f);
  std::vector<bf16_t> as_bf16(values.size());
  std::vector<fp8_e4m3_t> as_fp8(values.size());
  std::vector<float> from_bf16(values.size()), from_fp8(values.size());
  convert(values, as_bf16);
  convert(values, as_fp8);
  convert(as_bf16, from_bf16);
  convert(as_fp8, from_fp8);
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(as_bf16[i].bits, bf16(values[i]));
    ASSERT_EQ(as_fp8[i].bits, fp8(values[i]));
    ASSERT_EQ(from_bf16[i], bf16_to_float(as_bf16[i]));
    ASSERT_EQ(from_fp8[i], fp8_e4m3_to_float(as_fp8[i]));
  }
  std::vector<bf16_t> too_short(3);
  EXPECT_THROW(convert(values, too_short), InternalError);
}

}  // namespace
}  // namespace epmoe
