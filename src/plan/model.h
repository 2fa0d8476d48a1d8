// ModelSpec: the shape of a decoder-only MoE transformer, enough to count its
// parameters, activations and FLOPs. Presets for the models the plan is
// checked on (sources in docs/PLAN.md), or any model from a YAML file with
// the same field names (configs/models/*.yaml).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe::plan {

enum class AttentionKind {
  gqa,  // multi-head / grouped-query: q [heads, qk], k and v [kv_heads, ...]
  mla,  // DeepSeek multi-head latent attention: low-rank q and kv projections
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::gqa;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;  // gqa; mla expands kv to num_heads
  std::int64_t qk_head_dim = 0;   // mla: nope + rope part (DeepSeek-V3: 128 + 64)
  std::int64_t v_head_dim = 0;
  std::int64_t q_lora_rank = 0;       // mla; 0 = a full-rank q projection
  std::int64_t kv_lora_rank = 0;      // mla
  std::int64_t qk_rope_head_dim = 0;  // mla: the rope part of qk_head_dim, shared by all heads
};

struct ModelSpec {
  std::string name;
  std::int64_t num_layers = 0;
  std::int64_t num_dense_layers = 0;  // the first layers have a dense MLP instead of experts
  std::int64_t hidden = 0;            // H
  std::int64_t moe_ffn = 0;           // F of one routed (and shared) expert
  std::int64_t dense_ffn = 0;         // F of the dense layers' MLP
  std::int64_t num_experts = 0;       // E, routed
  std::int64_t top_k = 0;             // K
  std::int64_t num_shared_experts = 0;
  std::int64_t vocab = 0;
  bool tie_embeddings = false;
  AttentionSpec attention;

  std::int64_t num_moe_layers() const { return num_layers - num_dense_layers; }
  // ConfigError naming `what` (the preset or file) and the field: counts
  // positive, K <= E, dense layers <= layers, mla fields consistent.
  void validate(const std::string& what) const;
};

// Parameter counts (elements), by where they live.
struct ParameterCounts {
  double embedding = 0;            // token embedding + LM head (one copy if tied)
  double attention_per_layer = 0;  // projections and their norms
  double dense_mlp_per_layer = 0;
  double routed_experts_per_layer = 0;  // all E experts of one MoE layer
  double shared_experts_per_layer = 0;
  double router_per_layer = 0;
  double norms = 0;  // the layers' RMSNorm scales + the final norm

  double attention_total(const ModelSpec& m) const { return attention_per_layer * m.num_layers; }
  double routed_experts_total(const ModelSpec& m) const { return routed_experts_per_layer * m.num_moe_layers(); }
  // Everything that is not a routed expert (sharded like any dense weight).
  double non_expert_total(const ModelSpec& m) const;
  double total(const ModelSpec& m) const { return non_expert_total(m) + routed_experts_total(m); }
  // Parameters one token's forward multiplies by (K routed experts, the shared
  // ones, attention, router, LM head; the embedding lookup is no matmul).
  double active_matmul(const ModelSpec& m) const;
};

ParameterCounts count_parameters(const ModelSpec& model);

// deepseek3-671b, mixtral-8x7b, qwen3-235b-a22b.
std::vector<std::string> model_preset_names();
// A preset name, or else a path to a YAML file (configs/models/*.yaml).
// ConfigError / FileError naming `key`, the value and what is accepted.
ModelSpec load_model(const std::string& key, const std::string& name_or_path);

std::string to_string(AttentionKind kind);

}  // namespace epmoe::plan
