// RMSNorm against a double loop. Topology: one caller; N = 5 tokens with H in
// {1, 63, 64, 65} (around the 64-column block of dscale) for the numerics;
// N = 96, H = 1000 for the thread-budget test, several parallel grains of
// work so that two threads really split it. Loss for gradients:
// sum(y * w) with random w, i.e. dy = w.
#include "model/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model_test_util.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::relative_error;

constexpr float kEps = 1e-5f;

struct RmsReference {
  std::vector<double> y, inv_rms;
};

RmsReference reference_forward(const std::vector<double>& x, const std::vector<double>& scale, std::int64_t n_tokens,
                               std::int64_t hidden) {
  RmsReference ref{std::vector<double>(x.size()), std::vector<double>(n_tokens)};
  for (std::int64_t n = 0; n < n_tokens; ++n) {
    double sum_sq = 0;
    for (std::int64_t j = 0; j < hidden; ++j) sum_sq += x[n * hidden + j] * x[n * hidden + j];
    const double r = 1.0 / std::sqrt(sum_sq / hidden + kEps);
    ref.inv_rms[n] = r;
    for (std::int64_t j = 0; j < hidden; ++j) ref.y[n * hidden + j] = x[n * hidden + j] * r * scale[j];
  }
  return ref;
}

struct RmsGradients {
  std::vector<double> dx, dscale;
};

// Hand-derived: dx = r s dy - r^3 / H x sum(dy s x), dscale = sum_n dy x r.
RmsGradients reference_backward(const std::vector<double>& x, const std::vector<double>& scale,
                                const std::vector<double>& dy, std::int64_t n_tokens, std::int64_t hidden) {
  const RmsReference fwd = reference_forward(x, scale, n_tokens, hidden);
  RmsGradients g{std::vector<double>(x.size()), std::vector<double>(hidden, 0.0)};
  for (std::int64_t n = 0; n < n_tokens; ++n) {
    const double r = fwd.inv_rms[n];
    double dot = 0;
    for (std::int64_t j = 0; j < hidden; ++j) dot += dy[n * hidden + j] * scale[j] * x[n * hidden + j];
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t i = n * hidden + j;
      g.dx[i] = r * scale[j] * dy[i] - r * r * r / hidden * x[i] * dot;
      g.dscale[j] += dy[i] * x[i] * r;
    }
  }
  return g;
}

TEST(RmsNorm, ForwardAndBackwardMatchDouble) {
  const std::int64_t n_tokens = 5;
  for (std::int64_t hidden : {1, 63, 64, 65}) {
    const Tensor x = testing::random_tensor({n_tokens, hidden}, 1);
    const Tensor scale = testing::random_tensor({hidden}, 2, 0.5f, 1.5f);
    const Tensor dy = testing::random_tensor({n_tokens, hidden}, 3);
    Tensor y = testing::nan_tensor({n_tokens, hidden});
    Tensor inv_rms = testing::nan_tensor({n_tokens});
    rms_norm_forward(x, scale, kEps, y, inv_rms);

    const auto xd = testing::to_double(x), sd = testing::to_double(scale), dyd = testing::to_double(dy);
    const RmsReference ref = reference_forward(xd, sd, n_tokens, hidden);
    EXPECT_LE(relative_error(y, ref.y), kF32RelativeTolerance) << "H=" << hidden;
    EXPECT_LE(relative_error(inv_rms, ref.inv_rms), kF32RelativeTolerance) << "H=" << hidden;

    // dx accumulates onto what is there (the residual stream's gradient);
    // dscale is overwritten (NaN before).
    const Tensor dx_before = testing::random_tensor({n_tokens, hidden}, 4);
    Tensor dx = dx_before.clone();
    Tensor dscale = testing::nan_tensor({hidden});
    rms_norm_backward(x, scale, inv_rms, dy, dx, dscale);
    RmsGradients grad = reference_backward(xd, sd, dyd, n_tokens, hidden);
    for (std::size_t i = 0; i < grad.dx.size(); ++i) grad.dx[i] += dx_before.data<float>()[i];
    EXPECT_LE(relative_error(dx, grad.dx), kF32RelativeTolerance) << "H=" << hidden;
    EXPECT_LE(relative_error(dscale, grad.dscale), kF32RelativeTolerance) << "H=" << hidden;
  }
}

// The hand-derived backward above is the derivative of the forward: central
// differences of sum(y * w) in double over every x and scale element.
TEST(RmsNorm, ReferenceBackwardMatchesFiniteDifferences) {
  const std::int64_t n_tokens = 3, hidden = 7;
  const auto x = testing::to_double(testing::random_tensor({n_tokens, hidden}, 11));
  const auto scale = testing::to_double(testing::random_tensor({hidden}, 12, 0.5f, 1.5f));
  const auto w = testing::to_double(testing::random_tensor({n_tokens, hidden}, 13));
  const RmsGradients analytic = reference_backward(x, scale, w, n_tokens, hidden);
  const auto numeric_dx = testing::numeric_gradient(x, [&](const std::vector<double>& xp) {
    return testing::dot(reference_forward(xp, scale, n_tokens, hidden).y, w);
  });
  const auto numeric_dscale = testing::numeric_gradient(scale, [&](const std::vector<double>& sp) {
    return testing::dot(reference_forward(x, sp, n_tokens, hidden).y, w);
  });
  EXPECT_LE(relative_error(analytic.dx, numeric_dx), testing::kFiniteDifferenceTolerance);
  EXPECT_LE(relative_error(analytic.dscale, numeric_dscale), testing::kFiniteDifferenceTolerance);
}

TEST(RmsNorm, BitIdenticalForOneAndTwoThreads) {
  const std::int64_t n_tokens = 96, hidden = 1000;
  const Tensor x = testing::random_tensor({n_tokens, hidden}, 21);
  const Tensor scale = testing::random_tensor({hidden}, 22);
  const Tensor dy = testing::random_tensor({n_tokens, hidden}, 23);
  struct Run {
    Tensor y, inv_rms, dx, dscale;
  };
  auto run = [&](int threads) {
    testing::ScopedComputeThreads budget(threads);
    Run r{Tensor(DType::f32, {n_tokens, hidden}), Tensor(DType::f32, {n_tokens}),
          Tensor::zeros(DType::f32, {n_tokens, hidden}), Tensor(DType::f32, {hidden})};
    rms_norm_forward(x, scale, kEps, r.y, r.inv_rms);
    rms_norm_backward(x, scale, r.inv_rms, dy, r.dx, r.dscale);
    return r;
  };
  const Run one = run(1), two = run(2);
  EXPECT_TRUE(testing::same_bits(one.dscale, two.dscale));
  EXPECT_TRUE(testing::same_bits(one.y, two.y));
  EXPECT_TRUE(testing::same_bits(one.dx, two.dx));
  // And the common answer is the right one.
  const RmsGradients grad =
      reference_backward(testing::to_double(x), testing::to_double(scale), testing::to_double(dy), n_tokens, hidden);
  EXPECT_LE(relative_error(one.dscale, grad.dscale), kF32RelativeTolerance);
}

TEST(RmsNorm, ZeroTokens) {
  const std::int64_t hidden = 8;
  const Tensor x(DType::f32, {0, hidden});
  const Tensor scale = testing::random_tensor({hidden}, 31);
  Tensor y(DType::f32, {0, hidden}), inv_rms(DType::f32, {0}), dx(DType::f32, {0, hidden});
  const Tensor dy(DType::f32, {0, hidden});
  Tensor dscale = testing::nan_tensor({hidden});
  rms_norm_forward(x, scale, kEps, y, inv_rms);
  rms_norm_backward(x, scale, inv_rms, dy, dx, dscale);
  for (float v : dscale.span<float>()) EXPECT_EQ(v, 0.0f);  // an empty sum, not left as NaN
}

}  // namespace
}  // namespace epmoe
