#include "run/balance_replay.h"

#include <string>

namespace epmoe::run {
namespace {

KeyGroup replay_keys() {
  return {
      "with --loads: replay balancing policies",
      {
          {.name = "ranks",
           .type = KeyType::integer,
           .default_value = "8",
           .help = "expert-parallel ranks (R); must divide E",
           .min_value = 1},
          {.name = "slots",
           .type = KeyType::integer,
           .default_value = "2",
           .help = "redundant expert slots per rank (B)",
           .min_value = 0},
          {.name = "policy",
           .type = KeyType::choice,
           .default_value = "all",
           .help = "policy to replay; all = every policy",
           .choices = {"none", "eplb", "dynamic", "hybrid", "all"}},
          {.name = "window",
           .type = KeyType::integer,
           .default_value = "50",
           .help = "eplb, hybrid: steps of past loads a placement is made from (W)",
           .min_value = 1},
          {.name = "period",
           .type = KeyType::integer,
           .default_value = "50",
           .help = "eplb, hybrid: steps between placements (P)",
           .min_value = 1},
          {.name = "rebalance_threshold",
           .type = KeyType::real,
           .default_value = "1.05",
           .help = "dynamic, hybrid: stop adding replicas at this max/mean rank load",
           .min_value = 1},
          {.name = "hidden",
           .type = KeyType::integer,
           .default_value = "7168",
           .help = "hidden size H, for weight bytes (default: DeepSeek-V3)",
           .min_value = 1},
          {.name = "ffn",
           .type = KeyType::integer,
           .default_value = "2048",
           .help = "expert FFN size F; an expert move is 3*H*F*4 bytes",
           .min_value = 1},
          {.name = "layer",
           .type = KeyType::text,
           .default_value = "all",
           .help = "a metrics.jsonl's MoE layer to replay (0-based); all = every layer, each on its own"},
          {.name = "plans",
           .type = KeyType::boolean,
           .default_value = "true",
           .help = "with --json: every step's copies and weight moves per policy (false: the summary only)"},
      },
  };
}

std::vector<balance::BalancePolicy> policies_to_replay(const std::string& policy) {
  using balance::BalancePolicy;
  if (policy == "none") return {BalancePolicy::none};
  if (policy == "eplb") return {BalancePolicy::eplb};
  if (policy == "dynamic") return {BalancePolicy::dynamic};
  if (policy == "hybrid") return {BalancePolicy::hybrid};
  return {BalancePolicy::none, BalancePolicy::eplb, BalancePolicy::dynamic, BalancePolicy::hybrid};
}

nlohmann::json step_to_json(const balance::StepOutcome& step, int s, const std::vector<std::int64_t>* train_steps) {
  nlohmann::json copies = nlohmann::json::array(), moves = nlohmann::json::array();
  for (const balance::PlannedCopy& copy : step.copies) copies.push_back({copy.expert, copy.rank, copy.quota});
  for (const balance::WeightMove& move : step.moves) moves.push_back({move.rank, move.expert});
  nlohmann::json out = {{"step", s}};
  if (train_steps != nullptr) out["train_step"] = (*train_steps)[static_cast<std::size_t>(s)];
  out["max_over_mean"] = step.max_over_mean;
  out["ideal_max_over_mean"] = step.ideal_max_over_mean;
  out["reached_ideal"] = step.reached_ideal;
  out["expert_moves"] = step.expert_moves;
  out["active_replicas"] = step.active_replicas;
  out["copies"] = std::move(copies);
  out["moves"] = std::move(moves);
  return out;
}

}  // namespace

const KeyRegistry& replay_key_registry() {
  static const KeyRegistry registry("balance --loads", {replay_keys()});
  return registry;
}

ReplaySettings replay_settings(const ConfigValues& values, bool json) {
  ReplaySettings settings;
  balance::PolicyReplayOptions& options = settings.options;
  options.num_ranks = values.get_int32("ranks");
  options.num_redundant_slots_per_rank = values.get_int32("slots");
  options.rebalance_threshold = values.get_float("rebalance_threshold");
  options.window_steps = values.get_int32("window");
  options.period_steps = values.get_int32("period");
  // The plans are kept only where they are printed.
  options.record_plans = json && values.get_bool("plans");
  // fp32 wi0 [H, F], wi1 [H, F] and wo [F, H] of one expert.
  settings.expert_weight_bytes =
      3.0 * static_cast<double>(values.get_int("hidden")) * static_cast<double>(values.get_int("ffn")) * 4.0;
  settings.policies = policies_to_replay(values.get_string("policy"));
  return settings;
}

nlohmann::json replay_policies_json(const balance::ExpertLoadHistory& history, const ReplaySettings& settings,
                                    const std::vector<std::int64_t>* train_steps) {
  const balance::PolicyReplayOptions& options = settings.options;
  const double expert_weight_bytes = settings.expert_weight_bytes;
  nlohmann::json policies = nlohmann::json::array();
  for (const balance::BalancePolicy policy : settings.policies) {
    const balance::PolicyReplay replay = balance::replay_policy(policy, history, options);
    nlohmann::json row = {
        {"policy", std::string(balance::policy_name(policy))},
        {"mean_max_over_mean", replay.mean_max_over_mean()},
        {"worst_max_over_mean", replay.worst_max_over_mean()},
        {"mean_max_over_mean_from_first_period", replay.mean_max_over_mean_from_first_period()},
        {"mean_expert_moves_per_step", replay.mean_expert_moves_per_step()},
        {"max_expert_moves_in_a_step", replay.max_expert_moves_in_a_step()},
        {"mean_weight_bytes_moved_per_step", replay.mean_expert_moves_per_step() * expert_weight_bytes},
        {"mean_active_replicas", replay.mean_active_replicas()},
        {"fraction_of_steps_at_ideal", replay.fraction_of_steps_at_ideal()}};
    if (options.record_plans) {
      nlohmann::json steps = nlohmann::json::array();
      for (std::size_t s = 0; s < replay.steps.size(); ++s) {
        steps.push_back(step_to_json(replay.steps[s], static_cast<int>(s), train_steps));
      }
      row["steps"] = std::move(steps);
    }
    policies.push_back(std::move(row));
  }
  return policies;
}

}  // namespace epmoe::run
