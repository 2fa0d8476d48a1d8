// A step-time estimate from FLOPs and link bandwidths — a bound to reason
// with, not a measurement. Assumptions (printed with every plan):
//  * compute = (6 · active matmul parameters · T + 3 · causal attention core
//    + the forward FLOPs of every recomputed name) / (peak · efficiency);
//    uniform routing, no load imbalance.
//  * EP collectives (communication_model.h) run on the EP group's links: on
//    a torus the group is one ring along a torus axis (2 links per chip, one
//    each way): ring collectives use both; all-to-all messages also cross
//    min(d, R-d) hops, the mean of which multiplies their bytes. On NVLink
//    (switched) every byte leaves at the GPU's NVLink rate. Beyond the
//    scale-up domain, the scale-out (DCN / InfiniBand) rate applies.
//  * FSDP: weights all-gathered in bf16 forward and again in backward (the
//    layer is recomputed), gradients reduce-scattered in f32; on a torus over
//    the links EP does not use. dp: a gradient all-reduce over scale-out.
//  * Two bounds: nothing overlaps (serial) and everything overlaps compute
//    (the max).
#pragma once

#include <string>
#include <vector>

#include "plan/plan_config.h"

namespace epmoe::plan {

struct StepTime {
  double model_flops = 0;      // per device
  double recompute_flops = 0;  // per device
  double compute_seconds = 0;
  double ep_bytes = 0;  // per device, all MoE layers
  double ep_seconds = 0;
  double fsdp_bytes = 0;
  double fsdp_seconds = 0;
  double dp_bytes = 0;
  double dp_seconds = 0;
  double serial_seconds = 0;
  double overlapped_seconds = 0;
  double tokens_per_second_per_device = 0;  // at the overlapped bound
};

// Mean hops of a message to each of the other R-1 ranks of a bidirectional
// ring: sum_{d=1}^{R-1} min(d, R-d) / (R-1).
double mean_ring_hops(std::int64_t num_ranks);

// Seconds for `bytes` sent per device by the EP dispatcher over the links
// that carry it (see above).
double ep_transfer_seconds(const PlanConfig& config, DispatchKind dispatch, double bytes);

StepTime estimate_step_time(const PlanConfig& config, double ep_bytes_per_device);

std::vector<std::string> step_time_assumptions(const PlanConfig& config);

}  // namespace epmoe::plan
