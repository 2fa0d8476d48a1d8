// AdamW against a double reference written out from the update formulas.
// Topology: one caller; 37 parameters over 3 steps with fresh gradients each
// step, for decay off/on and a clipping multiplier; 100003 parameters (many
// 1024-element blocks and an odd tail) for the thread-budget test.
#include "model/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model_test_util.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::relative_error;

struct Case {
  bool decay;
  float grad_multiplier;
};

TEST(AdamW, MatchesDoubleReferenceForThreeSteps) {
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const std::int64_t size = 37;
  const double lr = 0.05;
  for (const Case c : {Case{false, 1.0f}, Case{true, 1.0f}, Case{true, 0.5f}}) {
    Tensor param = testing::random_tensor({size}, 1);
    const std::vector<double> param0 = testing::to_double(param);
    Tensor m = Tensor::zeros(DType::f32, {size}), v = Tensor::zeros(DType::f32, {size});
    std::vector<double> p_ref = param0, m_ref(size, 0.0), v_ref(size, 0.0);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = testing::random_tensor({size}, 10 + step);
      adamw_update(config, step, lr, c.decay, c.grad_multiplier, param.span<float>(), grad.span<float>(),
                   m.span<float>(), v.span<float>());
      for (std::int64_t i = 0; i < size; ++i) {
        const double g = double(grad.data<float>()[i]) * c.grad_multiplier;
        m_ref[i] = 0.9 * m_ref[i] + 0.1 * g;
        v_ref[i] = 0.95 * v_ref[i] + 0.05 * g * g;
        const double m_hat = m_ref[i] / (1 - std::pow(0.9, step));
        const double v_hat = v_ref[i] / (1 - std::pow(0.95, step));
        p_ref[i] -= lr * (m_hat / (std::sqrt(v_hat) + 1e-8) + (c.decay ? 0.1 * p_ref[i] : 0.0));
      }
    }
    const std::string label =
        std::string("decay=") + (c.decay ? "on" : "off") + " multiplier=" + std::to_string(c.grad_multiplier);
    EXPECT_LE(relative_error(m, m_ref), kF32RelativeTolerance) << label;
    EXPECT_LE(relative_error(v, v_ref), kF32RelativeTolerance) << label;
    // The parameters move by ~lr per step; compare the movement, which is
    // what the update computes (param itself is dominated by its start).
    std::vector<double> moved(size), moved_ref(size);
    for (std::int64_t i = 0; i < size; ++i) {
      moved[i] = double(param.data<float>()[i]) - param0[i];
      moved_ref[i] = p_ref[i] - param0[i];
    }
    EXPECT_LE(relative_error(moved, moved_ref), kF32RelativeTolerance) << label;
  }
}

// At t = 1 the bias corrections make m_hat = g and v_hat = g^2, so every
// parameter moves by exactly lr against the sign of its gradient (|g| >> eps),
// whatever the multiplier: Adam is invariant to gradient scale.
TEST(AdamW, FirstStepMovesEachParameterByTheLearningRate) {
  const AdamWConfig config{.weight_decay = 0.0};
  const std::vector<float> grad = {0.5f, -2.0f, 1e-3f, -7.0f};
  std::vector<float> param = {1.0f, 1.0f, 1.0f, 1.0f}, m(4, 0.0f), v(4, 0.0f);
  adamw_update(config, 1, 0.01, true, 0.25f, param, grad, m, v);
  for (std::size_t i = 0; i < grad.size(); ++i)
    EXPECT_NEAR(param[i], 1.0f - 0.01f * (grad[i] > 0 ? 1.0f : -1.0f), 1e-6f) << i;
}

TEST(AdamW, BitIdenticalForOneAndTwoThreads) {
  const std::int64_t size = 100003;
  const Tensor param0 = testing::random_tensor({size}, 2);
  const Tensor grad = testing::random_tensor({size}, 3);
  const Tensor m0 = testing::random_tensor({size}, 4, -0.1f, 0.1f);
  const Tensor v0 = testing::random_tensor({size}, 5, 0.0f, 0.01f);
  struct State {
    Tensor param, m, v;
  };
  auto run = [&](int threads) {
    testing::ScopedComputeThreads budget(threads);
    State s{param0.clone(), m0.clone(), v0.clone()};
    adamw_update(AdamWConfig{}, 7, 1e-3, true, 0.8f, s.param.span<float>(), grad.span<float>(), s.m.span<float>(),
                 s.v.span<float>());
    return s;
  };
  const State one = run(1), two = run(2);
  EXPECT_TRUE(testing::same_bits(one.param, two.param));
  EXPECT_TRUE(testing::same_bits(one.m, two.m));
  EXPECT_TRUE(testing::same_bits(one.v, two.v));
  EXPECT_FALSE(testing::same_bits(one.param, param0));  // it did update
}

TEST(AdamW, ValidateNamesTheKey) {
  EXPECT_NO_THROW(AdamWConfig{}.validate());
  struct Bad {
    AdamWConfig config;
    const char* key;
  };
  const double nan = std::nan("");
  for (const Bad& bad : {Bad{{.beta1 = 1.0}, "adam_beta1"}, Bad{{.beta1 = -0.1}, "adam_beta1"},
                         Bad{{.beta2 = 1.5}, "adam_beta2"}, Bad{{.beta2 = nan}, "adam_beta2"},
                         Bad{{.eps = 0.0}, "adam_eps"}, Bad{{.weight_decay = -1e-3}, "weight_decay"}}) {
    try {
      bad.config.validate();
      ADD_FAILURE() << "no error for " << bad.key;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad.key) + "="), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace epmoe
