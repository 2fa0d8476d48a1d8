// Keys of `epmoe train` beyond the MoE layer's (run/layer_key_groups.h):
// the model around the MoE layers, the optimizer and schedule, the synthetic
// data, and checkpoints / metrics; and their translation into the model's
// and trainer's config structs (validated, ConfigError naming the key).
#pragma once

#include "model/moe_lm.h"
#include "model/trainer.h"
#include "run/config_keys.h"

namespace epmoe::run {

KeyGroup model_keys();         // vocab_size, hidden, ffn, num_experts, num_layers, shared_expert_ffn, ...
KeyGroup training_keys();      // steps, batch_size, seq_len, learning_rate, ..., aux_loss_coef, bias_update_rate
KeyGroup data_keys();          // data, zipf_exponent, repeat_probability, data_seed
KeyGroup train_output_keys();  // checkpoint_dir, checkpoint_every, checkpoint_keep, resume, metrics_file, ...

MoeLmConfig moe_lm_config_from(const ConfigValues& values);
// `compatibility` of checkpoints: the keys that shape the saved tensors.
TrainerConfig trainer_config_from(const ConfigValues& values, const MoeLmConfig& model, int num_ranks);

}  // namespace epmoe::run
