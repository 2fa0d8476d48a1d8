// epmoe::MoeLayer: one rank's routed MoE layer, y = sum_k w_k *
// expert_{id_k}(x) with SwiGLU experts, expert_e(x) = (silu(x wi0_e) *
// (x wi1_e)) wo_e, forward and backward, on an EP group (<epmoe/ep_group.h>)
// shared by every layer of the model. Each rank runs its own layer on its
// own tokens with its own experts' weights (wi0/wi1/wo hold the rank's
// E_l = E / R experts, [r * E_l, (r + 1) * E_l)); the gate is replicated,
// so dgate is this rank's contribution, to be summed over ranks.
//
//   epmoe::MoeLayer layer({.hidden = 1024, .ffn = 512, .router = {.num_experts = 16, .top_k = 2}}, group);
//   epmoe::MoeForwardOutput out = layer.forward(x, {gate, wi0, wi1, wo});
//   epmoe::MoeGradients grads = layer.backward(dy);      // dx, dgate, dwi0, dwi1, dwo
//
// The backward uses what its forward kept (x_sorted and the activations the
// remat policy saves, the step's dispatch layout): nothing is recomputed
// but what the policy says.
//
// Split phase, and several steps in flight (micro-batch overlap): a step is
// a MoeStep, begun by begin_forward and ended by finish_backward:
//
//   epmoe::MoeStep a = layer.begin_forward(x_a, w);     // routed, chunk 0 in flight
//   ... anything that does not touch x_a or the weights (a shared expert) ...
//   out_a = layer.finish_forward(a);                     // experts + combine
//   epmoe::MoeStep b = layer.begin_forward(x_b, w);     // a second micro-batch
//   out_b = layer.finish_forward(b);
//   layer.begin_backward(a, dy_a); grads_a = layer.finish_backward(a);
//   layer.begin_backward(b, dy_b); grads_b = layer.finish_backward(b);
//
// The bits are those of forward() / backward() whatever the interleaving.
// Every call out of a step's order throws UsageError naming the call and
// the order, leaving the step as it was; an Error inside a phase abandons
// the step (its collectives are cancelled, the peers learn of it through the
// transport). With replicas (EpConfig::balance) a layer holds one step at a
// time: its replica slots hold that step's experts.
//
// Caller memory. Inputs are views, read in place, never copied in: x,
// weights and dy must be f32 and C-contiguous (a strided view is refused
// with a UsageError naming it) and stay alive and unchanged until the step's
// finish_backward (the usual autograd contract). Outputs go into the
// caller's buffers where given (MoeForwardBuffers / MoeGradientBuffers: any
// member left empty is allocated, the others are written in place and come
// back as empty Tensors), so a steady step with every buffer given
// allocates nothing of the caller's size.
//
// Non-finite numbers never pass silently (NumericError): a NaN or infinity
// in an input is refused before any work or communication, naming the
// tensor and index ("moe layer 1: x[3, 17] = nan: inputs must be finite");
// one the step produces is reported with the layer, phase and row.
//
// Threads: a layer and its steps belong to their rank's thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <epmoe/config.h>
#include <epmoe/ep_group.h>
#include <epmoe/memory_ledger.h>
#include <epmoe/routing.h>
#include <epmoe/step_stats.h>
#include <epmoe/tensor.h>
#include <epmoe/tensor_view.h>

namespace epmoe {

// The layer's parameters, wherever the caller keeps them (an epmoe Tensor
// converts; so does any f32 C-contiguous memory, e.g. a framework's or a
// std::vector's): read in place, never copied.
struct MoeWeights {
  TensorView gate;       // [H, E]
  TensorView wi0;        // [E_l, H, F], this rank's experts
  TensorView wi1;        // [E_l, H, F]
  TensorView wo;         // [E_l, F, H]
  TensorView bias = {};  // [E] or empty (sigmoid_grouped selection bias)
};

struct MoeForwardOutput {
  Tensor y;             // [N, H]
  Tensor topk_ids;      // [N, K] i32
  Tensor topk_weights;  // [N, K] f32
};

struct MoeGradients {
  Tensor dx;     // [N, H]
  Tensor dgate;  // [H, E], this rank's tokens' contribution
  Tensor dwi0;   // [E_l, H, F]
  Tensor dwi1;   // [E_l, H, F]
  Tensor dwo;    // [E_l, F, H]
};

// The caller's buffers for a step's outputs, C-contiguous, of exactly the
// shapes above (UsageError otherwise); empty members are allocated.
struct MoeForwardBuffers {
  MutableTensorView y = {};             // [N, H] f32
  MutableTensorView topk_ids = {};      // [N, K] i32
  MutableTensorView topk_weights = {};  // [N, K] f32
};
struct MoeGradientBuffers {
  MutableTensorView dx = {};     // [N, H] f32
  MutableTensorView dgate = {};  // [H, E] f32
  MutableTensorView dwi0 = {};   // [E_l, H, F] f32
  MutableTensorView dwi1 = {};   // [E_l, H, F] f32
  MutableTensorView dwo = {};    // [E_l, F, H] f32
};

struct MoeLayerStats {
  // route, dispatch, experts, combine, backward_*: seconds on the rank's
  // clock (modelled seconds under clock=modelled), accumulated over steps.
  std::map<std::string, double> phase_seconds;
  std::int64_t saved_activation_peak_bytes = 0;  // last forward, with a ledger
  std::int64_t recomputed_bytes = 0;             // last backward: tensors the remat policy rebuilt
};

// The last step's (the last finish_forward's, then its finish_backward's).
struct MoeStepStats {
  DispatchStats dispatch;  // the replica exchange's bytes included
  ReplicaStats replicas;   // all-default without replicas
};

class MoeLayer;

// What a step's forward is told beside its inputs; every field optional.
struct MoeStepContext {
  // Identifies the values of the experts' weights, the same on every rank
  // of the step: replica slots are not resent, and the weights not
  // re-checked for finiteness, while it and their buffers are unchanged.
  // Default: a new version every forward (always correct).
  std::optional<std::uint64_t> weight_version = std::nullopt;
  // router=random: the stream of its seed this step draws from, so that a
  // trainer makes the draws a function of (step, layer, rank) and a resumed
  // run draws what an uninterrupted one would have. Default: the layer's
  // generator goes on where its last step left it.
  std::optional<std::uint64_t> random_router_stream = std::nullopt;
};

// One step of one layer, from begin_forward to finish_backward. Move-only;
// destroying it mid-step abandons the step.
class MoeStep {
 public:
  MoeStep();
  MoeStep(MoeStep&&) noexcept;
  MoeStep& operator=(MoeStep&&) noexcept;
  ~MoeStep();

  bool active() const;  // begun and not yet finished (or abandoned)

  struct State;  // opaque: what the step keeps (src/moe/moe_layer.cc)

 private:
  friend class MoeLayer;
  std::unique_ptr<State> state_;
};

class MoeLayer {
 public:
  // `group` (not owned) must outlive the layer, and config's num_experts,
  // top_k and hidden must be the group's (ConfigError naming the key
  // otherwise). `ledger` (optional, not owned) sees every activation saved
  // for the backward ("saved/x_sorted", ...) and the replica slots' buffers.
  MoeLayer(const MoeLayerConfig& config, EpGroup& group, MemoryLedger* ledger = nullptr);
  ~MoeLayer();
  MoeLayer(MoeLayer&&) noexcept;
  MoeLayer& operator=(MoeLayer&&) noexcept;

  const MoeLayerConfig& config() const;
  int num_local_experts() const;

  // One step at a time: begin and finish of the layer's own step.
  MoeForwardOutput forward(TensorView x, const MoeWeights& weights, const MoeStepContext& context = {},
                           const MoeForwardBuffers& out = {});
  // Uses the last forward()'s step; dy [N, H]. `extra_d_logits` [N, E]
  // (optional): a gradient of the router logits from a loss outside the
  // layer (a load-balance loss), added to the combine weights' before dgate
  // and dx are formed.
  MoeGradients backward(TensorView dy, TensorView extra_d_logits = {}, const MoeGradientBuffers& out = {});

  // Split phase (see above). Between a begin and its finish the caller may
  // compute anything that does not touch the step's inputs: the
  // communication the begin started moves meanwhile.
  //  * begin_forward: checks the inputs, routes, and starts the dispatch
  //    (chunk 0's tokens and, with replicas, the slot weights in flight).
  //  * finish_forward: the experts and the combine, chunk by chunk.
  //  * begin_backward: checks dy and starts sending the cotangents.
  //  * finish_backward: the experts' backward, the gradients' return, the
  //    router's backward. Ends the step.
  [[nodiscard]] MoeStep begin_forward(TensorView x, const MoeWeights& weights, const MoeStepContext& context = {});
  MoeForwardOutput finish_forward(MoeStep& step, const MoeForwardBuffers& out = {});
  void begin_backward(MoeStep& step, TensorView dy, TensorView extra_d_logits = {});
  MoeGradients finish_backward(MoeStep& step, const MoeGradientBuffers& out = {});

  // The router's output of a step whose forward finished, until its
  // backward ends.
  const RouterOutput& routing(const MoeStep& step) const;

  // Replicas: what later steps' replica plans depend on, for checkpoints;
  // empty without replicas. Restoring an empty state is a no-op.
  std::vector<std::int64_t> balance_state() const;
  void restore_balance_state(const std::vector<std::int64_t>& state);
  // balance=dynamic with replica_planning=forecast (a no-op otherwise): the
  // counts of the step just run, [R * E] (rank r's (token, k) pairs of
  // expert e at r * E + e), the same on every rank — gathered on a
  // collective the caller runs anyway (the trainer's expert-count
  // exchange). The next step looks for replicas only when a priced plan on
  // them places some; otherwise its pairs go home at no cost.
  void forecast_replicas(std::span<const std::int64_t> rank_expert_counts);

  const MoeLayerStats& stats() const;
  const MoeStepStats& last_step_stats() const;

  struct Impl;  // opaque: what outlives the layer's steps (src/moe/moe_layer.cc)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epmoe
