// Router selection rules on hand-made logits (one token each unless said):
// ties go to the lower expert id, bias only selects, groups limit the choice.
#include "moe/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace epmoe {
namespace {

// x = identity rows so that logits == gate rows: x [N, E] with H = E.
struct Routed {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

Routed route_logits(const RouterConfig& cfg, const std::vector<std::vector<float>>& logits,
                    const std::vector<float>& bias = {}) {
  const std::int64_t n = static_cast<std::int64_t>(logits.size());
  const std::int64_t e = cfg.num_experts;
  // x [N, N] = I and gate [N, E] = logits, so x gate = logits exactly.
  Tensor x = Tensor::zeros(DType::f32, {n, n});
  Tensor gate(DType::f32, {n, e});
  for (std::int64_t t = 0; t < n; ++t) {
    x.data<float>()[t * n + t] = 1.0f;
    for (std::int64_t j = 0; j < e; ++j) gate.data<float>()[t * e + j] = logits[t][j];
  }
  Tensor bias_tensor = Tensor::zeros(DType::f32, {e});
  for (std::size_t j = 0; j < bias.size(); ++j) bias_tensor.data<float>()[j] = bias[j];
  Router router(cfg);
  RouterOutput out = router.forward(x, gate, &bias_tensor);
  return {{out.topk_ids.span<std::int32_t>().begin(), out.topk_ids.span<std::int32_t>().end()},
          {out.topk_weights.span<float>().begin(), out.topk_weights.span<float>().end()}};
}

TEST(SoftmaxTopk, TiesGoToTheLowerExpertId) {
  RouterConfig cfg{.num_experts = 5, .top_k = 2};
  const Routed r = route_logits(cfg, {{1.0f, 3.0f, 3.0f, 0.0f, 3.0f}});
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
}

TEST(SoftmaxTopk, AllEqualLogitsPickTheFirstK) {
  RouterConfig cfg{.num_experts = 4, .top_k = 3};
  EXPECT_EQ(route_logits(cfg, {{0, 0, 0, 0}}).ids, (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(SoftmaxTopk, NormalisedOverKOrOverAll) {
  const std::vector<std::vector<float>> logits = {{0.0f, 1.0f, 2.0f}};
  RouterConfig over_k{.num_experts = 3, .top_k = 2, .norm_topk_prob = true};
  RouterConfig over_all{.num_experts = 3, .top_k = 2, .norm_topk_prob = false};
  const Routed a = route_logits(over_k, logits), b = route_logits(over_all, logits);
  EXPECT_EQ(a.ids, (std::vector<std::int32_t>{2, 1}));
  EXPECT_NEAR(a.weights[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(b.weights[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(b.weights[1], std::exp(1.0) / z, 1e-6);
}

TEST(SigmoidGrouped, BiasSelectsButDoesNotWeigh) {
  RouterConfig cfg{.kind = RouterKind::sigmoid_grouped, .num_experts = 4, .top_k = 1,
                   .norm_topk_prob = false, .routed_scaling_factor = 2.0f};
  // Expert 0 has the best score, but bias makes expert 3 selected; the weight
  // is expert 3's own sigmoid (no bias) times the scaling factor.
  const Routed r = route_logits(cfg, {{2.0f, 0.0f, 0.0f, -1.0f}}, {0.0f, 0.0f, 0.0f, 1.0f});
  EXPECT_EQ(r.ids[0], 3);
  EXPECT_NEAR(r.weights[0], 2.0 / (1.0 + std::exp(1.0)), 1e-6);
}

TEST(SigmoidGrouped, GroupScoreIsTheSumOfTopTwo) {
  // 2 groups of 3. Group 0 holds the single best expert (logit 4) but its
  // top-2 sum loses to group 1's two good experts; with topk_groups=1 every
  // chosen expert comes from group 1.
  RouterConfig cfg{.kind = RouterKind::sigmoid_grouped, .num_experts = 6, .top_k = 2,
                   .n_groups = 2, .topk_groups = 1};
  const Routed r = route_logits(cfg, {{4.0f, -6.0f, -6.0f, 2.0f, 2.0f, -6.0f}});
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{3, 4}));
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-6);
}

TEST(SigmoidGrouped, TiedGroupsGoToTheLowerGroupId) {
  RouterConfig cfg{.kind = RouterKind::sigmoid_grouped, .num_experts = 4, .top_k = 2,
                   .n_groups = 2, .topk_groups = 1};
  const Routed r = route_logits(cfg, {{1.0f, 0.5f, 0.5f, 1.0f}});
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{0, 1}));
}

void expect_config_error(const RouterConfig& cfg, const std::string& needle) {
  try {
    cfg.validate();
    FAIL() << "accepted a bad config, expected: " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RouterConfig, RejectsBadKeysByName) {
  expect_config_error({.num_experts = 4, .top_k = 5}, "top_k=5");
  expect_config_error({.num_experts = 4, .top_k = 0}, "top_k=0");
  expect_config_error({.kind = RouterKind::sigmoid_grouped, .num_experts = 6, .top_k = 1, .n_groups = 4},
                      "n_groups=4: must divide num_experts=6");
  expect_config_error({.kind = RouterKind::sigmoid_grouped, .num_experts = 8, .top_k = 1,
                       .n_groups = 4, .topk_groups = 5},
                      "topk_groups=5");
  expect_config_error({.kind = RouterKind::sigmoid_grouped, .num_experts = 8, .top_k = 5,
                       .n_groups = 4, .topk_groups = 2},
                      "top_k=5: must be at most topk_groups");
  EXPECT_THROW(parse_router_kind("router", "top2"), ConfigError);
}

}  // namespace
}  // namespace epmoe
