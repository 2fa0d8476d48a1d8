// Dense SwiGLU MLP (the shared expert) against a double loop. Topology: one
// caller; N in {1, 6} tokens, H = 8, F = 12 for the numerics; N = 3, H = 4,
// F = 5 for finite differences. Loss for gradients: sum(y * w), i.e. dy = w.
#include "model/dense_swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model_test_util.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::relative_error;

struct Problem {
  std::int64_t n_tokens, hidden, ffn;
  std::vector<double> x, w0, w1, wo;
};

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

std::vector<double> reference_forward(const Problem& p) {
  const std::int64_t N = p.n_tokens, H = p.hidden, F = p.ffn;
  std::vector<double> y(N * H, 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t f = 0; f < F; ++f) {
      double h0 = 0, h1 = 0;
      for (std::int64_t k = 0; k < H; ++k) {
        h0 += p.x[n * H + k] * p.w0[k * F + f];
        h1 += p.x[n * H + k] * p.w1[k * F + f];
      }
      const double act = h0 * sigmoid(h0) * h1;
      for (std::int64_t j = 0; j < H; ++j) y[n * H + j] += act * p.wo[f * H + j];
    }
  }
  return y;
}

struct Gradients {
  std::vector<double> dx, dw0, dw1, dwo;
};

// Hand-derived, one token and one hidden unit f at a time.
Gradients reference_backward(const Problem& p, const std::vector<double>& dy) {
  const std::int64_t N = p.n_tokens, H = p.hidden, F = p.ffn;
  Gradients g{std::vector<double>(N * H, 0.0), std::vector<double>(H * F, 0.0), std::vector<double>(H * F, 0.0),
              std::vector<double>(F * H, 0.0)};
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t f = 0; f < F; ++f) {
      double h0 = 0, h1 = 0;
      for (std::int64_t k = 0; k < H; ++k) {
        h0 += p.x[n * H + k] * p.w0[k * F + f];
        h1 += p.x[n * H + k] * p.w1[k * F + f];
      }
      const double s = sigmoid(h0), silu = h0 * s, act = silu * h1;
      double dact = 0;
      for (std::int64_t j = 0; j < H; ++j) {
        dact += dy[n * H + j] * p.wo[f * H + j];
        g.dwo[f * H + j] += act * dy[n * H + j];
      }
      const double dh0 = dact * h1 * s * (1 + h0 * (1 - s)), dh1 = dact * silu;
      for (std::int64_t k = 0; k < H; ++k) {
        g.dw0[k * F + f] += p.x[n * H + k] * dh0;
        g.dw1[k * F + f] += p.x[n * H + k] * dh1;
        g.dx[n * H + k] += dh0 * p.w0[k * F + f] + dh1 * p.w1[k * F + f];
      }
    }
  }
  return g;
}

struct Tensors {
  Tensor x, w0, w1, wo;
};

// O(1) activations: x ~ U(-1, 1) and weights ~ U(-1, 1) / sqrt(fan_in).
Tensors make_tensors(std::int64_t n_tokens, std::int64_t hidden, std::int64_t ffn, std::uint64_t seed) {
  const float in = 1.0f / std::sqrt(float(hidden)), out = 1.0f / std::sqrt(float(ffn));
  return {testing::random_tensor({n_tokens, hidden}, seed, -1.0f, 1.0f),
          testing::random_tensor({hidden, ffn}, seed + 1, -2 * in, 2 * in),
          testing::random_tensor({hidden, ffn}, seed + 2, -2 * in, 2 * in),
          testing::random_tensor({ffn, hidden}, seed + 3, -2 * out, 2 * out)};
}

Problem to_problem(const Tensors& t) {
  return {t.x.dim(0),
          t.x.dim(1),
          t.w0.dim(1),
          testing::to_double(t.x),
          testing::to_double(t.w0),
          testing::to_double(t.w1),
          testing::to_double(t.wo)};
}

TEST(DenseSwiglu, ForwardAndBackwardMatchDouble) {
  const std::int64_t hidden = 8, ffn = 12;
  for (std::int64_t n_tokens : {1, 6}) {
    const Tensors t = make_tensors(n_tokens, hidden, ffn, 1);
    const Problem p = to_problem(t);
    Tensor y = testing::nan_tensor({n_tokens, hidden});
    DenseSwigluSaved saved;
    dense_swiglu_forward(t.x, t.w0, t.w1, t.wo, y, saved);
    EXPECT_LE(relative_error(y, reference_forward(p)), kF32RelativeTolerance) << "N=" << n_tokens;

    const Tensor dy = testing::random_tensor({n_tokens, hidden}, 9);
    const Tensor dx_before = testing::random_tensor({n_tokens, hidden}, 10);
    Tensor dx = dx_before.clone();
    Tensor dw0 = testing::nan_tensor({hidden, ffn}), dw1 = testing::nan_tensor({hidden, ffn});
    Tensor dwo = testing::nan_tensor({ffn, hidden});
    dense_swiglu_backward(t.x, t.w0, t.w1, t.wo, saved, dy, dx, dw0, dw1, dwo);
    Gradients ref = reference_backward(p, testing::to_double(dy));
    for (std::size_t i = 0; i < ref.dx.size(); ++i) ref.dx[i] += dx_before.data<float>()[i];
    EXPECT_LE(relative_error(dx, ref.dx), kF32RelativeTolerance) << "N=" << n_tokens;
    EXPECT_LE(relative_error(dw0, ref.dw0), kF32RelativeTolerance) << "N=" << n_tokens;
    EXPECT_LE(relative_error(dw1, ref.dw1), kF32RelativeTolerance) << "N=" << n_tokens;
    EXPECT_LE(relative_error(dwo, ref.dwo), kF32RelativeTolerance) << "N=" << n_tokens;
  }
}

// The hand-derived backward against central differences of sum(y * w) in
// double, for every element of x, w0, w1 and wo.
TEST(DenseSwiglu, ReferenceBackwardMatchesFiniteDifferences) {
  const Problem base = to_problem(make_tensors(3, 4, 5, 21));
  const auto w = testing::to_double(testing::random_tensor({3, 4}, 25));
  const Gradients analytic = reference_backward(base, w);
  struct Case {
    const char* name;
    std::vector<double> Problem::*member;
    const std::vector<double>& grad;
  };
  for (const Case& c : {Case{"x", &Problem::x, analytic.dx}, Case{"w0", &Problem::w0, analytic.dw0},
                        Case{"w1", &Problem::w1, analytic.dw1}, Case{"wo", &Problem::wo, analytic.dwo}}) {
    const auto numeric = testing::numeric_gradient(base.*c.member, [&](const std::vector<double>& values) {
      Problem p = base;
      p.*c.member = values;
      return testing::dot(reference_forward(p), w);
    });
    EXPECT_LE(relative_error(c.grad, numeric), testing::kFiniteDifferenceTolerance) << c.name;
  }
}

TEST(DenseSwiglu, ZeroTokens) {
  const std::int64_t hidden = 4, ffn = 6;
  const Tensors t = make_tensors(0, hidden, ffn, 31);
  Tensor y(DType::f32, {0, hidden}), dx(DType::f32, {0, hidden});
  DenseSwigluSaved saved;
  dense_swiglu_forward(t.x, t.w0, t.w1, t.wo, y, saved);
  EXPECT_EQ(saved.h0.shape(), (Shape{0, ffn}));
  Tensor dw0 = testing::nan_tensor({hidden, ffn}), dw1 = testing::nan_tensor({hidden, ffn});
  Tensor dwo = testing::nan_tensor({ffn, hidden});
  dense_swiglu_backward(t.x, t.w0, t.w1, t.wo, saved, Tensor(DType::f32, {0, hidden}), dx, dw0, dw1, dwo);
  for (const Tensor* g : {&dw0, &dw1, &dwo})
    for (float v : g->span<float>()) EXPECT_EQ(v, 0.0f);  // overwritten with the empty sum
}

// A training loop keeps one DenseSwigluSaved: a second forward of the same
// shape writes into the same buffers instead of allocating new ones.
TEST(DenseSwiglu, ForwardReusesSavedBuffers) {
  const Tensors t = make_tensors(4, 8, 12, 41);
  Tensor y(DType::f32, {4, 8});
  DenseSwigluSaved saved;
  dense_swiglu_forward(t.x, t.w0, t.w1, t.wo, y, saved);
  const void* h0 = saved.h0.raw();
  const void* act = saved.act.raw();
  dense_swiglu_forward(t.x, t.w0, t.w1, t.wo, y, saved);
  EXPECT_EQ(saved.h0.raw(), h0);
  EXPECT_EQ(saved.act.raw(), act);
}

}  // namespace
}  // namespace epmoe
