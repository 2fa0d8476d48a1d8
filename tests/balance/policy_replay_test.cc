// Offline policy replays (balance/policy_replay.h) on generated loads:
// E = 32 experts, R = 8 ranks (E_l = 4), B = 2, K = 4, 60 steps, W = P = 20.
// What holds by construction: none moves nothing; dynamic never exceeds none
// in any step (the planner never raises the max); eplb equals none until its
// first period and moves weights only at period steps; every policy conserves
// tokens; the hybrid balancer's plans keep the planner's invariants. With
// record_plans every step's copies and weight moves are kept: quotas sum to
// the step's counts, the moves are exactly the residency rule's, and the
// summary figures are the same as without.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "balance/eplb.h"
#include "balance/hybrid_balancer.h"
#include "balance/load_generator.h"
#include "balance/load_imbalance.h"
#include "balance/policy_replay.h"
#include "balance/replica_planner.h"
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

TEST(PolicyReplay, RecordedPlansMatchTheCountsTheSummaryAndTheResidencyRule) {
  const ExpertLoadHistory history = skewed_history(HotExpertPlacement::packed);
  const int num_experts = 32, num_ranks = 8;
  for (const BalancePolicy policy :
       {BalancePolicy::none, BalancePolicy::eplb, BalancePolicy::dynamic, BalancePolicy::hybrid}) {
    SCOPED_TRACE(std::string(policy_name(policy)));
    PolicyReplayOptions options = replay_options();
    const PolicyReplay summary = replay_policy(policy, history, options);
    options.record_plans = true;
    const PolicyReplay plans = replay_policy(policy, history, options);
    ASSERT_EQ(plans.steps.size(), summary.steps.size());
    // Before step 0 every expert is at its home.
    std::set<std::pair<int, int>> held_before;  // (rank, expert)
    const std::vector<int> homes = contiguous_home_ranks(num_experts, num_ranks);
    for (int e = 0; e < num_experts; ++e) held_before.insert({homes[e], e});
    int total_moves = 0;
    for (int s = 0; s < history.num_steps; ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      const StepOutcome& step = plans.steps[s];
      EXPECT_TRUE(summary.steps[s].copies.empty());
      EXPECT_TRUE(summary.steps[s].moves.empty());
      EXPECT_EQ(step.max_over_mean, summary.steps[s].max_over_mean);
      EXPECT_EQ(step.expert_moves, summary.steps[s].expert_moves);
      EXPECT_EQ(step.active_replicas, summary.steps[s].active_replicas);
      // Copies by expert, quotas summing to the count, one copy per rank at most.
      std::vector<std::int64_t> quota_sum(num_experts, 0), rank_loads(num_ranks, 0);
      std::vector<std::set<int>> ranks_of(num_experts);
      std::set<std::pair<int, int>> held;
      int previous_expert = 0;
      for (const PlannedCopy& copy : step.copies) {
        ASSERT_GE(copy.expert, previous_expert);
        ASSERT_LT(copy.expert, num_experts);
        ASSERT_GE(copy.rank, 0);
        ASSERT_LT(copy.rank, num_ranks);
        EXPECT_GE(copy.quota, 0);
        EXPECT_TRUE(ranks_of[copy.expert].insert(copy.rank).second) << "expert " << copy.expert;
        previous_expert = copy.expert;
        quota_sum[copy.expert] += copy.quota;
        rank_loads[copy.rank] += copy.quota;
        held.insert({copy.rank, copy.expert});
      }
      for (int e = 0; e < num_experts; ++e) {
        EXPECT_EQ(quota_sum[e], history.step(s)[e]) << "expert " << e;
        EXPECT_FALSE(ranks_of[e].empty()) << "expert " << e;
      }
      EXPECT_EQ(static_cast<int>(step.copies.size()) - num_experts, step.active_replicas);
      // The quotas are the loads the figure was measured on.
      EXPECT_DOUBLE_EQ(measure_load_imbalance(rank_loads).max_over_mean(), step.max_over_mean);
      if (policy == BalancePolicy::none) {
        EXPECT_EQ(static_cast<int>(step.copies.size()), num_experts);
      }
      if (policy == BalancePolicy::eplb) {
        // The even split: an expert's quotas differ by at most one token.
        for (int e = 0; e < num_experts; ++e) {
          std::int64_t low = INT64_MAX, high = 0;
          for (const PlannedCopy& copy : step.copies) {
            if (copy.expert != e) continue;
            low = std::min(low, copy.quota);
            high = std::max(high, copy.quota);
          }
          EXPECT_LE(high - low, 1) << "expert " << e;
        }
      }
      // Moves: the pairs held now and not in the step before, ascending.
      std::vector<std::pair<int, int>> expected_moves;
      for (const auto& pair : held) {
        if (!held_before.count(pair)) expected_moves.push_back(pair);
      }
      std::vector<std::pair<int, int>> moves;
      for (const WeightMove& move : step.moves) moves.push_back({move.rank, move.expert});
      EXPECT_EQ(moves, expected_moves);
      EXPECT_EQ(static_cast<int>(step.moves.size()), step.expert_moves);
      total_moves += step.expert_moves;
      held_before = std::move(held);
    }
    if (policy != BalancePolicy::none) {
      EXPECT_GT(total_moves, 0);
    }
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
