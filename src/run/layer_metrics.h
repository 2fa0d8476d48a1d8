// metrics.json of `epmoe layer`: the config echo, dimensions and shapes, the
// layer's timings and expert GEMM rate, and, under expert_parallel, what each
// rank received, sent, dropped and spent per phase, with totals over ranks.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run/config_keys.h"
#include "run/expert_parallel_settings.h"
#include "run/layer_inputs.h"
#include "run/rank_report.h"

namespace epmoe::run {

nlohmann::json layer_metrics(const ConfigValues& values, const LayerInputs& inputs, const MoeLayerConfig& config,
                             const ExpertParallelSettings& settings, const std::vector<RankReport>& ranks,
                             const std::vector<std::string>& output_files);

}  // namespace epmoe::run
