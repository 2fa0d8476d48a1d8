#include "balance/policy_replay.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>

#include "balance/eplb.h"
#include "balance/hybrid_balancer.h"
#include "balance/load_imbalance.h"
#include "balance/replica_planner.h"
#include "core/error.h"

namespace epmoe::balance {
namespace {

// Which ranks hold which experts' weights, step after step; counts the
// transfers a new placement needs.
class ResidencyTracker {
 public:
  ResidencyTracker(int num_experts, int num_ranks)
      : num_experts_(num_experts), held_(static_cast<std::size_t>(num_ranks) * num_experts, 0), next_(held_.size()) {
    const std::vector<int> homes = contiguous_home_ranks(num_experts, num_ranks);
    for (int e = 0; e < num_experts; ++e) held_[index(homes[e], e)] = 1;
  }

  void begin_step() { std::fill(next_.begin(), next_.end(), 0); }
  void hold(int rank, int expert) { next_[index(rank, expert)] = 1; }
  // Pairs held now and not before, appended to `moves` (when not null) in
  // ascending (rank, expert) order; the new residency becomes the old.
  int finish_step(std::vector<WeightMove>* moves) {
    int count = 0;
    for (std::size_t i = 0; i < held_.size(); ++i) {
      if (!next_[i] || held_[i]) continue;
      ++count;
      if (moves != nullptr) {
        moves->push_back({static_cast<int>(i / num_experts_), static_cast<int>(i % num_experts_)});
      }
    }
    held_.swap(next_);
    return count;
  }

 private:
  std::size_t index(int rank, int expert) const { return static_cast<std::size_t>(rank) * num_experts_ + expert; }

  int num_experts_;
  std::vector<char> held_, next_;  // [R * E]
};

bool replans_at(int step, const PolicyReplayOptions& options) { return step > 0 && step % options.period_steps == 0; }

std::vector<std::int64_t> window_loads(const ExpertLoadHistory& history, int step, const PolicyReplayOptions& options) {
  return history.window_sum(std::max(0, step - options.window_steps), step);
}

void set_balance(const LoadImbalance& loads, StepOutcome& outcome) {
  outcome.max_over_mean = loads.max_over_mean();
  outcome.ideal_max_over_mean = loads.ideal_max_over_mean();
  outcome.reached_ideal = loads.max_load <= loads.ideal_max_load();
}

// One step of a planner-based policy: the residency of `plan` (copies_of()
// lists the home and every occupied slot of the expert) and, with
// record_plans, its copies and moves.
StepOutcome plan_outcome(const ReplicaPlan& plan, ResidencyTracker& residency, bool record_plans) {
  StepOutcome outcome;
  residency.begin_step();
  for (int e = 0; e < plan.num_experts; ++e) {
    for (const ExpertCopy& copy : plan.copies_of(e)) {
      residency.hold(copy.rank, e);
      if (record_plans) outcome.copies.push_back({e, copy.rank, copy.token_quota});
    }
  }
  set_balance(plan.after, outcome);
  outcome.expert_moves = residency.finish_step(record_plans ? &outcome.moves : nullptr);
  outcome.active_replicas = plan.num_replicas();
  return outcome;
}

std::vector<StepOutcome> replay_fixed_homes(const ExpertLoadHistory& history, const PolicyReplayOptions& options,
                                            bool with_replicas) {
  const std::vector<int> homes = contiguous_home_ranks(history.num_experts, options.num_ranks);
  const ReplicaPlannerOptions planner_options{
      options.num_ranks, with_replicas ? options.num_redundant_slots_per_rank : 0, options.rebalance_threshold};
  ResidencyTracker residency(history.num_experts, options.num_ranks);
  std::vector<int> previous_slots(
      static_cast<std::size_t>(options.num_ranks) * planner_options.num_redundant_slots_per_rank, kEmptySlot);
  std::vector<StepOutcome> outcomes;
  for (int step = 0; step < history.num_steps; ++step) {
    const ReplicaPlan plan = plan_replicas(history.step(step), homes, planner_options, previous_slots);
    previous_slots = plan.slot_experts;
    outcomes.push_back(plan_outcome(plan, residency, options.record_plans));
  }
  return outcomes;
}

std::vector<StepOutcome> replay_hybrid(const ExpertLoadHistory& history, const PolicyReplayOptions& options) {
  HybridBalancer balancer(history.num_experts,
                          {options.num_ranks, options.num_redundant_slots_per_rank, options.rebalance_threshold});
  ResidencyTracker residency(history.num_experts, options.num_ranks);
  std::vector<StepOutcome> outcomes;
  for (int step = 0; step < history.num_steps; ++step) {
    if (replans_at(step, options)) balancer.rehome(window_loads(history, step, options));
    const ReplicaPlan plan = balancer.plan_step(history.step(step));
    outcomes.push_back(plan_outcome(plan, residency, options.record_plans));
  }
  return outcomes;
}

// An eplb step's copies: each expert's count split evenly over its copies,
// the quotas its rank loads assume.
void record_even_split(const ExpertPlacement& placement, std::span<const std::int64_t> counts,
                       std::vector<PlannedCopy>& out) {
  const std::vector<std::vector<ExpertCopy>> copies = placement.evenly_split_copies(counts);
  for (int e = 0; e < placement.num_experts; ++e) {
    for (const ExpertCopy& copy : copies[e]) out.push_back({e, copy.rank, copy.token_quota});
  }
}

std::vector<StepOutcome> replay_eplb(const ExpertLoadHistory& history, const PolicyReplayOptions& options) {
  const int num_experts = history.num_experts, num_ranks = options.num_ranks;
  const int slots_per_rank = num_experts / num_ranks + options.num_redundant_slots_per_rank;
  // Before the first window is complete: homes only, the redundant slots empty.
  ExpertPlacement placement{num_experts, num_ranks, slots_per_rank,
                            std::vector<int>(static_cast<std::size_t>(num_ranks) * slots_per_rank, kEmptySlot)};
  const std::vector<int> homes = contiguous_home_ranks(num_experts, num_ranks);
  std::vector<int> used_slots(num_ranks, 0);
  for (int e = 0; e < num_experts; ++e) placement.slot_experts[homes[e] * slots_per_rank + used_slots[homes[e]]++] = e;

  ResidencyTracker residency(num_experts, num_ranks);
  std::vector<StepOutcome> outcomes;
  for (int step = 0; step < history.num_steps; ++step) {
    if (replans_at(step, options)) {
      placement = eplb_global_placement(window_loads(history, step, options), num_ranks, slots_per_rank, &placement);
    }
    residency.begin_step();
    int copies = 0;
    for (std::size_t slot = 0; slot < placement.slot_experts.size(); ++slot) {
      if (placement.slot_experts[slot] == kEmptySlot) continue;
      residency.hold(static_cast<int>(slot) / slots_per_rank, placement.slot_experts[slot]);
      ++copies;
    }
    StepOutcome outcome;
    set_balance(measure_load_imbalance(placement.rank_loads(history.step(step))), outcome);
    outcome.expert_moves = residency.finish_step(options.record_plans ? &outcome.moves : nullptr);
    outcome.active_replicas = copies - num_experts;
    if (options.record_plans) record_even_split(placement, history.step(step), outcome.copies);
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

}  // namespace

std::string_view policy_name(BalancePolicy policy) {
  switch (policy) {
    case BalancePolicy::none:
      return "none";
    case BalancePolicy::eplb:
      return "eplb";
    case BalancePolicy::dynamic:
      return "dynamic";
    case BalancePolicy::hybrid:
      return "hybrid";
  }
  return "?";
}

void validate(const PolicyReplayOptions& options, int num_experts) {
  const auto fail = [](const std::string& message) { throw ConfigError(message); };
  if (options.num_ranks < 1) fail("ranks=" + std::to_string(options.num_ranks) + ": must be >= 1");
  if (num_experts % options.num_ranks != 0) {
    fail("ranks=" + std::to_string(options.num_ranks) + " does not divide the " + std::to_string(num_experts) +
         " experts of the loads (every rank is home to E/R experts)");
  }
  if (options.num_redundant_slots_per_rank < 0) fail("slots must be >= 0");
  if (!(options.rebalance_threshold >= 1.0)) fail("rebalance_threshold must be >= 1.0 (it bounds max/mean)");
  if (options.window_steps < 1) fail("window must be >= 1");
  if (options.period_steps < 1) fail("period must be >= 1");
}

double PolicyReplay::fraction_of_steps_at_ideal() const {
  int reached = 0;
  for (const StepOutcome& step : steps) reached += step.reached_ideal;
  return steps.empty() ? 1.0 : static_cast<double>(reached) / static_cast<double>(steps.size());
}

double PolicyReplay::mean_max_over_mean() const {
  double sum = 0;
  for (const StepOutcome& step : steps) sum += step.max_over_mean;
  return steps.empty() ? 1.0 : sum / static_cast<double>(steps.size());
}

double PolicyReplay::worst_max_over_mean() const {
  double worst = 1.0;
  for (const StepOutcome& step : steps) worst = std::max(worst, step.max_over_mean);
  return worst;
}

double PolicyReplay::mean_max_over_mean_from_first_period() const {
  if (static_cast<int>(steps.size()) <= period_steps) return mean_max_over_mean();
  double sum = 0;
  for (std::size_t s = period_steps; s < steps.size(); ++s) sum += steps[s].max_over_mean;
  return sum / static_cast<double>(steps.size() - period_steps);
}

double PolicyReplay::mean_expert_moves_per_step() const {
  double sum = 0;
  for (const StepOutcome& step : steps) sum += step.expert_moves;
  return steps.empty() ? 0.0 : sum / static_cast<double>(steps.size());
}

int PolicyReplay::max_expert_moves_in_a_step() const {
  int most = 0;
  for (const StepOutcome& step : steps) most = std::max(most, step.expert_moves);
  return most;
}

double PolicyReplay::mean_active_replicas() const {
  double sum = 0;
  for (const StepOutcome& step : steps) sum += step.active_replicas;
  return steps.empty() ? 0.0 : sum / static_cast<double>(steps.size());
}

PolicyReplay replay_policy(BalancePolicy policy, const ExpertLoadHistory& history, const PolicyReplayOptions& options) {
  validate(options, history.num_experts);
  PolicyReplay replay;
  replay.policy = policy;
  replay.period_steps = options.period_steps;
  switch (policy) {
    case BalancePolicy::none:
      replay.steps = replay_fixed_homes(history, options, false);
      break;
    case BalancePolicy::dynamic:
      replay.steps = replay_fixed_homes(history, options, true);
      break;
    case BalancePolicy::eplb:
      replay.steps = replay_eplb(history, options);
      break;
    case BalancePolicy::hybrid:
      replay.steps = replay_hybrid(history, options);
      break;
  }
  return replay;
}

}  // namespace epmoe::balance
