// epmoe plan: projects one MoE training step of a large model on a cluster —
// memory per device with a FITS / EXCEEDS verdict, bytes per collective of
// every dispatcher, a step-time estimate — from formulas only (plan/, no
// tensors). sweep=key:v1,v2,... prints one table row per value.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "plan/plan_report.h"
#include "run/config_keys.h"
#include "run/plan_run.h"
#include "run/yaml_overrides.h"

namespace epmoe::cli {

using run::command_assignments;
using run::non_empty_config_path;
using run::plan_key_registry;
using run::plan_run_to_json;
using run::PlanRun;
using run::run_plan;
namespace {

constexpr char kPlanCommand[] = "plan";

struct PlanArguments {
  std::string config_file;
  bool json = false;
  std::vector<std::string> assignments;
};

void run_plan_command(const PlanArguments& arguments) {
  const PlanRun run = run_plan(command_assignments(arguments.config_file, arguments.assignments, kPlanCommand));
  if (arguments.json) {
    std::cout << plan_run_to_json(run).dump(2) << "\n";
  } else if (run.sweep_key.empty()) {
    std::cout << plan::format_report(run.rows.front().report);
  } else {
    std::cout << plan::format_sweep_table(run.sweep_key, run.rows);
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto arguments = std::make_shared<PlanArguments>();
  CLI::App* command = app.add_subcommand(
      kPlanCommand,
      "Project memory per device (FITS / EXCEEDS), bytes per collective and step time of MoE training "
      "for a model on a cluster (formulas; nothing runs)");
  command->add_option("--config", arguments->config_file, "YAML file of keys; key=value arguments override it")
      ->check(non_empty_config_path);
  command->add_flag("--json", arguments->json, "print JSON instead of text");
  command->add_option("assignments", arguments->assignments, "key=value settings (see Keys below)");
  command->footer(plan_key_registry().help_text());
  command->callback([arguments] { run_plan_command(*arguments); });
}

}  // namespace epmoe::cli
