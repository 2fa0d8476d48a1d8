#include "plan/step_time.h"

#include <algorithm>
#include <cstdio>

#include "plan/activation_sizes.h"
#include "plan/memory_model.h"

namespace epmoe::plan {

double mean_ring_hops(std::int64_t num_ranks) {
  if (num_ranks <= 1) return 0;
  double hops = 0;
  for (std::int64_t d = 1; d < num_ranks; ++d) hops += double(std::min(d, num_ranks - d));
  return hops / double(num_ranks - 1);
}

double ep_transfer_seconds(const PlanConfig& c, DispatchKind dispatch, double bytes) {
  const hardware::HardwareSpec& hw = c.hardware;
  const std::int64_t r = c.parallel.ep;
  if (r <= 1 || bytes == 0) return 0;
  if (r > hw.scale_up_devices) return bytes / hw.scale_out_bytes_per_s;
  if (hw.interconnect == hardware::Interconnect::switched) return bytes / hw.link_bytes_per_s;
  const double ring_bandwidth = 2 * hw.link_bytes_per_s;  // one link each way along the axis
  const double hops = dispatch == DispatchKind::ring ? 1.0 : mean_ring_hops(r);
  return bytes * hops / ring_bandwidth;
}

namespace {

double fsdp_link_bandwidth(const PlanConfig& c) {
  const hardware::HardwareSpec& hw = c.hardware;
  if (c.parallel.fsdp * c.parallel.ep * c.parallel.tp > hw.scale_up_devices) return hw.scale_out_bytes_per_s;
  if (hw.interconnect == hardware::Interconnect::switched) return hw.link_bytes_per_s;
  const std::int64_t ep_links = c.parallel.ep > 1 ? 2 : 0;
  return double(std::max<std::int64_t>(1, hw.links_per_device - ep_links)) * hw.link_bytes_per_s;
}

}  // namespace

double moe_data_movement_bytes(const PlanConfig& c) {
  const double tokens = c.parallel.tokens_per_device();  // as expected_routed_rows()
  const double k = double(c.model.top_k), h = double(c.model.hidden),
               f = double(c.model.moe_ffn) / double(c.parallel.tp);
  const double a = c.activation_bytes(), w = c.token_row_bytes(), rows = tokens * k;
  const bool fp8 = c.token_transfer != TokenTransfer::activation_dtype;
  const bool alltoall = c.dispatch == DispatchKind::alltoall;
  const double encode = (alltoall ? rows : tokens) * (a * h + w);
  const double gather = 2 * rows * w + (fp8 ? rows * (w + a * h) : 0.0);
  double bytes = encode + gather;
  if (c.choice("x_sorted") == RematChoice::remat) bytes += encode + gather;  // the backward re-runs the dispatch
  bytes += (3 + 3 + 5) * a * rows * f;                                       // SwiGLU, its recompute, its backward
  bytes += (2 + 3 + 2) * a * rows * h;  // combine weighted sum, its backward, slot dx sum
  bytes += alltoall ? 2 * (3 * a * rows * h + a * tokens * h) + 2 * a * rows * h : 2 * 2 * a * tokens * h;
  bytes += ring_wire_conversion_bytes(c);
  return bytes * double(c.model.num_moe_layers());
}

double ring_wire_conversion_bytes(const PlanConfig& c) {
  if (c.dispatch != DispatchKind::ring || c.activation_bytes() == 4) return 0;
  const double a = c.activation_bytes(), h = double(c.model.hidden), others = double(c.parallel.ep - 1);
  // Two reduce-scatters (combine, dx); per one, each way R-1 blocks of N_l·H values.
  return 2 * 2 * (4 + a) * others * c.parallel.tokens_per_device() * h;
}

StepTime estimate_step_time(const PlanConfig& c, double ep_bytes_per_device) {
  StepTime s;
  const ModelSpec& m = c.model;
  const ParallelismSpec& p = c.parallel;
  const ParameterCounts counts = count_parameters(m);
  const double t = p.tokens_per_device(), tp = double(p.tp);
  s.model_flops = 6 * counts.active_matmul(m) * t / tp + 3 * attention_core_flops(c) * double(m.num_layers);
  for (const std::string& name : activation_names())
    if (c.choice(name) == RematChoice::remat) s.recompute_flops += activation_footprint(c, name).recompute_flops;
  const double peak = c.matmul_type == MatmulType::fp8 ? c.hardware.peak_fp8_flops : c.hardware.peak_bf16_flops;
  s.flop_seconds = (s.model_flops + s.recompute_flops) / (peak * c.compute_efficiency);
  s.data_movement_bytes = moe_data_movement_bytes(c);
  s.data_movement_seconds = s.data_movement_bytes / c.hardware.memory_bytes_per_s;
  s.compute_seconds = s.flop_seconds + s.data_movement_seconds;

  s.ep_bytes = ep_bytes_per_device;
  s.ep_seconds = ep_transfer_seconds(c, c.dispatch, ep_bytes_per_device);

  // FSDP: per device, receive (g-1)/g of each gathered weight (g = group size).
  const double fsdp = double(p.fsdp), ep = double(p.ep);
  const double expert_gathered = counts.routed_experts_total(m) / (ep * tp);
  const double other_gathered = counts.non_expert_total(m) / tp;
  const double received = (fsdp - 1) / fsdp * expert_gathered + (fsdp * ep - 1) / (fsdp * ep) * other_gathered;
  s.fsdp_bytes = received * (2 + 2 + 4);  // bf16 all-gather forward and backward, f32 reduce-scatter
  s.fsdp_seconds = s.fsdp_bytes / fsdp_link_bandwidth(c);

  if (p.dp > 1) {
    const ShardedParameters shard = sharded_parameters(c);
    s.dp_bytes = 2.0 * double(p.dp - 1) / double(p.dp) * (shard.routed_experts + shard.other) * 4;
    s.dp_seconds = s.dp_bytes / c.hardware.scale_out_bytes_per_s;
  }
  const double communication = s.ep_seconds + s.fsdp_seconds + s.dp_seconds;
  s.serial_seconds = s.compute_seconds + communication;
  s.overlapped_seconds = std::max(s.compute_seconds, communication);
  s.tokens_per_second_per_device = t / tp / s.overlapped_seconds;
  return s;
}

std::vector<std::string> step_time_assumptions(const PlanConfig& c) {
  char text[256];
  std::vector<std::string> out;
  std::snprintf(text, sizeof text, "compute at %.0f%% of the %s peak (%.0f TFLOP/s); uniform routing, no imbalance",
                c.compute_efficiency * 100, c.matmul_type == MatmulType::fp8 ? "fp8" : "bf16",
                (c.matmul_type == MatmulType::fp8 ? c.hardware.peak_fp8_flops : c.hardware.peak_bf16_flops) / 1e12);
  out.push_back(text);
  std::snprintf(text, sizeof text,
                "plus the MoE layers' data movement (row packing and gathers, SwiGLU, the combine's sums) at %.0f GB/s "
                "HBM",
                c.hardware.memory_bytes_per_s / 1e9);
  out.push_back(text);
  const hardware::HardwareSpec& hw = c.hardware;
  if (c.parallel.ep > hw.scale_up_devices) {
    std::snprintf(text, sizeof text,
                  "EP group of %lld exceeds the %lld-device scale-up domain: %.1f GB/s scale-out per device",
                  (long long)c.parallel.ep, (long long)hw.scale_up_devices, hw.scale_out_bytes_per_s / 1e9);
  } else if (hw.interconnect == hardware::Interconnect::torus) {
    std::snprintf(
        text, sizeof text,
        "EP group = one torus ring of %lld chips, %.0f GB/s per link each way; all-to-all bytes x %.2f mean hops",
        (long long)c.parallel.ep, hw.link_bytes_per_s / 1e9, mean_ring_hops(c.parallel.ep));
  } else {
    std::snprintf(text, sizeof text, "EP group inside one NVLink domain: %.0f GB/s per GPU each way",
                  hw.link_bytes_per_s / 1e9);
  }
  out.push_back(text);
  out.push_back(
      "FSDP: bf16 weight all-gather in forward and again in backward, f32 gradient reduce-scatter, on the links EP "
      "leaves free");
  out.push_back("bounds: serial = compute + all communication; overlapped = max(compute, communication)");
  out.push_back(
      "not modelled: host offload transfers, optimizer update time, pipeline bubbles, kernel launch / latency");
  return out;
}

}  // namespace epmoe::plan
