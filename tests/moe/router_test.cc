// Router selection rules on hand-made logits (one token each unless said):
// ties go to the lower expert id, bias only selects, groups limit the choice.
#include "moe/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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
  RouterOutput out = router.forward(x, gate, bias_tensor);
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

// DeepSeek-V2 group-limited greedy (router=softmax_topk, n_groups > 1): a
// group scores its MAX probability, not the top-2 sum of sigmoid_grouped.
// 2 groups of 3: group 0 = {4, -6, -6} (max 4, top-2 sum -2), group 1 =
// {2, 2, -6} (max 2, top-2 sum 4). Keeping 1 group keeps group 0.
TEST(SoftmaxTopk, GroupScoreIsTheMaxProbability) {
  const std::vector<std::vector<float>> logits = {{4.0f, -6.0f, -6.0f, 2.0f, 2.0f, -6.0f}};
  RouterConfig cfg{.num_experts = 6, .top_k = 2, .n_groups = 2, .topk_groups = 1};
  const Routed r = route_logits(cfg, logits);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{0, 1}));  // -6 tie: lower id
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-10.0)), 1e-6);
  // Ungrouped, the same logits choose across both groups.
  EXPECT_EQ(route_logits({.num_experts = 6, .top_k = 2}, logits).ids, (std::vector<std::int32_t>{0, 3}));
  // norm_topk_prob=false: the chosen experts' softmax over all 6, times c.
  cfg.norm_topk_prob = false;
  cfg.routed_scaling_factor = 16.0f;  // DeepSeek-V2's own setting
  const Routed v2 = route_logits(cfg, logits);
  EXPECT_EQ(v2.ids, (std::vector<std::int32_t>{0, 1}));
  const double z = std::exp(4.0) + 2 * std::exp(2.0) + 3 * std::exp(-6.0);
  EXPECT_NEAR(v2.weights[0], 16.0 * std::exp(4.0) / z, 1e-5);
  EXPECT_NEAR(v2.weights[1], 16.0 * std::exp(-6.0) / z, 1e-9);
}

TEST(SoftmaxTopk, TiedGroupsGoToTheLowerGroupId) {
  RouterConfig cfg{.num_experts = 4, .top_k = 2, .n_groups = 2, .topk_groups = 1};
  EXPECT_EQ(route_logits(cfg, {{0.5f, 1.0f, 1.0f, 0.0f}}).ids, (std::vector<std::int32_t>{1, 0}));
}

// Properties over random logits (64 tokens, E = 8, K = 3), both norms:
//  * keeping every group (topk_groups = n_groups) is bit-identical to no
//    groups, and the defaults are the code path of before the keys existed;
//  * a power-of-two routed_scaling_factor multiplies each weight exactly;
//  * with groups, every chosen expert lies in one of topk_groups groups, and
//    those are the groups with the largest max logit.
TEST(SoftmaxTopk, GroupsAndScalingProperties) {
  Rng rng(99);
  std::vector<std::vector<float>> logits(64, std::vector<float>(8));
  for (auto& row : logits)
    for (float& v : row) v = static_cast<float>(rng.normal() * 2.0);
  for (bool norm : {true, false}) {
    const RouterConfig plain{.num_experts = 8, .top_k = 3, .norm_topk_prob = norm};
    const Routed base = route_logits(plain, logits);
    RouterConfig all_groups = plain;
    all_groups.n_groups = 4;
    all_groups.topk_groups = 4;
    const Routed same = route_logits(all_groups, logits);
    EXPECT_EQ(same.ids, base.ids);
    EXPECT_EQ(same.weights, base.weights);  // bit for bit
    RouterConfig scaled = plain;
    scaled.routed_scaling_factor = 4.0f;
    const Routed times4 = route_logits(scaled, logits);
    EXPECT_EQ(times4.ids, base.ids);
    for (std::size_t i = 0; i < base.weights.size(); ++i) EXPECT_EQ(times4.weights[i], 4.0f * base.weights[i]);
    RouterConfig grouped = plain;
    grouped.n_groups = 4;
    grouped.topk_groups = 2;
    const Routed limited = route_logits(grouped, logits);
    int differs = 0;
    for (std::size_t t = 0; t < logits.size(); ++t) {
      std::vector<float> group_max(4);
      for (int g = 0; g < 4; ++g) group_max[g] = std::max(logits[t][2 * g], logits[t][2 * g + 1]);
      std::vector<float> sorted = group_max;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      for (int k = 0; k < 3; ++k) {
        const int g = limited.ids[t * 3 + k] / 2;
        EXPECT_GE(group_max[g], sorted[1]) << "token " << t << " chose expert outside the 2 best groups";
      }
      for (int k = 0; k < 3; ++k) differs += limited.ids[t * 3 + k] != base.ids[t * 3 + k];
    }
    EXPECT_GT(differs, 0) << "group limits never changed a choice: the test is empty";
  }
}

TEST(SigmoidGrouped, BiasSelectsButDoesNotWeigh) {
  RouterConfig cfg{.kind = RouterKind::sigmoid_grouped,
                   .num_experts = 4,
                   .top_k = 1,
                   .norm_topk_prob = false,
                   .routed_scaling_factor = 2.0f};
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
  RouterConfig cfg{.kind = RouterKind::sigmoid_grouped, .num_experts = 6, .top_k = 2, .n_groups = 2, .topk_groups = 1};
  const Routed r = route_logits(cfg, {{4.0f, -6.0f, -6.0f, 2.0f, 2.0f, -6.0f}});
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{3, 4}));
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-6);
}

TEST(SigmoidGrouped, TiedGroupsGoToTheLowerGroupId) {
  RouterConfig cfg{.kind = RouterKind::sigmoid_grouped, .num_experts = 4, .top_k = 2, .n_groups = 2, .topk_groups = 1};
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
  expect_config_error(
      {.kind = RouterKind::sigmoid_grouped, .num_experts = 8, .top_k = 1, .n_groups = 4, .topk_groups = 5},
      "topk_groups=5");
  expect_config_error(
      {.kind = RouterKind::sigmoid_grouped, .num_experts = 8, .top_k = 5, .n_groups = 4, .topk_groups = 2},
      "top_k=5: must be at most topk_groups");
  EXPECT_THROW(parse_router_kind("router", "top2"), ConfigError);
  // The group and scaling keys are honoured, so checked, for softmax_topk too.
  expect_config_error({.num_experts = 6, .top_k = 1, .n_groups = 4}, "n_groups=4: must divide num_experts=6");
  expect_config_error({.num_experts = 8, .top_k = 1, .n_groups = 2, .topk_groups = 3}, "topk_groups=3");
  expect_config_error({.num_experts = 8, .top_k = 3, .n_groups = 4, .topk_groups = 1},
                      "top_k=3: must be at most topk_groups * num_experts / n_groups = 2");
  expect_config_error({.num_experts = 4, .top_k = 1, .routed_scaling_factor = 0.0f}, "routed_scaling_factor=0");
  expect_config_error({.num_experts = 4, .top_k = 1, .routed_scaling_factor = -1.0f}, "routed_scaling_factor=-1");
  // One expert per group: sigmoid_grouped's top-2 group score is impossible.
  // softmax_topk's max score is fine with one expert per group.
  expect_config_error(
      {.kind = RouterKind::sigmoid_grouped, .num_experts = 4, .top_k = 2, .n_groups = 4, .topk_groups = 2},
      "n_groups=4 with num_experts=4: router=sigmoid_grouped scores a group by the sum of its "
      "top-2 experts, so each group needs at least 2 experts (num_experts / n_groups >= 2)");
  EXPECT_NO_THROW((RouterConfig{.num_experts = 4, .top_k = 2, .n_groups = 4, .topk_groups = 2}.validate()));
  EXPECT_NO_THROW((RouterConfig{.kind = RouterKind::sigmoid_grouped, .num_experts = 1, .top_k = 1}.validate()));
}

}  // namespace
}  // namespace epmoe
