// Memory one device holds at its peak (the start of the backward), the way
// MaxText lays a training step out:
//  * parameters in f32 (MaxText's weight_dtype=float32: they are the master
//    weights; bf16 / fp8 copies are made per layer when it runs), f32
//    gradients and AdamW's two f32 moments, all sharded over fsdp × ep × tp
//    (MaxText shards the embed dimension over fsdp and expert) — 16 bytes per
//    parameter per shard. Gradients are counted whole: under scan the
//    stacked gradient buffer exists while the saved activations still do.
//  * saved activations: each name kept on device, per layer × layers;
//    offloaded ones are listed as host bytes.
//  * communication buffers of the MoE layer in flight (dispatch and combine).
//  * working memory of the layer in flight: its weights gathered by FSDP (bf16,
//    this layer and the prefetched next), its expert intermediates and their
//    values (gradients overwrite them as they are consumed), and the f32 logits.
//  * replica slots: B experts' bf16 weights per MoE layer, kept from forward
//    to backward, and one layer's f32 slot gradients.
#pragma once

#include <string>
#include <vector>

#include "plan/plan_config.h"

namespace epmoe::plan {

struct MemoryItem {
  std::string category;  // parameters | gradients | optimizer state | saved activations | ...
  std::string name;
  double bytes = 0;  // per device
  std::string note;  // how it was sized
};

struct MemoryBreakdown {
  std::vector<MemoryItem> device;  // on the accelerator at the peak
  std::vector<MemoryItem> host;    // offloaded activations
  double device_total_bytes = 0;
  double usable_bytes = 0;  // hardware memory × usable fraction
  bool fits = false;

  double category_bytes(const std::string& category) const;
  double item_bytes(const std::string& name) const;  // 0 when absent
};

MemoryBreakdown project_memory(const PlanConfig& config);

// Parameters one device holds (elements): every weight sharded over
// fsdp × ep × tp, the routed experts and the rest.
struct ShardedParameters {
  double routed_experts = 0;
  double other = 0;
};
ShardedParameters sharded_parameters(const PlanConfig& config);

}  // namespace epmoe::plan
