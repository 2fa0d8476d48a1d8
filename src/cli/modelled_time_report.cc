#include "cli/modelled_time_report.h"

#include <cstdio>
#include <map>

namespace epmoe::cli {
namespace {

// "all_to_all_v tag 12" -> "all_to_all_v": collectives of one kind together.
std::string collective_kind(const std::string& name) {
  const std::size_t tag = name.find(" tag ");
  return tag == std::string::npos ? name : name.substr(0, tag);
}

}  // namespace

ModelledStepReport modelled_step_report(const std::vector<ModelledRankTime>& ranks,
                                        const ExpertParallelSettings& settings) {
  ModelledStepReport report;
  nlohmann::json per_rank = nlohmann::json::array();
  struct KindTotals {
    std::int64_t count = 0, bytes_sent = 0;
    double seconds = 0, exposed_seconds = 0;
  };
  std::map<std::string, KindTotals> kinds;
  double least_idle = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const ModelledRankTime& t = ranks[r];
    report.step_seconds = std::max(report.step_seconds, t.forward_seconds + t.backward_seconds);
    if (r == 0 || t.idle_seconds < least_idle) {
      least_idle = t.idle_seconds;
      report.critical_rank = static_cast<int>(r);
    }
    per_rank.push_back({{"rank", r},
                        {"forward_seconds", t.forward_seconds},
                        {"backward_seconds", t.backward_seconds},
                        {"compute_seconds", t.compute_seconds},
                        {"communication_seconds", t.communication_seconds},
                        {"idle_seconds", t.idle_seconds}});
    for (const CollectiveTiming& c : t.collectives) {
      KindTotals& k = kinds[collective_kind(c.name)];
      ++k.count;
      k.bytes_sent += c.bytes_sent;
      k.seconds += c.end_seconds - c.start_seconds;
      k.exposed_seconds += c.exposed_seconds;
    }
  }
  nlohmann::json collectives = nlohmann::json::object();
  for (const auto& [kind, k] : kinds) {
    collectives[kind] = {{"count", k.count},
                         {"seconds", k.seconds},
                         {"exposed_seconds", k.exposed_seconds},
                         {"hidden_fraction", k.seconds > 0 ? 1.0 - k.exposed_seconds / k.seconds : 1.0},
                         {"bytes_sent", k.bytes_sent}};
  }
  const transport::threads::ModelledTimeOptions& m = settings.modelled;
  report.json = {
      {"hardware", settings.hardware},
      {"compute_time", m.measured_compute ? "measured" : "modelled"},
      {"compute_efficiency", m.compute_efficiency},
      {"compute_scale", m.compute_scale},
      {"links",
       {{"topology", transport::threads::link_topology_name(settings.links.topology)},
        {"bandwidth_gb_per_s", settings.links.bandwidth_gb_per_s},
        {"latency_us", settings.links.latency_us}}},
      {"step_seconds", report.step_seconds},
      {"critical_path_rank", report.critical_rank},
      {"per_rank", per_rank},
      {"collectives", collectives},
  };
  return report;
}

std::string modelled_summary_line(const ModelledStepReport& report) {
  const nlohmann::json& rank = report.json["per_rank"][static_cast<std::size_t>(report.critical_rank)];
  char line[256];
  std::snprintf(line, sizeof line,
                "modelled %.3f ms/step on %s (critical rank %d: compute %.3f, communication %.3f, idle %.3f ms)",
                report.step_seconds * 1e3, report.json["hardware"].get<std::string>().c_str(), report.critical_rank,
                rank["compute_seconds"].get<double>() * 1e3, rank["communication_seconds"].get<double>() * 1e3,
                rank["idle_seconds"].get<double>() * 1e3);
  return line;
}

}  // namespace epmoe::cli
