#include "plan/activation_sizes.h"

#include <algorithm>

#include "core/error.h"

namespace epmoe::plan {

double x_sorted_bytes(double rows, SavedRowForm form, std::int64_t hidden, std::int64_t experts_per_rank) {
  return x_sorted_bundle_bytes(rows, form, hidden, experts_per_rank);
}

double routed_expert_activation_bytes(const std::string& name, double rows, std::int64_t hidden, std::int64_t ffn,
                                      double element_bytes) {
  if (name == "mlpwi_0" || name == "mlpwi_1") return rows * double(ffn) * element_bytes;
  if (name == "mlpwo") return rows * double(hidden) * element_bytes;
  EPMOE_CHECK(false && "not a routed expert activation");
  return 0;
}

double attention_core_flops(const PlanConfig& c) {
  // Per token, QK^T and AV over S/2 keys on average (causal): 2·(S/2)·heads·(qk + v).
  const AttentionSpec& a = c.model.attention;
  const double heads = double(a.num_heads) / double(c.parallel.tp);
  return c.parallel.tokens_per_device() * double(c.parallel.seq_len) * heads * double(a.qk_head_dim + a.v_head_dim);
}

ActivationFootprint activation_footprint(const PlanConfig& c, const std::string& name) {
  const ModelSpec& m = c.model;
  const AttentionSpec& att = m.attention;
  const double t = c.parallel.tokens_per_device();
  const double tp = double(c.parallel.tp);
  const double h = double(m.hidden), a = c.activation_bytes();
  const double heads = double(att.num_heads) / tp;
  const double kv_heads = att.kind == AttentionKind::mla ? heads : std::max(1.0, double(att.num_kv_heads) / tp);
  const std::int64_t all_layers = m.num_layers, moe_layers = m.num_moe_layers(), dense_layers = m.num_dense_layers;
  const double buffered_rows = c.buffered_routed_rows(), expected_rows = c.expected_routed_rows();
  const double moe_f = double(m.moe_ffn) / tp, dense_f = double(m.dense_ffn) / tp;
  const double shared_f = moe_f * double(m.num_shared_experts);

  ActivationFootprint f;
  if (name == "decoder_layer_input") {
    f = {t * h * a * all_layers, 0, all_layers};  // never recomputed (plan_config.h)
  } else if (name == "query_proj") {
    const double q_params = att.kind == AttentionKind::mla && att.q_lora_rank > 0
                                ? h * att.q_lora_rank + double(att.q_lora_rank) * heads * att.qk_head_dim
                                : h * heads * att.qk_head_dim;
    f = {t * heads * att.qk_head_dim * a * all_layers, 2 * t * q_params * all_layers, all_layers};
  } else if (name == "key_proj") {
    const double k_params = att.kind == AttentionKind::mla
                                ? h * double(att.kv_lora_rank + att.qk_rope_head_dim) / tp +
                                      double(att.kv_lora_rank) * heads * double(att.qk_head_dim - att.qk_rope_head_dim)
                                : h * kv_heads * att.qk_head_dim;
    f = {t * kv_heads * att.qk_head_dim * a * all_layers, 2 * t * k_params * all_layers, all_layers};
  } else if (name == "value_proj") {
    const double v_params = att.kind == AttentionKind::mla ? double(att.kv_lora_rank) * heads * att.v_head_dim
                                                           : h * kv_heads * att.v_head_dim;
    f = {t * kv_heads * att.v_head_dim * a * all_layers, 2 * t * v_params * all_layers, all_layers};
  } else if (name == "context") {
    f = {t * heads * att.v_head_dim * a * all_layers, attention_core_flops(c) * all_layers, all_layers};
  } else if (name == "out_proj") {
    f = {t * h * a * all_layers, 2 * t * heads * att.v_head_dim * h * all_layers, all_layers};
  } else if (name == "x_sorted") {
    // Saved as it travelled: fp8 + scale when fp8_tokens is on (MaxText saves
    // the quantized QArray leaf-wise), else in the activation type (the
    // engine's definition, core/x_sorted_size.h). Recomputing it costs
    // communication (communication_model.h "backward/remat"), and a sort,
    // not FLOPs.
    f = {x_sorted_bytes(buffered_rows, c.saved_row_form(), m.hidden, m.num_experts / c.parallel.ep) * moe_layers, 0,
         moe_layers};
  } else if (name == "mlpwi_0" || name == "mlpwi_1" || name == "mlpwo") {
    const bool wi = name != "mlpwo";
    // Routed rows, the shared experts (one fused MLP over all T tokens) and the dense layers' MLP.
    const double moe_bytes =
        wi ? (buffered_rows * moe_f + t * shared_f) * a : (buffered_rows + (m.num_shared_experts > 0 ? t : 0)) * h * a;
    const double dense_bytes = wi ? t * dense_f * a : t * h * a;
    const double gemm_flops_moe = 2 * h * (expected_rows * moe_f + t * shared_f);
    const double gemm_flops_dense = 2 * h * t * dense_f;
    f = {moe_bytes * moe_layers + dense_bytes * dense_layers,
         gemm_flops_moe * moe_layers + gemm_flops_dense * dense_layers, all_layers};
  } else {
    EPMOE_CHECK(false && "unknown activation name");
  }
  return f;
}

}  // namespace epmoe::plan
