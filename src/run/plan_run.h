// What `epmoe plan` computes, apart from printing it: the key registry, the
// plan (or one plan per value of sweep=) from key=value assignments, and the
// JSON that `epmoe plan --json` prints. One implementation for the command and
// the Python package's epmoe.plan().
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan_report.h"
#include "run/config_keys.h"

namespace epmoe::run {

const KeyRegistry& plan_key_registry();

// One report, or with sweep= one row per value (sweep_key names the key).
struct PlanRun {
  std::string sweep_key;  // empty: no sweep, rows holds the one report
  std::vector<plan::SweepRow> rows;
};

// ConfigError naming the key for a bad assignment (or a bad model/hardware file).
PlanRun run_plan(const std::vector<KeyAssignment>& assignments);

// `epmoe plan --json`: the report object, or with a sweep an array of
// {sweep_key: value, "plan": report}.
nlohmann::json plan_run_to_json(const PlanRun& run);

}  // namespace epmoe::run
