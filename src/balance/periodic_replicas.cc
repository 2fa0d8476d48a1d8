#include "balance/periodic_replicas.h"

#include <algorithm>
#include <numeric>

#include "balance/eplb.h"
#include "core/error.h"

namespace epmoe::balance {

std::vector<int> place_periodic_replicas(std::span<const std::int64_t> window_loads, std::span<const int> homes,
                                         int num_ranks, int slots_per_rank,
                                         std::span<const int> previous_slot_experts) {
  const int num_experts = static_cast<int>(window_loads.size());
  std::vector<int> slot_experts(static_cast<std::size_t>(num_ranks) * slots_per_rank, kEmptySlot);
  if (slots_per_rank == 0 || num_ranks < 2) return slot_experts;
  // At most one copy per rank: the home plus R - 1 replicas.
  const std::vector<int> copies =
      eplb_replica_counts(window_loads, num_experts + num_ranks * slots_per_rank, num_ranks);

  // Replicas to place, heaviest load per copy first (ties: lower expert).
  std::vector<int> order(static_cast<std::size_t>(num_experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return window_loads[a] * copies[b] > window_loads[b] * copies[a]; });
  // Rank loads as doubles (load / copies); only compared to pick a rank, with
  // ties to the lower rank. Every rank runs the same operations in the same
  // order on the same integers, so every rank picks the same placement.
  std::vector<double> rank_load(static_cast<std::size_t>(num_ranks), 0.0);
  for (int e = 0; e < num_experts; ++e) rank_load[homes[e]] += double(window_loads[e]) / copies[e];
  std::vector<int> free_slots(static_cast<std::size_t>(num_ranks), slots_per_rank);
  auto holds = [&](int rank, int expert) {
    if (homes[expert] == rank) return true;
    for (int b = 0; b < slots_per_rank; ++b)
      if (slot_experts[static_cast<std::size_t>(rank) * slots_per_rank + b] == expert) return true;
    return false;
  };
  for (int e : order) {
    for (int replica = 1; replica < copies[e]; ++replica) {
      int best = -1;
      for (int r = 0; r < num_ranks; ++r) {
        if (free_slots[r] == 0 || holds(r, e)) continue;
        if (best < 0 || rank_load[r] < rank_load[best]) best = r;
      }
      if (best < 0) break;  // no rank can take another copy of e
      const int slot = slots_per_rank - free_slots[best];
      slot_experts[static_cast<std::size_t>(best) * slots_per_rank + slot] = e;
      free_slots[best] -= 1;
      rank_load[best] += double(window_loads[e]) / copies[e];
    }
  }
  if (!previous_slot_experts.empty()) keep_previous_slot_positions(slot_experts, previous_slot_experts, slots_per_rank);
  return slot_experts;
}

ReplicaPlan plan_with_placement(std::span<const std::int64_t> expert_counts, std::span<const int> homes, int num_ranks,
                                int slots_per_rank, std::span<const int> slot_experts) {
  const int num_experts = static_cast<int>(expert_counts.size());
  EPMOE_CHECK_EQ(slot_experts.size(), static_cast<std::size_t>(num_ranks) * slots_per_rank);
  ReplicaPlan plan;
  plan.num_experts = num_experts;
  plan.num_ranks = num_ranks;
  plan.num_redundant_slots_per_rank = slots_per_rank;
  plan.slot_experts.assign(slot_experts.begin(), slot_experts.end());
  plan.copy_offsets.assign(static_cast<std::size_t>(num_experts) + 1, 0);
  plan.rank_loads_before.assign(static_cast<std::size_t>(num_ranks), 0);
  plan.rank_loads_after.assign(static_cast<std::size_t>(num_ranks), 0);
  for (int e = 0; e < num_experts; ++e) {
    plan.copy_offsets[e] = static_cast<int>(plan.copies.size());
    const std::size_t first = plan.copies.size();
    plan.copies.push_back({homes[e], 0});
    for (int r = 0; r < num_ranks; ++r)
      for (int b = 0; b < slots_per_rank; ++b)
        if (slot_experts[static_cast<std::size_t>(r) * slots_per_rank + b] == e) plan.copies.push_back({r, 0});
    // split_evenly gives the remainder to the lowest ranks; the home stays first.
    split_evenly(expert_counts[e], std::span<ExpertCopy>(plan.copies).subspan(first));
    plan.rank_loads_before[homes[e]] += expert_counts[e];
    for (std::size_t i = first; i < plan.copies.size(); ++i)
      plan.rank_loads_after[plan.copies[i].rank] += plan.copies[i].token_quota;
  }
  plan.copy_offsets[num_experts] = static_cast<int>(plan.copies.size());
  plan.before = measure_load_imbalance(plan.rank_loads_before);
  plan.after = measure_load_imbalance(plan.rank_loads_after);
  return plan;
}

}  // namespace epmoe::balance
