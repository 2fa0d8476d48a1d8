#include "cli/layer_key_groups.h"

#include <limits>
#include <string>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/compute_dtype.h"
#include "moe/router.h"

namespace epmoe::cli {

KeyGroup moe_layer_keys() {
  return {
      "MoE layer",
      {
          {.name = "top_k", .type = KeyType::integer, .default_value = "2",
           .help = "experts per token (K); at most num_experts", .min_value = 1},
          {.name = "router", .type = KeyType::choice, .default_value = to_string(RouterKind::softmax_topk),
           .help = "softmax over the top-K logits (Mixtral/Qwen), DeepSeek-V3 grouped sigmoid, or seeded random ids",
           .choices = {to_string(RouterKind::softmax_topk), to_string(RouterKind::sigmoid_grouped),
                       to_string(RouterKind::random)}},
          {.name = "norm_topk_prob", .type = KeyType::boolean, .default_value = "true",
           .help = "normalise the K routing weights to sum to 1"},
          {.name = "n_groups", .type = KeyType::integer, .default_value = "1",
           .help = "sigmoid_grouped: expert groups; must divide num_experts", .min_value = 1},
          {.name = "topk_groups", .type = KeyType::integer, .default_value = "1",
           .help = "sigmoid_grouped: groups kept per token; at most n_groups", .min_value = 1},
          {.name = "routed_scaling_factor", .type = KeyType::real, .default_value = "1.0",
           .help = "sigmoid_grouped: multiplies the routing weights", .min_value = 0, .min_exclusive = true},
          {.name = "compute_dtype", .type = KeyType::choice, .default_value = to_string(ComputeDType::f32),
           .help = "GEMM operand type; accumulation is always fp32",
           .choices = {to_string(ComputeDType::f32), to_string(ComputeDType::bf16)}},
          {.name = "seed", .type = KeyType::integer, .default_value = "0",
           .help = "random router: seed of its generator", .min_value = 0},
      },
  };
}

KeyGroup runtime_keys() {
  return {
      "runtime",
      {
          {.name = "threads", .type = KeyType::integer, .default_value = std::to_string(hardware_cores()),
           .help = "compute threads (default: every core of this machine)", .min_value = 1},
      },
  };
}

MoeLayerConfig moe_layer_config_from(const ConfigValues& values, std::int64_t hidden,
                                     std::int64_t ffn, std::int64_t num_experts) {
  if (num_experts > std::numeric_limits<int>::max()) {
    throw ConfigError("num_experts=" + std::to_string(num_experts) + ": must be <= " +
                      std::to_string(std::numeric_limits<int>::max()));
  }
  MoeLayerConfig config;
  config.hidden = hidden;
  config.ffn = ffn;
  config.compute_dtype = parse_compute_dtype("compute_dtype", values.get_string("compute_dtype"));
  RouterConfig& router = config.router;
  router.kind = parse_router_kind("router", values.get_string("router"));
  router.num_experts = static_cast<int>(num_experts);
  router.top_k = values.get_int32("top_k");
  router.norm_topk_prob = values.get_bool("norm_topk_prob");
  router.n_groups = values.get_int32("n_groups");
  router.topk_groups = values.get_int32("topk_groups");
  router.routed_scaling_factor = static_cast<float>(values.get_float("routed_scaling_factor"));
  router.seed = static_cast<std::uint64_t>(values.get_int("seed"));  // >= 0 by its declaration
  config.validate();  // validates the router config too
  return config;
}

void apply_runtime_keys(const ConfigValues& values) {
  set_compute_threads(values.get_int32("threads"));
}

}  // namespace epmoe::cli
