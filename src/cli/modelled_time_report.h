// The modelled-time report of a step (clock=modelled): per rank where its
// time went (compute, communication not hidden, idle waiting on a slower
// rank), the critical path's rank (the one that waited least: everyone else
// waited on it), and per kind of collective how much of it was hidden
// behind compute. For `epmoe layer`'s metrics.json and `epmoe train`'s
// metrics.jsonl.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/expert_parallel_run.h"
#include "cli/expert_parallel_settings.h"

namespace epmoe::cli {

struct ModelledStepReport {
  double step_seconds = 0;  // the slowest rank's forward + backward
  int critical_rank = 0;
  nlohmann::json json;      // the metrics' "modelled" object
};

// `ranks` in rank order.
ModelledStepReport modelled_step_report(const std::vector<ModelledRankTime>& ranks,
                                        const ExpertParallelSettings& settings);

// "modelled 1.23 ms/step on h100 (compute 0.80, communication 0.30, idle 0.13 ms on rank 0; critical rank 2)"
std::string modelled_summary_line(const ModelledStepReport& report);

}  // namespace epmoe::cli
