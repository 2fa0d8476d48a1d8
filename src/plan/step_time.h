// A step-time estimate from FLOPs and link bandwidths — a bound to reason
// with, not a measurement. Assumptions (printed with every plan):
//  * compute = (6 · active matmul parameters · T + 3 · causal attention core
//    + the forward FLOPs of every recomputed name) / (peak · efficiency)
//    + the MoE layers' data movement at the HBM rate (moe_data_movement_bytes:
//    the bytes the engine's modelled clock charges, docs/MODELLED_TIME.md);
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
  double model_flops = 0;            // per device
  double recompute_flops = 0;        // per device
  double flop_seconds = 0;           // the FLOPs at peak · efficiency
  double data_movement_bytes = 0;    // per device, all MoE layers (moe_data_movement_bytes)
  double data_movement_seconds = 0;  // at the HBM rate
  double compute_seconds = 0;        // flop_seconds + data_movement_seconds
  double ep_bytes = 0;               // per device, all MoE layers
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

// Bytes one device's MoE layers read and write per step moving rows (not
// multiplying them): each memory-bound step the engine charges at the HBM
// rate (docs/MODELLED_TIME.md), with uniform routing - per layer, with
// N_l tokens, K, rows = N_l·K routed rows, H, F, a = activation bytes, w =
// a token row on the wire:
//  token packing (encode): all-to-all N_l·K·(aH + w), ring N_l·(aH + w);
//  the expert-order row gather 2·rows·w (again in the backward when
//  x_sorted is recomputed), fp8 decode rows·(w + aH);
//  SwiGLU 3a·rows·F forward and again in the backward (recomputed), its
//  backward 5a·rows·F;
//  the combine's weighted sum 2a·rows·H, its backward 3a·rows·H, the slot
//  dx sum 2a·rows·H;
//  the home side: all-to-all sums the K returned rows per token, forward
//  and dx, 2·(3a·N_l·K·H + a·N_l·H), and packs the cotangents 2a·N_l·K·H;
//  ring copies its reduced rows, y and dx, 2·2a·N_l·H, and with a bf16
//  wire its reduce-scatters convert partial sums (ring_wire_conversion_bytes).
double moe_data_movement_bytes(const PlanConfig& config);

// Per MoE layer and device: with a bf16 wire (a = 2) the ring's two
// reduce-scatters (combine, dx) each convert every partial sum they receive
// to f32 and every one they send to bf16, R-1 blocks of N_l·H values each
// way at (4 + a) bytes a value: 2·2·(4 + a)·(R-1)·N_l·H; 0 otherwise. The
// modelled clock charges them on the reduce-scatter's own clock (they delay
// its steps, beside the rank's compute); the plan, which overlaps nothing
// but in its second bound, counts them with the data movement.
double ring_wire_conversion_bytes(const PlanConfig& config);

StepTime estimate_step_time(const PlanConfig& config, double ep_bytes_per_device);

std::vector<std::string> step_time_assumptions(const PlanConfig& config);

}  // namespace epmoe::plan
