// Key groups shared by the commands that run MoE layers (`epmoe layer`, and
// later `train` and `bench`), and their translation into the library's config
// structs. The translation is the only place that knows both the key names
// and the structs; validation of cross-key rules (top_k <= E, n_groups
// divides E, ...) stays in the structs' validate().
#pragma once

#include <cstdint>

#include "cli/config_keys.h"
#include "moe/moe_layer.h"

namespace epmoe::cli {

// top_k, router, norm_topk_prob, n_groups, topk_groups, routed_scaling_factor,
// compute_dtype, seed.
KeyGroup moe_layer_keys();
// threads.
KeyGroup runtime_keys();

// The layer config for the given dimensions (from the input files) and the
// keys of moe_layer_keys(); validated, so it throws ConfigError naming the key
// and the rule.
MoeLayerConfig moe_layer_config_from(const ConfigValues& values, std::int64_t hidden,
                                     std::int64_t ffn, std::int64_t num_experts);

// Applies runtime_keys() to the calling thread (its compute thread budget).
void apply_runtime_keys(const ConfigValues& values);

}  // namespace epmoe::cli
