#include "balance/hybrid_balancer.h"

#include <algorithm>

#include "balance/eplb.h"

namespace epmoe::balance {

HybridBalancer::HybridBalancer(int num_experts, const ReplicaPlannerOptions& options)
    : options_(options),
      home_ranks_(contiguous_home_ranks(num_experts, options.num_ranks)),
      previous_slot_experts_(static_cast<std::size_t>(options.num_ranks) * options.num_redundant_slots_per_rank,
                             kEmptySlot) {}

namespace {

std::int64_t max_home_load(std::span<const std::int64_t> expert_loads, const std::vector<int>& homes, int num_ranks) {
  std::vector<std::int64_t> loads(num_ranks, 0);
  for (std::size_t e = 0; e < homes.size(); ++e) loads[homes[e]] += expert_loads[e];
  return *std::max_element(loads.begin(), loads.end());
}

}  // namespace

void HybridBalancer::rehome(std::span<const std::int64_t> window_loads) {
  std::vector<int> packed = balanced_home_ranks(window_loads, options_.num_ranks, home_ranks_);
  // Re-homing moves weights (and, in training, optimizer state): only when
  // the packing beats the current homes on the window it was made from. With
  // hot experts already spread this keeps homes put.
  if (max_home_load(window_loads, packed, options_.num_ranks) <
      max_home_load(window_loads, home_ranks_, options_.num_ranks)) {
    home_ranks_ = std::move(packed);
  }
}

ReplicaPlan HybridBalancer::plan_step(std::span<const std::int64_t> expert_counts) {
  ReplicaPlan plan = plan_replicas(expert_counts, home_ranks_, options_, previous_slot_experts_);
  previous_slot_experts_ = plan.slot_experts;
  return plan;
}

}  // namespace epmoe::balance
