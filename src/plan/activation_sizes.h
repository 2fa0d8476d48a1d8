// Bytes of each named activation (plan_config.h activation_names()) one
// device keeps per layer, and the FLOPs that recompute it. Memory and step
// time both read these, so a saved byte and a recomputed FLOP come from the
// same shapes. Shapes per device: T tokens (tokens_per_device), heads and F
// divided by tp, routed rows = buffered_routed_rows() for sizes and
// expected_routed_rows() for FLOPs (a ragged grouped GEMM computes only the
// rows that exist).
#pragma once

#include <cstdint>
#include <string>

#include "core/x_sorted_size.h"
#include "plan/plan_config.h"

namespace epmoe::plan {

// The engine's x_sorted bundle for `rows` routed rows, its rows kept in
// `form`: the engine's own definition (core/x_sorted_size.h), so projection
// and ledger agree by construction.
double x_sorted_bytes(double rows, SavedRowForm form, std::int64_t hidden, std::int64_t experts_per_rank);
// The engine's expert activations for `rows` routed rows: mlpwi_0 and mlpwi_1
// [rows, F], mlpwo [rows, H], `element_bytes` each.
double routed_expert_activation_bytes(const std::string& name, double rows, std::int64_t hidden, std::int64_t ffn,
                                      double element_bytes);

struct ActivationFootprint {
  double bytes_per_device = 0;  // summed over the layers that have it
  double recompute_flops = 0;   // per device, per step, when it is recomputed
  std::int64_t num_layers = 0;  // layers that produce it
};

ActivationFootprint activation_footprint(const PlanConfig& config, const std::string& name);

// Forward FLOPs of causal attention scores and values for one layer, per device.
double attention_core_flops(const PlanConfig& config);

}  // namespace epmoe::plan
