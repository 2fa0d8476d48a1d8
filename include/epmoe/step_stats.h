// What one expert-parallel step measured on one rank: the dispatch's bytes
// and rows (DispatchStats) and, with redundant experts, the replica plan it
// ran under (ReplicaStats). An MoE layer (<epmoe/moe_layer.h>) reports both
// for its last step; a dispatch handle (<epmoe/ep_group.h>) for its own.
//
// Public and std-only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <epmoe/config.h>

namespace epmoe {

struct DispatchStats {
  // Bytes this rank sent to other ranks, by collective ("forward/all_to_all_v
  // tokens", ...; "backward/remat ..." is what recomputing x_sorted costs).
  // Every byte sent is under some kind, the small control streams too: the
  // count round ("forward/all_to_all_v counts"), the ring's token counts,
  // the fp8_tensor scales, and with replicas the exchange's counts, weights
  // and gradients ("forward/replica weights", "backward/replica gradients").
  std::map<std::string, std::int64_t> bytes_sent;
  // Rows this rank's home experts computed, per local expert (all chunks);
  // a replica slot's are in ReplicaStats::rows_per_slot.
  std::vector<std::int64_t> rows_per_local_expert;
  // (token, expert) pairs this rank's tokens lost to a capacity limit
  // (capacity_factor > 0; never otherwise).
  std::int64_t dropped_pairs = 0;
};

struct ReplicaStats {
  std::vector<std::int64_t> rows_per_slot;      // [B] rows this rank's redundant slots computed
  std::vector<int> slot_experts;                // [B] expert each slot held (-1: empty)
  std::vector<std::int64_t> slot_quotas;        // [B] rows the plan gave each slot
  std::vector<std::int64_t> home_quotas;        // [E_l] rows the plan left with each home expert
  std::vector<std::int64_t> rank_loads_before;  // [R] rows per rank with every expert at home
  std::vector<std::int64_t> rank_loads_after;   // [R] rows per rank under the plan
  double max_over_mean_before = 1.0, max_over_mean_after = 1.0;
  // ceil(total / R) / mean: the best any plan reaches; after > ideal means
  // the B slots did not allow it.
  double ideal_max_over_mean = 1.0;
  int num_replicas = 0;          // occupied slots over all ranks
  int slots_refreshed = 0;       // this rank's slots that received weights this step
  double planner_seconds = 0.0;  // counts all-gather excluded
  // balance=dynamic with priced replicas (EpConfig::replica_costs): the
  // plan's predicted critical-path seconds saved and spent, and what the
  // plan that balanced whatever it cost would have added beyond it
  // (replicas it refused, their saving and their cost). All 0 unpriced.
  double predicted_saving_seconds = 0.0, predicted_cost_seconds = 0.0;
  int refused_replicas = 0;
  double refused_saving_seconds = 0.0, refused_cost_seconds = 0.0;
  // The rates the plan was priced at: EpConfig::replica_costs, or with
  // replica_costs=measured what the group's first plan measured.
  ReplicaCostRates priced_at;
  // Priced: this step had no counts round and no plan, the last plans having
  // placed nothing (every pair went home; the loads above are not known).
  bool skipped_planning = false;
  // Bytes this rank sent for the replicas (also in DispatchStats::bytes_sent
  // of a layer's step): "forward/ring_all_gather replica counts",
  // "forward/replica weights", "backward/replica gradients".
  std::map<std::string, std::int64_t> bytes_sent;

  void reset() { *this = ReplicaStats(); }
};

}  // namespace epmoe
