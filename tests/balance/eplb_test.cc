// EPLB's global policy (balance/eplb.h) and the balanced home packing hybrid
// uses: every expert placed, slot budget and "one copy per rank" respected,
// the replication rule of the published policy, and stable rank labels
// (re-planning the same loads moves nothing). R in {1, 2, 3, 4, 8}, E_l in
// {1, 2, 4}, B in {0, 1, 2}, random Zipf-like and adversarial loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "balance/eplb.h"
#include "balance/load_imbalance.h"
#include "balance/replica_plan.h"
#include "core/rng.h"

namespace epmoe::balance {
namespace {

std::vector<std::int64_t> random_loads(int num_experts, Rng& rng) {
  std::vector<std::int64_t> loads(num_experts);
  const int shape = static_cast<int>(rng.uniform_int(3));
  for (int e = 0; e < num_experts; ++e) {
    if (shape == 0) loads[e] = static_cast<std::int64_t>(50000.0 / (1 + rng.uniform_int(num_experts)));
    if (shape == 1) loads[e] = static_cast<std::int64_t>(rng.uniform_int(10));
    if (shape == 2) loads[e] = e == 0 ? 100000 : 0;  // one expert holds everything
  }
  return loads;
}

TEST(EplbGlobalPlacement, PlacesEveryExpertWithinTheSlotBudget) {
  Rng rng(11);
  for (const int R : {1, 2, 3, 4, 8}) {
    for (const int experts_per_rank : {1, 2, 4}) {
      for (const int B : {0, 1, 2}) {
        for (int trial = 0; trial < 20; ++trial) {
          const int E = R * experts_per_rank, S = experts_per_rank + B;
          const std::vector<std::int64_t> loads = random_loads(E, rng);
          const ExpertPlacement placement = eplb_global_placement(loads, R, S, nullptr);
          ASSERT_EQ(placement.slot_experts.size(), static_cast<std::size_t>(R * S));
          for (int r = 0; r < R; ++r) {
            std::set<int> on_rank;
            for (int s = 0; s < S; ++s) {
              const int expert = placement.slot_experts[r * S + s];
              if (expert == kEmptySlot) continue;
              ASSERT_TRUE(expert >= 0 && expert < E);
              ASSERT_TRUE(on_rank.insert(expert).second) << "expert " << expert << " twice on rank " << r;
            }
          }
          for (int e = 0; e < E; ++e) ASSERT_GE(placement.num_copies(e), 1) << "expert " << e << " not placed";
          // Tokens are conserved by the even split.
          const std::vector<std::int64_t> rank_loads = placement.rank_loads(loads);
          EXPECT_EQ(std::accumulate(rank_loads.begin(), rank_loads.end(), std::int64_t{0}),
                    std::accumulate(loads.begin(), loads.end(), std::int64_t{0}));
        }
      }
    }
  }
}

TEST(EplbReplicaCounts, EachExtraCopyWentToTheLargestLoadPerCopy) {
  // The published rule, checked after the fact: when expert a got its last
  // copy, its load per copy, load[a] / (copies[a] - 1), was at least every
  // other expert's — and theirs have only fallen since.
  Rng rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 16;
    std::vector<std::int64_t> loads(E);
    for (auto& load : loads) load = 1 + static_cast<std::int64_t>(rng.uniform_int(10000));
    const int num_slots = E + static_cast<int>(rng.uniform_int(2 * E));
    const std::vector<int> copies = eplb_replica_counts(loads, num_slots, 8);
    EXPECT_EQ(std::accumulate(copies.begin(), copies.end(), 0), num_slots);
    for (int a = 0; a < E; ++a) {
      if (copies[a] == 1) continue;
      for (int b = 0; b < E; ++b) {
        if (b == a || copies[b] >= 8) continue;
        EXPECT_GE(loads[a] * copies[b], loads[b] * (copies[a] - 1)) << "experts " << a << ", " << b;
      }
    }
  }
}

TEST(EplbGlobalPlacement, BalancesAPackedHotRankCompletely) {
  // 4 ranks, 2 experts each, B = 1: the two hot experts both live on rank 0
  // at home (max/mean 2.29); EPLB moves experts freely: 3 copies of each hot
  // one (~133 tokens) and the six 100s pack to within 5% of the mean.
  const std::vector<std::int64_t> loads = {400, 400, 100, 100, 100, 100, 100, 100};
  const ExpertPlacement placement = eplb_global_placement(loads, 4, 3, nullptr);
  EXPECT_EQ(placement.num_copies(0), 3);
  EXPECT_EQ(placement.num_copies(1), 3);
  EXPECT_LT(measure_load_imbalance(placement.rank_loads(loads)).max_over_mean(), 1.05);
}

TEST(EplbGlobalPlacement, ReplanningTheSameLoadsMovesNothing) {
  Rng rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<std::int64_t> loads = random_loads(32, rng);
    const ExpertPlacement first = eplb_global_placement(loads, 8, 5, nullptr);
    const ExpertPlacement second = eplb_global_placement(loads, 8, 5, &first);
    EXPECT_EQ(second.slot_experts, first.slot_experts);
  }
}

TEST(BalancedHomeRanks, EveryRankGetsEOverRExperts) {
  Rng rng(9);
  for (const int R : {1, 2, 3, 8}) {
    const int E = 4 * R;
    const std::vector<std::int64_t> loads = random_loads(E, rng);
    const std::vector<int> homes = balanced_home_ranks(loads, R, {});
    std::vector<int> per_rank(R, 0);
    for (const int home : homes) {
      ASSERT_TRUE(home >= 0 && home < R);
      ++per_rank[home];
    }
    for (const int count : per_rank) EXPECT_EQ(count, 4);
    // Same loads, previous homes given: no expert moves.
    EXPECT_EQ(balanced_home_ranks(loads, R, homes), homes);
  }
}

}  // namespace
}  // namespace epmoe::balance
