#include "run/modelled_time_report.h"

#include <cstdio>

namespace epmoe::run {

nlohmann::json modelled_metrics(const ModelledStep& step, const ExpertParallelSettings& settings) {
  const transport::threads::ModelledTimeOptions& m = settings.modelled;
  nlohmann::json json = step.json;
  json["hardware"] = settings.hardware;
  json["compute_time"] = m.measured_compute ? "measured" : "modelled";
  json["compute_efficiency"] = m.compute_efficiency;
  json["compute_scale"] = m.compute_scale;
  json["links"] = {{"topology", transport::threads::link_topology_name(settings.links.topology)},
                   {"bandwidth_gb_per_s", settings.links.bandwidth_gb_per_s},
                   {"latency_us", settings.links.latency_us}};
  return json;
}

std::string modelled_summary_line(const ModelledStep& step, const ExpertParallelSettings& settings) {
  const nlohmann::json& rank = step.json["per_rank"][static_cast<std::size_t>(step.critical_rank)];
  char line[256];
  std::snprintf(line, sizeof line,
                "modelled %.3f ms/step on %s (critical rank %d: compute %.3f, communication %.3f, idle %.3f ms)",
                step.step_seconds * 1e3, settings.hardware.c_str(), step.critical_rank,
                rank["compute_seconds"].get<double>() * 1e3, rank["communication_seconds"].get<double>() * 1e3,
                rank["idle_seconds"].get<double>() * 1e3);
  return line;
}

}  // namespace epmoe::run
