// ReplicaPlan: where the tokens of every expert go in one step — the contract
// between the planner (balance/replica_planner.h) and the dispatchers that
// reroute tokens and move replica weights (ep/).
//
// Layout. R ranks, E experts, B redundant slots per rank. Expert e always has
// its home copy (the rank holding its weights and optimizer state) and 0 or
// more replicas, each in one redundant slot of another rank; never two copies
// of one expert on one rank.
//
// Rerouting rule (what makes replica slots really receive tokens). The copies
// of expert e are listed home first, then replicas in ascending rank order,
// with token quotas that sum exactly to e's global count. Every rank knows the
// all-gathered [R, E] local counts n_s, and from them and the plan computes
// the same LOCALITY-FIRST sub-quotas sub[s][i], how many of source rank s's
// (token, k) pairs of e copy i (rank r_i, quota q_i) computes:
//  1. each copy first takes its own rank's pairs: min(q_i, n_{r_i});
//  2. the remaining quotas and counts are matched sources ascending, copies
//     in copy order (northwest corner rule).
// Within source s, its pairs of e in its local (token, k) order over the step
// go to the copies in copy order, sub[s][i] to copy i (the positional rule);
// the all-to-all with dedup may instead pick which of s's pairs fill each
// sub-quota (balance/dedup_aware_choice.h). A pure integer function of (plan,
// counts), sub_quotas() below: each source knows its
// split and each receiver its count with no further communication, every
// copy receives exactly its quota, and a replica computes its own rank's
// tokens before anyone else's (no wire bytes for those).
//
// Quotas: integers >= 0 summing exactly to the expert's global count. A
// replica's quota is > 0 (an idle slot would cost a weight transfer for
// nothing); a home's may be 0 when the planner moved all of the expert's
// tokens for this step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/load_imbalance.h"

namespace epmoe::balance {

inline constexpr int kEmptySlot = -1;

struct ExpertCopy {
  int rank = 0;
  std::int64_t token_quota = 0;  // (token, k) pairs this copy computes
};

struct ReplicaPlan {
  int num_experts = 0;
  int num_ranks = 0;
  int num_redundant_slots_per_rank = 0;

  // Copies of expert e: copies[copy_offsets[e] .. copy_offsets[e + 1]), home
  // first. Read through copies_of().
  std::vector<int> copy_offsets;  // [E + 1]
  std::vector<ExpertCopy> copies;

  // Expert held by redundant slot b of rank r at [r * B + b], or kEmptySlot.
  // An expert that held a slot of this rank in the previous plan keeps that
  // slot index, so a weight transfer can be skipped when the slot is current.
  std::vector<int> slot_experts;  // [R * B]

  // Tokens per rank with every expert at home only, and under this plan.
  std::vector<std::int64_t> rank_loads_before;  // [R]
  std::vector<std::int64_t> rank_loads_after;   // [R]
  LoadImbalance before;
  LoadImbalance after;

  // Cost-aware planning (ReplicaCosts in balance/replica_planner.h): the
  // predicted critical-path seconds this plan saves (rows off the busiest
  // rank x a row's compute) and costs (weights in, gradients home, token
  // rows added, on the busiest link of each), and what the plan that
  // balanced as far as the threshold asked would have saved and cost beyond
  // this one, with its replicas this plan refused. All 0 when costs are off.
  double predicted_saving_seconds = 0;
  double predicted_cost_seconds = 0;
  int refused_replicas = 0;
  double refused_saving_seconds = 0;
  double refused_cost_seconds = 0;

  std::span<const ExpertCopy> copies_of(int expert) const;
  int home_rank(int expert) const { return copies[copy_offsets[expert]].rank; }
  int slot_expert(int rank, int slot) const {
    return slot_experts[static_cast<std::size_t>(rank) * num_redundant_slots_per_rank + slot];
  }
  int num_replicas() const;  // occupied redundant slots
  // Whether max load reached the ideal, ceil(total / R) (before.ideal_max_load()).
  bool reached_ideal() const { return after.max_load <= before.ideal_max_load(); }
};

// Quotas of one expert's copies: `count` split as evenly as integers allow,
// the remainder one token each to the copies on the lowest ranks — a rule
// every rank evaluates identically. `copies` hold the ranks (any order, all
// distinct); their token_quota is overwritten.
void split_evenly(std::int64_t count, std::span<ExpertCopy> copies);

// The rerouting rule's locality-first sub-quotas (above), for every source
// at once: [R * plan.copies.size()], at s * copies.size() + i
// the number of source s's pairs that copy i (indexed like plan.copies)
// computes. Per expert e with copies i (rank r_i, quota q_i) and counts n_s:
// first local_i = min(q_i, n_{r_i}) to each copy from its own rank, then the
// remaining quotas and counts matched sources ascending, copies in copy order
// (northwest corner rule). O(E * R + copies). `counts` is the all-gathered
// [R * E] (counts[r * E + e]); the plan's quotas must sum to each expert's
// column sum (checked).
std::vector<std::int64_t> sub_quotas(const ReplicaPlan& plan, std::span<const std::int64_t> counts);
// Row `source` of sub_quotas, indexed like plan.copies.
std::vector<std::int64_t> source_sub_quotas(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source);

// Reorders each rank's B slots in `slot_experts` [R * B] so that an expert
// that held slot b of the rank in `previous` [R * B] stays in slot b (its
// weights there are current); the others take the remaining slots in their
// order. `slot_values` (same layout, may be empty) moves along, e.g. quotas.
// Changes which rank holds what, never; so no load changes.
void keep_previous_slot_positions(std::span<int> slot_experts, std::span<const int> previous, int slots_per_rank,
                                  std::span<std::int64_t> slot_values = {});

}  // namespace epmoe::balance
