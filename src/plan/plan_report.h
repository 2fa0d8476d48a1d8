// PlanReport: everything `epmoe plan` prints for one configuration — the
// memory breakdown with its verdict, the bytes per collective of every
// dispatcher variant (ring, all-to-all, all-to-all with dedup), and the step
// time of the chosen one — as text for people and JSON for scripts.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/communication_model.h"
#include "plan/memory_model.h"
#include "plan/plan_config.h"
#include "plan/step_time.h"

namespace epmoe::plan {

struct DispatcherBytes {
  std::string label;  // "ring", "alltoall", "alltoall+dedup"
  DispatchKind kind = DispatchKind::alltoall;
  bool dedup = false;
  std::vector<CollectiveBytes> per_layer;  // per device, one MoE layer
  double per_step_bytes = 0;               // × MoE layers
  double token_bytes_per_step = 0;
  double seconds_per_step = 0;  // on the EP links (step_time.h)
};

struct PlanReport {
  PlanConfig config;
  ParameterCounts parameters;
  MemoryBreakdown memory;
  std::vector<DispatcherBytes> dispatchers;  // ring, alltoall, alltoall+dedup
  StepTime step;                             // with the configured dispatcher
  std::vector<std::string> assumptions;

  const DispatcherBytes& chosen() const;
};

PlanReport make_plan(const PlanConfig& config);

std::string format_report(const PlanReport& report);
nlohmann::json report_to_json(const PlanReport& report);

// One row of a sweep table (sweep=key:v1,v2,...).
struct SweepRow {
  std::string value;  // the swept key's value
  PlanReport report;
};
std::string format_sweep_table(const std::string& key, const std::vector<SweepRow>& rows);

}  // namespace epmoe::plan
