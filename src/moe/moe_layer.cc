#include "moe/moe_layer.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "core/error.h"
#include "core/finite_check.h"
#include "core/modelled_clock.h"
#include "ep/local_dispatcher.h"
#include "ep/replica_exchange.h"
#include "kernels/gemm.h"
#include "moe/local_experts.h"
#include "moe/saved_expert_rows.h"

namespace epmoe {

void MoeLayerConfig::validate() const {
  if (hidden < 1) throw ConfigError("hidden=" + std::to_string(hidden) + ": must be at least 1");
  if (ffn < 1) throw ConfigError("ffn=" + std::to_string(ffn) + ": must be at least 1");
  router.validate();
}

// What the backward needs from the forward, per chunk: the expert rows
// (x_sorted with its routing metadata) and the expert activations, each kept
// or dropped by the remat policy (a dropped one is an empty value). Kept ones
// are recorded in the ledger under "saved/<name>". x, the weights and the
// routing are the caller's / the router's: x and the weights must stay alive
// and unchanged until backward (the usual autograd contract).
struct MoeLayer::Saved {
  TensorView x;
  TensorView dy;              // from begin_backward
  TensorView extra_d_logits;  // from begin_backward, or empty
  MoeWeights weights;
  ep::DispatchHandle dispatch;        // the step's dispatch, from begin_forward to finish_backward
  LocalExpertWeights expert_weights;  // the caller's; with replicas, per-group pointers (homes, then slots)
  RouterOutput routing;
  std::vector<ep::ExpertRows> rows;            // [chunk] the chunk's rows while it computes
  std::vector<SavedExpertRows> saved_rows;     // [chunk] x_sorted kept for the backward
  std::vector<ExpertActivations> activations;  // [chunk]
};

namespace {

// Keeps `tensor` (recorded in the ledger) or drops it, as the policy says.
void keep_or_drop(Tensor& tensor, bool keep, MemoryLedger* ledger, const char* name) {
  if (keep) {
    tensor.attribute_to(ledger, std::string("saved/") + name);
  } else {
    tensor = Tensor();
  }
}

}  // namespace

MoeLayer::MoeLayer(MoeLayerConfig config, MemoryLedger* ledger)
    : MoeLayer(config, std::make_unique<ep::LocalDispatcher>(config.router.num_experts, 1), ledger) {}

MoeLayer::MoeLayer(MoeLayerConfig config, std::unique_ptr<ep::Dispatcher> dispatcher, MemoryLedger* ledger)
    : config_(std::move(config)),
      ledger_(ledger),
      router_((config_.validate(), config_.router)),
      dispatcher_(std::move(dispatcher)) {
  EPMOE_CHECK(dispatcher_ != nullptr);
  dispatcher_->charge_buffers_to(ledger_);
}

MoeLayer::~MoeLayer() = default;

namespace {

std::string layer_label(const MoeLayerConfig& config) {
  return config.label.empty() ? std::string("moe layer") : config.label;
}

// An input the layer reads in place: f32 (InternalError otherwise, as for a
// shape) and C-contiguous (UsageError naming it: a caller's strided view).
void check_layout(const MoeLayerConfig& config, std::string_view name, TensorView tensor) {
  EPMOE_CHECK(tensor.dtype() == DType::f32);
  tensor.require_contiguous(layer_label(config) + ": " + std::string(name));
}

void check_weights(const MoeLayerConfig& config, int num_local_experts, TensorView x, const MoeWeights& w) {
  const std::int64_t h = config.hidden, f = config.ffn, e = config.router.num_experts;
  const std::int64_t el = num_local_experts;
  EPMOE_CHECK(w.gate.raw() && w.wi0.raw() && w.wi1.raw() && w.wo.raw());
  EPMOE_CHECK_EQ(x.rank(), 2);
  EPMOE_CHECK_EQ(x.dim(1), h);
  EPMOE_CHECK((w.gate.has_shape({h, e})));
  EPMOE_CHECK((w.wi0.has_shape({el, h, f})));
  EPMOE_CHECK((w.wi1.has_shape({el, h, f})));
  EPMOE_CHECK((w.wo.has_shape({el, f, h})));
  if (!w.bias.empty()) EPMOE_CHECK((w.bias.has_shape({e})));
  check_layout(config, "x", x);
  check_layout(config, "gate", w.gate);
  check_layout(config, "wi0", w.wi0);
  check_layout(config, "wi1", w.wi1);
  check_layout(config, "wo", w.wo);
  if (!w.bias.empty()) check_layout(config, "bias", w.bias);
}

// An input of the layer: refused with its name and first bad index.
void check_input(const MoeLayerConfig& config, std::string_view name, TensorView tensor) {
  check_finite(layer_label(config) + ": " + std::string(name), tensor);
}

// A value the step produced. `where(index)` turns the flat index of the first
// bad element into words ("row 5 of chunk 0 (local expert 2)").
template <typename Where>
void check_produced(const MoeLayerConfig& config, std::string_view what, std::string_view phase,
                    std::span<const float> values, Where where) {
  const std::int64_t index = find_non_finite(values);
  if (index < 0) return;
  throw NumericError(layer_label(config) + ": non-finite value in " + std::string(what) + " (" + std::string(phase) +
                     ") at " + where(index) + ": " + value_to_string(values[index]));
}

// Rows of a [rows, width] tensor.
auto at_row(std::int64_t width) {
  return [width](std::int64_t index) { return "row " + std::to_string(index / width); };
}

// Rows of one chunk's expert rows, with the local expert each belongs to.
auto at_expert_row(const ep::ExpertRows& rows, std::int64_t width, int chunk) {
  return [&rows, width, chunk](std::int64_t index) {
    const std::int64_t row = index / width;
    std::int64_t expert = 0, end = 0;
    while (expert < static_cast<std::int64_t>(rows.group_sizes.size()) && row >= end + rows.group_sizes[expert])
      end += rows.group_sizes[expert++];
    return "row " + std::to_string(row) + " of chunk " + std::to_string(chunk) + " (local expert " +
           std::to_string(expert) + ")";
  };
}

// An index of a weight-shaped tensor [E_l, a, b].
auto at_weight_index(const Tensor& tensor) {
  return [&tensor](std::int64_t index) {
    return index_to_string(tensor.shape(), index) + " (local expert " +
           std::to_string(index / (tensor.dim(1) * tensor.dim(2))) + ")";
  };
}

LocalExpertWeights expert_weights(const MoeWeights& w) {
  return {w.wi0.data<float>(), w.wi1.data<float>(), w.wo.data<float>()};
}

}  // namespace

void MoeLayer::expect_stage(Stage expected, const char* call) const {
  if (stage_ == expected || (expected == Stage::idle && stage_ == Stage::forward_done)) return;
  static constexpr const char* kNext[] = {"begin_forward (or forward)", "finish_forward",
                                          "begin_backward (or backward), or a new begin_forward", "finish_backward"};
  throw UsageError(layer_label(config_) + ": " + call + "() out of order: the next call must be " +
                   kNext[static_cast<int>(stage_)] +
                   " (the order is begin_forward, finish_forward, begin_backward, finish_backward; "
                   "forward() and backward() are a begin and its finish)");
}

MoeForwardOutput MoeLayer::forward(TensorView x, const MoeWeights& weights,
                                   std::optional<std::uint64_t> weight_version) {
  begin_forward(x, weights, weight_version);
  return finish_forward();
}

MoeGradients MoeLayer::backward(TensorView dy, TensorView extra_d_logits) {
  begin_backward(dy, extra_d_logits);
  return finish_backward();
}

std::uint64_t MoeLayer::kernel_weights_version(std::optional<std::uint64_t> weight_version, const MoeWeights& weights) {
  // Process-wide, so that no two layers (nor one layer's weights before and
  // after its buffers were freed and reused) share a version: the kernels'
  // caches are process-wide and keyed by pointer and version.
  static std::atomic<std::uint64_t> next_version{1};
  const ExpertWeightsSeen seen{weight_version, weights.wi0.raw(), weights.wi1.raw(), weights.wo.raw()};
  // A replica slot's buffer holds whichever expert the plan puts there, so
  // with replicas the caller's version does not identify the slots' values.
  const bool reusable = weight_version && seen == kernel_weights_seen_ && dispatcher_->replicas() == nullptr;
  if (!reusable) {
    kernel_weights_version_ = next_version++;
    kernel_weights_seen_ = seen;
  }
  return kernel_weights_version_;
}

void MoeLayer::begin_forward(TensorView x, const MoeWeights& weights, std::optional<std::uint64_t> weight_version) {
  expect_stage(Stage::idle, "begin_forward");
  check_weights(config_, dispatcher_->num_local_experts(), x, weights);
  // Before any work or communication, so a refused input leaves the layer
  // (and its peers) as they were.
  check_input(config_, "x", x);
  check_input(config_, "gate", weights.gate);
  if (!weights.bias.empty()) check_input(config_, "bias", weights.bias);
  // The expert weights are most of the bytes; a caller's version vouches for
  // unchanged values (as it does for the replica slots), so a repeated
  // forward on the same version and buffers skips their pass.
  const ExpertWeightsSeen seen{weight_version, weights.wi0.raw(), weights.wi1.raw(), weights.wo.raw()};
  if (!weight_version || !(seen == finite_weights_seen_)) {
    finite_weights_seen_ = {};
    check_input(config_, "wi0", weights.wi0);
    check_input(config_, "wi1", weights.wi1);
    check_input(config_, "wo", weights.wo);
    finite_weights_seen_ = seen;
  }
  PhaseTimes& times = stats_.phase_seconds;
  saved_.reset();        // a forward without its backward (inference) is simply dropped
  stage_ = Stage::idle;  // until the begin completes: an error abandons the step
  if (ledger_ != nullptr) ledger_->reset_peaks();

  saved_ = std::make_unique<Saved>();
  Saved& s = *saved_;
  s.x = x;
  s.weights = weights;
  {
    ScopedPhase phase(times, "route");
    s.routing = router_.forward(x, weights.gate, weights.bias);
    const int num_experts = config_.router.num_experts, top_k = config_.router.top_k;
    check_produced(config_, "router logits", "forward/route", s.routing.logits.span<float>(), at_row(num_experts));
    check_produced(config_, "routing weights", "forward/route", s.routing.topk_weights.span<float>(), at_row(top_k));
  }
  const int num_chunks = dispatcher_->num_chunks();
  s.rows.resize(static_cast<std::size_t>(num_chunks));
  s.saved_rows.resize(static_cast<std::size_t>(num_chunks));
  s.activations.resize(static_cast<std::size_t>(num_chunks));
  s.dispatch = dispatcher_->dispatch(x, {s.routing.topk_ids.data<std::int32_t>(), s.routing.topk_weights.data<float>(),
                                         x.dim(0), config_.router.top_k});
  s.expert_weights = expert_weights(weights);
  // Only the opt-in fused product needs a version (its concatenation is
  // keyed by it); unfused, the kernels see no version, as before it.
  if (config_.fuse_up_projection) s.expert_weights.version = kernel_weights_version(weight_version, weights);
  if (ep::ReplicaExchange* replicas = dispatcher_->replicas()) {
    // The slots' weights move while the caller works until finish_forward;
    // the experts compute on per-group pointers: the caller's home weights
    // as they are, the slots' from the exchange's buffers.
    ScopedPhase phase(times, "replica_weights");
    // Automatic versions have the top bit set so they never equal a caller's.
    const std::uint64_t version = weight_version ? *weight_version : (std::uint64_t{1} << 63) | ++auto_version_;
    replicas->start_slot_weights({weights.wi0, weights.wi1, weights.wo}, version);
    const std::int64_t home = replicas->num_local_experts(), hf = config_.hidden * config_.ffn;
    LocalExpertWeights& w = s.expert_weights;
    for (std::int64_t e = 0; e < home; ++e) {
      w.wi0_groups.push_back(w.wi0 + e * hf);
      w.wi1_groups.push_back(w.wi1 + e * hf);
      w.wo_groups.push_back(w.wo + e * hf);
    }
    for (int b = 0; b < replicas->num_slots(); ++b) {
      w.wi0_groups.push_back(replicas->slot_weights(0, b));
      w.wi1_groups.push_back(replicas->slot_weights(1, b));
      w.wo_groups.push_back(replicas->slot_weights(2, b));
    }
  }
  stage_ = Stage::forward_begun;
}

MoeForwardOutput MoeLayer::finish_forward() {
  expect_stage(Stage::forward_begun, "finish_forward");
  stage_ = Stage::idle;  // until the finish completes
  Saved& s = *saved_;
  PhaseTimes& times = stats_.phase_seconds;
  const ExpertShape shape{.hidden = config_.hidden,
                          .ffn = config_.ffn,
                          .compute_dtype = config_.compute_dtype,
                          .fuse_up_projection = config_.fuse_up_projection};
  const RematPolicy& remat = config_.remat;
  const int num_chunks = dispatcher_->num_chunks();
  if (ep::ReplicaExchange* replicas = dispatcher_->replicas()) {
    ScopedPhase phase(times, "replica_weights");
    replicas->finish_slot_weights();
  }
  for (int c = 0; c < num_chunks; ++c) {
    {
      ScopedPhase phase(times, "dispatch");
      s.rows[c] = s.dispatch.rows(c);
    }
    Tensor slot_outputs;
    {
      ScopedPhase phase(times, "experts");
      slot_outputs = experts_forward(shape, s.rows[c], s.expert_weights, s.activations[c]);
      // mlpwo is per row (so the message names the expert); the weighted
      // slot sums can still overflow on their own.
      check_produced(config_, "expert output", "forward/experts", s.activations[c].mlpwo.span<float>(),
                     at_expert_row(s.rows[c], config_.hidden, c));
      check_produced(config_, "weighted expert output", "forward/experts", slot_outputs.span<float>(),
                     [this, c](std::int64_t i) {
                       return "slot " + std::to_string(i / config_.hidden) + " of chunk " + std::to_string(c);
                     });
    }
    if (remat.save_x_sorted)
      s.saved_rows[c] = SavedExpertRows(std::move(s.rows[c]), config_.hidden, config_.compute_dtype, ledger_);
    s.rows[c] = ep::ExpertRows();
    keep_or_drop(s.activations[c].mlpwi_0, remat.save_mlpwi_0, ledger_, "mlpwi_0");
    keep_or_drop(s.activations[c].mlpwi_1, remat.save_mlpwi_1, ledger_, "mlpwi_1");
    keep_or_drop(s.activations[c].mlpwo, remat.save_mlpwo, ledger_, "mlpwo");
    ScopedPhase phase(times, "combine");
    s.dispatch.combine(c, std::move(slot_outputs));
  }
  MoeForwardOutput out;
  {
    ScopedPhase phase(times, "combine");
    out.y = s.dispatch.finish_forward();
    check_produced(config_, "layer output y", "forward/combine", out.y.span<float>(), at_row(config_.hidden));
  }
  out.topk_ids = s.routing.topk_ids.clone();
  out.topk_weights = s.routing.topk_weights.clone();
  if (ledger_ != nullptr) stats_.saved_activation_peak_bytes = ledger_->group_peak_bytes("saved");
  stage_ = Stage::forward_done;
  return out;
}

const ep::ReplicaStats& MoeLayer::replica_stats() const {
  static const ep::ReplicaStats kNoReplicas;
  const ep::ReplicaExchange* replicas = dispatcher_->replicas();
  return replicas != nullptr ? replicas->stats() : kNoReplicas;
}

std::vector<std::int64_t> MoeLayer::balance_state() const {
  const ep::ReplicaExchange* replicas = dispatcher_->replicas();
  return replicas != nullptr ? replicas->planning_state() : std::vector<std::int64_t>{};
}

void MoeLayer::restore_balance_state(const std::vector<std::int64_t>& state) {
  if (state.empty()) return;
  ep::ReplicaExchange* replicas = dispatcher_->replicas();
  if (replicas == nullptr) {
    throw ConfigError(
        "the checkpoint holds replica balancing state but this run has no replicas "
        "(balance=off or redundant_slots=0); resume with the checkpoint's balance settings");
  }
  replicas->restore_planning_state(state);
}

const RouterOutput& MoeLayer::last_routing() const {
  EPMOE_CHECK(saved_ != nullptr, "the activations are saved between a forward and its backward only");
  return saved_->routing;
}

void MoeLayer::begin_backward(TensorView dy, TensorView extra_d_logits) {
  expect_stage(Stage::forward_done, "begin_backward");
  // Before the stage moves on: a refused dy leaves the forward's state for a retry.
  EPMOE_CHECK(dy.has_shape(saved_->x.shape()));
  check_layout(config_, "dy", dy);
  if (!extra_d_logits.empty()) {
    EPMOE_CHECK((extra_d_logits.has_shape({saved_->x.dim(0), std::int64_t{config_.router.num_experts}})));
    check_layout(config_, "extra_d_logits", extra_d_logits);
  }
  check_input(config_, "dy", dy);
  if (!extra_d_logits.empty()) check_input(config_, "extra_d_logits", extra_d_logits);
  stage_ = Stage::idle;  // until the begin completes
  saved_->dy = dy;
  saved_->extra_d_logits = extra_d_logits;
  {
    ScopedPhase phase(stats_.phase_seconds, "backward_combine");
    saved_->dispatch.start_backward(dy);
  }
  stage_ = Stage::backward_begun;
}

MoeGradients MoeLayer::finish_backward() {
  expect_stage(Stage::backward_begun, "finish_backward");
  stage_ = Stage::idle;  // the step ends here, whatever happens
  std::unique_ptr<Saved> saved = std::move(saved_);
  Saved& s = *saved;
  const TensorView extra_d_logits = s.extra_d_logits;
  const TensorView x = s.x;
  const std::int64_t num_tokens = x.dim(0);
  const std::int64_t hidden = config_.hidden, ffn = config_.ffn;
  const int num_experts = config_.router.num_experts;
  const std::int64_t num_local = dispatcher_->num_local_experts();
  PhaseTimes& times = stats_.phase_seconds;
  const ExpertShape shape{.hidden = hidden,
                          .ffn = ffn,
                          .compute_dtype = config_.compute_dtype,
                          .fuse_up_projection = config_.fuse_up_projection};

  MoeGradients grads{Tensor(), Tensor(DType::f32, {hidden, std::int64_t{num_experts}}),
                     Tensor(DType::f32, {num_local, hidden, ffn}), Tensor(DType::f32, {num_local, hidden, ffn}),
                     Tensor(DType::f32, {num_local, ffn, hidden})};
  // With replicas the experts' dW covers E_l + B groups: the home experts'
  // straight into grads, the slots' into the exchange's buffers, which go
  // home after the loop.
  ep::ReplicaExchange* replicas = dispatcher_->replicas();
  ExpertWeightGradients dw;
  if (replicas != nullptr) {
    const std::int64_t hf = hidden * ffn;
    for (std::int64_t e = 0; e < num_local; ++e) {
      dw.dwi0.push_back(grads.dwi0.data<float>() + e * hf);
      dw.dwi1.push_back(grads.dwi1.data<float>() + e * hf);
      dw.dwo.push_back(grads.dwo.data<float>() + e * hf);
    }
    for (int b = 0; b < replicas->num_slots(); ++b) {
      dw.dwi0.push_back(replicas->slot_gradients(0, b));
      dw.dwi1.push_back(replicas->slot_gradients(1, b));
      dw.dwo.push_back(replicas->slot_gradients(2, b));
    }
  }
  stats_.recomputed_bytes = 0;
  for (int c = 0; c < dispatcher_->num_chunks(); ++c) {
    if (config_.remat.save_x_sorted) {
      s.rows[c] = s.saved_rows[c].restore();
    } else {
      ScopedPhase phase(times, "backward_remat_dispatch");
      s.rows[c] = s.dispatch.redispatch_rows(c);
      stats_.recomputed_bytes += SavedExpertRows::bytes_of(s.rows[c], config_.hidden, config_.compute_dtype);
    }
    {
      ScopedPhase phase(times, "backward_remat_experts");
      stats_.recomputed_bytes += recompute_activations(shape, s.rows[c], s.expert_weights, s.activations[c]);
    }
    Tensor slot_dy;
    {
      ScopedPhase phase(times, "backward_combine");
      slot_dy = s.dispatch.cotangents(c);
    }
    ExpertGradients expert_grads;
    {
      ScopedPhase phase(times, "backward_experts");
      expert_grads = replicas != nullptr
                         ? experts_backward(shape, s.rows[c], s.expert_weights, s.activations[c], slot_dy, dw,
                                            /*accumulate=*/c > 0)
                         : experts_backward(shape, s.rows[c], s.expert_weights, s.activations[c], slot_dy, grads.dwi0,
                                            grads.dwi1, grads.dwo, /*accumulate=*/c > 0);
      check_produced(config_, "expert input gradient", "backward/experts", expert_grads.slot_dx.span<float>(),
                     [c, hidden](std::int64_t i) {
                       return "slot " + std::to_string(i / hidden) + " of chunk " + std::to_string(c);
                     });
      check_produced(config_, "routing weight gradient", "backward/experts", expert_grads.row_dweights,
                     at_expert_row(s.rows[c], 1, c));
    }
    // The chunk's saved state is no longer needed.
    s.rows[c] = ep::ExpertRows();
    s.saved_rows[c] = SavedExpertRows();
    s.activations[c] = ExpertActivations();
    ScopedPhase phase(times, "backward_dispatch");
    s.dispatch.return_gradients(c, std::move(expert_grads.slot_dx), std::move(expert_grads.row_dweights));
  }
  ep::DispatchGradients routed;
  {
    ScopedPhase phase(times, "backward_dispatch");
    routed = s.dispatch.finish_backward();
  }
  grads.dx = std::move(routed.dx);
  check_produced(config_, "input gradient dx", "backward/dispatch", grads.dx.span<float>(), at_row(hidden));
  if (replicas != nullptr) {
    ScopedPhase phase(times, "backward_replica_gradients");
    replicas->reduce_slot_gradients({grads.dwi0.data<float>(), grads.dwi1.data<float>(), grads.dwo.data<float>()});
  }
  {
    ScopedPhase phase(times, "backward_router");
    if (config_.router.kind == RouterKind::random) {
      // The random router never reads the gate: its gradient is exactly zero.
      EPMOE_CHECK(extra_d_logits.empty(), "a loss on random logits cannot train anything");
      grads.dgate.fill_zero();
    } else {
      Tensor d_logits = router_.backward(s.routing, routed.d_topk_weights);
      check_produced(config_, "router logit gradient", "backward/router", d_logits.span<float>(), at_row(num_experts));
      if (!extra_d_logits.empty()) {
        EPMOE_CHECK(extra_d_logits.has_shape(d_logits.shape()));
        float* d = d_logits.data<float>();
        const float* extra = extra_d_logits.data<float>();
        for (std::int64_t i = 0; i < d_logits.numel(); ++i) d[i] += extra[i];
      }
      // dgate = x^T d_logits; dx += d_logits gate^T. fp32 like the router's forward.
      gemm({.a = x.data<float>(),
            .b = d_logits.data<float>(),
            .c = grads.dgate.data<float>(),
            .m = hidden,
            .n = num_experts,
            .k = num_tokens,
            .transpose_a = true});
      gemm({.a = d_logits.data<float>(),
            .b = s.weights.gate.data<float>(),
            .c = grads.dx.data<float>(),
            .m = num_tokens,
            .n = hidden,
            .k = num_experts,
            .transpose_b = true,
            .accumulate = true});
      check_produced(config_, "gate gradient dgate", "backward/router", grads.dgate.span<float>(),
                     [&grads](std::int64_t i) { return index_to_string(grads.dgate.shape(), i); });
      check_produced(config_, "input gradient dx", "backward/router", grads.dx.span<float>(), at_row(hidden));
    }
  }
  check_produced(config_, "expert weight gradient dwi0", "backward/experts", grads.dwi0.span<float>(),
                 at_weight_index(grads.dwi0));
  check_produced(config_, "expert weight gradient dwi1", "backward/experts", grads.dwi1.span<float>(),
                 at_weight_index(grads.dwi1));
  check_produced(config_, "expert weight gradient dwo", "backward/experts", grads.dwo.span<float>(),
                 at_weight_index(grads.dwo));
  return grads;
}

}  // namespace epmoe
