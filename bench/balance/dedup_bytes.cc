// bench_balance_dedup_bytes: token rows the all-to-all with dedup sends off
// the source rank (= bytes / (H * bytes per element)) under DeepSeek-like
// routing — E = 256, K = 8 distinct experts per token, 4096 tokens per rank,
// R = 8 and 16, Zipf s = 0 (uniform), 1.0, 1.2, hot experts spread and packed
// (balance/token_routing_generator.h, one seed) — with replicas planned by
// plan_replicas (B = 2, rebalance_threshold = 1.0, contiguous homes):
//   no replicas     every pair to its home (the reference);
//   positional      pairs to copies by position within the locality-first
//                   per-(source, copy) sub-quotas (balance/replica_plan.h);
//   dedup-aware     balance/dedup_aware_choice.h (same sub-quotas).
// Also the pairs sent off-rank without dedup, the rank loads' max/mean before
// and after the plan, and the choice's cost per source rank (µs, best of 5).
// Every choice is checked: per (source, copy) counts equal the sub-quotas.
//
//   bench_balance_dedup_bytes
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "balance/dedup_aware_choice.h"
#include "balance/replica_planner.h"
#include "balance/token_routing_generator.h"

namespace {

using namespace epmoe::balance;

// Off-rank rows with dedup when every pair goes to its home.
std::int64_t home_rows(const std::vector<std::int32_t>& ids, int top_k, int experts_per_rank, int source) {
  std::int64_t rows = 0;
  for (std::size_t t = 0; t * top_k < ids.size(); ++t) {
    int seen[64], n = 0;
    for (int k = 0; k < top_k; ++k) {
      const int rank = ids[t * top_k + k] / experts_per_rank;
      if (rank == source || std::find(seen, seen + n, rank) != seen + n) continue;
      seen[n++] = rank;
    }
    rows += n;
  }
  return rows;
}

std::vector<std::int64_t> per_copy(const ReplicaPlan& plan, const std::vector<std::int32_t>& ids,
                                   const std::vector<int>& choice) {
  std::vector<std::int64_t> n(plan.copies.size(), 0);
  for (std::size_t p = 0; p < ids.size(); ++p) ++n[static_cast<std::size_t>(plan.copy_offsets[ids[p]] + choice[p])];
  return n;
}

}  // namespace

int main() {
  constexpr int kExperts = 256, kTopK = 8, kSlots = 2;
  constexpr std::int64_t kTokensPerRank = 4096;
  std::printf("E=%d K=%d tokens/rank=%lld B=%d threshold=1.0; rows = off-rank token rows summed over source ranks\n",
              kExperts, kTopK, static_cast<long long>(kTokensPerRank), kSlots);
  std::printf("%3s %4s %-6s | %11s %9s | %10s | %10s %10s %10s | %7s %7s | %8s\n", "R", "zipf", "hot", "max/mean",
              "replicas", "no dedup", "no replica", "positional", "dedup-awr", "aw/pos", "saved", "us/rank");
  for (int num_ranks : {8, 16})
    for (double zipf : {0.0, 1.0, 1.2})
      for (HotExpertPlacement placement : {HotExpertPlacement::spread, HotExpertPlacement::packed}) {
        const LoadGeneratorOptions options{.num_experts = kExperts,
                                           .num_ranks = num_ranks,
                                           .num_tokens_per_rank = kTokensPerRank,
                                           .top_k = kTopK,
                                           .zipf_exponent = zipf,
                                           .placement = placement,
                                           .seed = 2024};
        const std::vector<std::vector<std::int32_t>> routing = generate_token_routing(options);
        std::vector<std::int64_t> counts(static_cast<std::size_t>(num_ranks) * kExperts, 0), global(kExperts, 0);
        for (int r = 0; r < num_ranks; ++r)
          for (const std::int32_t e : routing[r]) {
            ++counts[static_cast<std::size_t>(r) * kExperts + e];
            ++global[e];
          }
        const ReplicaPlan plan =
            plan_replicas(global, contiguous_home_ranks(kExperts, num_ranks),
                          {.num_ranks = num_ranks, .num_redundant_slots_per_rank = kSlots, .rebalance_threshold = 1.0});
        const int experts_per_rank = kExperts / num_ranks;
        std::int64_t no_dedup = 0, no_replica = 0, positional = 0, aware = 0;
        double best_us = 1e30;
        for (int s = 0; s < num_ranks; ++s) {
          const std::vector<std::int32_t>& ids = routing[s];
          for (const std::int32_t e : ids) no_dedup += e / experts_per_rank != s;
          no_replica += home_rows(ids, kTopK, experts_per_rank, s);
          const std::vector<int> by_position = positional_copy_choice(plan, counts, s, ids, kTopK);
          std::vector<int> choice;
          for (int rep = 0; rep < 5; ++rep) {
            const auto start = std::chrono::steady_clock::now();
            choice = dedup_aware_copy_choice(plan, counts, s, ids, kTopK);
            best_us = std::min(
                best_us, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
          }
          if (per_copy(plan, ids, choice) != per_copy(plan, ids, by_position) ||
              per_copy(plan, ids, by_position) != source_sub_quotas(plan, counts, s)) {
            std::fprintf(stderr, "R=%d zipf=%.1f source %d: per-(source, copy) counts differ\n", num_ranks, zipf, s);
            return EXIT_FAILURE;
          }
          positional += off_rank_rows(plan, s, ids, kTopK, by_position);
          aware += off_rank_rows(plan, s, ids, kTopK, choice);
        }
        std::printf("%3d %4.1f %-6s | %5.3f %5.3f %9d | %10lld | %10lld %10lld %10lld | %7.4f %7lld | %8.1f\n",
                    num_ranks, zipf, placement == HotExpertPlacement::packed ? "packed" : "spread",
                    plan.before.max_over_mean(), plan.after.max_over_mean(), plan.num_replicas(),
                    static_cast<long long>(no_dedup), static_cast<long long>(no_replica),
                    static_cast<long long>(positional), static_cast<long long>(aware),
                    positional > 0 ? static_cast<double>(aware) / static_cast<double>(positional) : 1.0,
                    static_cast<long long>(positional - aware), best_us);
      }
  return EXIT_SUCCESS;
}
