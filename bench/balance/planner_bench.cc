// bench_balance_planner: microseconds per plan_replicas() call — the planner
// runs on every rank, every step, every MoE layer, on the critical path
// between the count all-reduce and the dispatch — for E=256/R=64/B=2
// (DeepSeek-V3 over 64 ranks) and a few other sizes, on one step of
// generated Zipf loads (s=1.2, K=8, 4096 tokens per rank; hot experts spread
// and packed). Peer in the same run: eplb_global_placement() for the same
// loads and slot budget, interleaved with the planner so that background load
// hits both alike; and the cost-aware plan (issue 31, priced at the rates
// below, as the engine prices the all-to-all) beside them; "min" columns are
// the fastest repetition (min of 9). Every plan is verified (quotas sum to the counts, no expert
// twice on a rank, slot limits) before it is timed.
//
//   bench_balance_planner [--quick | --calls N balance|priced]
//     --quick: shorter repetitions
//     --calls N ...: no timing; N plans per case, balance-only or priced,
//       for instruction counts that do not depend on the machine's load:
//       valgrind --tool=callgrind --dump-after='*untimed_plans*'
//       --toggle-collect='*untimed_plans*' gives one dump per case
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "balance/eplb.h"
#include "balance/load_generator.h"
#include "balance/replica_planner.h"
#include "bench_harness.h"

namespace {

using namespace epmoe::balance;

struct BenchCase {
  int num_experts, num_ranks, num_slots;
  HotExpertPlacement placement;
  double threshold;
};

// Aborts the benchmark on a wrong plan: a fast wrong answer is not a result.
bool verify(const ReplicaPlan& plan, const std::vector<std::int64_t>& counts, int num_slots) {
  for (int e = 0; e < plan.num_experts; ++e) {
    std::int64_t sum = 0;
    std::set<int> ranks;
    for (const ExpertCopy& copy : plan.copies_of(e)) {
      sum += copy.token_quota;
      if (!ranks.insert(copy.rank).second) return false;
    }
    if (sum != counts[e]) return false;
  }
  return plan.num_replicas() <= plan.num_ranks * num_slots && plan.after.max_load <= plan.before.max_load;
}

// --calls: one case's plans, in a function of its own so callgrind can
// collect and dump exactly these calls.
[[gnu::noinline]] std::int64_t untimed_plans(const std::vector<std::int64_t>& counts, const std::vector<int>& homes,
                                             const ReplicaPlannerOptions& planner, const ReplicaCosts& costs,
                                             int calls) {
  std::int64_t sink = 0;
  for (int i = 0; i < calls; ++i) sink += plan_replicas(counts, homes, planner, {}, costs).after.max_load;
  return sink;
}

}  // namespace

int main(int argc, char** argv) {
  epmoe::bench::BenchOptions options;
  options.repetitions = 9;
  options.min_repetition_seconds = argc > 1 && std::strcmp(argv[1], "--quick") == 0 ? 0.02 : 0.2;
  const int untimed_calls = argc > 3 && std::strcmp(argv[1], "--calls") == 0 ? std::atoi(argv[2]) : 0;
  const bool untimed_priced = untimed_calls > 0 && std::strcmp(argv[3], "priced") == 0;

  const std::vector<BenchCase> cases = {
      {256, 64, 2, HotExpertPlacement::spread, 1.05}, {256, 64, 2, HotExpertPlacement::packed, 1.05},
      {256, 64, 2, HotExpertPlacement::spread, 1.0},  {256, 64, 2, HotExpertPlacement::packed, 1.0},
      {256, 64, 1, HotExpertPlacement::spread, 1.05}, {256, 64, 4, HotExpertPlacement::spread, 1.05},
      {64, 8, 2, HotExpertPlacement::spread, 1.05},   {128, 16, 2, HotExpertPlacement::spread, 1.05},
      {256, 32, 2, HotExpertPlacement::spread, 1.05}, {1024, 128, 2, HotExpertPlacement::spread, 1.05},
  };
  std::printf("%5s %4s %2s %-6s %5s | %9s %9s %9s %7s | %8s %15s | %9s %7s | %9s %9s %8s\n", "E", "R", "B", "hot",
              "thr", "plan us", "min", "max", "spread", "replicas", "max/mean", "eplb us", "ratio", "priced us", "min",
              "replicas");
  for (const BenchCase& c : cases) {
    LoadGeneratorOptions generator;
    generator.num_experts = c.num_experts;
    generator.num_ranks = c.num_ranks;
    generator.num_tokens_per_rank = 4096;
    generator.top_k = 8;
    generator.num_steps = 1;
    generator.zipf_exponent = 1.2;
    generator.placement = c.placement;
    generator.seed = 1;
    const std::vector<std::int64_t> counts = generate_expert_loads(generator).counts;
    const std::vector<int> homes = contiguous_home_ranks(c.num_experts, c.num_ranks);
    const ReplicaPlannerOptions planner{c.num_ranks, c.num_slots, c.threshold};

    const ReplicaPlan plan = plan_replicas(counts, homes, planner);
    if (!verify(plan, counts, c.num_slots)) {
      std::fprintf(stderr, "bench_balance_planner: plan failed verification (E=%d R=%d B=%d)\n", c.num_experts,
                   c.num_ranks, c.num_slots);
      return 1;
    }
    const int slots_per_rank = c.num_experts / c.num_ranks + c.num_slots;
    // Priced (issue 31): a DeepSeek-V3 expert (H=7168, F=2048) on an H200
    // (989 TFLOP/s bf16 x 0.5, 450 GB/s, 2 us), bf16 weights, with
    // per-source counts for the token rows (each expert's count spread evenly
    // over the ranks).
    std::vector<std::int64_t> source(static_cast<std::size_t>(c.num_ranks) * c.num_experts);
    for (int r = 0; r < c.num_ranks; ++r)
      for (int e = 0; e < c.num_experts; ++e)
        source[static_cast<std::size_t>(r) * c.num_experts + e] =
            counts[e] / c.num_ranks + (r < counts[e] % c.num_ranks ? 1 : 0);
    ReplicaCosts costs;
    costs.row_seconds = 18.0 * 7168 * 2048 / 494.5e12;
    costs.weight_seconds = 3.0 * 7168 * 2048 * 2 / 450e9 + 2e-6;
    costs.gradient_seconds = 3.0 * 7168 * 2048 * 4 / 450e9 + 2e-6;
    costs.token_row_seconds = 7168.0 * 16 / 450e9;
    // The all-to-all's rows per direction (f32 tokens and dx), beside which
    // the transfers are priced by their bytes (ep/replica_exchange.cc).
    costs.forward_row_seconds = costs.backward_row_seconds = 7168.0 * 4 / 450e9;
    costs.link_latency_seconds = 2e-6;
    costs.source_counts = source;
    // Each rank's pairs, as the engine all-gathers them with the counts.
    std::vector<std::int64_t> pairs(static_cast<std::size_t>(c.num_ranks), 0);
    for (int r = 0; r < c.num_ranks; ++r)
      for (int e = 0; e < c.num_experts; ++e) pairs[r] += source[static_cast<std::size_t>(r) * c.num_experts + e];
    costs.source_pairs = pairs;
    std::int64_t sink = 0;  // keeps the calls from being optimised away
    if (untimed_calls > 0) {
      sink += untimed_plans(counts, homes, planner, untimed_priced ? costs : ReplicaCosts{}, untimed_calls);
      std::printf("%5d %4d %2d %-6s %5.2f | %d %s plans (untimed) | %lld\n", c.num_experts, c.num_ranks, c.num_slots,
                  c.placement == HotExpertPlacement::spread ? "spread" : "packed", c.threshold, untimed_calls,
                  untimed_priced ? "priced" : "balance", static_cast<long long>(sink));
      continue;
    }
    const auto stats = epmoe::bench::measure_interleaved(
        {[&] { sink += plan_replicas(counts, homes, planner).after.max_load; },
         [&] { sink += eplb_global_placement(counts, c.num_ranks, slots_per_rank, nullptr).slot_experts[0]; },
         [&] { sink += plan_replicas(counts, homes, planner, {}, costs).after.max_load; }},
        options);
    const ReplicaPlan priced = plan_replicas(counts, homes, planner, {}, costs);
    char balance[32];
    std::snprintf(balance, sizeof balance, "%.2f -> %.3f", plan.before.max_over_mean(), plan.after.max_over_mean());
    std::printf("%5d %4d %2d %-6s %5.2f | %9.2f %9.2f %9.2f %6.0f%% | %8d %15s | %9.2f %6.1fx | %9.2f %9.2f %8d\n",
                c.num_experts, c.num_ranks, c.num_slots,
                c.placement == HotExpertPlacement::spread ? "spread" : "packed", c.threshold,
                stats[0].median_seconds * 1e6, stats[0].min_seconds * 1e6, stats[0].max_seconds * 1e6,
                100 * stats[0].relative_spread(), plan.num_replicas(), balance, stats[1].median_seconds * 1e6,
                stats[1].median_seconds / stats[0].median_seconds, stats[2].median_seconds * 1e6,
                stats[2].min_seconds * 1e6, priced.num_replicas());
    if (sink == 42) std::printf(" ");
  }
  return 0;
}
