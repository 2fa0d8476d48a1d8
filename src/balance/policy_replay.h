// Offline replay of a balancing policy over recorded per-step expert loads
// (`epmoe balance --loads`): for every step, the max/mean rank load the policy
// achieves and the expert weights it moves.
//
// Policies, all with the same memory: R * (E/R + B) expert slots.
//   none:    homes only (expert e on rank e / (E/R)), B slots unused;
//   eplb:    EPLB's global policy (balance/eplb.h), every expert free to move,
//            placed from the sum of the last `window` steps at every step
//            that is a multiple of `period` (from step `period` on; before it,
//            homes only) and applied unchanged, with an even split over
//            copies, to the following steps;
//   dynamic: the per-step replica planner (balance/replica_planner.h) with
//            fixed homes, from each step's own counts;
//   hybrid:  homes re-packed on eplb's schedule + the per-step planner on top
//            (balance/hybrid_balancer.h).
//
// Weight moves: a (rank, expert) pair that holds the expert's weights in step
// s but did not in step s - 1 (before step 0: the homes) costs one transfer of
// that expert's weights. In inference that is the traffic. In training the
// weights change every optimizer step, so every active replica must be
// refreshed every step (counted separately as active replicas), and a re-home
// also moves the optimizer state.
//
// Plans (options.record_plans): each step also keeps what was decided, for
// `epmoe balance --json` — every copy (expert, rank, token quota) and every
// weight move (rank, expert). Off by default: a summary needs none of it.
// On, it costs (copies + moves) * 16 bytes per step: about 8 KB a step at
// E=256 R=64 B=2, 1.6 MB for a 200-step replay of one policy.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "balance/expert_load_history.h"

namespace epmoe::balance {

enum class BalancePolicy { none, eplb, dynamic, hybrid };

std::string_view policy_name(BalancePolicy policy);

struct PolicyReplayOptions {
  int num_ranks = 8;
  int num_redundant_slots_per_rank = 2;  // B
  double rebalance_threshold = 1.05;     // dynamic, hybrid
  int window_steps = 50;                 // eplb, hybrid: W
  int period_steps = 50;                 // eplb, hybrid: P
  bool record_plans = false;             // keep StepOutcome::copies and moves
};

// ConfigError naming the key (ranks, slots, window, ...) and the rule;
// `num_experts` comes from the loads.
void validate(const PolicyReplayOptions& options, int num_experts);

// One copy of an expert in a step's plan and the (token, k) pairs it computes.
struct PlannedCopy {
  int expert = 0;
  int rank = 0;
  std::int64_t quota = 0;
};

// A (rank, expert) pair that receives the expert's weights in this step.
struct WeightMove {
  int rank = 0;
  int expert = 0;
};

struct StepOutcome {
  double max_over_mean = 1.0;
  // The bound no policy can beat, ceil(total / R) / mean, and whether this
  // step's max load reached it.
  double ideal_max_over_mean = 1.0;
  bool reached_ideal = true;
  int expert_moves = 0;     // weight transfers into this step (see above)
  int active_replicas = 0;  // expert copies beyond one per expert
  // With record_plans only, else empty. `copies`: by expert, each expert's
  // copies as the policy lists them — none, dynamic, hybrid: the plan's
  // order, home first then replicas by ascending rank; eplb (no homes): by
  // ascending rank — with quotas summing to the step's count of the expert
  // (eplb: split_evenly over its copies, what its rank loads assume).
  // `moves`: by ascending (rank, expert), expert_moves of them.
  std::vector<PlannedCopy> copies;
  std::vector<WeightMove> moves;
};

struct PolicyReplay {
  BalancePolicy policy = BalancePolicy::none;
  int period_steps = 0;
  std::vector<StepOutcome> steps;

  double mean_max_over_mean() const;
  double worst_max_over_mean() const;
  // Mean over steps >= period_steps: eplb's steady state, once it has a
  // window to plan from (equal to the mean when there are no such steps).
  double mean_max_over_mean_from_first_period() const;
  double mean_expert_moves_per_step() const;
  int max_expert_moves_in_a_step() const;
  double mean_active_replicas() const;
  double fraction_of_steps_at_ideal() const;
};

PolicyReplay replay_policy(BalancePolicy policy, const ExpertLoadHistory& history, const PolicyReplayOptions& options);

}  // namespace epmoe::balance
