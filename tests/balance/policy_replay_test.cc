// Offline policy replays (balance/policy_replay.h) on generated loads:
// E = 32 experts, R = 8 ranks (E_l = 4), B = 2, K = 4, 60 steps, W = P = 20.
// What holds by construction: none moves nothing; dynamic never exceeds none
// in any step (the planner never raises the max); eplb equals none until its
// first period and moves weights only at period steps; every policy conserves
// tokens; the hybrid balancer's plans keep the planner's invariants.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "balance/eplb.h"
#include "balance/hybrid_balancer.h"
#include "balance/load_generator.h"
#include "balance/policy_replay.h"
#include "core/error.h"

namespace epmoe::balance {
namespace {

ExpertLoadHistory skewed_history(HotExpertPlacement placement) {
  LoadGeneratorOptions options;
  options.num_experts = 32;
  options.num_ranks = 8;
  options.num_tokens_per_rank = 256;
  options.top_k = 4;
  options.num_steps = 60;
  options.zipf_exponent = 1.2;
  options.placement = placement;
  options.drift = PopularityDrift::swap;
  options.seed = 1;
  return generate_expert_loads(options);
}

PolicyReplayOptions replay_options() { return {8, 2, 1.05, 20, 20}; }

TEST(PolicyReplay, DynamicNeverWorseThanNoneAndNoneMovesNothing) {
  for (const HotExpertPlacement placement : {HotExpertPlacement::spread, HotExpertPlacement::packed}) {
    const ExpertLoadHistory history = skewed_history(placement);
    const PolicyReplay none = replay_policy(BalancePolicy::none, history, replay_options());
    const PolicyReplay dynamic = replay_policy(BalancePolicy::dynamic, history, replay_options());
    ASSERT_EQ(none.steps.size(), 60u);
    for (std::size_t s = 0; s < none.steps.size(); ++s) {
      EXPECT_EQ(none.steps[s].expert_moves, 0);
      EXPECT_EQ(none.steps[s].active_replicas, 0);
      EXPECT_LE(dynamic.steps[s].max_over_mean, none.steps[s].max_over_mean) << "step " << s;
      EXPECT_LE(dynamic.steps[s].active_replicas, 8 * 2);
      EXPECT_LE(dynamic.steps[s].expert_moves, dynamic.steps[s].active_replicas);
    }
    EXPECT_LT(dynamic.mean_max_over_mean(), none.mean_max_over_mean());
  }
}

TEST(PolicyReplay, EplbActsOnlyAtPeriods) {
  const ExpertLoadHistory history = skewed_history(HotExpertPlacement::packed);
  const PolicyReplay none = replay_policy(BalancePolicy::none, history, replay_options());
  const PolicyReplay eplb = replay_policy(BalancePolicy::eplb, history, replay_options());
  for (int s = 0; s < 60; ++s) {
    if (s < 20) {
      EXPECT_EQ(eplb.steps[s].max_over_mean, none.steps[s].max_over_mean) << "step " << s;
    }
    if (s % 20 != 0) {
      EXPECT_EQ(eplb.steps[s].expert_moves, 0) << "step " << s;
    }
  }
  EXPECT_GT(eplb.steps[20].expert_moves, 0);
  // Once it has a window, EPLB fixes the packed hot rank.
  EXPECT_LT(eplb.mean_max_over_mean_from_first_period(), 0.5 * none.mean_max_over_mean());
  EXPECT_EQ(eplb.steps[30].active_replicas, 8 * 2);  // every redundant slot filled
}

TEST(HybridBalancer, PlansKeepThePlannerInvariantsOnNewHomes) {
  const ExpertLoadHistory history = skewed_history(HotExpertPlacement::packed);
  HybridBalancer balancer(32, {8, 2, 1.05});
  balancer.rehome(history.window_sum(0, 20));
  std::vector<int> per_rank(8, 0);
  for (const int home : balancer.home_ranks()) ++per_rank[home];
  for (const int count : per_rank) EXPECT_EQ(count, 4);
  for (int s = 20; s < 40; ++s) {
    const ReplicaPlan plan = balancer.plan_step(history.step(s));
    for (int e = 0; e < 32; ++e) {
      const auto copies = plan.copies_of(e);
      EXPECT_EQ(copies[0].rank, balancer.home_ranks()[e]);
      std::int64_t sum = 0;
      for (const ExpertCopy& copy : copies) sum += copy.token_quota;
      EXPECT_EQ(sum, history.step(s)[e]);
    }
    EXPECT_LE(plan.after.max_load, plan.before.max_load);
  }
}

TEST(PolicyReplay, RejectsRanksThatDoNotDivideTheExperts) {
  const ExpertLoadHistory history = skewed_history(HotExpertPlacement::spread);
  PolicyReplayOptions options = replay_options();
  options.num_ranks = 6;
  EXPECT_THROW(replay_policy(BalancePolicy::dynamic, history, options), ConfigError);
}

}  // namespace
}  // namespace epmoe::balance
