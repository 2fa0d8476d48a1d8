// What `epmoe balance --loads` computes per loads history, apart from reading
// and printing: its keys, the replay options they set, and each policy's JSON
// row (the summary and, with plans, every step's plan). One implementation
// for the command and the Python package's epmoe.replay_balance().
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "balance/expert_load_history.h"
#include "balance/policy_replay.h"
#include "run/config_keys.h"

namespace epmoe::run {

const KeyRegistry& replay_key_registry();

struct ReplaySettings {
  balance::PolicyReplayOptions options;
  double expert_weight_bytes = 0;  // 3*H*F*4: fp32 wi0, wi1, wo of one expert
  std::vector<balance::BalancePolicy> policies;
};

// From the parsed keys; the plans are recorded only when `json` (they are
// printed nowhere else) and plans=true.
ReplaySettings replay_settings(const ConfigValues& values, bool json);

// The policies' rows, as `epmoe balance --json` prints them under
// "policies"; `train_steps` (may be null) labels a metrics file's steps.
nlohmann::json replay_policies_json(const balance::ExpertLoadHistory& history, const ReplaySettings& settings,
                                    const std::vector<std::int64_t>* train_steps);

}  // namespace epmoe::run
