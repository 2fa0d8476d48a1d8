#include "plan/plan_config.h"

#include <cmath>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace epmoe::plan {

const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> names = {"decoder_layer_input",
                                                 "query_proj",
                                                 "key_proj",
                                                 "value_proj",
                                                 "context",
                                                 "out_proj",
                                                 "x_sorted",
                                                 "mlpwi_0",
                                                 "mlpwi_1",
                                                 "mlpwo"};
  return names;
}

std::vector<std::string> remat_choices(const std::string& name) {
  if (name == "decoder_layer_input") return {"save", "offload"};
  return {"save", "remat", "offload"};
}

std::map<std::string, RematChoice> default_remat() {
  std::map<std::string, RematChoice> remat;
  for (const std::string& name : activation_names()) remat[name] = RematChoice::remat;
  remat["decoder_layer_input"] = RematChoice::save;
  return remat;
}

std::string to_string(RematChoice choice) {
  switch (choice) {
    case RematChoice::save:
      return "save";
    case RematChoice::remat:
      return "remat";
    case RematChoice::offload:
      return "offload";
  }
  return "?";
}

namespace {

void require(bool ok, const std::string& setting, const std::string& rule) {
  if (!ok) throw ConfigError(setting + ": " + rule);
}

}  // namespace

void PlanConfig::validate() const {
  const ParallelismSpec& p = parallel;
  // Every count below is multiplied with others (devices, shards, tokens
  // per step); an overflow would wrap to a negative device count and a
  // FITS verdict. A product that fits int64 keeps every partial product in
  // range too (all factors are >= 1).
  // The message names all four keys: the one that overflows last need not be
  // the one that is too big (fsdp=2^63-1 with ep=8 overflows at ep).
  const std::string layout = "dp=" + std::to_string(p.dp) + " fsdp=" + std::to_string(p.fsdp) +
                             " ep=" + std::to_string(p.ep) + " tp=" + std::to_string(p.tp);
  std::int64_t devices = 1;
  for (const auto& [key, value] :
       {std::pair<const char*, std::int64_t>{"dp", p.dp}, {"fsdp", p.fsdp}, {"ep", p.ep}, {"tp", p.tp}}) {
    require(value >= 1, std::string(key) + "=" + std::to_string(value), "must be >= 1");
    require(!__builtin_mul_overflow(devices, value, &devices), layout,
            "the device count dp*fsdp*ep*tp overflows a 64-bit integer");
  }
  // Tokens per step (devices * batch * seq_len) and the byte counts derived
  // from them are doubles; beyond 2^53 they stop being exact integers, far
  // beyond any real cluster, so that is the honest limit.
  const double tokens_per_step = double(devices) * p.per_device_batch_size * double(p.seq_len);
  const auto shortest = [](double value) {
    std::ostringstream text;
    text << value;  // 1e+300, not 300 digits
    return text.str();
  };
  require(tokens_per_step <= 9007199254740992.0,
          "per_device_batch_size=" + shortest(p.per_device_batch_size) + " seq_len=" + std::to_string(p.seq_len),
          "tokens per step = devices*per_device_batch_size*seq_len = " + shortest(tokens_per_step) +
              " exceeds 2^53, where the byte counts stop being exact");
  require(redundant_slots <= (std::int64_t{1} << 31), "redundant_slots=" + std::to_string(redundant_slots),
          "must be <= 2^31 replica slots per rank");
  const std::string ep_setting = "ep=" + std::to_string(p.ep);
  require(model.num_experts % p.ep == 0, ep_setting,
          "must divide the model's num_experts=" + std::to_string(model.num_experts) + " (" + model.name + ")");
  const std::string tp_setting = "tp=" + std::to_string(p.tp);
  require(model.attention.num_heads % p.tp == 0, tp_setting,
          "must divide attention.num_heads=" + std::to_string(model.attention.num_heads));
  require(model.moe_ffn % p.tp == 0, tp_setting, "must divide moe_ffn=" + std::to_string(model.moe_ffn));
  require(model.num_dense_layers == 0 || model.dense_ffn % p.tp == 0, tp_setting,
          "must divide dense_ffn=" + std::to_string(model.dense_ffn));
  require(dispatch == DispatchKind::alltoall || !dedup, "dedup=true",
          "applies to dispatch=alltoall only; the ring already sends each token once to every rank");
  require(token_buffer_factor == 0 || token_buffer_factor >= 1,
          "token_buffer_factor=" + std::to_string(token_buffer_factor),
          "must be 0 (no-drop worst case) or >= 1 (a multiple of the balanced N_l*K rows)");
  for (const std::string& name : activation_names()) {
    require(remat.count(name) == 1, "remat." + name, "missing (a bug in the caller)");
    require(name != "decoder_layer_input" || choice(name) != RematChoice::remat, "remat." + name + "=remat",
            "the layer input cannot be recomputed inside the layer; use save or offload");
  }
}

double PlanConfig::token_row_bytes() const {
  const double h = double(model.hidden);
  switch (token_transfer) {
    case TokenTransfer::activation_dtype:
      return h * activation_bytes();
    case TokenTransfer::fp8_tensor:
      return h;  // e4m3 bytes; one scale for the whole tensor
    case TokenTransfer::fp8_token:
      return h + 4;  // e4m3 bytes + an f32 scale per row
  }
  return 0;
}

SavedRowForm PlanConfig::saved_row_form() const {
  switch (token_transfer) {
    case TokenTransfer::activation_dtype:
      break;
    case TokenTransfer::fp8_tensor:
      return SavedRowForm::fp8_tensor;
    case TokenTransfer::fp8_token:
      return SavedRowForm::fp8_token;
  }
  return activation_type == ElementType::bf16 ? SavedRowForm::bf16 : SavedRowForm::f32;
}

DispatchShape PlanConfig::dispatch_shape() const {
  return {.num_ranks = parallel.ep,
          .tokens_per_rank = parallel.tokens_per_device(),
          .hidden = model.hidden,
          .top_k = model.top_k,
          .num_experts = model.num_experts,
          .token_row_bytes = token_row_bytes(),
          .activation_bytes = activation_bytes(),
          .num_chunks = token_chunks,
          .fp8_tensor_scale = token_transfer == TokenTransfer::fp8_tensor,
          .replicas = redundant_slots > 0,
          .replicas_priced = redundant_slots > 0 && replica_costs_priced};
}

double PlanConfig::expected_routed_rows() const { return parallel.tokens_per_device() * double(model.top_k); }

double PlanConfig::buffered_routed_rows() const {
  if (token_buffer_factor == 0) return double(parallel.ep) * expected_routed_rows();
  return std::ceil(token_buffer_factor * expected_routed_rows());
}

}  // namespace epmoe::plan
