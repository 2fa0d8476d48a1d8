// check_finite / find_non_finite: every bad value (NaN, +inf, -inf) at every
// kind of position (first, last, either side of the 1024-element block edge,
// in the second parallel slice) of tensors of rank 1..3 is found, the first
// one is reported, its index is printed in the tensor's shape, and finite
// extremes (max float, subnormals, -0) pass.
#include "core/finite_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/threading.h"

namespace epmoe {
namespace {

const float kBadValues[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
const char* const kBadNames[] = {"nan", "inf", "-inf"};

Tensor filled(Shape shape, float value = 0.5f) {
  Tensor t(DType::f32, std::move(shape));
  for (float& v : t.span<float>()) v = value;
  return t;
}

std::string message_of(const std::string& name, const Tensor& t) {
  try {
    check_finite(name, t);
  } catch (const NumericError& e) {
    return e.what();
  }
  return "";
}

TEST(FiniteCheck, FiniteExtremesPass) {
  Tensor t = filled({6});
  const float values[] = {std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          -0.0f,
                          0.0f,
                          std::numeric_limits<float>::min()};
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = values[i];
  EXPECT_EQ(find_non_finite(t), -1);
  EXPECT_NO_THROW(check_finite("x", t));
  const Tensor empty(DType::f32, {0, 4});
  EXPECT_NO_THROW(check_finite("empty", empty));
}

// The property: for each tensor name, shape, position and bad value, the
// message is exactly "<name>[<index>] = <value>: inputs must be finite".
TEST(FiniteCheck, NamesTensorFirstBadIndexAndValue) {
  struct Case {
    Shape shape;
    std::int64_t flat;
    std::string index;
  };
  const std::vector<Case> cases = {
      {{7}, 0, "[0]"},                    // first element
      {{7}, 6, "[6]"},                    // last element
      {{5, 40}, 3 * 40 + 17, "[3, 17]"},  // the example
      {{5, 40}, 199, "[4, 39]"},          // last of a matrix
      {{3, 4, 5}, 0, "[0, 0, 0]"},
      {{3, 4, 5}, 59, "[2, 3, 4]"},
      {{3, 4, 5}, 1 * 20 + 2 * 5 + 3, "[1, 2, 3]"},
      {{2048}, 1023, "[1023]"},        // last of the first 1024-block
      {{2048}, 1024, "[1024]"},        // first of the second block
      {{1, 1025}, 1024, "[0, 1024]"},  // a block of one element
  };
  for (const char* name : {"x", "gate", "wi0", "wi1", "wo", "bias", "dy", "layers.3.moe.wi0"}) {
    for (const Case& c : cases) {
      for (int b = 0; b < 3; ++b) {
        Tensor t = filled(c.shape);
        t.data<float>()[c.flat] = kBadValues[b];
        EXPECT_EQ(find_non_finite(t), c.flat);
        EXPECT_EQ(message_of(name, t), std::string(name) + c.index + " = " + kBadNames[b] + ": inputs must be finite");
      }
    }
  }
}

TEST(FiniteCheck, ReportsTheFirstOfSeveralAcrossThreads) {
  // Big enough for several parallel slices: a bad value late in the tensor
  // (found first by another thread) must not hide an earlier one.
  const std::int64_t n = 3 << 20;
  set_compute_threads(2);
  Tensor t = filled({n});
  t.data<float>()[n - 1] = kBadValues[0];
  t.data<float>()[n / 2 + 5] = kBadValues[2];
  EXPECT_EQ(find_non_finite(t), n / 2 + 5);
  t.data<float>()[3] = kBadValues[1];
  EXPECT_EQ(find_non_finite(t), 3);
  t.data<float>()[0] = kBadValues[0];
  EXPECT_EQ(message_of("x", t), "x[0] = nan: inputs must be finite");
}

TEST(FiniteCheck, SpanFormTakesTheShapeAndRule) {
  std::vector<float> values(12, 1.0f);
  values[11] = kBadValues[1];
  try {
    check_finite("npy x.npy", values, {3, 4}, "npy inputs must be finite");
    FAIL() << "accepted inf";
  } catch (const NumericError& e) {
    EXPECT_STREQ(e.what(), "npy x.npy[2, 3] = inf: npy inputs must be finite");
  }
  // NumericError is an epmoe::Error: callers that catch Error see it.
  EXPECT_THROW(check_finite("x", values, {12}), Error);
}

TEST(FiniteCheck, NarrowAndIntegerDtypes) {
  // Bit patterns written out (core has no converters): bf16 1.5, nan, inf,
  // -inf; e4m3 448 (largest finite) and its NaN code.
  Tensor bf16(DType::bf16, {2, 3});
  for (auto& v : bf16.span<bf16_t>()) v = bf16_t{0x3fc0};
  EXPECT_EQ(find_non_finite(bf16), -1);
  const std::uint16_t bad_bf16[] = {0x7fc0, 0x7f80, 0xff80};
  for (int b = 0; b < 3; ++b) {
    bf16.data<bf16_t>()[5] = bf16_t{bad_bf16[b]};
    EXPECT_EQ(message_of("w", bf16), std::string("w[1, 2] = ") + kBadNames[b] + ": inputs must be finite");
  }
  Tensor fp8(DType::fp8_e4m3, {4});
  for (auto& v : fp8.span<fp8_e4m3_t>()) v = fp8_e4m3_t{0x7e};
  EXPECT_EQ(find_non_finite(fp8), -1);
  fp8.data<fp8_e4m3_t>()[2] = fp8_e4m3_t{0xff};
  EXPECT_EQ(message_of("t", fp8), "t[2] = nan: inputs must be finite");
  Tensor ids = Tensor::zeros(DType::i32, {3});
  ids.data<std::int32_t>()[0] = -1;
  EXPECT_EQ(find_non_finite(ids), -1);
}

}  // namespace
}  // namespace epmoe
