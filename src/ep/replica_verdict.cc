#include "ep/replica_verdict.h"

namespace epmoe::ep {

nlohmann::json replica_verdict_json(const ReplicaStats& stats) {
  return {{"predicted_saving_us", stats.predicted_saving_seconds * 1e6},
          {"predicted_cost_us", stats.predicted_cost_seconds * 1e6},
          {"refused_replicas", stats.refused_replicas},
          {"refused_saving_us", stats.refused_saving_seconds * 1e6},
          {"refused_cost_us", stats.refused_cost_seconds * 1e6},
          {"skipped_planning", stats.skipped_planning},
          {"priced_at",
           {{"compute_gflops", stats.priced_at.compute_flops_per_s * 1e-9},
            {"link_gb_per_s", stats.priced_at.link_bytes_per_s * 1e-9},
            {"link_latency_us", stats.priced_at.link_latency_s * 1e6}}}};
}

}  // namespace epmoe::ep
