#include "hardware/replica_cost_rates.h"

#include <algorithm>

namespace epmoe::hardware {

ReplicaCostRates replica_cost_rates(const ModelledTimeOptions& modelled, const EmulatedLinkOptions& links,
                                    int compute_threads_per_rank) {
  ReplicaCostRates rates;
  const double cpu_flops = kAssumedFlopsPerComputeThread * std::max(1, compute_threads_per_rank);
  if (modelled.enabled) {
    rates.compute_flops_per_s = modelled.measured_compute ? cpu_flops / modelled.compute_scale
                                                          : modelled.peak_flops * modelled.compute_efficiency;
  } else {
    rates.compute_flops_per_s = cpu_flops;
  }
  // clock=modelled always runs the links; the wall clock only when emulated.
  const bool links_known = modelled.enabled || links.enabled;
  rates.link_bytes_per_s = links_known ? links.bandwidth_gb_per_s * 1e9 : kAssumedCopyBytesPerSecond;
  rates.link_latency_s = links_known ? links.latency_us * 1e-6 : 0;
  if (links_known && links.topology == LinkTopology::two_level) {
    // A replica may sit in another group: priced at the slower level.
    rates.link_bytes_per_s = std::min(rates.link_bytes_per_s, links.scale_out_bandwidth_gb_per_s * 1e9);
    rates.link_latency_s = std::max(rates.link_latency_s, links.scale_out_latency_us * 1e-6);
  }
  return rates;
}

}  // namespace epmoe::hardware
