// balance=periodic in the engine: EPLB's replica policy with the homes kept
// where they are. Every `period` steps the replicas are re-placed from the
// summed loads of the last `window` steps; in between the placement holds,
// and each step splits every expert's actual count evenly over its copies.
// Compare balance=dynamic (replica_planner.h), which re-plans every step
// from that step's own counts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/replica_plan.h"

namespace epmoe::balance {

// Stage 1 of EPLB (eplb_replica_counts) over E homes + R·B slots, then each
// replica, heaviest load per copy first, onto the least loaded rank (loads
// split evenly over copies; ties to the lower rank) that has a free slot and
// does not hold that expert yet. Returns slot_experts [R * B] (kEmptySlot
// when unused). Deterministic: integers only. `previous_slot_experts` [R * B]
// (or empty): the placement being replaced; an expert that stays on a rank
// keeps its slot index there, so its weights are not sent again.
std::vector<int> place_periodic_replicas(std::span<const std::int64_t> window_loads, std::span<const int> homes,
                                         int num_ranks, int slots_per_rank,
                                         std::span<const int> previous_slot_experts = {});

// The plan of one step under a held placement: copies = home, then the slots
// holding the expert by ascending rank; quotas split_evenly(count).
ReplicaPlan plan_with_placement(std::span<const std::int64_t> expert_counts, std::span<const int> homes, int num_ranks,
                                int slots_per_rank, std::span<const int> slot_experts);

}  // namespace epmoe::balance
