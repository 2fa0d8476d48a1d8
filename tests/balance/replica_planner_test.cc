// The per-step replica planner (balance/replica_planner.h) against its
// contract, on thousands of random count vectors and on adversarial ones:
// one expert holds everything, all equal, all zero, tiny counts, a single
// rank, B = 0, one expert per rank (E_l = 1), a busiest rank whose experts are
// all replicated already (the seeds' bug). Topologies: R in {1, 2, 3, 4, 8,
// 16}, E_l in {1, 2, 4, 8}, B in {0, 1, 2, 3}; homes contiguous (e / E_l) or
// shuffled (as after a hybrid re-home).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "balance/replica_planner.h"
#include "core/rng.h"

namespace epmoe::balance {
namespace {

std::vector<std::int64_t> home_loads(std::span<const std::int64_t> counts, std::span<const int> homes, int num_ranks) {
  std::vector<std::int64_t> loads(num_ranks, 0);
  for (std::size_t e = 0; e < counts.size(); ++e) loads[homes[e]] += counts[e];
  return loads;
}

// Would some single further move lower the busiest rank without lifting the
// new replica's rank to the old maximum? (The planner must not stop while one
// exists, unless it is already under the threshold.) Brute force over every
// expert on the busiest rank and every admissible target.
bool improving_move_exists(const ReplicaPlan& plan, std::span<const std::int64_t> counts) {
  const auto& loads = plan.rank_loads_after;
  const int busiest = static_cast<int>(std::max_element(loads.begin(), loads.end()) - loads.begin());
  const std::int64_t max_load = loads[busiest];
  std::vector<int> free_slots(plan.num_ranks, plan.num_redundant_slots_per_rank);
  for (int r = 0; r < plan.num_ranks; ++r) {
    for (int b = 0; b < plan.num_redundant_slots_per_rank; ++b) free_slots[r] -= plan.slot_expert(r, b) != kEmptySlot;
  }
  for (int e = 0; e < plan.num_experts; ++e) {
    const auto copies = plan.copies_of(e);
    std::int64_t quota_on_busiest = -1;
    for (const ExpertCopy& copy : copies) {
      if (copy.rank == busiest) quota_on_busiest = copy.token_quota;
    }
    if (quota_on_busiest <= 0) continue;
    if (counts[e] < static_cast<std::int64_t>(copies.size()) + 1) continue;
    for (int target = 0; target < plan.num_ranks; ++target) {
      if (free_slots[target] == 0) continue;
      if (std::any_of(copies.begin(), copies.end(), [&](const ExpertCopy& c) { return c.rank == target; })) continue;
      std::vector<ExpertCopy> split(copies.begin(), copies.end());
      split.push_back({target, 0});
      split_evenly(counts[e], split);
      std::int64_t busiest_after = loads[busiest] - quota_on_busiest, target_after = loads[target];
      for (const ExpertCopy& c : split) {
        if (c.rank == busiest) busiest_after += c.token_quota;
        if (c.rank == target) target_after += c.token_quota;
      }
      if (busiest_after < max_load && target_after < max_load) return true;
    }
  }
  return false;
}

// Every property of a plan that the dispatchers and the balance claims rely on.
::testing::AssertionResult plan_is_valid(const ReplicaPlan& plan, std::span<const std::int64_t> counts,
                                         std::span<const int> homes, const ReplicaPlannerOptions& options) {
  const int num_experts = static_cast<int>(counts.size()), R = options.num_ranks, B = options.num_redundant_slots_per_rank;
  auto fail = [](auto&&... parts) {
    ::testing::AssertionResult result = ::testing::AssertionFailure();
    (result << ... << parts);
    return result;
  };
  if (plan.num_experts != num_experts || plan.num_ranks != R || plan.num_redundant_slots_per_rank != B) {
    return fail("plan dimensions");
  }
  if (plan.slot_experts.size() != static_cast<std::size_t>(R) * B) return fail("slot table size");
  std::vector<std::int64_t> loads(R, 0);
  int num_replica_copies = 0;
  for (int e = 0; e < num_experts; ++e) {
    const auto copies = plan.copies_of(e);
    if (copies.empty()) return fail("expert ", e, " has no copy");
    if (copies[0].rank != homes[e]) return fail("expert ", e, " home moved to ", copies[0].rank);
    std::int64_t sum = 0;
    std::set<int> ranks;
    for (std::size_t i = 0; i < copies.size(); ++i) {
      sum += copies[i].token_quota;
      loads[copies[i].rank] += copies[i].token_quota;
      if (!ranks.insert(copies[i].rank).second) return fail("expert ", e, " twice on rank ", copies[i].rank);
      if (copies.size() > 1 && copies[i].token_quota <= 0) return fail("expert ", e, " copy ", i, " has quota 0");
      if (i >= 2 && copies[i].rank <= copies[i - 1].rank) return fail("expert ", e, " replicas not by rank");
      if (i >= 1) {
        // The replica occupies exactly one slot of its rank.
        int slots_holding = 0;
        for (int b = 0; b < B; ++b) slots_holding += plan.slot_expert(copies[i].rank, b) == e;
        if (slots_holding != 1) return fail("expert ", e, " replica on rank ", copies[i].rank, " in ", slots_holding, " slots");
      }
    }
    if (sum != counts[e]) return fail("expert ", e, " quotas sum to ", sum, ", count ", counts[e]);
    // Even split: quotas differ by at most one, the larger ones on lower ranks.
    std::vector<ExpertCopy> by_rank(copies.begin(), copies.end());
    std::sort(by_rank.begin(), by_rank.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
    for (std::size_t i = 1; i < by_rank.size(); ++i) {
      if (by_rank[i].token_quota > by_rank[i - 1].token_quota || by_rank[0].token_quota - by_rank[i].token_quota > 1) {
        return fail("expert ", e, " split unevenly");
      }
    }
    num_replica_copies += static_cast<int>(copies.size()) - 1;
  }
  if (num_replica_copies != plan.num_replicas()) return fail("occupied slots ", plan.num_replicas(), " vs replicas ", num_replica_copies);
  if (loads != plan.rank_loads_after) return fail("rank_loads_after disagrees with the quotas");
  if (plan.rank_loads_before != home_loads(counts, homes, R)) return fail("rank_loads_before is not the home load");
  if (plan.after.max_load > plan.before.max_load) return fail("max load rose");
  if (plan.before.within(options.rebalance_threshold) && plan.num_replicas() != 0) {
    return fail("replicas placed although already under the threshold");
  }
  if (!plan.after.within(options.rebalance_threshold) && improving_move_exists(plan, counts)) {
    return fail("stopped above the threshold while an improving move exists");
  }
  return ::testing::AssertionSuccess();
}

bool same_plan(const ReplicaPlan& a, const ReplicaPlan& b) {
  if (a.copy_offsets != b.copy_offsets || a.slot_experts != b.slot_experts || a.rank_loads_after != b.rank_loads_after) return false;
  for (std::size_t i = 0; i < a.copies.size(); ++i) {
    if (a.copies[i].rank != b.copies[i].rank || a.copies[i].token_quota != b.copies[i].token_quota) return false;
  }
  return true;
}

enum class CountShape { uniform_small, zipf_large, mostly_zero, one_hot, all_equal, all_zero };

std::vector<std::int64_t> make_counts(CountShape shape, int num_experts, Rng& rng) {
  std::vector<std::int64_t> counts(num_experts, 0);
  const auto hot = static_cast<int>(rng.uniform_int(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    switch (shape) {
      case CountShape::uniform_small: counts[e] = static_cast<std::int64_t>(rng.uniform_int(6)); break;
      case CountShape::zipf_large: counts[e] = static_cast<std::int64_t>(100000.0 / (1 + rng.uniform_int(num_experts)) * rng.uniform01()); break;
      case CountShape::mostly_zero: counts[e] = rng.uniform_int(8) == 0 ? static_cast<std::int64_t>(rng.uniform_int(1000)) : 0; break;
      case CountShape::one_hot: counts[e] = e == hot ? 1 + static_cast<std::int64_t>(rng.uniform_int(100000)) : 0; break;
      case CountShape::all_equal: counts[e] = 777; break;
      case CountShape::all_zero: break;
    }
  }
  return counts;
}

TEST(ReplicaPlanner, InvariantsOnThousandsOfRandomAndAdversarialCounts) {
  Rng rng(2024);
  int plans = 0;
  for (const int R : {1, 2, 3, 4, 8, 16}) {
    for (const int experts_per_rank : {1, 2, 4, 8}) {
      for (const int B : {0, 1, 2, 3}) {
        for (const CountShape shape : {CountShape::uniform_small, CountShape::zipf_large, CountShape::mostly_zero,
                                       CountShape::one_hot, CountShape::all_equal, CountShape::all_zero}) {
          for (const double threshold : {1.0, 1.05, 1.3}) {
            for (const bool shuffled_homes : {false, true}) {
              const int E = R * experts_per_rank;
              std::vector<int> homes = contiguous_home_ranks(E, R);
              if (shuffled_homes) {
                for (int i = E - 1; i > 0; --i) std::swap(homes[i], homes[rng.uniform_int(i + 1)]);
              }
              const std::vector<std::int64_t> counts = make_counts(shape, E, rng);
              const ReplicaPlannerOptions options{R, B, threshold};
              const ReplicaPlan plan = plan_replicas(counts, homes, options);
              ASSERT_TRUE(plan_is_valid(plan, counts, homes, options))
                  << "R=" << R << " E_l=" << experts_per_rank << " B=" << B << " shape=" << static_cast<int>(shape)
                  << " threshold=" << threshold;
              // Same input, same plan: every rank computes it independently.
              ASSERT_TRUE(same_plan(plan, plan_replicas(counts, homes, options)));
              ++plans;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 3000);
}

TEST(ReplicaPlanner, SpreadsOneVeryHotExpertOverEveryRank) {
  // 8 ranks, one expert each (E_l = 1), B = 1; expert 0 has every token.
  const int R = 8;
  std::vector<std::int64_t> counts(R, 0);
  counts[0] = 8000;
  const ReplicaPlan plan = plan_replicas(counts, contiguous_home_ranks(R, R), {R, 1, 1.0});
  ASSERT_EQ(plan.copies_of(0).size(), static_cast<std::size_t>(R));
  for (const ExpertCopy& copy : plan.copies_of(0)) EXPECT_EQ(copy.token_quota, 1000);
  EXPECT_EQ(plan.after.max_over_mean(), 1.0);
  EXPECT_EQ(plan.before.max_over_mean(), 8.0);
}

TEST(ReplicaPlanner, UsesAFreeSlotOnAnyRankNotOnlyTheLeastLoaded) {
  // 3 ranks, 2 experts each, B = 1. Rank loads 1200 / 0 / 600.
  //   move 1: expert 0 (600) from rank 0 onto rank 1: 900 / 300 / 600;
  //   move 2: rank 1, the least loaded, is full. Expert 1 onto rank 2 would
  //           lift it to 900 (rejected); expert 0's third copy on rank 2
  //           works: 200 each, loads 800 / 200 / 800.
  const std::vector<std::int64_t> counts = {600, 600, 0, 0, 300, 300};
  const ReplicaPlan plan = plan_replicas(counts, contiguous_home_ranks(6, 3), {3, 1, 1.0});
  EXPECT_EQ(plan.rank_loads_after, (std::vector<std::int64_t>{800, 200, 800}));
  EXPECT_EQ(plan.slot_expert(1, 0), 0);
  EXPECT_EQ(plan.slot_expert(2, 0), 0);
  ASSERT_EQ(plan.copies_of(0).size(), 3u);
  EXPECT_EQ(plan.copies_of(1).size(), 1u);
}

TEST(ReplicaPlanner, StopsWhenTheBusiestRankHasNoExpertLeftToSplit) {
  // The seeds' bug: rank 0's two experts are both replicated on rank 1 (R = 2
  // allows no third copy), rank 1 still has a free slot (B = 3) and max/mean
  // is above the threshold. The planner must stop, not replicate an expert
  // onto a rank that holds it already.
  const std::vector<std::int64_t> counts = {101, 100, 0, 0};
  const ReplicaPlan plan = plan_replicas(counts, contiguous_home_ranks(4, 2), {2, 3, 1.0});
  EXPECT_EQ(plan.num_replicas(), 2);
  EXPECT_EQ(plan.rank_loads_after, (std::vector<std::int64_t>{101, 100}));
  EXPECT_EQ(plan.slot_expert(1, 2), kEmptySlot);
  EXPECT_EQ(plan.slot_expert(0, 0), kEmptySlot);
}

TEST(ReplicaPlanner, StopsAtTheThreshold) {
  // 4 ranks, 1 expert each, B = 2; loads 400 / 100 / 100 / 100 (max/mean 2.29).
  const std::vector<std::int64_t> counts = {400, 100, 100, 100};
  const auto homes = contiguous_home_ranks(4, 4);
  const ReplicaPlan loose = plan_replicas(counts, homes, {4, 2, 2.5});
  EXPECT_EQ(loose.num_replicas(), 0);  // already under 2.5
  const ReplicaPlan one_move = plan_replicas(counts, homes, {4, 2, 1.5});
  // 200 / 300 / 100 / 100 after one replica: max/mean 1.71 > 1.5, so a second:
  // 134 / 233 / 233 / 100 (max/mean 1.33).
  EXPECT_EQ(one_move.num_replicas(), 2);
  EXPECT_LE(one_move.after.max_over_mean(), 1.5);
  const ReplicaPlan tight = plan_replicas(counts, homes, {4, 2, 1.0});
  EXPECT_GE(tight.num_replicas(), one_move.num_replicas());
  EXPECT_LE(tight.after.max_load, one_move.after.max_load);
}

TEST(ReplicaPlanner, NothingToDoWithoutSlotsOrRanksOrTokens) {
  const std::vector<std::int64_t> skewed = {1000, 1, 1, 1};
  EXPECT_EQ(plan_replicas(skewed, contiguous_home_ranks(4, 4), {4, 0, 1.0}).num_replicas(), 0);  // B = 0
  EXPECT_EQ(plan_replicas(skewed, contiguous_home_ranks(4, 1), {1, 2, 1.0}).num_replicas(), 0);  // R = 1
  const std::vector<std::int64_t> zeros(8, 0);
  const ReplicaPlan idle = plan_replicas(zeros, contiguous_home_ranks(8, 4), {4, 2, 1.0});
  EXPECT_EQ(idle.num_replicas(), 0);
  EXPECT_EQ(idle.after.max_over_mean(), 1.0);
}

TEST(ReplicaPlanner, ExpertsKeepTheirSlotFromThePreviousPlan) {
  // 4 ranks, 2 experts each, B = 2. Plan once, then re-plan the same counts
  // with the slots of every rank reversed as the "previous" plan: the same
  // experts land on the same ranks, in the reversed slot positions.
  Rng rng(7);
  const int R = 4, E = 8, B = 2;
  std::vector<std::int64_t> counts(E);
  for (auto& count : counts) count = static_cast<std::int64_t>(rng.uniform_int(1000));
  counts[1] = 5000;
  const auto homes = contiguous_home_ranks(E, R);
  const ReplicaPlan first = plan_replicas(counts, homes, {R, B, 1.0});
  ASSERT_GE(first.num_replicas(), 2);
  std::vector<int> reversed = first.slot_experts;
  for (int r = 0; r < R; ++r) std::reverse(reversed.begin() + r * B, reversed.begin() + (r + 1) * B);
  const ReplicaPlan second = plan_replicas(counts, homes, {R, B, 1.0}, reversed);
  EXPECT_EQ(second.slot_experts, reversed);
  EXPECT_EQ(second.rank_loads_after, first.rank_loads_after);
  EXPECT_TRUE(plan_is_valid(second, counts, homes, {R, B, 1.0}));
}

TEST(SplitEvenly, RemainderGoesToTheLowestRanks) {
  std::vector<ExpertCopy> copies = {{5, 0}, {1, 0}, {3, 0}};  // home on rank 5
  split_evenly(11, copies);
  EXPECT_EQ(copies[0].token_quota, 3);  // rank 5
  EXPECT_EQ(copies[1].token_quota, 4);  // rank 1
  EXPECT_EQ(copies[2].token_quota, 4);  // rank 3
}

}  // namespace
}  // namespace epmoe::balance
