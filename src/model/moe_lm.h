// MoeLm: the tiny MoE language model of the trainer (DESIGN.md §4.9), on one
// expert-parallel rank:
//
//   h_0 = embedding[ids]
//   h_{l+1} = h_l + moe_l(rms_norm_l(h_l)) (+ shared_l(rms_norm_l(h_l)))   l < L
//   logits = rms_norm_f(h_L) head;  loss = mean softmax cross-entropy
//
// No attention: every token is predicted from the previous one alone, which
// is all synthetic i.i.d. data needs and keeps the MoE layers the workload.
// The optional shared expert is a dense SwiGLU every token passes through
// (DeepSeek's). Expert weights are sharded (rank r holds experts
// [r·E/R, (r+1)·E/R)); every other parameter is replicated.
//
// The model is only math: the trainer (model/trainer.h) owns the collectives
// between forward and backward (the step's global expert counts, which the
// load-balance loss needs) and after it (the replicated gradients).
// Initialisation draws every tensor from its own stream of init_seed, experts
// by their global index, so the initial model is the same for every R.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <epmoe/ep_group.h>
#include <epmoe/moe_layer.h>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "model/parameters.h"

namespace epmoe {

struct MoeLmConfig {
  std::int64_t vocab_size = 512;
  int num_layers = 2;
  std::int64_t shared_expert_ffn = 0;  // F of the shared expert; 0 = none
  MoeLayerConfig layer;                // hidden, ffn, router (num_experts, top_k), dtype, remat
  float norm_eps = 1e-6f;
  double init_std = 0.02;
  std::uint64_t init_seed = 0;

  // ConfigError naming the key ("vocab_size", "num_layers", ...).
  void validate() const;
};

struct LmForwardResult {
  double loss_sum = 0;  // cross-entropy summed over this rank's tokens
  // [L * E] (token, expert) pairs this rank's tokens routed to each expert.
  std::vector<std::int64_t> expert_counts;
};

class MoeLm {
 public:
  // Every MoE layer runs on `group` (not owned; one per rank, shared by the
  // layers: its buffers serve each layer's phase in turn).
  MoeLm(MoeLmConfig config, EpGroup& group, MemoryLedger* ledger = nullptr);
  ~MoeLm();
  MoeLm(const MoeLm&) = delete;
  MoeLm& operator=(const MoeLm&) = delete;

  const MoeLmConfig& config() const { return config_; }
  ParameterSet& state() { return state_; }
  const ParameterSet& state() const { return state_; }
  const MoeLayer& layer(int l) const { return *layers_[static_cast<std::size_t>(l)]; }
  MoeLayer& layer(int l) { return *layers_[static_cast<std::size_t>(l)]; }
  // Layer l's selection bias [E] (router=sigmoid_grouped; null otherwise),
  // updated by the trainer's aux-loss-free balancing.
  Tensor* selection_bias(int l);

  // tokens [B_l, S + 1] i32: inputs are columns [0, S), targets [1, S].
  // `global_tokens` (N over all ranks) scales the loss gradient to the mean.
  // `step` names the replica weight version and the random router's stream.
  LmForwardResult forward(const Tensor& tokens, std::int64_t global_tokens, std::int64_t step);

  // Told during backward each time some parameters' gradients are final:
  // the head and the final norm first, then each layer's (last to first),
  // then the embedding - the reverse of their order in state(), so that a
  // caller can start summing them over ranks while the earlier layers'
  // backward runs. The pointers are valid for the call.
  using GradientsReady = std::function<void(std::span<Parameter* const>)>;

  // The step's expert counts summed over ranks, [L * E]: asked for once,
  // when the load-balance loss first needs them (aux_loss_coef > 0), which
  // is after the first on_gradients_ready call (the head's) has returned,
  // so that a caller may complete their exchange under the head's backward.
  using GlobalExpertCounts = std::function<std::span<const std::int64_t>()>;

  // After forward: the load-balance loss (when aux_loss_coef > 0) and the
  // backward into every parameter's grad (replicated ones hold this rank's
  // part). Returns this rank's part of the load-balance loss.
  double backward(const GlobalExpertCounts& global_expert_counts, double aux_loss_coef,
                  const GradientsReady& on_gradients_ready = {});

 private:
  struct LayerParams;
  struct Activations;
  void initialise();

  MoeLmConfig config_;
  int num_ranks_, rank_;
  MemoryLedger* ledger_;
  ParameterSet state_;
  Parameter *embedding_ = nullptr, *final_norm_ = nullptr, *head_ = nullptr;
  std::vector<LayerParams> layer_params_;
  std::vector<std::unique_ptr<MoeLayer>> layers_;
  std::unique_ptr<Activations> saved_;
  std::int64_t global_tokens_ = 0;
};

}  // namespace epmoe
