// The Zipf load generator (balance/load_generator.h): reproducible from the
// seed, every token picks K distinct experts, popularity order follows the
// Zipf ranks, spread vs packed hot experts, drift, and its key errors.
// Default topology: E = 16 experts on R = 4 ranks (E_l = 4), K = 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "balance/load_generator.h"
#include "core/error.h"

namespace epmoe::balance {
namespace {

LoadGeneratorOptions small_options() {
  LoadGeneratorOptions options;
  options.num_experts = 16;
  options.num_ranks = 4;
  options.num_tokens_per_rank = 512;
  options.top_k = 2;
  options.num_steps = 20;
  options.zipf_exponent = 1.2;
  options.seed = 42;
  return options;
}

std::vector<std::int64_t> total_per_expert(const ExpertLoadHistory& history) {
  return history.window_sum(0, history.num_steps);
}

TEST(LoadGenerator, SameSeedSameLoadsOtherSeedOtherLoads) {
  const LoadGeneratorOptions options = small_options();
  EXPECT_EQ(generate_expert_loads(options).counts, generate_expert_loads(options).counts);
  LoadGeneratorOptions other = options;
  other.seed = 43;
  EXPECT_NE(generate_expert_loads(other).counts, generate_expert_loads(options).counts);
}

TEST(LoadGenerator, EveryTokenPicksKDistinctExperts) {
  for (const int top_k : {1, 3, 16}) {  // 16 = E: every expert, through the exact fallback
    LoadGeneratorOptions options = small_options();
    options.top_k = top_k;
    options.zipf_exponent = 2.0;
    const ExpertLoadHistory history = generate_expert_loads(options);
    const std::int64_t tokens = options.num_tokens_per_rank * options.num_ranks;
    for (int s = 0; s < history.num_steps; ++s) {
      const auto step = history.step(s);
      EXPECT_EQ(std::accumulate(step.begin(), step.end(), std::int64_t{0}), tokens * top_k);
      for (const std::int64_t count : step) EXPECT_LE(count, tokens);  // at most once per token
      if (top_k == options.num_experts) {
        for (const std::int64_t count : step) EXPECT_EQ(count, tokens);
      }
    }
  }
}

TEST(LoadGenerator, LoadsFollowZipfPopularity) {
  LoadGeneratorOptions options = small_options();
  options.placement = HotExpertPlacement::packed;  // popularity rank i = expert i
  const std::vector<std::int64_t> totals = total_per_expert(generate_expert_loads(options));
  for (int i = 0; i + 1 < 6; ++i) EXPECT_GT(totals[i], totals[i + 1]) << "popularity ranks " << i << ", " << i + 1;
  EXPECT_GT(totals[0], 5 * totals[15]);

  options.zipf_exponent = 0;  // uniform: every expert within 5% of the mean
  const std::vector<std::int64_t> uniform = total_per_expert(generate_expert_loads(options));
  const double mean = std::accumulate(uniform.begin(), uniform.end(), 0.0) / uniform.size();
  for (const std::int64_t total : uniform) EXPECT_NEAR(total, mean, 0.05 * mean);
}

TEST(LoadGenerator, SpreadPutsHotExpertsOnDistinctRanksPackedOnRankZero) {
  LoadGeneratorOptions options = small_options();
  const int experts_per_rank = options.num_experts / options.num_ranks;
  const auto hottest = [&](HotExpertPlacement placement, int how_many) {
    options.placement = placement;
    const std::vector<std::int64_t> totals = total_per_expert(generate_expert_loads(options));
    std::vector<int> order(totals.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return totals[a] > totals[b]; });
    order.resize(how_many);
    return order;
  };
  std::vector<int> spread_ranks;
  for (const int expert : hottest(HotExpertPlacement::spread, options.num_ranks)) {
    spread_ranks.push_back(expert / experts_per_rank);
  }
  std::sort(spread_ranks.begin(), spread_ranks.end());
  EXPECT_EQ(spread_ranks, (std::vector<int>{0, 1, 2, 3}));
  for (const int expert : hottest(HotExpertPlacement::packed, experts_per_rank)) {
    EXPECT_EQ(expert / experts_per_rank, 0) << "hot expert " << expert;
  }
}

TEST(LoadGenerator, RotateDriftHandsTheTopToTheNextExpert) {
  LoadGeneratorOptions options = small_options();
  options.top_k = 1;
  options.zipf_exponent = 2.0;  // the hottest expert takes ~60% of tokens
  options.num_steps = 3;
  options.drift = PopularityDrift::rotate;
  const std::vector<int> mapping = initial_expert_of_popularity_rank(options);
  const ExpertLoadHistory history = generate_expert_loads(options);
  for (int s = 0; s < history.num_steps; ++s) {
    const auto step = history.step(s);
    const int hottest = static_cast<int>(std::max_element(step.begin(), step.end()) - step.begin());
    EXPECT_EQ(hottest, mapping[s]) << "step " << s;
  }
}

TEST(LoadGenerator, SwapDriftKeepsEachStepAPermutationOfTheSameProfile) {
  LoadGeneratorOptions options = small_options();
  options.drift = PopularityDrift::swap;
  LoadGeneratorOptions fixed = options;
  fixed.drift = PopularityDrift::none;
  // Step 0 precedes any drift event, and steps draw their own streams.
  const ExpertLoadHistory drifting = generate_expert_loads(options), still = generate_expert_loads(fixed);
  EXPECT_TRUE(std::equal(drifting.step(0).begin(), drifting.step(0).end(), still.step(0).begin()));
  EXPECT_NE(drifting.counts, still.counts);
}

TEST(LoadGenerator, RejectsBadOptionsNamingTheKey) {
  LoadGeneratorOptions options = small_options();
  options.num_experts = 18;
  try {
    validate(options);
    FAIL() << "18 experts on 4 ranks accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("experts=18 is not divisible by ranks=4"), std::string::npos) << e.what();
  }
  options = small_options();
  options.top_k = 17;
  EXPECT_THROW(validate(options), ConfigError);
}

}  // namespace
}  // namespace epmoe::balance
