#include "plan/model.h"

#include <filesystem>
#include <stdexcept>

#include "core/error.h"
#include "hardware/spec_file.h"

namespace epmoe::plan {
namespace {

// Values from each model's published config.json; docs/PLAN.md gives the links.
ModelSpec deepseek3_671b() {
  ModelSpec m;
  m.name = "deepseek3-671b";
  m.num_layers = 61;         // num_hidden_layers
  m.num_dense_layers = 3;    // first_k_dense_replace
  m.hidden = 7168;           // hidden_size
  m.moe_ffn = 2048;          // moe_intermediate_size
  m.dense_ffn = 18432;       // intermediate_size
  m.num_experts = 256;       // n_routed_experts
  m.top_k = 8;               // num_experts_per_tok
  m.num_shared_experts = 1;  // n_shared_experts
  m.vocab = 129280;          // vocab_size
  m.attention = {.kind = AttentionKind::mla,
                 .num_heads = 128,
                 .num_kv_heads = 128,
                 .qk_head_dim = 128 + 64,
                 .v_head_dim = 128,
                 .q_lora_rank = 1536,
                 .kv_lora_rank = 512,
                 .qk_rope_head_dim = 64};
  return m;
}

ModelSpec mixtral_8x7b() {
  ModelSpec m;
  m.name = "mixtral-8x7b";
  m.num_layers = 32;
  m.hidden = 4096;
  m.moe_ffn = 14336;
  m.dense_ffn = 14336;
  m.num_experts = 8;
  m.top_k = 2;
  m.vocab = 32000;
  m.attention = {.kind = AttentionKind::gqa, .num_heads = 32, .num_kv_heads = 8, .qk_head_dim = 128, .v_head_dim = 128};
  return m;
}

ModelSpec qwen3_235b_a22b() {
  ModelSpec m;
  m.name = "qwen3-235b-a22b";
  m.num_layers = 94;
  m.hidden = 4096;
  m.moe_ffn = 1536;     // moe_intermediate_size
  m.dense_ffn = 12288;  // intermediate_size (unused: every layer is MoE)
  m.num_experts = 128;
  m.top_k = 8;
  m.vocab = 151936;
  m.attention = {.kind = AttentionKind::gqa, .num_heads = 64, .num_kv_heads = 4, .qk_head_dim = 128, .v_head_dim = 128};
  return m;
}

void require(bool ok, const std::string& what, const std::string& field, std::int64_t value, const std::string& rule) {
  if (!ok) throw ConfigError(what + ": " + field + "=" + std::to_string(value) + ": must be " + rule);
}

}  // namespace

std::string to_string(AttentionKind kind) { return kind == AttentionKind::mla ? "mla" : "gqa"; }

void ModelSpec::validate(const std::string& what) const {
  require(num_layers >= 1, what, "num_layers", num_layers, ">= 1");
  require(num_dense_layers >= 0 && num_dense_layers <= num_layers, what, "num_dense_layers", num_dense_layers,
          "between 0 and num_layers=" + std::to_string(num_layers));
  require(hidden >= 1, what, "hidden", hidden, ">= 1");
  require(moe_ffn >= 1, what, "moe_ffn", moe_ffn, ">= 1");
  require(num_dense_layers == 0 || dense_ffn >= 1, what, "dense_ffn", dense_ffn, ">= 1 when there are dense layers");
  require(num_experts >= 1, what, "num_experts", num_experts, ">= 1");
  require(top_k >= 1 && top_k <= num_experts, what, "top_k", top_k,
          "between 1 and num_experts=" + std::to_string(num_experts));
  require(num_shared_experts >= 0, what, "num_shared_experts", num_shared_experts, ">= 0");
  require(vocab >= 1, what, "vocab", vocab, ">= 1");
  const AttentionSpec& a = attention;
  require(a.num_heads >= 1, what, "attention.num_heads", a.num_heads, ">= 1");
  require(a.qk_head_dim >= 1, what, "attention.qk_head_dim", a.qk_head_dim, ">= 1");
  require(a.v_head_dim >= 1, what, "attention.v_head_dim", a.v_head_dim, ">= 1");
  if (a.kind == AttentionKind::gqa) {
    require(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0, what, "attention.num_kv_heads", a.num_kv_heads,
            ">= 1 and divide attention.num_heads=" + std::to_string(a.num_heads));
  } else {
    require(a.kv_lora_rank >= 1, what, "attention.kv_lora_rank", a.kv_lora_rank, ">= 1 for mla");
    require(a.q_lora_rank >= 0, what, "attention.q_lora_rank", a.q_lora_rank, ">= 0 (0 = full-rank q)");
    require(a.qk_rope_head_dim >= 0 && a.qk_rope_head_dim < a.qk_head_dim, what, "attention.qk_rope_head_dim",
            a.qk_rope_head_dim, "between 0 and attention.qk_head_dim-1");
  }
}

double ParameterCounts::non_expert_total(const ModelSpec& m) const {
  return embedding + attention_total(m) + dense_mlp_per_layer * m.num_dense_layers +
         (shared_experts_per_layer + router_per_layer) * m.num_moe_layers() + norms;
}

double ParameterCounts::active_matmul(const ModelSpec& m) const {
  const double lm_head = double(m.vocab) * m.hidden;
  const double routed_active = routed_experts_per_layer / m.num_experts * m.top_k;
  return attention_total(m) + dense_mlp_per_layer * m.num_dense_layers +
         (routed_active + shared_experts_per_layer + router_per_layer) * m.num_moe_layers() + lm_head;
}

ParameterCounts count_parameters(const ModelSpec& m) {
  ParameterCounts p;
  const double h = double(m.hidden);
  const AttentionSpec& a = m.attention;
  p.embedding = double(m.vocab) * h * (m.tie_embeddings ? 1 : 2);
  const double heads = double(a.num_heads);
  if (a.kind == AttentionKind::gqa) {
    p.attention_per_layer = h * heads * a.qk_head_dim + h * double(a.num_kv_heads) * (a.qk_head_dim + a.v_head_dim) +
                            heads * a.v_head_dim * h;
  } else {
    // q: H -> q_lora (+ its norm) -> heads x qk; kv: H -> kv_lora + shared rope
    // key (+ norm) -> heads x (nope + v); out: heads x v -> H.
    const double q = a.q_lora_rank > 0
                         ? h * a.q_lora_rank + a.q_lora_rank + double(a.q_lora_rank) * heads * a.qk_head_dim
                         : h * heads * a.qk_head_dim;
    const double kv = h * double(a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank +
                      double(a.kv_lora_rank) * heads * double(a.qk_head_dim - a.qk_rope_head_dim + a.v_head_dim);
    p.attention_per_layer = q + kv + heads * a.v_head_dim * h;
  }
  p.dense_mlp_per_layer = 3.0 * h * double(m.dense_ffn);
  p.routed_experts_per_layer = double(m.num_experts) * 3.0 * h * double(m.moe_ffn);
  p.shared_experts_per_layer = double(m.num_shared_experts) * 3.0 * h * double(m.moe_ffn);
  p.router_per_layer = h * double(m.num_experts);
  p.norms = 2.0 * h * m.num_layers + h;
  return p;
}

std::vector<std::string> model_preset_names() { return {"deepseek3-671b", "mixtral-8x7b", "qwen3-235b-a22b"}; }

namespace {

std::vector<hardware::SpecField> model_fields(ModelSpec& m) {
  auto count = [](std::int64_t& field, long long min_value) {
    return [&field, min_value](const std::string& text) { field = hardware::parse_count(text, min_value); };
  };
  return {
      {"name", false, "a word", [&m](const std::string& t) { m.name = t; }},
      {"num_layers", true, "an integer >= 1", count(m.num_layers, 1)},
      {"num_dense_layers", false, "an integer >= 0", count(m.num_dense_layers, 0)},
      {"hidden", true, "an integer >= 1", count(m.hidden, 1)},
      {"moe_ffn", true, "an integer >= 1", count(m.moe_ffn, 1)},
      {"dense_ffn", false, "an integer >= 1", count(m.dense_ffn, 1)},
      {"num_experts", true, "an integer >= 1", count(m.num_experts, 1)},
      {"top_k", true, "an integer >= 1", count(m.top_k, 1)},
      {"num_shared_experts", false, "an integer >= 0", count(m.num_shared_experts, 0)},
      {"vocab", true, "an integer >= 1", count(m.vocab, 1)},
      {"tie_embeddings", false, "true or false",
       [&m](const std::string& t) {
         if (t != "true" && t != "false") throw std::invalid_argument(t);
         m.tie_embeddings = t == "true";
       }},
      {"attention.kind", false, "gqa or mla",
       [&m](const std::string& t) {
         if (t != "gqa" && t != "mla") throw std::invalid_argument(t);
         m.attention.kind = t == "mla" ? AttentionKind::mla : AttentionKind::gqa;
       }},
      {"attention.num_heads", true, "an integer >= 1", count(m.attention.num_heads, 1)},
      {"attention.num_kv_heads", false, "an integer >= 1", count(m.attention.num_kv_heads, 1)},
      {"attention.qk_head_dim", true, "an integer >= 1", count(m.attention.qk_head_dim, 1)},
      {"attention.v_head_dim", true, "an integer >= 1", count(m.attention.v_head_dim, 1)},
      {"attention.q_lora_rank", false, "an integer >= 0", count(m.attention.q_lora_rank, 0)},
      {"attention.kv_lora_rank", false, "an integer >= 1", count(m.attention.kv_lora_rank, 1)},
      {"attention.qk_rope_head_dim", false, "an integer >= 0", count(m.attention.qk_rope_head_dim, 0)},
  };
}

}  // namespace

ModelSpec load_model(const std::string& key, const std::string& name_or_path) {
  if (name_or_path == "deepseek3-671b") return deepseek3_671b();
  if (name_or_path == "mixtral-8x7b") return mixtral_8x7b();
  if (name_or_path == "qwen3-235b-a22b") return qwen3_235b_a22b();
  const std::filesystem::path path(name_or_path);
  if (!std::filesystem::exists(path)) {
    std::string names;
    for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError(key + "=" + name_or_path + ": neither a model preset (" + names +
                      ") nor an existing YAML file (e.g. configs/models/deepseek3-671b.yaml)");
  }
  ModelSpec m;
  m.name = path.stem().string();
  hardware::read_spec_file(path, "model", model_fields(m));
  if (m.attention.num_kv_heads == 0) m.attention.num_kv_heads = m.attention.num_heads;
  m.validate(key + "=" + name_or_path);
  return m;
}

}  // namespace epmoe::plan
