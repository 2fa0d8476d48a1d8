// Our implementation of EPLB's global policy (DeepSeek, github.com/
// deepseek-ai/EPLB, `rebalance_experts` with one group per node), the periodic
// baseline `epmoe balance policy=eplb` compares against. Every expert is free
// to move: the R ranks hold R * S physical slots (S = E/R + B), filled in two
// stages from a load estimate (the window sum of past steps):
//   1. replicate: start with one copy per expert; while slots remain, give one
//      more copy to the expert with the largest load per copy;
//   2. pack: copies, heaviest (load / copies) first, each onto the least
//      loaded rank that still has a free slot.
// Within a step each expert's tokens are split evenly over its copies
// (split_evenly in balance/replica_plan.h).
//
// Departures from the published code (their measured effect on balance, from
// bench/balance/eplb_departures.cc, is in docs/BALANCE.md: better on 12 of 36
// Zipf scenarios by up to 0.060 of max/mean, worse on 4 by up to 0.018):
//   * two copies of one expert never share a rank (EPLB's global packing may
//     do that, which wastes a slot); an expert gets at most R copies, and a
//     copy that finds every rank with a free slot already holding its expert
//     is dropped (its share goes to the other copies);
//   * packs are unlabelled, so they are matched to ranks keeping as many
//     experts where they were as possible: the same loads, fewer weight moves;
//   * integer arithmetic throughout (loads per copy compared by
//     cross-multiplying) so that every rank computes the same placement.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/replica_plan.h"

namespace epmoe::balance {

// Which experts every rank holds; each rank has slots_per_rank slots.
struct ExpertPlacement {
  int num_experts = 0;
  int num_ranks = 0;
  int slots_per_rank = 0;
  std::vector<int> slot_experts;  // [R * slots_per_rank], kEmptySlot when unused

  int num_copies(int expert) const;
  bool holds(int rank, int expert) const;
  // Each expert's copies (ascending rank) with its count split evenly over
  // them (split_evenly): the quotas a step under this placement computes.
  std::vector<std::vector<ExpertCopy>> evenly_split_copies(std::span<const std::int64_t> expert_counts) const;
  // Tokens per rank when each expert's `expert_counts` are split evenly over
  // its copies.
  std::vector<std::int64_t> rank_loads(std::span<const std::int64_t> expert_counts) const;
};

// Stage 1: copies per expert for `num_slots` slots, at most `max_copies` each.
// Stops early (slots left unused) once the largest load per copy is 0.
std::vector<int> eplb_replica_counts(std::span<const std::int64_t> expert_loads, int num_slots, int max_copies);

// Both stages. `previous` (may be null) is the placement being replaced, used
// only to label packs with ranks. Requires E <= R * slots_per_rank.
ExpertPlacement eplb_global_placement(std::span<const std::int64_t> expert_loads, int num_ranks, int slots_per_rank,
                                      const ExpertPlacement* previous);

// Stage 2 alone with one copy per expert and E/R per rank: a balanced home
// placement (hybrid's periodic re-homing). Returns home_rank_of_expert [E];
// `previous_homes` (may be empty) labels packs as above.
std::vector<int> balanced_home_ranks(std::span<const std::int64_t> expert_loads, int num_ranks,
                                     std::span<const int> previous_homes);

}  // namespace epmoe::balance
