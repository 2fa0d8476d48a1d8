#include "plan/memory_model.h"

#include <algorithm>
#include <cstdio>

#include "plan/activation_sizes.h"

namespace epmoe::plan {
namespace {

constexpr double kMasterWeightBytes = 4;    // f32 parameters
constexpr double kGradientBytes = 4;        // f32, the parameters' dtype
constexpr double kAdamMomentBytes = 4;      // m and v each, f32 (MaxText mu_dtype defaults to the weights')
constexpr double kGatheredWeightBytes = 2;  // bf16 copy of a layer's weights after the FSDP all-gather
constexpr double kLogitBytes = 4;           // f32 logits for the cross-entropy

std::string rows_note(const PlanConfig& c) {
  char text[160];
  std::snprintf(text, sizeof text, "%.0f rows/layer (%s), ", c.buffered_routed_rows(),
                c.token_buffer_factor == 0 ? "no-drop worst case R*N_l*K" : "token_buffer_factor*N_l*K");
  return text;
}

}  // namespace

double MemoryBreakdown::category_bytes(const std::string& category) const {
  double sum = 0;
  for (const MemoryItem& item : device)
    if (item.category == category) sum += item.bytes;
  return sum;
}

double MemoryBreakdown::item_bytes(const std::string& name) const {
  for (const MemoryItem& item : device)
    if (item.name == name) return item.bytes;
  return 0;
}

ShardedParameters sharded_parameters(const PlanConfig& c) {
  const ParameterCounts counts = count_parameters(c.model);
  const double shards = double(c.parallel.fsdp * c.parallel.ep * c.parallel.tp);
  return {counts.routed_experts_total(c.model) / shards, counts.non_expert_total(c.model) / shards};
}

MemoryBreakdown project_memory(const PlanConfig& c) {
  MemoryBreakdown out;
  const ModelSpec& m = c.model;
  const ParallelismSpec& p = c.parallel;
  const ShardedParameters params = sharded_parameters(c);
  const double all_params = params.routed_experts + params.other;
  const std::string shard_note = "/ (fsdp*ep*tp)";
  out.device.push_back({"parameters", "routed experts (f32)", params.routed_experts * kMasterWeightBytes, shard_note});
  out.device.push_back({"parameters", "other weights (f32)", params.other * kMasterWeightBytes, shard_note});
  out.device.push_back({"gradients", "gradients (f32)", all_params * kGradientBytes, shard_note});
  out.device.push_back({"optimizer state", "AdamW m + v (f32)", all_params * 2 * kAdamMomentBytes, shard_note});

  for (const std::string& name : activation_names()) {
    const RematChoice choice = c.choice(name);
    if (choice == RematChoice::remat) continue;
    const ActivationFootprint f = activation_footprint(c, name);
    std::string note = std::to_string(f.num_layers) + " layers";
    if (name == "x_sorted") note = rows_note(c) + note;
    MemoryItem item{"saved activations", name, f.bytes_per_device, note};
    (choice == RematChoice::save ? out.device : out.host).push_back(item);
  }

  // The MoE layer in flight: its dispatch and combine buffers.
  const DispatchShape shape = c.dispatch_shape();
  const double r = double(p.ep), n_l = shape.tokens_per_rank, h = double(m.hidden), a = c.activation_bytes();
  const double rows = c.buffered_routed_rows();
  const double chunks = double(c.token_chunks);
  const std::string per_chunk = c.token_chunks > 1 ? " / token_chunks" : "";
  if (p.ep > 1) {
    if (c.dispatch == DispatchKind::ring) {
      out.device.push_back({"communication buffers", "ring: gathered tokens + routing",
                            r * n_l * (shape.token_row_bytes + 2.0 * m.top_k * 4) / chunks, "R*N_l rows" + per_chunk});
      out.device.push_back({"communication buffers", "ring: partial outputs before reduce-scatter",
                            r * n_l * h * a / chunks, "R*N_l*H" + per_chunk});
    } else {
      out.device.push_back({"communication buffers", "all-to-all: send + receive token rows",
                            2 * rows * shape.token_row_bytes / chunks, "2 x buffered rows" + per_chunk});
      out.device.push_back({"communication buffers", "all-to-all: combine send + receive", 2 * rows * h * a / chunks,
                            "2 x buffered rows x H" + per_chunk});
    }
  }

  // Working memory of the layer in flight.
  const ParameterCounts counts = count_parameters(m);
  const double tp = double(p.tp);
  const double moe_layer_params =
      counts.routed_experts_per_layer / (double(p.ep) * tp) +
      (counts.attention_per_layer + counts.shared_experts_per_layer + counts.router_per_layer) / tp;
  const double dense_layer_params =
      m.num_dense_layers > 0 ? (counts.attention_per_layer + counts.dense_mlp_per_layer) / tp : 0;
  out.device.push_back({"working memory", "FSDP-gathered weights, 2 layers (bf16)",
                        2 * std::max(moe_layer_params, dense_layer_params) * kGatheredWeightBytes,
                        "this layer + the prefetched next"});
  // Each intermediate's gradient is produced as the value is consumed, so
  // one set of rows x (2F + H) is counted, not two.
  out.device.push_back({"working memory", "expert intermediates, 1 layer",
                        rows * (2.0 * m.moe_ffn / tp + h) * a / chunks, "rows x (2F + H)" + per_chunk});
  // MaxText casts logits to f32 (cast_logits_to_fp32); the cross-entropy
  // gradient overwrites them in place, so one f32 copy.
  out.device.push_back(
      {"working memory", "logits (f32)", p.tokens_per_device() * double(m.vocab) / tp * kLogitBytes, "T x vocab"});

  if (c.redundant_slots > 0) {
    const double expert_params = 3.0 * h * double(m.moe_ffn) / tp;
    out.device.push_back({"replica slots", "replica weights (bf16), all MoE layers",
                          double(c.redundant_slots) * expert_params * kGatheredWeightBytes * m.num_moe_layers(),
                          "B x 3HF, kept forward to backward"});
    out.device.push_back({"replica slots", "replica gradients (f32), 1 layer",
                          double(c.redundant_slots) * expert_params * kGradientBytes, "returned home per layer"});
  }

  for (const MemoryItem& item : out.device) out.device_total_bytes += item.bytes;
  out.usable_bytes = c.hardware.memory_bytes * c.usable_memory_fraction;
  out.fits = out.device_total_bytes <= out.usable_bytes;
  return out;
}

}  // namespace epmoe::plan
