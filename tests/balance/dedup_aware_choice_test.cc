// The dedup-aware replica choice (balance/dedup_aware_choice.h) against its
// contract, on random skewed routings (R in
// {1, 2, 3, 4, 8}, B in {0, 1, 2}, K in {1, 2, 4}; random plans, so the
// contract is checked on any valid plan, not only the planner's), on Zipf
// routing planned by plan_replicas, and on a constructed case:
//  * every pair goes to a copy of its expert; per (source, copy) the counts
//    are exactly the positional rule's (source_sub_quotas), so every copy's
//    total over sources is exactly its quota;
//  * deterministic (same inputs, same output);
//  * off-rank rows after dedup never more than the positional rule's, and
//    strictly fewer on the constructed case and summed over the random ones;
//  * zero tokens, R = 1, B = 0.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "balance/dedup_aware_choice.h"
#include "balance/replica_planner.h"
#include "balance/token_routing_generator.h"
#include "core/rng.h"

namespace epmoe::balance {
namespace {

// Per copy (indexed like plan.copies), how many pairs `choice` sends there.
std::vector<std::int64_t> per_copy(const ReplicaPlan& plan, std::span<const std::int32_t> ids,
                                   std::span<const int> choice) {
  std::vector<std::int64_t> n(plan.copies.size(), 0);
  for (std::size_t p = 0; p < ids.size(); ++p) {
    const int e = ids[p];
    EXPECT_GE(choice[p], 0);
    EXPECT_LT(choice[p], plan.copy_offsets[e + 1] - plan.copy_offsets[e]);
    ++n[static_cast<std::size_t>(plan.copy_offsets[e] + choice[p])];
  }
  return n;
}

// Random routing, K distinct experts per token; with `skew` most picks come
// from rank 0's experts (hot experts packed on rank 0).
std::vector<std::int32_t> random_routing(Rng& rng, std::int64_t num_tokens, int num_experts, int num_ranks,
                                         int top_k, bool skew) {
  std::vector<std::int32_t> ids;
  const int hot = std::max(num_experts / num_ranks, top_k);
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    std::vector<char> used(static_cast<std::size_t>(num_experts), 0);
    for (int k = 0; k < top_k; ++k) {
      int e;
      do {
        const bool from_hot = skew && rng.uniform_int(10) < 7;
        e = static_cast<int>(rng.uniform_int(static_cast<std::uint64_t>(from_hot ? hot : num_experts)));
      } while (used[e]);
      used[e] = 1;
      ids.push_back(e);
    }
  }
  return ids;
}

struct Totals {
  std::int64_t positional = 0, dedup_aware = 0;
};

// Checks one (plan, counts, routing per source) case; adds its rows to totals.
void check_case(const ReplicaPlan& plan, const std::vector<std::int64_t>& counts,
                const std::vector<std::vector<std::int32_t>>& routing, int top_k, Totals& totals,
                const std::string& what) {
  std::vector<std::int64_t> received(plan.copies.size(), 0);
  for (int s = 0; s < plan.num_ranks; ++s) {
    const std::vector<std::int32_t>& ids = routing[s];
    const std::vector<int> positional = positional_copy_choice(plan, counts, s, ids, top_k);
    const std::vector<int> choice = dedup_aware_copy_choice(plan, counts, s, ids, top_k);
    ASSERT_EQ(choice.size(), ids.size()) << what;
    const std::vector<std::int64_t> sub = source_sub_quotas(plan, counts, s);
    EXPECT_EQ(per_copy(plan, ids, positional), sub) << what << " source " << s << ": positional";
    const std::vector<std::int64_t> mine = per_copy(plan, ids, choice);
    EXPECT_EQ(mine, sub) << what << " source " << s << ": dedup-aware per-(source, copy) counts";
    for (std::size_t i = 0; i < mine.size(); ++i) received[i] += mine[i];
    EXPECT_EQ(dedup_aware_copy_choice(plan, counts, s, ids, top_k), choice) << what << ": deterministic";
    const std::int64_t rows_positional = off_rank_rows(plan, s, ids, top_k, positional);
    const std::int64_t rows = off_rank_rows(plan, s, ids, top_k, choice);
    EXPECT_LE(rows, rows_positional) << what << " source " << s;
    totals.positional += rows_positional;
    totals.dedup_aware += rows;
  }
  for (std::size_t i = 0; i < plan.copies.size(); ++i)
    EXPECT_EQ(received[i], plan.copies[i].token_quota) << what << " copy " << i << ": quota";
}

std::vector<std::int64_t> gathered_counts(const std::vector<std::vector<std::int32_t>>& routing, int num_experts) {
  std::vector<std::int64_t> counts(routing.size() * num_experts, 0);
  for (std::size_t r = 0; r < routing.size(); ++r)
    for (const std::int32_t e : routing[r]) ++counts[r * num_experts + e];
  return counts;
}

std::vector<std::int64_t> column_sums(const std::vector<std::int64_t>& counts, int num_ranks, int num_experts) {
  std::vector<std::int64_t> global(static_cast<std::size_t>(num_experts), 0);
  for (int r = 0; r < num_ranks; ++r)
    for (int e = 0; e < num_experts; ++e) global[e] += counts[static_cast<std::size_t>(r) * num_experts + e];
  return global;
}

// A random plan on contiguous homes, independent of the planner: every
// expert with enough tokens gets up to 3 replicas on random other ranks with
// a free slot; quotas random integers summing to the count, a replica's > 0,
// a home's possibly 0 (as the planner may leave it).
ReplicaPlan random_plan(Rng& rng, const std::vector<std::int64_t>& global, int num_ranks, int slots) {
  const int num_experts = static_cast<int>(global.size());
  const std::vector<int> homes = contiguous_home_ranks(num_experts, num_ranks);
  ReplicaPlan plan;
  plan.num_experts = num_experts;
  plan.num_ranks = num_ranks;
  plan.num_redundant_slots_per_rank = slots;
  plan.slot_experts.assign(static_cast<std::size_t>(num_ranks) * slots, kEmptySlot);
  std::vector<int> used(static_cast<std::size_t>(num_ranks), 0);
  plan.copy_offsets.push_back(0);
  for (int e = 0; e < num_experts; ++e) {
    std::vector<int> ranks;
    const int wanted = static_cast<int>(rng.uniform_int(4));
    for (int r = 0; r < num_ranks && static_cast<int>(ranks.size()) < wanted; ++r)
      if (r != homes[e] && used[r] < slots && global[e] > static_cast<std::int64_t>(ranks.size()) &&
          rng.uniform_int(2) == 0) {
        plan.slot_experts[static_cast<std::size_t>(r) * slots + used[r]++] = e;
        ranks.push_back(r);  // ascending
      }
    // Cuts: each replica >= 1, the rest anywhere.
    std::int64_t left = global[e] - static_cast<std::int64_t>(ranks.size());
    std::vector<std::int64_t> quota(ranks.size() + 1, 0);
    for (std::size_t i = 1; i < quota.size(); ++i) quota[i] = 1;
    for (std::int64_t i = 0; i < left; ++i) ++quota[rng.uniform_int(quota.size())];
    plan.copies.push_back({homes[e], quota[0]});
    for (std::size_t i = 0; i < ranks.size(); ++i) plan.copies.push_back({ranks[i], quota[i + 1]});
    plan.copy_offsets.push_back(static_cast<int>(plan.copies.size()));
  }
  return plan;
}

TEST(DedupAwareChoice, RandomRoutingsKeepQuotasAndNeverAddRows) {
  Rng rng(13);
  Totals totals;
  int cases_with_replicas = 0;
  for (int num_ranks : {1, 2, 3, 4, 8})
    for (int slots : {0, 1, 2})
      for (int top_k : {1, 2, 4})
        for (int trial = 0; trial < 6; ++trial) {
          const int num_experts = num_ranks * (trial % 2 == 0 ? 2 : 4);
          if (top_k > num_experts) continue;
          std::vector<std::vector<std::int32_t>> routing;
          for (int r = 0; r < num_ranks; ++r) {
            const std::int64_t num_tokens = static_cast<std::int64_t>(rng.uniform_int(40));  // zeros too
            routing.push_back(random_routing(rng, num_tokens, num_experts, num_ranks, top_k, trial % 3 != 2));
          }
          const std::vector<std::int64_t> counts = gathered_counts(routing, num_experts);
          const ReplicaPlan plan = random_plan(rng, column_sums(counts, num_ranks, num_experts), num_ranks, slots);
          cases_with_replicas += plan.num_replicas() > 0;
          check_case(plan, counts, routing, top_k, totals,
                     "R" + std::to_string(num_ranks) + " B" + std::to_string(slots) + " K" + std::to_string(top_k) +
                         " trial " + std::to_string(trial));
        }
  EXPECT_GT(cases_with_replicas, 50);
  EXPECT_LT(totals.dedup_aware, totals.positional) << "the choice saves rows somewhere";
}

// DeepSeek-like routing from the bench's generator (E = 64, K = 8, R = 8).
TEST(DedupAwareChoice, ZipfPackedRoutingSavesRows) {
  for (double zipf : {1.0, 1.2}) {
    const LoadGeneratorOptions options{.num_experts = 64, .num_ranks = 8, .num_tokens_per_rank = 512, .top_k = 8,
                                       .zipf_exponent = zipf, .placement = HotExpertPlacement::packed, .seed = 5};
    const std::vector<std::vector<std::int32_t>> routing = generate_token_routing(options);
    const std::vector<std::int64_t> counts = gathered_counts(routing, 64);
    const ReplicaPlan plan = plan_replicas(column_sums(counts, 8, 64), contiguous_home_ranks(64, 8),
                                           {.num_ranks = 8, .num_redundant_slots_per_rank = 2,
                                            .rebalance_threshold = 1.0});
    ASSERT_GT(plan.num_replicas(), 0);
    Totals totals;
    check_case(plan, counts, routing, 8, totals, "zipf " + std::to_string(zipf));
    EXPECT_LT(totals.dedup_aware, totals.positional) << zipf;
  }
}

// Two ranks, expert 0 (home rank 0) with a replica on rank 1, quotas 2 + 2,
// all four pairs from source 0. Tokens 0 and 1 also go to expert 2 (rank 1),
// tokens 2 and 3 to expert 1 (rank 0). The positional rule sends tokens 0, 1
// to the home and 2, 3 to the replica: 4 off-rank rows. Dedup-aware: tokens
// 0, 1 to the replica on rank 1 (which receives them for expert 2 anyway),
// 2, 3 to the home: 2 rows.
TEST(DedupAwareChoice, ConstructedCaseSavesRows) {
  ReplicaPlan plan;
  plan.num_experts = 4;
  plan.num_ranks = 2;
  plan.num_redundant_slots_per_rank = 1;
  plan.copy_offsets = {0, 2, 3, 4, 5};
  plan.copies = {{0, 2}, {1, 2}, {0, 2}, {1, 2}, {1, 0}};
  plan.slot_experts = {kEmptySlot, 0};
  const std::vector<std::int64_t> counts = {4, 2, 2, 0, 0, 0, 0, 0};
  const std::vector<std::vector<std::int32_t>> routing = {{0, 2, 0, 2, 0, 1, 0, 1}, {}};
  const std::vector<int> positional = positional_copy_choice(plan, counts, 0, routing[0], 2);
  EXPECT_EQ(positional, (std::vector<int>{0, 0, 0, 0, 1, 0, 1, 0}));
  EXPECT_EQ(off_rank_rows(plan, 0, routing[0], 2, positional), 4);
  const std::vector<int> choice = dedup_aware_copy_choice(plan, counts, 0, routing[0], 2);
  EXPECT_EQ(choice, (std::vector<int>{1, 0, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(off_rank_rows(plan, 0, routing[0], 2, choice), 2);
  Totals totals;
  check_case(plan, counts, routing, 2, totals, "constructed");
  EXPECT_EQ(totals.positional, 4);
  EXPECT_EQ(totals.dedup_aware, 2);
}

TEST(DedupAwareChoice, EdgeCases) {
  // Zero tokens everywhere: empty choices, zero rows.
  {
    Rng rng(1);
    const std::vector<std::int64_t> counts(2 * 4, 0);
    const ReplicaPlan plan = random_plan(rng, std::vector<std::int64_t>(4, 0), 2, 1);
    for (int s = 0; s < 2; ++s) {
      EXPECT_TRUE(dedup_aware_copy_choice(plan, counts, s, {}, 2).empty());
      EXPECT_EQ(off_rank_rows(plan, s, {}, 2, {}), 0);
    }
  }
  // R = 1: every pair to the home (copy 0), no off-rank rows.
  {
    const std::vector<std::int32_t> ids = {0, 1, 1, 2, 3, 0};
    const std::vector<std::int64_t> counts = {2, 2, 1, 1};
    Rng rng(2);
    const ReplicaPlan plan = random_plan(rng, counts, 1, 2);
    EXPECT_EQ(plan.num_replicas(), 0);
    const std::vector<int> choice = dedup_aware_copy_choice(plan, counts, 0, ids, 2);
    EXPECT_EQ(choice, std::vector<int>(6, 0));
    EXPECT_EQ(off_rank_rows(plan, 0, ids, 2, choice), 0);
  }
  // B = 0: no replicas, every pair to its home, the same as the positional rule.
  {
    Rng rng(3);
    std::vector<std::vector<std::int32_t>> routing;
    for (int r = 0; r < 4; ++r) routing.push_back(random_routing(rng, 30, 8, 4, 2, true));
    const std::vector<std::int64_t> counts = gathered_counts(routing, 8);
    const ReplicaPlan plan = random_plan(rng, column_sums(counts, 4, 8), 4, 0);
    EXPECT_EQ(plan.num_replicas(), 0);
    Totals totals;
    check_case(plan, counts, routing, 2, totals, "B0");
    EXPECT_EQ(totals.dedup_aware, totals.positional);
    for (int s = 0; s < 4; ++s)
      EXPECT_EQ(dedup_aware_copy_choice(plan, counts, s, routing[s], 2), std::vector<int>(routing[s].size(), 0));
  }
}

}  // namespace
}  // namespace epmoe::balance
