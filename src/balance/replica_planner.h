// The per-step replica planner (DESIGN.md §4.8 step 2): from this step's
// global expert counts, place up to B replicas per rank, each with an integer
// token quota, so that the busiest rank's load comes down to a target. Runs on
// every rank after the all-gather of counts and before dispatch; every rank
// computes the same plan from the same integers (no floating-point sums, ties
// broken by the lowest index).
//
// Water filling towards a target load T (the idea of MoonEP's planner):
//   * donors are the ranks above T, receivers the ranks below it; a receiver
//     can take T - load more tokens, in at most B distinct experts;
//   * repeatedly the donor with the largest excess hands a contiguous run of
//     its largest remaining home expert to a receiver: one that already holds
//     a replica of that expert if one has room (no slot spent), else the
//     receiver with a free slot that can absorb the whole remaining piece most
//     tightly (best fit), else the one with the most room. The run is
//     min(excess, the expert's remaining home quota, the receiver's room);
//   * a receiver may take experts from several donors, never one expert
//     twice (a second run of an expert it holds is added to that replica).
// The runs are quotas, not an even split: the engine's rerouting cuts every
// expert's tokens into contiguous runs of exactly these sizes by global
// position (balance/replica_plan.h), so each copy computes its quota.
//
// Targets. T starts at the smallest load that meets rebalance_threshold
// (threshold 1.0: ceil(total / R), the ideal). When the slots do not allow it
// (some rank would need more than B remote experts), the fill leaves excess
// on a donor; the planner then searches, by bisection on T, the smallest
// target the fill reaches within B slots, and returns that plan. The plan
// records the ideal it could not reach (ReplicaPlan::ideal_max_load). The
// bisection ends once the interval is within 1/512 of the mean load, so a
// plan costs a few fills at most; the common case is one fill.
//
// What is optimal and what is not: when the fill reaches T, max load = T, the
// best possible for that target. The fill is greedy, so on the rare loads
// where a cleverer assignment of runs to receivers would fit within B slots
// and the greedy one does not, the bisection settles above the true optimum
// (docs/BALANCE.md has the measured gap).
//
// Cost-aware plans (ReplicaCosts, issue 31). Balance is not free: a replica
// moves its expert's weights in and its gradient home, and with the
// all-to-all may send token rows over links they did not cross before. With
// costs given, the planner
//   * refuses any run that opens a slot unless its rows' compute pays for
//     the slot's own transfers (a kept slot whose weights are current pays
//     only its gradient; in inference, nothing);
//   * prices whole plans: saving = (busiest rank's load before - after) x a
//     row's compute; cost = the busiest link's weight transfers + its
//     gradient transfers, each at the link's rate (transfers on different
//     links overlap, on one add up); the token rows the busiest link gains
//     count as cost, those it loses as saving (the all-to-all's time goes to
//     its busiest link: under packed hot experts, the hot home's). With the
//     all-to-all's rows per direction given (forward_row_seconds), the
//     transfers cost only what they add to the busiest port beside the
//     dispatch's token rows (weights) and dx's (gradients), their bytes
//     only (the rows pay the link's latency, which the transfers' overlaps):
//     on a port the tokens leave idle, they are hidden;
//   * takes, among the balance plan, plans that stop short of it (targets
//     at 1/3 and 2/3 of the way back to the homes' max load) and, with
//     B > 1, the fill at the balance target with one slot per rank (fewer
//     weights from a hot home's port), the one with the largest
//     saving - cost, and no replicas at all unless that is > 0.
// So a plan is never predicted slower than no replicas; what it did not
// take is reported in ReplicaPlan's refused_* fields.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/replica_plan.h"

namespace epmoe::balance {

// Seconds on the clock the plan is judged on (modelled, or the wall clock's
// assumed rates): see docs/BALANCE.md "Cost model". row_seconds = 0 turns
// costs off: the plan balances as far as the threshold asks, whatever it
// costs (the planner of issues 6-13).
struct ReplicaCosts {
  double row_seconds = 0;        // one (token, k) row's expert compute, forward (+ backward when training)
  double weight_seconds = 0;     // one expert's weights over one link into a slot, latency included
  double gradient_seconds = 0;   // one slot's gradient over one link home; 0 without a backward
  double token_row_seconds = 0;  // one token row more over a link (all-to-all); 0 for the ring
  // The transfers move beside the all-to-all's rows (ep/replica_exchange.h:
  // the weights leave with the plan, before the dispatch; the gradients as
  // dx comes back), each rank's port one way carrying both: a token row
  // forward (the dispatch) and a dx row back. With token rows priced, a
  // plan pays only what the transfers add to the busiest port beyond its
  // token rows (the hidden part is free). 0: the transfers are priced as
  // exposed (the ring, whose all-gather keeps every link busy).
  double forward_row_seconds = 0;
  double backward_row_seconds = 0;
  // The part of weight_seconds and gradient_seconds that is the link's
  // latency. A message holds a port only for its bytes (the modelled links,
  // transport/threads/emulated_links.h): its latency runs while the next
  // message's bytes cross, so beside the rows, which pay the latency
  // themselves, the transfers add only their bytes. The modelled step shows
  // it (docs/BALANCE.md "Cost model"): on b200 five weights leave rank 0's
  // port 0.44 us apart, not 2.4.
  double link_latency_seconds = 0;
  // What planning itself costs a step (the counts round): a plan with
  // replicas pays it, one without lets the engine skip it next time.
  double plan_seconds = 0;
  // The previous plan's slots (previous_slot_experts) still hold current
  // weights (same weight version: inference, micro-batches of one optimizer
  // step): keeping a replica there moves no weights.
  bool previous_weights_current = false;
  // [R * E] per-source counts (counts[r * E + e]) for the token rows a plan
  // adds (token_row_seconds); empty: no token cost.
  std::span<const std::int64_t> source_counts;
  // [R] each rank's pairs (row sums of source_counts), when the caller has
  // them (the engine all-gathers them with the counts): spares the planner
  // a pass over R * E counts (half its time at E=256 R=64); empty: summed.
  std::span<const std::int64_t> source_pairs;
  // With dedup: [R * R] rows source s sends rank d with every expert at home
  // (at s * R + d: s's tokens with an expert homed on d); empty: a pair is a
  // row.
  std::span<const std::int64_t> source_rows;

  bool enabled() const { return row_seconds > 0; }
};

struct ReplicaPlannerOptions {
  int num_ranks = 1;
  int num_redundant_slots_per_rank = 0;  // B
  // Target max/mean rank load: no replicas when the homes already meet it,
  // else the fill aims at the largest load that meets it (1.0: balance as far
  // as the slots allow). Any value from R up, infinity included, means never
  // rebalance: no rank carries more than the total, so max/mean <= R.
  double rebalance_threshold = 1.05;
};

// The standard home placement: expert e on rank e / (E / R). E % R == 0.
std::vector<int> contiguous_home_ranks(int num_experts, int num_ranks);

// `expert_counts` [E]: global (token, k) pairs per expert this step, >= 0.
// `home_rank_of_expert` [E]: any placement (hybrid re-homes experts).
// `previous_slot_experts` [R * B] or empty: the last plan's slot_experts, so
// experts that stay on a rank keep their slot (see ReplicaPlan).
// `costs`: off by default (balance whatever it costs).
ReplicaPlan plan_replicas(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
                          const ReplicaPlannerOptions& options, std::span<const int> previous_slot_experts = {},
                          const ReplicaCosts& costs = {});

}  // namespace epmoe::balance
