// Topology: single caller; n = 100003 exercises the parallel path and an odd
// SIMD tail. Inputs cover ordinary values and |z| up to 1e30, where a naive
// exp(-z) overflows.
#include "kernels/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "reference.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::relative_error;

double sigmoid_ref(double z) { return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z)); }
double silu_ref(double z) { return z * sigmoid_ref(z); }
double dsilu_ref(double z) { return sigmoid_ref(z) * (1 + z * (1 - sigmoid_ref(z))); }

struct Inputs {
  std::vector<float> h0, h1, dact;
};

Inputs make_inputs(std::int64_t n) {
  Rng rng(9);
  Inputs in{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (std::int64_t i = 0; i < n; ++i) {
    in.h0[i] = rng.uniform(-12.0f, 12.0f);
    in.h1[i] = rng.uniform(-2.0f, 2.0f);
    in.dact[i] = rng.uniform(-1.0f, 1.0f);
  }
  return in;
}

TEST(Swiglu, ForwardAndBackwardMatchDouble) {
  const std::int64_t n = 100003;
  const Inputs in = make_inputs(n);
  std::vector<float> act(n), dh0(n), dh1(n);
  swiglu_forward(in.h0.data(), in.h1.data(), act.data(), n);
  swiglu_backward(in.h0.data(), in.h1.data(), in.dact.data(), dh0.data(), dh1.data(), n);
  std::vector<double> act_ref(n), dh0_ref(n), dh1_ref(n);
  for (std::int64_t i = 0; i < n; ++i) {
    act_ref[i] = silu_ref(in.h0[i]) * in.h1[i];
    dh0_ref[i] = in.dact[i] * in.h1[i] * dsilu_ref(in.h0[i]);
    dh1_ref[i] = in.dact[i] * silu_ref(in.h0[i]);
  }
  EXPECT_LE(relative_error(act, act_ref), kF32RelativeTolerance);
  EXPECT_LE(relative_error(dh0, dh0_ref), kF32RelativeTolerance);
  EXPECT_LE(relative_error(dh1, dh1_ref), kF32RelativeTolerance);
  // Elementwise too, so that small values are not hidden by the max: the
  // sigmoid is accurate in relative terms even where it is tiny.
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(act[i], act_ref[i], 1e-5 * std::abs(act_ref[i]) + 1e-30) << "z=" << in.h0[i];
}

// The analytic backward is the derivative of the forward actually computed:
// central differences of swiglu_forward in float, step 1e-2 (error O(h^2)
// ~ 1e-4 plus float cancellation ~ 1e-7/h ~ 1e-5).
TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  const std::int64_t n = 257;
  const Inputs in = make_inputs(n);
  std::vector<float> dh0(n), dh1(n);
  swiglu_backward(in.h0.data(), in.h1.data(), in.dact.data(), dh0.data(), dh1.data(), n);
  constexpr float kStep = 1e-2f;
  auto forward_at = [&](std::vector<float> h0, std::vector<float> h1) {
    std::vector<float> act(n);
    swiglu_forward(h0.data(), h1.data(), act.data(), n);
    return act;
  };
  for (int input = 0; input < 2; ++input) {
    auto plus = in.h0, minus = in.h0, h1_plus = in.h1, h1_minus = in.h1;
    for (std::int64_t i = 0; i < n; ++i) {
      (input == 0 ? plus[i] : h1_plus[i]) += kStep;
      (input == 0 ? minus[i] : h1_minus[i]) -= kStep;
    }
    const auto act_plus = forward_at(input == 0 ? plus : in.h0, input == 0 ? in.h1 : h1_plus);
    const auto act_minus = forward_at(input == 0 ? minus : in.h0, input == 0 ? in.h1 : h1_minus);
    std::vector<double> numeric(n);
    for (std::int64_t i = 0; i < n; ++i) numeric[i] = in.dact[i] * (double(act_plus[i]) - act_minus[i]) / (2.0 * kStep);
    EXPECT_LE(relative_error(input == 0 ? dh0 : dh1, numeric), 1e-3) << "input " << input;
  }
}

TEST(Swiglu, LargeMagnitudesStayFinite) {
  const std::vector<float> h0 = {-1e30f, -1e4f, -100.0f, -88.0f, -87.0f, -20.0f, 0.0f,
                                 20.0f,  87.0f, 88.0f,   100.0f, 1e4f,   1e30f};
  const auto n = static_cast<std::int64_t>(h0.size());
  const std::vector<float> h1(n, 1.0f), dact(n, 1.0f);
  std::vector<float> act(n), dh0(n), dh1(n);
  swiglu_forward(h0.data(), h1.data(), act.data(), n);
  swiglu_backward(h0.data(), h1.data(), dact.data(), dh0.data(), dh1.data(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(act[i]) && std::isfinite(dh0[i]) && std::isfinite(dh1[i])) << h0[i];
    EXPECT_NEAR(act[i], silu_ref(h0[i]), 1e-6 * std::abs(silu_ref(h0[i])) + 1e-30) << h0[i];
    EXPECT_NEAR(dh0[i], dsilu_ref(h0[i]), 1e-5 * std::abs(dsilu_ref(h0[i])) + 1e-30) << h0[i];
  }
}

// The backward's activation is the forward's, bit for bit (the experts'
// backward rebuilds it there for dwo), and asking for it changes neither
// gradient.
TEST(Swiglu, BackwardRebuildsTheForwardActivationBitForBit) {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{37}, std::int64_t{100003}}) {
    const Inputs in = make_inputs(n);
    std::vector<float> act(n), rebuilt(n, -1.0f), dh0(n), dh1(n), plain_dh0(n), plain_dh1(n);
    swiglu_forward(in.h0.data(), in.h1.data(), act.data(), n);
    swiglu_backward(in.h0.data(), in.h1.data(), in.dact.data(), dh0.data(), dh1.data(), n, rebuilt.data());
    swiglu_backward(in.h0.data(), in.h1.data(), in.dact.data(), plain_dh0.data(), plain_dh1.data(), n);
    EXPECT_EQ(std::memcmp(act.data(), rebuilt.data(), n * sizeof(float)), 0) << "n = " << n;
    EXPECT_EQ(std::memcmp(dh0.data(), plain_dh0.data(), n * sizeof(float)), 0) << "n = " << n;
    EXPECT_EQ(std::memcmp(dh1.data(), plain_dh1.data(), n * sizeof(float)), 0) << "n = " << n;
  }
}

// A NaN in h0 reaches every output, in vector lanes and in the scalar tail
// alike: the exp clamps a NaN to -88 (swiglu.cc works on the bits), so what
// keeps it is that each output multiplies by z; silu(-inf) is NaN as in
// PyTorch. Nothing non-finite may come out finite.
TEST(Swiglu, NonFiniteInputsReachEveryOutput) {
  for (const float bad : {std::nanf(""), -std::nanf(""), -INFINITY}) {
    for (const std::int64_t at : {0, 5, 8, 33, 36}) {
      const std::int64_t n = 37;  // 4 vectors of 8 and a tail
      Inputs in = make_inputs(n);
      in.h0[at] = bad;
      std::vector<float> act(n), dh0(n), dh1(n);
      swiglu_forward(in.h0.data(), in.h1.data(), act.data(), n);
      swiglu_backward(in.h0.data(), in.h1.data(), in.dact.data(), dh0.data(), dh1.data(), n);
      EXPECT_TRUE(std::isnan(act[at]) && std::isnan(dh0[at]) && std::isnan(dh1[at]))
          << "h0 = " << bad << " at " << at << ": act " << act[at] << " dh0 " << dh0[at] << " dh1 " << dh1[at];
      for (std::int64_t i = 0; i < n; ++i)
        if (i != at) {
          EXPECT_TRUE(std::isfinite(act[i]) && std::isfinite(dh0[i]) && std::isfinite(dh1[i])) << i;
        }
    }
  }
  // +inf: silu(inf) = inf, its gradient factor 1.
  const std::vector<float> h0 = {INFINITY}, one = {1.0f};
  std::vector<float> act(1), dh0(1), dh1(1);
  swiglu_forward(h0.data(), one.data(), act.data(), 1);
  swiglu_backward(h0.data(), one.data(), one.data(), dh0.data(), dh1.data(), 1);
  EXPECT_EQ(act[0], INFINITY);
  EXPECT_EQ(dh1[0], INFINITY);
}

}  // namespace
}  // namespace epmoe
