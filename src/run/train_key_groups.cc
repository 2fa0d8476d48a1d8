#include "run/train_key_groups.h"

#include "core/error.h"
#include "run/json_output.h"
#include "run/layer_key_groups.h"

namespace epmoe::run {

KeyGroup model_keys() {
  return {
      "model (embedding -> L x (RMSNorm -> MoE -> residual) -> RMSNorm -> LM head)",
      {
          {.name = "vocab_size",
           .type = KeyType::integer,
           .default_value = "512",
           .help = "token ids [0, vocab_size)",
           .min_value = 2},
          {.name = "hidden",
           .type = KeyType::integer,
           .default_value = "128",
           .help = "H, model width",
           .min_value = 1},
          {.name = "ffn",
           .type = KeyType::integer,
           .default_value = "256",
           .help = "F, each expert's FFN width",
           .min_value = 1},
          {.name = "num_experts",
           .type = KeyType::integer,
           .default_value = "16",
           .help = "E routed experts per layer; must be divisible by ranks",
           .min_value = 1},
          {.name = "num_layers",
           .type = KeyType::integer,
           .default_value = "2",
           .help = "L MoE layers",
           .min_value = 1,
           .max_value = 1000},
          {.name = "shared_expert_ffn",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "F of a dense SwiGLU shared expert every token also passes (DeepSeek); 0 = none",
           .min_value = 0},
          {.name = "init_std",
           .type = KeyType::real,
           .default_value = "0.02",
           .help = "standard deviation of the initial weights (norm scales start at 1)",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "init_seed",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "seed of the initial weights (the same model for every rank count)",
           .min_value = 0},
      },
  };
}

KeyGroup training_keys() {
  return {
      "training",
      {
          {.name = "steps",
           .type = KeyType::integer,
           .default_value = "500",
           .help = "optimizer steps",
           .min_value = 1},
          {.name = "batch_size",
           .type = KeyType::integer,
           .default_value = "32",
           .help = "sequences per step over all ranks; must be divisible by ranks",
           .min_value = 1},
          {.name = "seq_len",
           .type = KeyType::integer,
           .default_value = "64",
           .help = "tokens per sequence (each predicts the next)",
           .min_value = 1},
          {.name = "learning_rate",
           .type = KeyType::real,
           .default_value = "0.003",
           .help = "peak learning rate, after warm-up; cosine decay to min_lr_ratio of it at the last step",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "warmup_steps",
           .type = KeyType::integer,
           .default_value = "20",
           .help = "linear warm-up steps",
           .min_value = 0},
          {.name = "min_lr_ratio",
           .type = KeyType::real,
           .default_value = "0.1",
           .help = "final learning rate as a fraction of the peak",
           .min_value = 0,
           .max_value = 1},
          {.name = "weight_decay",
           .type = KeyType::real,
           .default_value = "0.1",
           .help = "AdamW decoupled weight decay (matrices only; not norms or the embedding)",
           .min_value = 0},
          {.name = "adam_beta1",
           .type = KeyType::real,
           .default_value = "0.9",
           .help = "AdamW beta1",
           .min_value = 0,
           .max_value = 0.999999},
          {.name = "adam_beta2",
           .type = KeyType::real,
           .default_value = "0.95",
           .help = "AdamW beta2",
           .min_value = 0,
           .max_value = 0.999999},
          {.name = "adam_eps",
           .type = KeyType::real,
           .default_value = "1e-8",
           .help = "AdamW epsilon",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "grad_clip",
           .type = KeyType::real,
           .default_value = "1.0",
           .help = "clip the global gradient L2 norm (all parameters, all ranks) to this; 0 = off",
           .min_value = 0},
          {.name = "aux_loss_coef",
           .type = KeyType::real,
           .default_value = "0.01",
           .help = "load-balance loss coef * E * sum_e f_e P_e (Switch/GShard; normalised sigmoid "
                   "scores for sigmoid_grouped; not applied with router=random); 0 = off",
           .min_value = 0},
          {.name = "bias_update_rate",
           .type = KeyType::real,
           .default_value = "0.001",
           .help = "router=sigmoid_grouped: aux-loss-free balancing (DeepSeek-V3), each step "
                   "bias_e += rate * sign(mean load - load_e) from the all-reduced counts; 0 = off",
           .min_value = 0},
      },
  };
}

KeyGroup data_keys() {
  return {
      "synthetic data",
      {
          {.name = "data",
           .type = KeyType::choice,
           .default_value = "zipf",
           .help = "token ids i.i.d. uniform, or Zipf (p(id) ~ (id+1)^-zipf_exponent: hot tokens, hot experts)",
           .choices = {"zipf", "uniform"}},
          {.name = "zipf_exponent",
           .type = KeyType::real,
           .default_value = "1.25",
           .help = "data=zipf: the exponent a",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "repeat_probability",
           .type = KeyType::real,
           .default_value = "0.5",
           .help = "each token repeats the previous one with this probability, else a fresh draw: every "
                   "token keeps the data= distribution, and the model has its input to learn from; 0 = i.i.d.",
           .min_value = 0,
           .max_value = 0.999},
          {.name = "data_seed",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "seed of the batches; sequence s of step t comes from its own stream",
           .min_value = 0},
      },
  };
}

KeyGroup train_output_keys() {
  return {
      "checkpoints and metrics",
      {
          {.name = "metrics_file",
           .type = KeyType::text,
           .default_value = "runs/train/metrics.jsonl",
           .help = "JSON lines, one per step (loss, grad norm, tokens/s, phases, bytes, loads, memory); "
                   "empty = none"},
          {.name = "checkpoint_dir",
           .type = KeyType::text,
           .default_value = "",
           .help = "directory of step_N checkpoints (per-rank shards + checksummed manifest); empty = none"},
          {.name = "checkpoint_every",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "steps between checkpoints (and one at the end); 0 = only at the end",
           .min_value = 0},
          {.name = "checkpoint_keep",
           .type = KeyType::integer,
           .default_value = "3",
           .help = "newest checkpoints kept; older ones are deleted after a new one is committed",
           .min_value = 1},
          {.name = "resume",
           .type = KeyType::boolean,
           .default_value = "false",
           .help = "continue from the newest checkpoint in checkpoint_dir (same bits as never stopping)"},
          {.name = "progress",
           .type = KeyType::choice,
           .default_value = "auto",
           .help = "progress line: auto = on a terminal (updated in place) or every log_every steps otherwise",
           .choices = {"auto", "on", "off"}},
          {.name = "log_every",
           .type = KeyType::integer,
           .default_value = "50",
           .help = "off a terminal: print a progress line every this many steps",
           .min_value = 1},
      },
  };
}

MoeLmConfig moe_lm_config_from(const ConfigValues& values) {
  MoeLmConfig model;
  model.vocab_size = values.get_int("vocab_size");
  model.num_layers = values.get_int32("num_layers");
  model.shared_expert_ffn = values.get_int("shared_expert_ffn");
  model.init_std = values.get_float("init_std");
  model.init_seed = static_cast<std::uint64_t>(values.get_int("init_seed"));
  model.layer =
      moe_layer_config_from(values, values.get_int("hidden"), values.get_int("ffn"), values.get_int("num_experts"));
  model.validate();
  return model;
}

TrainerConfig trainer_config_from(const ConfigValues& values, const MoeLmConfig& model, int num_ranks) {
  TrainerConfig config;
  config.steps = values.get_int("steps");
  config.batch_size = values.get_int("batch_size");
  config.data.vocab_size = model.vocab_size;
  config.data.seq_len = values.get_int("seq_len");
  config.data.distribution = parse_token_distribution("data", values.get_string("data"));
  config.data.zipf_exponent = values.get_float("zipf_exponent");
  config.data.repeat_probability = values.get_float("repeat_probability");
  config.data.seed = static_cast<std::uint64_t>(values.get_int("data_seed"));
  config.adamw.beta1 = values.get_float("adam_beta1");
  config.adamw.beta2 = values.get_float("adam_beta2");
  config.adamw.eps = values.get_float("adam_eps");
  config.adamw.weight_decay = values.get_float("weight_decay");
  config.learning_rate.peak = values.get_float("learning_rate");
  config.learning_rate.warmup_steps = values.get_int("warmup_steps");
  config.learning_rate.total_steps = config.steps;
  config.learning_rate.min_ratio = values.get_float("min_lr_ratio");
  config.grad_clip = values.get_float("grad_clip");
  const RouterKind router = model.layer.router.kind;
  // The default coefficient applies where there is a router to train.
  config.aux_loss_coef =
      router == RouterKind::random && !values.is_set("aux_loss_coef") ? 0.0 : values.get_float("aux_loss_coef");
  if (config.aux_loss_coef > 0 && router == RouterKind::random) {
    throw ConfigError("aux_loss_coef=" + std::to_string(config.aux_loss_coef) +
                      ": router=random draws its logits at random; there is no router to balance (use 0)");
  }
  config.bias_update_rate = router == RouterKind::sigmoid_grouped ? values.get_float("bias_update_rate") : 0.0;
  if (router != RouterKind::sigmoid_grouped && values.is_set("bias_update_rate") &&
      values.get_float("bias_update_rate") > 0) {
    throw ConfigError(
        "bias_update_rate: aux-loss-free balancing adjusts the selection bias of "
        "router=sigmoid_grouped only (this run has router=" +
        to_string(router) + ")");
  }
  config.checkpoint_dir = values.get_string("checkpoint_dir");
  config.checkpoint_every = values.get_int("checkpoint_every");
  config.checkpoint_keep = values.get_int32("checkpoint_keep");
  config.resume = values.get_bool("resume");
  config.comm_timeout = std::chrono::milliseconds(values.get_int("comm_timeout_ms"));
  // What a resumed run must share with the checkpoint: the tensors' shapes
  // and what their values mean. Not the rank count: a checkpoint reshards
  // onto any R' dividing num_experts (model/checkpoint.h).
  const nlohmann::json all_keys = config_to_json(values);
  nlohmann::json compatibility = nlohmann::json::object();
  for (const char* key : {"vocab_size", "hidden", "ffn", "num_experts", "num_layers", "shared_expert_ffn", "router",
                          "top_k", "n_groups"}) {
    compatibility[key] = all_keys[key];
  }
  config.checkpoint_metadata = {{"compatibility", compatibility}, {"config", all_keys}};
  config.validate(num_ranks);
  return config;
}

}  // namespace epmoe::run
