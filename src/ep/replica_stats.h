// ReplicaStats: what a ReplicaExchange (ep/replica_exchange.h) measured over
// its last step — the plan this rank computed under and the rows its
// redundant slots computed. The exchange owns and resets it; readers get it
// through Dispatcher::replicas()->stats() or MoeLayer::replica_stats(), which
// returns an all-default ReplicaStats when replicas are off.
#pragma once

#include <cstdint>
#include <vector>

namespace epmoe::ep {

struct ReplicaStats {
  std::vector<std::int64_t> rows_per_slot;      // [B] rows this rank's redundant slots computed
  std::vector<int> slot_experts;                // [B] expert each slot held (-1: empty)
  std::vector<std::int64_t> slot_quotas;        // [B] rows the plan gave each slot
  std::vector<std::int64_t> home_quotas;        // [E_l] rows the plan left with each home expert
  std::vector<std::int64_t> rank_loads_before;  // [R] rows per rank with every expert at home
  std::vector<std::int64_t> rank_loads_after;   // [R] rows per rank under the plan
  double max_over_mean_before = 1.0, max_over_mean_after = 1.0;
  // ceil(total / R) / mean: the best any plan reaches; after > ideal means
  // the B slots did not allow it (balance/replica_planner.h).
  double ideal_max_over_mean = 1.0;
  int num_replicas = 0;          // occupied slots over all ranks
  int slots_refreshed = 0;       // this rank's slots that received weights this step
  double planner_seconds = 0.0;  // counts all-gather excluded

  void reset() { *this = ReplicaStats(); }
};

}  // namespace epmoe::ep
