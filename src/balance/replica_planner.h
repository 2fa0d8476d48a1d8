// The per-step replica planner (DESIGN.md §4.8 step 2): from this step's
// global expert counts, place up to B replicas per rank so that the busiest
// rank's load approaches the mean. Runs on every rank after the all-reduce of
// counts and before dispatch; every rank computes the same plan from the same
// integers (no floating-point sums, ties broken by the lowest index).
//
// Greedy, one replica per move:
//   1. take the busiest rank m (load M);
//   2. its experts (homes and replicas held there) in order of tokens that
//      copy computes, largest first; skip an expert that cannot be split again
//      (a copy on every rank, or too few tokens for one more non-empty quota);
//   3. for the first expert that works: a replica on the least loaded rank
//      that has a free slot and does not already hold that expert (any rank,
//      not only the globally least loaded one), the expert's count re-split
//      evenly over all its copies;
//   4. a move is taken only if both m and the new replica's rank end below M,
//      so (max load, number of ranks at max) falls strictly: max/mean never
//      rises and the loop ends after at most R * B moves.
// It stops when max/mean <= rebalance_threshold, or when no expert of the
// busiest rank has a move that lowers it — an exhausted rank ends the search
// rather than picking an already-replicated expert by accident (the seeds'
// bug, DESIGN.md §6). A very hot expert may be picked again on purpose: each
// move adds one more copy of it on another rank.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/replica_plan.h"

namespace epmoe::balance {

struct ReplicaPlannerOptions {
  int num_ranks = 1;
  int num_redundant_slots_per_rank = 0;  // B
  // Stop once max/mean rank load is at or below this (1.0: balance as far as
  // the slots allow).
  double rebalance_threshold = 1.05;
};

// The standard home placement: expert e on rank e / (E / R). E % R == 0.
std::vector<int> contiguous_home_ranks(int num_experts, int num_ranks);

// `expert_counts` [E]: global (token, k) pairs per expert this step, >= 0.
// `home_rank_of_expert` [E]: any placement (hybrid re-homes experts).
// `previous_slot_experts` [R * B] or empty: the last plan's slot_experts, so
// experts that stay on a rank keep their slot (see ReplicaPlan).
ReplicaPlan plan_replicas(std::span<const std::int64_t> expert_counts,
                          std::span<const int> home_rank_of_expert,
                          const ReplicaPlannerOptions& options,
                          std::span<const int> previous_slot_experts = {});

}  // namespace epmoe::balance
