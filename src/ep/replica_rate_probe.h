// replica_costs=measured (ReplicaCostRates::measure): the rates a group
// prices replicas at on the wall clock, measured by its own ranks instead of
// assumed (hardware/replica_cost_rates.h). Each rank times what a replica
// costs and saves on this machine:
//  * compute: one expert's forward product at 256 rows (H x F, the layer's
//    compute dtype) on the rank's compute threads, the median of 3 after a
//    warm-up: FLOP/s;
//  * a link: a message of one expert's weights (3 H F elements in the
//    format they travel in) to the next rank while receiving the previous
//    rank's, and the same with 8 bytes, the median of 3 each: latency is
//    the small message's time, bandwidth the large one's bytes over its
//    time less that latency.
// Every rank then all-gathers the three figures and prices at the slowest
// compute, the slowest link and the longest latency, so every rank holds
// the same rates and makes the same plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include <epmoe/config.h>

#include "transport/communicator.h"

namespace epmoe::ep {

// One rank's measurement.
struct ReplicaRateProbe {
  double compute_flops_per_s = 0;
  double link_bytes_per_s = 0;
  double link_latency_s = 0;
};

// The rates every rank prices at, from every rank's probe: the minimum
// compute and link rates, the maximum latency (a plan must hold on the
// slowest rank's port). `measure` stays set.
ReplicaCostRates agreed_replica_rates(std::span<const ReplicaRateProbe> probes);

struct ReplicaProbeShape {
  std::int64_t hidden = 0, ffn = 0;  // H, F
  ComputeDType compute_dtype = ComputeDType::f32;
  int weight_element_bytes = 4;  // a replica's weights on the wire (2: bf16)
};

// Collective (every rank, with the same `tag_base`: a step's block,
// EpOp::replica_rate_probe): measures this rank's probe, all-gathers every
// rank's and returns agreed_replica_rates. `bytes_sent` gets what this rank
// sent. One rank: no link to measure; the rates are returned unpriced
// (replicas need another rank).
ReplicaCostRates measure_replica_rates(transport::Communicator& comm, const ReplicaProbeShape& shape,
                                       std::uint32_t tag_base, std::chrono::milliseconds timeout,
                                       std::int64_t& bytes_sent);

}  // namespace epmoe::ep
