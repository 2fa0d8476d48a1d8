// The "modelled" object of `epmoe layer`'s metrics.json and `epmoe train`'s
// metrics.jsonl lines: the step over all ranks (core/modelled_report.h) with
// the device and links it was modelled on, and its one-line summary.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/modelled_report.h"
#include "run/expert_parallel_settings.h"

namespace epmoe::run {

// step.json plus hardware, compute_time, compute_efficiency, compute_scale and links.
nlohmann::json modelled_metrics(const ModelledStep& step, const ExpertParallelSettings& settings);

// "modelled 1.234 ms/step on h100 (critical rank 2: compute 0.800, communication 0.300, idle 0.000 ms)"
std::string modelled_summary_line(const ModelledStep& step, const ExpertParallelSettings& settings);

}  // namespace epmoe::run
