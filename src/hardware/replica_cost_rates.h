// The rates balance=dynamic prices replicas at (EpConfig::replica_costs,
// docs/BALANCE.md "Cost model"), from the clock's settings:
//  * clock=modelled: the device's modelled FLOP rate (peak x efficiency;
//    compute_time=measured: the assumed CPU rate / compute_scale) and the
//    group's links (bandwidth, latency);
//  * clock=wall: the emulated links when on, else a shared-memory copy
//    between ranks; compute at an assumed rate per compute thread.
#pragma once

#include <epmoe/config.h>

#include "hardware/link_options.h"
#include "hardware/modelled_time_options.h"

namespace epmoe::hardware {

// oneDNN's f32 GEMMs on one core of the machines this runs on (AVX2 gemm:jit
// at 0.5-0.7 of the FMA peak, DESIGN.md section 7): an assumption, stated.
constexpr double kAssumedFlopsPerComputeThread = 50e9;
// A copy between two ranks' buffers in one process (DESIGN.md section 7
// measured 37-55 GB/s; ranks share the memory bus).
constexpr double kAssumedCopyBytesPerSecond = 20e9;

ReplicaCostRates replica_cost_rates(const ModelledTimeOptions& modelled, const EmulatedLinkOptions& links,
                                    int compute_threads_per_rank);

}  // namespace epmoe::hardware
