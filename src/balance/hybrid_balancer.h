// Hybrid balancing: slow, cheap-to-decide re-homing plus fast per-step
// replicas. Every period the experts' homes are re-packed from a window of
// past loads (EPLB's balanced packing, one copy each, E/R per rank), which
// removes the persistent skew that fixed homes cannot (all hot experts homed
// on one rank); every step the replica planner then fills the B redundant
// slots from that step's counts, on top of the current homes, which absorbs
// the step-to-step noise and drift a stale periodic placement cannot.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/replica_plan.h"
#include "balance/replica_planner.h"

namespace epmoe::balance {

class HybridBalancer {
 public:
  // Starts from the contiguous home placement (expert e on rank e / (E/R)).
  HybridBalancer(int num_experts, const ReplicaPlannerOptions& options);

  // New homes from a load estimate (e.g. the sum of the last W steps), kept
  // only if their max rank load on that estimate is lower than the current
  // homes'.
  void rehome(std::span<const std::int64_t> window_loads);
  // This step's plan on the current homes; replicas that stay on a rank keep
  // their slot from the previous step.
  ReplicaPlan plan_step(std::span<const std::int64_t> expert_counts);

  const std::vector<int>& home_ranks() const { return home_ranks_; }

 private:
  ReplicaPlannerOptions options_;
  std::vector<int> home_ranks_;             // [E]
  std::vector<int> previous_slot_experts_;  // [R * B] of the last plan
};

}  // namespace epmoe::balance
