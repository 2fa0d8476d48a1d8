#include "run/plan_run.h"

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "hardware/hardware.h"

namespace epmoe::run {
namespace {

std::string join(const std::vector<std::string>& names, const char* separator) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : separator) + n;
  return out;
}

KeyGroup plan_layout_keys() {
  return {
      "model, hardware and layout",
      {
          {.name = "model",
           .type = KeyType::text,
           .default_value = "deepseek3-671b",
           .help = "a preset (" + join(plan::model_preset_names(), ", ") + ") or a YAML file (configs/models/)"},
          {.name = "hardware",
           .type = KeyType::text,
           .default_value = "tpu-v7x",
           .help =
               "a preset (" + join(hardware::hardware_preset_names(), ", ") + ") or a YAML file (configs/hardware/)"},
          {.name = "dp",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "data-parallel replicas (weights replicated, gradients all-reduced)",
           .min_value = 1},
          {.name = "fsdp",
           .type = KeyType::integer,
           .default_value = "64",
           .help = "FSDP shards: weights, gradients and optimizer state sharded, batch sharded",
           .min_value = 1},
          {.name = "ep",
           .type = KeyType::integer,
           .default_value = "8",
           .help = "expert-parallel ranks R; must divide the model's experts",
           .min_value = 1},
          {.name = "tp",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "tensor-parallel shards of heads and F; tokens replicated in the group",
           .min_value = 1},
          {.name = "per_device_batch_size",
           .type = KeyType::real,
           .default_value = "1",
           .help = "sequences per device (MaxText's meaning: global batch / devices)",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "seq_len",
           .type = KeyType::integer,
           .default_value = "4096",
           .help = "tokens per sequence",
           .min_value = 1},
      },
  };
}

KeyGroup plan_moe_keys() {
  KeyGroup group{
      "dispatch and activations",
      {
          {.name = "dispatch",
           .type = KeyType::choice,
           .default_value = "ring",
           .help = "ring of experts (all-gather tokens, reduce-scatter outputs) or ragged all-to-all",
           .choices = {"ring", "alltoall"}},
          {.name = "dedup",
           .type = KeyType::boolean,
           .default_value = "false",
           .help = "alltoall: one row per (token, destination rank); every dispatcher is reported either way"},
          {.name = "fp8_tokens",
           .type = KeyType::choice,
           .default_value = "off",
           .help = "forward tokens travel (and x_sorted is saved) as fp8 e4m3 with one scale per tensor or per "
                   "token (+4 B per row)",
           .choices = {"off", "tensor", "token"}},
          {.name = "activation_dtype",
           .type = KeyType::choice,
           .default_value = "bf16",
           .help = "saved activations and gradients on the wire (bf16 as MaxText; f32 as this engine)",
           .choices = {"bf16", "f32"}},
          {.name = "matmul_dtype",
           .type = KeyType::choice,
           .default_value = "bf16",
           .help = "which peak FLOP rate the step time uses",
           .choices = {"bf16", "fp8"}},
          {.name = "token_buffer_factor",
           .type = KeyType::real,
           .default_value = "1",
           .help = "routed rows buffered (and saved as x_sorted) per rank, x N_l*K (MaxText ragged_buffer_factor); "
                   "0 = no-drop worst case R*N_l*K",
           .min_value = 0},
          {.name = "token_chunks",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "MoE tokens in n pipelined chunks (MaxText num_moe_token_chunks): one chunk's buffers live",
           .min_value = 1},
          {.name = "redundant_slots",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "replica slots B per rank and MoE layer (their weights and gradients count in memory)",
           .min_value = 0},
          {.name = "replica_costs",
           .type = KeyType::choice,
           .default_value = "priced",
           .help = "priced (as epmoe layer and train): the all-to-all's counts round also carries each rank's "
                   "pair total and, with dedup, its rows per rank; off: the E expert counts alone",
           .choices = {"priced", "off"}},
          {.name = "usable_memory_fraction",
           .type = KeyType::real,
           .default_value = "0.95",
           .help = "share of HBM the step may use (the rest: runtime reserve, fragmentation) - an assumption",
           .min_value = 0,
           .min_exclusive = true,
           .max_value = 1},
          {.name = "compute_efficiency",
           .type = KeyType::real,
           .default_value = "0.5",
           .help = "achieved / peak FLOP rate for the step-time estimate - an assumption",
           .min_value = 0,
           .min_exclusive = true,
           .max_value = 1},
          {.name = "sweep",
           .type = KeyType::text,
           .default_value = "",
           .help = "key:v1,v2,... (e.g. per_device_batch_size:1,2,4 or ep:8,16,64), or 'dispatch': one table "
                   "row per value"},
      },
  };
  const std::map<std::string, plan::RematChoice> defaults = plan::default_remat();
  for (const std::string& name : plan::activation_names()) {
    group.keys.push_back({.name = "remat." + name,
                          .type = KeyType::choice,
                          .default_value = plan::to_string(defaults.at(name)),
                          .help = "save on device, remat (recompute in backward) or offload to host; default as "
                                  "MaxText remat_policy=custom",
                          .choices = plan::remat_choices(name)});
  }
  return group;
}

}  // namespace

const KeyRegistry& plan_key_registry() {
  static const KeyRegistry registry("plan", {plan_layout_keys(), plan_moe_keys()});
  return registry;
}

namespace {

plan::PlanConfig plan_config_from(const ConfigValues& values) {
  plan::PlanConfig c;
  c.model = plan::load_model("model", values.get_string("model"));
  c.hardware = hardware::load_hardware("hardware", values.get_string("hardware"));
  c.parallel = {.dp = values.get_int("dp"),
                .fsdp = values.get_int("fsdp"),
                .ep = values.get_int("ep"),
                .tp = values.get_int("tp"),
                .per_device_batch_size = values.get_float("per_device_batch_size"),
                .seq_len = values.get_int("seq_len")};
  c.dispatch = values.get_string("dispatch") == "ring" ? plan::DispatchKind::ring : plan::DispatchKind::alltoall;
  c.dedup = values.get_bool("dedup");
  const std::string& fp8 = values.get_string("fp8_tokens");
  c.token_transfer = fp8 == "tensor"  ? plan::TokenTransfer::fp8_tensor
                     : fp8 == "token" ? plan::TokenTransfer::fp8_token
                                      : plan::TokenTransfer::activation_dtype;
  c.activation_type = values.get_string("activation_dtype") == "f32" ? plan::ElementType::f32 : plan::ElementType::bf16;
  c.matmul_type = values.get_string("matmul_dtype") == "fp8" ? plan::MatmulType::fp8 : plan::MatmulType::bf16;
  c.token_buffer_factor = values.get_float("token_buffer_factor");
  c.redundant_slots = values.get_int("redundant_slots");
  c.replica_costs_priced = values.get_string("replica_costs") == "priced";
  c.token_chunks = values.get_int("token_chunks");
  c.usable_memory_fraction = values.get_float("usable_memory_fraction");
  c.compute_efficiency = values.get_float("compute_efficiency");
  for (const std::string& name : plan::activation_names()) {
    const std::string& choice = values.get_string("remat." + name);
    c.remat[name] = choice == "save"      ? plan::RematChoice::save
                    : choice == "offload" ? plan::RematChoice::offload
                                          : plan::RematChoice::remat;
  }
  c.validate();
  return c;
}

struct Sweep {
  std::string key;
  std::vector<std::string> values;
};

// "key:v1,v2" or "dispatch"; ConfigError naming sweep= and the rule.
Sweep parse_sweep(const std::string& text) {
  Sweep sweep;
  const std::size_t colon = text.find(':');
  sweep.key = text.substr(0, colon);
  if (colon == std::string::npos) {
    if (sweep.key != "dispatch")
      throw ConfigError("sweep=" + text +
                        ": must be key:v1,v2,... (e.g. per_device_batch_size:1,2,4), or "
                        "'dispatch' for alltoall,ring");
    sweep.values = {"alltoall", "ring"};
    return sweep;
  }
  if (sweep.key == "sweep" || plan_key_registry().find(sweep.key) == nullptr)
    throw ConfigError("sweep=" + text + ": '" + sweep.key + "' is not a plan key (epmoe plan --help lists them)");
  std::string rest = text.substr(colon + 1);
  std::size_t start = 0;
  while (start <= rest.size()) {
    const std::size_t comma = rest.find(',', start);
    const std::string value = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (value.empty()) throw ConfigError("sweep=" + text + ": an empty value in the list");
    sweep.values.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sweep;
}

}  // namespace

PlanRun run_plan(const std::vector<KeyAssignment>& assignments) {
  const KeyRegistry& registry = plan_key_registry();
  const ConfigValues values = registry.parse(assignments);
  const std::string& sweep_text = values.get_string("sweep");
  PlanRun run;
  if (sweep_text.empty()) {
    run.rows.push_back({"", plan::make_plan(plan_config_from(values))});
    return run;
  }
  const Sweep sweep = parse_sweep(sweep_text);
  run.sweep_key = sweep.key;
  for (const std::string& value : sweep.values) {
    std::vector<KeyAssignment> swept = assignments;
    swept.push_back({sweep.key, value, "sweep=" + sweep_text});
    run.rows.push_back({value, plan::make_plan(plan_config_from(registry.parse(swept)))});
  }
  return run;
}

nlohmann::json plan_run_to_json(const PlanRun& run) {
  if (run.sweep_key.empty()) return plan::report_to_json(run.rows.front().report);
  nlohmann::json out = nlohmann::json::array();
  for (const plan::SweepRow& row : run.rows)
    out.push_back({{run.sweep_key, row.value}, {"plan", plan::report_to_json(row.report)}});
  return out;
}

}  // namespace epmoe::run
