// The dedup-aware replica choice (balance/dedup_aware_choice.h) against its
// contract, on random skewed routings (R in
// {1, 2, 3, 4, 8}, B in {0, 1, 2}, K in {1, 2, 4}; random plans, so the
// contract is checked on any valid plan, not only the planner's), on Zipf
// routing planned by plan_replicas, and on a constructed case:
//  * the locality-first sub-quotas (sub_quotas, the contract of
//    balance/replica_plan.h): per copy they sum to its quota, per (source,
//    expert) to the source's count; a copy on rank r takes min(quota,
//    counts[r]) of rank r's pairs; the rest is a northwest-corner matching
//    (sources ascending, copies in order); deterministic; an exact
//    constructed case; zero counts, R = 1, B = 0;
//  * every pair goes to a copy of its expert; per (source, copy) the counts
//    are exactly the sub-quotas (source_sub_quotas), so every copy's
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
std::vector<std::int32_t> random_routing(Rng& rng, std::int64_t num_tokens, int num_experts, int num_ranks, int top_k,
                                         bool skew) {
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

// The sub-quotas against every property of the contract, for one case.
void check_sub_quotas(const ReplicaPlan& plan, const std::vector<std::int64_t>& counts, const std::string& what) {
  const int num_ranks = plan.num_ranks, num_experts = plan.num_experts;
  const std::size_t num_copies = plan.copies.size();
  const std::vector<std::int64_t> sub = sub_quotas(plan, counts);
  ASSERT_EQ(sub.size(), static_cast<std::size_t>(num_ranks) * num_copies) << what;
  EXPECT_EQ(sub_quotas(plan, counts), sub) << what << ": deterministic";
  const auto at = [&](int s, int i) { return sub[static_cast<std::size_t>(s) * num_copies + i]; };
  for (int s = 0; s < num_ranks; ++s) {
    const std::vector<std::int64_t> row = source_sub_quotas(plan, counts, s);
    EXPECT_EQ(row, std::vector<std::int64_t>(sub.begin() + s * num_copies, sub.begin() + (s + 1) * num_copies))
        << what << " source " << s << ": source_sub_quotas is row s";
  }
  for (int e = 0; e < num_experts; ++e) {
    const int first = plan.copy_offsets[e], last = plan.copy_offsets[e + 1];
    // Per copy: its quota. Per source: its count.
    for (int i = first; i < last; ++i) {
      std::int64_t sum = 0;
      for (int s = 0; s < num_ranks; ++s) {
        EXPECT_GE(at(s, i), 0) << what;
        sum += at(s, i);
      }
      EXPECT_EQ(sum, plan.copies[i].token_quota) << what << " expert " << e << " copy " << i - first;
    }
    for (int s = 0; s < num_ranks; ++s) {
      std::int64_t sum = 0;
      for (int i = first; i < last; ++i) sum += at(s, i);
      EXPECT_EQ(sum, counts[static_cast<std::size_t>(s) * num_experts + e])
          << what << " expert " << e << " source " << s;
    }
    // Local first: a copy on rank r takes min(quota, counts[r][e]) of rank r's pairs.
    std::vector<std::int64_t> rest(static_cast<std::size_t>(num_ranks) * (last - first), 0);
    for (int i = first; i < last; ++i) {
      const int r = plan.copies[i].rank;
      const std::int64_t local =
          std::min(plan.copies[i].token_quota, counts[static_cast<std::size_t>(r) * num_experts + e]);
      EXPECT_EQ(at(r, i), local) << what << " expert " << e << " copy " << i - first << ": local first";
      for (int s = 0; s < num_ranks; ++s)
        rest[static_cast<std::size_t>(s) * (last - first) + (i - first)] = at(s, i) - (s == r ? local : 0);
    }
    // The rest is the northwest corner rule: its nonzero cells form a
    // staircase (a later source never uses an earlier copy than an earlier
    // source). With the margins checked above (remaining counts, remaining
    // quotas), a staircase matching is unique, so this pins the rule down.
    int last_source = -1, last_copy = -1;
    for (int s = 0; s < num_ranks; ++s)
      for (int i = 0; i < last - first; ++i) {
        if (rest[static_cast<std::size_t>(s) * (last - first) + i] == 0) continue;
        EXPECT_TRUE(s > last_source ? i >= last_copy : i > last_copy)
            << what << " expert " << e << ": not the northwest corner order at source " << s << " copy " << i;
        last_source = s;
        last_copy = i;
      }
  }
}

TEST(SubQuotas, RandomPlansKeepEveryProperty) {
  Rng rng(29);
  int cases_with_replicas = 0;
  for (int num_ranks : {1, 2, 3, 4, 8})
    for (int slots : {0, 1, 2})
      for (int trial = 0; trial < 8; ++trial) {
        const int num_experts = num_ranks * (trial % 2 == 0 ? 2 : 4);
        std::vector<std::int64_t> counts(static_cast<std::size_t>(num_ranks) * num_experts);
        for (auto& c : counts) c = rng.uniform_int(3) == 0 ? 0 : static_cast<std::int64_t>(rng.uniform_int(30));
        const ReplicaPlan plan = random_plan(rng, column_sums(counts, num_ranks, num_experts), num_ranks, slots);
        cases_with_replicas += plan.num_replicas() > 0;
        check_sub_quotas(
            plan, counts,
            "R" + std::to_string(num_ranks) + " B" + std::to_string(slots) + " trial " + std::to_string(trial));
      }
  EXPECT_GT(cases_with_replicas, 40);
}

// DeepSeek-like routing from the bench's generator (E = 64, K = 8, R = 8,
// 512 tokens per rank), hot experts packed on rank 0, and the planner's plan
// for it (B = 2, threshold 1.0).
struct PackedZipfCase {
  std::vector<std::vector<std::int32_t>> routing;
  std::vector<std::int64_t> counts;  // [R * E] gathered
  ReplicaPlan plan;
};

PackedZipfCase packed_zipf_case(double zipf) {
  const LoadGeneratorOptions options{.num_experts = 64,
                                     .num_ranks = 8,
                                     .num_tokens_per_rank = 512,
                                     .top_k = 8,
                                     .zipf_exponent = zipf,
                                     .placement = HotExpertPlacement::packed,
                                     .seed = 5};
  PackedZipfCase c;
  c.routing = generate_token_routing(options);
  c.counts = gathered_counts(c.routing, 64);
  c.plan = plan_replicas(column_sums(c.counts, 8, 64), contiguous_home_ranks(64, 8),
                         {.num_ranks = 8, .num_redundant_slots_per_rank = 2, .rebalance_threshold = 1.0});
  return c;
}

TEST(SubQuotas, PlannerPlansUnderPackedZipf) {
  const PackedZipfCase c = packed_zipf_case(1.2);
  ASSERT_GT(c.plan.num_replicas(), 0);
  check_sub_quotas(c.plan, c.counts, "zipf packed");
}

// Exact sub-quotas on two constructed plans.
TEST(SubQuotas, ConstructedCases) {
  // R = 3. Expert 2 (home rank 2, copy 0, quota 3) with a replica on rank 0
  // (copy 1, quota 3); counts 2, 2, 2. Local first: the home takes rank 2's
  // 2, the replica rank 0's 2; the rest (1 each) from source 1 in copy order.
  // The old global-order rule gave the home positions 0..2 (source 0's 2,
  // source 1's first) and the replica 3..5 (source 1's second, source 2's 2):
  // neither copy computed a single pair of its own rank.
  {
    ReplicaPlan plan;
    plan.num_experts = 3;
    plan.num_ranks = 3;
    plan.num_redundant_slots_per_rank = 1;
    plan.copy_offsets = {0, 1, 2, 4};
    plan.copies = {{0, 1}, {1, 0}, {2, 3}, {0, 3}};
    plan.slot_experts = {2, kEmptySlot, kEmptySlot};
    const std::vector<std::int64_t> counts = {1, 0, 2,  //
                                              0, 0, 2,  //
                                              0, 0, 2};
    check_sub_quotas(plan, counts, "home on 2, replica on 0");
    // [R * copies]: rows sources, columns copies (expert 0's home, expert 1's home, expert 2's home, its replica).
    EXPECT_EQ(sub_quotas(plan, counts), (std::vector<std::int64_t>{1, 0, 0, 2,  //
                                                                   0, 0, 1, 1,  //
                                                                   0, 0, 2, 0}));
    // Within source 1: its first pair of expert 2 to the home, the second to the replica.
    EXPECT_EQ(positional_copy_choice(plan, counts, 1, std::vector<std::int32_t>{2, 2}, 1), (std::vector<int>{0, 1}));
  }
  // R = 4. Expert 0: home rank 0 (quota 6), replicas on rank 2 (quota 4) and
  // rank 3 (quota 2); counts 1, 2, 8, 1. Local first: home 1 (rank 0's only
  // pair), replica on 2 takes 4 of rank 2's 8 (its quota), replica on 3 rank
  // 3's 1. Left: home 5, replica on 3 1; sources 1: 2, 2: 4. Northwest
  // corner: home source 1's 2 and 3 of source 2's; replica on 3 source 2's
  // last. Expert 1 (home rank 1, no replica) takes every source's pairs.
  {
    ReplicaPlan plan;
    plan.num_experts = 4;
    plan.num_ranks = 4;
    plan.num_redundant_slots_per_rank = 1;
    plan.copy_offsets = {0, 3, 4, 5, 6};
    plan.copies = {{0, 6}, {2, 4}, {3, 2}, {1, 3}, {2, 0}, {3, 0}};
    plan.slot_experts = {kEmptySlot, kEmptySlot, 0, 0};
    const std::vector<std::int64_t> counts = {1, 1, 0, 0,  //
                                              2, 0, 0, 0,  //
                                              8, 2, 0, 0,  //
                                              1, 0, 0, 0};
    check_sub_quotas(plan, counts, "replica's rank over its quota");
    EXPECT_EQ(sub_quotas(plan, counts), (std::vector<std::int64_t>{1, 0, 0, 1, 0, 0,  //
                                                                   2, 0, 0, 0, 0, 0,  //
                                                                   3, 4, 1, 2, 0, 0,  //
                                                                   0, 0, 1, 0, 0, 0}));
    // The positional rule inside a source: source 2's pairs of expert 0 in
    // order fill the home (3), the replica on 2 (4), the replica on 3 (1).
    const std::vector<std::int32_t> ids = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
    EXPECT_EQ(positional_copy_choice(plan, counts, 2, ids, 1), (std::vector<int>{0, 0, 0, 1, 1, 1, 1, 2, 0, 0}));
  }
}

TEST(SubQuotas, EdgeCases) {
  // Zero counts everywhere: all zeros, on a plan with replicas of quota 0
  // allowed here (the contract's function does not require quota > 0).
  {
    Rng rng(4);
    const std::vector<std::int64_t> counts(3 * 6, 0);
    const ReplicaPlan plan = random_plan(rng, std::vector<std::int64_t>(6, 0), 3, 2);
    const std::vector<std::int64_t> sub = sub_quotas(plan, counts);
    EXPECT_EQ(sub, std::vector<std::int64_t>(3 * plan.copies.size(), 0));
    check_sub_quotas(plan, counts, "zeros");
  }
  // R = 1: one copy per expert, which takes all its pairs.
  {
    const std::vector<std::int64_t> counts = {2, 0, 1, 7};
    Rng rng(5);
    const ReplicaPlan plan = random_plan(rng, counts, 1, 2);
    EXPECT_EQ(plan.num_replicas(), 0);
    EXPECT_EQ(sub_quotas(plan, counts), counts);
    check_sub_quotas(plan, counts, "R1");
  }
  // B = 0: every source's pairs to the home.
  {
    Rng rng(6);
    std::vector<std::int64_t> counts(4 * 8);
    for (auto& c : counts) c = static_cast<std::int64_t>(rng.uniform_int(9));
    const ReplicaPlan plan = random_plan(rng, column_sums(counts, 4, 8), 4, 0);
    EXPECT_EQ(plan.num_replicas(), 0);
    EXPECT_EQ(sub_quotas(plan, counts), counts);  // one copy per expert, indexed like the experts
    check_sub_quotas(plan, counts, "B0");
  }
  // Quotas that do not sum to the counts are refused.
  {
    ReplicaPlan plan;
    plan.num_experts = 1;
    plan.num_ranks = 2;
    plan.copy_offsets = {0, 2};
    plan.copies = {{0, 2}, {1, 2}};
    EXPECT_ANY_THROW(sub_quotas(plan, std::vector<std::int64_t>{2, 1}));
  }
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
    const PackedZipfCase c = packed_zipf_case(zipf);
    ASSERT_GT(c.plan.num_replicas(), 0);
    Totals totals;
    check_case(c.plan, c.counts, c.routing, 8, totals, "zipf " + std::to_string(zipf));
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
