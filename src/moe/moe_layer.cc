// The MoE layer (<epmoe/moe_layer.h>): route -> dispatch (the group's
// dispatcher, through the step's ep::DispatchHandle) -> local experts
// (grouped GEMMs + SwiGLU, weighted into slots, moe/local_experts.h) ->
// combine, chunk by chunk, and the backward in reverse.
//
// Dynamic replicas (ep/replica_exchange.h, owned here): before the
// dispatch the layer plans the step's replicas and maps every (token, k)
// pair to a physical destination (a home expert or a replica slot); the
// experts then compute on E_l home experts + B slots through per-group
// weight pointers: the home experts are the caller's weights as they are
// (no copy), the slots live in the exchange, which receives them
// point-to-point from the experts' home ranks only when a slot's (expert,
// version) changed. The backward writes the home experts' dW straight into
// the result and the slots' into the exchange, which sends each home and
// adds the received ones there: dW of the E_l home experts, exactly as with
// replicas off.
#include <epmoe/moe_layer.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/finite_check.h"
#include "core/timer.h"
#include "ep/dispatcher.h"
#include "ep/replica_exchange.h"
#include "kernels/gemm.h"
#include "moe/layer_checks.h"
#include "moe/local_experts.h"
#include "moe/router.h"
#include "moe/saved_expert_rows.h"

namespace epmoe {

void MoeLayerConfig::validate() const {
  if (hidden < 1) throw ConfigError("hidden=" + std::to_string(hidden) + ": must be at least 1");
  if (ffn < 1) throw ConfigError("ffn=" + std::to_string(ffn) + ": must be at least 1");
  router.validate();
}

namespace {

// Keeps `tensor` (recorded in the ledger) or drops it, as the policy says.
void keep_or_drop(Tensor& tensor, bool keep, MemoryLedger* ledger, const char* name) {
  if (keep) {
    tensor.attribute_to(ledger, std::string("saved/") + name);
  } else {
    tensor = Tensor();
  }
}

// The caller's buffer when given (checked), else a new tensor: the view the
// step writes, and the tensor it returns (empty when the caller's).
MutableTensorView output_view(const MoeLayerConfig& config, const char* name, MutableTensorView given, DType dtype,
                              Shape shape, Tensor& owned) {
  if (given.raw() != nullptr || given.rank() > 0) {
    check_output(config, name, given, dtype, shape);
    return given;
  }
  owned = Tensor(dtype, std::move(shape));
  return owned.mutable_view();
}

void copy_into(MutableTensorView out, const Tensor& from) {
  if (from.size_bytes() > 0) std::memcpy(out.raw(), from.raw(), static_cast<std::size_t>(from.size_bytes()));
}

}  // namespace

// The layer: what outlives its steps.
struct MoeLayer::Impl {
  // The expert weights a check or a cache last saw: (caller's version, buffers).
  struct ExpertWeightsSeen {
    std::optional<std::uint64_t> version;
    const void* wi0 = nullptr;
    const void* wi1 = nullptr;
    const void* wo = nullptr;
    bool operator==(const ExpertWeightsSeen&) const = default;
  };

  Impl(const MoeLayerConfig& layer_config, EpGroup& ep_group, MemoryLedger* memory_ledger)
      : config((layer_config.validate(), layer_config)),
        dispatcher(&ep_group.dispatcher()),
        ledger(memory_ledger),
        router(config.router) {}

  MoeLayerConfig config;
  ep::Dispatcher* dispatcher;  // the group's (not owned; stays put when the group object moves)
  MemoryLedger* ledger;        // not owned; may be null
  Router router;
  std::unique_ptr<ep::ReplicaExchange> replicas;  // balance != off with slots
  LedgerCharge replica_buffers;                   // "buffer/replica slots"
  // "buffer/prepared expert weights": the kernels' per-version forms of this
  // layer's expert weights (bf16 copies, packed layouts, f32 copies off the
  // 32-byte grid for forward products of 32 rows and 256 columns or more,
  // kernels/gemm.h), opened with the first byte so that a layer where
  // nothing is prepared shows no such entry. Re-counted only after the
  // kernels prepared something: counting walks the shared cache under its
  // lock, which every chunk of every step would otherwise pay for nothing.
  LedgerCharge prepared_weights;
  std::int64_t preparations_counted = 0;
  void charge_prepared_weights(const ExpertShape& shape, std::size_t num_groups, const LocalExpertWeights& weights) {
    const std::int64_t preparations = gemm_weight_cache_stats().preparations;
    if (preparations == preparations_counted) return;
    preparations_counted = preparations;
    const std::int64_t bytes = prepared_weight_bytes(shape, num_groups, weights);
    if (bytes > 0 && prepared_weights.bytes() == 0)
      prepared_weights = LedgerCharge(ledger, "buffer/prepared expert weights", 0);
    prepared_weights.resize(bytes);
  }
  MoeLayerStats stats;
  MoeStepStats last_step;
  int steps_in_flight = 0;
  MoeStep own_step;  // forward() / backward()'s
  std::uint64_t auto_version = 0;
  ExpertWeightsSeen finite_weights_seen;
  // LocalExpertWeights::version for the kernels' caches of derived weights
  // (bf16 copies, the [wi0 | wi1] concatenation): a new process-wide value
  // unless the caller's version and buffers are the last forward's.
  ExpertWeightsSeen kernel_weights_seen;
  std::uint64_t kernel_weights_version = 0;

  ExpertShape expert_shape() const {
    return {.hidden = config.hidden,
            .ffn = config.ffn,
            .compute_dtype = config.compute_dtype,
            .fuse_up_projection = config.fuse_up_projection};
  }
  std::uint64_t next_kernel_weights_version(std::optional<std::uint64_t> weight_version, const MoeWeights& weights);
  void record_step_stats(const DispatchStats& dispatch);
};

// What a step holds from its forward to its backward, per chunk: the expert
// rows (x_sorted with its routing metadata) and the expert activations, each
// kept or dropped by the remat policy (a dropped one is an empty value).
// Kept ones are recorded in the ledger under "saved/<name>".
struct MoeStep::State {
  enum class Stage { forward_begun, forward_done, backward_begun };

  explicit State(MoeLayer::Impl& owner) : layer(&owner) { ++layer->steps_in_flight; }
  ~State() { --layer->steps_in_flight; }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  MoeLayer::Impl* layer;  // not owned; outlives the step
  Stage stage = Stage::forward_begun;
  TensorView x;
  TensorView dy;              // from begin_backward
  TensorView extra_d_logits;  // from begin_backward, or empty
  MoeWeights weights;
  ep::DispatchHandle dispatch;        // from begin_forward to finish_backward
  LocalExpertWeights expert_weights;  // the caller's; with replicas, per-group pointers (homes, then slots)
  RouterOutput routing;
  std::vector<std::int32_t> destinations;      // replicas: each pair's physical destination
  std::uint64_t weight_version = 0;            // replicas: the slots' weight version this step
  std::vector<ep::ExpertRows> rows;            // [chunk] the chunk's rows while it computes
  std::vector<SavedExpertRows> saved_rows;     // [chunk] x_sorted kept for the backward
  std::vector<ExpertActivations> activations;  // [chunk]
};

MoeStep::MoeStep() = default;
MoeStep::MoeStep(MoeStep&&) noexcept = default;
MoeStep& MoeStep::operator=(MoeStep&&) noexcept = default;
MoeStep::~MoeStep() = default;
bool MoeStep::active() const { return state_ != nullptr; }

namespace {

constexpr const char* kOrder =
    "the order is begin_forward, finish_forward, begin_backward, finish_backward; forward() and backward() are a "
    "begin and its finish";

// An Error inside a phase abandons the step: its dispatch handle goes
// (cancelling what is in flight while the error unwinds), and the next call
// on it is refused as on an ended step.
class AbandonOnError {
 public:
  explicit AbandonOnError(std::unique_ptr<MoeStep::State>& state) : state_(state) {}
  ~AbandonOnError() {
    if (std::uncaught_exceptions() > entered_) state_.reset();
  }
  AbandonOnError(const AbandonOnError&) = delete;
  AbandonOnError& operator=(const AbandonOnError&) = delete;

 private:
  std::unique_ptr<MoeStep::State>& state_;
  int entered_ = std::uncaught_exceptions();
};

}  // namespace

MoeLayer::MoeLayer(const MoeLayerConfig& config, EpGroup& group, MemoryLedger* ledger)
    : impl_(std::make_unique<Impl>(config, group, ledger)) {
  const EpConfig& ep = group.config();
  const RouterConfig& router = impl_->config.router;
  const auto mismatch = [&](const char* key, std::int64_t layer_value, std::int64_t group_value) {
    throw ConfigError(layer_label(impl_->config) + ": " + key + "=" + std::to_string(layer_value) +
                      " but its EP group has " + key + "=" + std::to_string(group_value) +
                      ": a layer runs on a group made for its shape");
  };
  if (router.num_experts != ep.num_experts) mismatch("num_experts", router.num_experts, ep.num_experts);
  if (router.top_k != ep.top_k) mismatch("top_k", router.top_k, ep.top_k);
  if (impl_->config.hidden != ep.hidden) mismatch("hidden", impl_->config.hidden, ep.hidden);
  if (ep.replicas_enabled()) {
    impl_->replicas = std::make_unique<ep::ReplicaExchange>(
        group.communicator(), ep,
        ep::ReplicaExpertShape{.ffn = impl_->config.ffn, .compute_dtype = impl_->config.compute_dtype});
    impl_->replica_buffers = LedgerCharge(ledger, "buffer/replica slots", 0);
  }
}

MoeLayer::~MoeLayer() = default;
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&&) noexcept = default;

const MoeLayerConfig& MoeLayer::config() const { return impl_->config; }
int MoeLayer::num_local_experts() const { return impl_->dispatcher->num_local_experts(); }
const MoeLayerStats& MoeLayer::stats() const { return impl_->stats; }
const MoeStepStats& MoeLayer::last_step_stats() const { return impl_->last_step; }

std::vector<std::int64_t> MoeLayer::balance_state() const {
  return impl_->replicas != nullptr ? impl_->replicas->planning_state() : std::vector<std::int64_t>{};
}

void MoeLayer::restore_balance_state(const std::vector<std::int64_t>& state) {
  if (state.empty()) return;
  if (impl_->replicas == nullptr) {
    throw ConfigError(
        "the checkpoint holds replica balancing state but this run has no replicas "
        "(balance=off or redundant_slots=0); resume with the checkpoint's balance settings");
  }
  impl_->replicas->restore_planning_state(state);
}

void MoeLayer::forecast_replicas(std::span<const std::int64_t> rank_expert_counts) {
  if (impl_->replicas != nullptr) impl_->replicas->forecast_from(rank_expert_counts);
}

std::uint64_t MoeLayer::Impl::next_kernel_weights_version(std::optional<std::uint64_t> weight_version,
                                                          const MoeWeights& weights) {
  // Process-wide, so that no two layers (nor one layer's weights before and
  // after its buffers were freed and reused) share a version: the kernels'
  // caches are process-wide and keyed by pointer and version.
  static std::atomic<std::uint64_t> next_version{1};
  const ExpertWeightsSeen seen{weight_version, weights.wi0.raw(), weights.wi1.raw(), weights.wo.raw()};
  // A replica slot's buffer holds whichever expert the plan puts there, so
  // with replicas the caller's version does not identify the slots' values.
  const bool reusable = weight_version && seen == kernel_weights_seen && replicas == nullptr;
  if (!reusable) {
    kernel_weights_version = next_version++;
    kernel_weights_seen = seen;
  }
  return kernel_weights_version;
}

// The step's dispatch statistics with the replica exchange's bytes merged
// in: one map holds every byte the layer's step sent.
void MoeLayer::Impl::record_step_stats(const DispatchStats& dispatch) {
  last_step.dispatch = dispatch;
  last_step.replicas = replicas != nullptr ? replicas->stats() : ReplicaStats();
  for (const auto& [name, bytes] : last_step.replicas.bytes_sent) last_step.dispatch.bytes_sent[name] += bytes;
}

namespace {

// The step's stage must be `expected` (UsageError naming the call otherwise).
void expect_stage(const MoeLayer::Impl& layer, const std::unique_ptr<MoeStep::State>& state,
                  MoeStep::State::Stage expected, const char* call) {
  const std::string label = layer_label(layer.config);
  if (state == nullptr) {
    throw UsageError(label + ": " + call + "() on a step that is not under way (never begun, ended by its " +
                     "finish_backward, abandoned by an error, or moved from): begin a new one with begin_forward (" +
                     kOrder + ")");
  }
  if (state->layer != &layer) {
    throw UsageError(label + ": " + call +
                     "() on a step of another layer: a step goes back to the layer that began it");
  }
  if (state->stage == expected) return;
  static constexpr const char* kNext[] = {"finish_forward", "begin_backward (or drop the step)", "finish_backward"};
  throw UsageError(label + ": " + call + "() out of order: the step's next call must be " +
                   kNext[static_cast<int>(state->stage)] + " (" + kOrder + ")");
}

}  // namespace

MoeStep MoeLayer::begin_forward(TensorView x, const MoeWeights& weights, const MoeStepContext& context) {
  const std::optional<std::uint64_t>& weight_version = context.weight_version;
  Impl& layer = *impl_;
  const MoeLayerConfig& config = layer.config;
  if (layer.replicas != nullptr && layer.steps_in_flight > 0) {
    throw UsageError(layer_label(config) +
                     ": begin_forward() while another step of this layer is in flight: with replicas "
                     "(balance=" +
                     to_string(layer.dispatcher->config().balance) +
                     ") the layer's slots hold one step's experts; finish (or drop) that step first");
  }
  check_weights(config, layer.dispatcher->num_local_experts(), x, weights);
  // Before any work or communication, so a refused input leaves the layer
  // (and its peers) as they were.
  check_input(config, "x", x);
  check_input(config, "gate", weights.gate);
  if (!weights.bias.empty()) check_input(config, "bias", weights.bias);
  // The expert weights are most of the bytes; a caller's version vouches for
  // unchanged values (as it does for the replica slots), so a repeated
  // forward on the same version and buffers skips their pass.
  const Impl::ExpertWeightsSeen seen{weight_version, weights.wi0.raw(), weights.wi1.raw(), weights.wo.raw()};
  if (!weight_version || !(seen == layer.finite_weights_seen)) {
    layer.finite_weights_seen = {};
    check_input(config, "wi0", weights.wi0);
    check_input(config, "wi1", weights.wi1);
    check_input(config, "wo", weights.wo);
    layer.finite_weights_seen = seen;
  }
  PhaseTimes& times = layer.stats.phase_seconds;
  if (layer.ledger != nullptr) layer.ledger->reset_peaks();

  MoeStep step;
  step.state_ = std::make_unique<MoeStep::State>(layer);
  MoeStep::State& s = *step.state_;
  s.x = x;
  s.weights = weights;
  {
    ScopedPhase phase(times, "route");
    if (context.random_router_stream) layer.router.set_stream(*context.random_router_stream);
    s.routing = layer.router.forward(x, weights.gate, weights.bias);
    const int num_experts = config.router.num_experts, top_k = config.router.top_k;
    check_produced(config, "router logits", "forward/route", s.routing.logits.span<float>(), at_row(num_experts));
    check_produced(config, "routing weights", "forward/route", s.routing.topk_weights.span<float>(), at_row(top_k));
  }
  const int num_chunks = layer.dispatcher->config().num_chunks;
  s.rows.resize(static_cast<std::size_t>(num_chunks));
  s.saved_rows.resize(static_cast<std::size_t>(num_chunks));
  s.activations.resize(static_cast<std::size_t>(num_chunks));
  s.dispatch = layer.dispatcher->start_step(num_chunks);
  const std::int64_t num_tokens = x.dim(0);
  const int top_k = config.router.top_k;
  const std::span<const std::int32_t> topk_ids = s.routing.topk_ids.span<std::int32_t>();
  const std::int32_t* destinations = topk_ids.data();  // without replicas, the experts themselves
  if (layer.replicas != nullptr) {
    // Every rank plans the same replicas from the all-gathered counts; this
    // rank's pairs then go to the copies the plan gives them.
    ScopedPhase phase(times, "balance");
    // Automatic versions have the top bit set so they never equal a caller's.
    s.weight_version = weight_version ? *weight_version : (std::uint64_t{1} << 63) | ++layer.auto_version;
    layer.replicas->plan_step(topk_ids, s.dispatch.tag_base(), s.weight_version);
    s.destinations.resize(topk_ids.size());
    layer.replicas->destinations(topk_ids, top_k, s.destinations.data());
    destinations = s.destinations.data();
  }
  if (layer.replicas != nullptr) {
    // The slots' weights leave as soon as the plan is known: they move while
    // the tokens are encoded and dispatched and the caller works, until
    // finish_forward.
    ScopedPhase phase(times, "replica_weights");
    layer.replicas->start_slot_weights({weights.wi0, weights.wi1, weights.wo}, s.weight_version, s.dispatch.tag_base());
  }
  s.dispatch.dispatch(x, {destinations, s.routing.topk_weights.data<float>(), num_tokens, top_k});
  s.expert_weights = {weights.wi0.data<float>(), weights.wi1.data<float>(), weights.wo.data<float>()};
  // The kernels keep forms derived from the weights per version: bf16
  // copies, layouts packed for fixed-shape row blocks where oneDNN packs
  // (kernels/grouped_gemm.h, RowBlocking; none for f32 on AVX2), the fused
  // product's concatenation. Charged to the ledger after the experts run.
  s.expert_weights.version = layer.next_kernel_weights_version(weight_version, weights);
  if (ep::ReplicaExchange* replicas = layer.replicas.get()) {
    // The experts compute on per-group pointers: the caller's home weights
    // as they are, the slots' from the exchange's buffers.
    const std::int64_t home = replicas->num_local_experts(), hf = config.hidden * config.ffn;
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
  return step;
}

MoeForwardOutput MoeLayer::finish_forward(MoeStep& step, const MoeForwardBuffers& out) {
  Impl& layer = *impl_;
  expect_stage(layer, step.state_, MoeStep::State::Stage::forward_begun, "finish_forward");
  const MoeLayerConfig& config = layer.config;
  MoeStep::State& s = *step.state_;
  const std::int64_t num_tokens = s.x.dim(0);
  const std::int64_t top_k = config.router.top_k;
  MoeForwardOutput result;
  // The caller's buffers are checked before any work: a wrong one costs nothing.
  const MutableTensorView y = output_view(config, "y", out.y, DType::f32, {num_tokens, config.hidden}, result.y);
  const MutableTensorView topk_ids =
      output_view(config, "topk_ids", out.topk_ids, DType::i32, {num_tokens, top_k}, result.topk_ids);
  const MutableTensorView topk_weights =
      output_view(config, "topk_weights", out.topk_weights, DType::f32, {num_tokens, top_k}, result.topk_weights);
  AbandonOnError abandon(step.state_);
  PhaseTimes& times = layer.stats.phase_seconds;
  const ExpertShape shape = layer.expert_shape();
  const RematPolicy& remat = config.remat;
  if (ep::ReplicaExchange* replicas = layer.replicas.get()) {
    ScopedPhase phase(times, "replica_weights");
    replicas->finish_slot_weights();
  }
  for (int c = 0; c < s.dispatch.num_chunks(); ++c) {
    {
      ScopedPhase phase(times, "dispatch");
      s.rows[c] = s.dispatch.rows(c);
      if (layer.replicas != nullptr) layer.replicas->count_slot_rows(s.rows[c]);
    }
    Tensor slot_outputs;
    {
      ScopedPhase phase(times, "experts");
      slot_outputs = experts_forward(shape, s.rows[c], s.expert_weights, s.activations[c]);
      layer.charge_prepared_weights(shape, s.rows[c].group_sizes.size(), s.expert_weights);
      // mlpwo is per row (so the message names the expert); the weighted
      // slot sums can still overflow on their own.
      check_produced(config, "expert output", "forward/experts", s.activations[c].mlpwo.span<float>(),
                     at_expert_row(s.rows[c], config.hidden, c));
      check_produced(config, "weighted expert output", "forward/experts", slot_outputs.span<float>(),
                     [&config, c](std::int64_t i) {
                       return "slot " + std::to_string(i / config.hidden) + " of chunk " + std::to_string(c);
                     });
    }
    if (remat.save_x_sorted)
      s.saved_rows[c] = SavedExpertRows(std::move(s.rows[c]), config.hidden, config.compute_dtype, layer.ledger);
    s.rows[c] = ep::ExpertRows();
    keep_or_drop(s.activations[c].mlpwi_0, remat.save_mlpwi_0, layer.ledger, "mlpwi_0");
    keep_or_drop(s.activations[c].mlpwi_1, remat.save_mlpwi_1, layer.ledger, "mlpwi_1");
    keep_or_drop(s.activations[c].mlpwo, remat.save_mlpwo, layer.ledger, "mlpwo");
    ScopedPhase phase(times, "combine");
    s.dispatch.combine(c, std::move(slot_outputs));
  }
  {
    ScopedPhase phase(times, "combine");
    s.dispatch.finish_forward(y);
    check_produced(config, "layer output y", "forward/combine", y.span<float>(), at_row(config.hidden));
  }
  copy_into(topk_ids, s.routing.topk_ids);
  copy_into(topk_weights, s.routing.topk_weights);
  if (layer.ledger != nullptr) layer.stats.saved_activation_peak_bytes = layer.ledger->group_peak_bytes("saved");
  if (layer.replicas != nullptr) layer.replica_buffers.resize(layer.replicas->buffer_bytes());
  layer.record_step_stats(s.dispatch.stats());
  s.stage = MoeStep::State::Stage::forward_done;
  return result;
}

const RouterOutput& MoeLayer::routing(const MoeStep& step) const {
  if (step.state_ == nullptr || step.state_->layer != impl_.get() ||
      step.state_->stage == MoeStep::State::Stage::forward_begun) {
    throw UsageError(layer_label(impl_->config) +
                     ": routing() of a step whose forward has not finished (or that ended or is another layer's)");
  }
  return step.state_->routing;
}

void MoeLayer::begin_backward(MoeStep& step, TensorView dy, TensorView extra_d_logits) {
  Impl& layer = *impl_;
  expect_stage(layer, step.state_, MoeStep::State::Stage::forward_done, "begin_backward");
  const MoeLayerConfig& config = layer.config;
  MoeStep::State& s = *step.state_;
  // Before the stage moves on: a refused dy leaves the forward's state for a retry.
  check_data(config, "dy", dy);
  check_data(config, "extra_d_logits", extra_d_logits);
  EPMOE_CHECK(dy.has_shape(s.x.shape()));
  check_layout(config, "dy", dy);
  if (!extra_d_logits.empty()) {
    EPMOE_CHECK((extra_d_logits.has_shape({s.x.dim(0), std::int64_t{config.router.num_experts}})));
    check_layout(config, "extra_d_logits", extra_d_logits);
  }
  check_input(config, "dy", dy);
  if (!extra_d_logits.empty()) check_input(config, "extra_d_logits", extra_d_logits);
  AbandonOnError abandon(step.state_);
  s.dy = dy;
  s.extra_d_logits = extra_d_logits;
  {
    ScopedPhase phase(layer.stats.phase_seconds, "backward_combine");
    s.dispatch.start_backward(dy);
  }
  s.stage = MoeStep::State::Stage::backward_begun;
}

namespace {

// Where the experts' backward writes each group's dW: with replicas, the
// home experts' straight into the result and the slots' into the
// exchange's buffers, which go home after the chunks.
ExpertWeightGradients expert_gradient_targets(const MoeLayerConfig& config, ep::ReplicaExchange& replicas,
                                              const MutableTensorView& dwi0, const MutableTensorView& dwi1,
                                              const MutableTensorView& dwo) {
  ExpertWeightGradients dw;
  const std::int64_t hf = config.hidden * config.ffn;
  for (std::int64_t e = 0; e < replicas.num_local_experts(); ++e) {
    dw.dwi0.push_back(dwi0.data<float>() + e * hf);
    dw.dwi1.push_back(dwi1.data<float>() + e * hf);
    dw.dwo.push_back(dwo.data<float>() + e * hf);
  }
  for (int b = 0; b < replicas.num_slots(); ++b) {
    dw.dwi0.push_back(replicas.slot_gradients(0, b));
    dw.dwi1.push_back(replicas.slot_gradients(1, b));
    dw.dwo.push_back(replicas.slot_gradients(2, b));
  }
  return dw;
}

// The router's part of the backward (moe/router.h): d(topk_weights) ->
// d(logits), plus a caller's extra logit gradient, then dgate and dx's part,
// each checked where it is produced.
void router_backward(const MoeLayerConfig& config, const Router& router, const RouterOutput& routing, TensorView x,
                     TensorView gate, TensorView extra_d_logits, const Tensor& d_topk_weights,
                     const MutableTensorView& dgate, const MutableTensorView& dx) {
  const std::int64_t hidden = config.hidden;
  const int num_experts = config.router.num_experts;
  if (config.router.kind == RouterKind::random) {
    // The random router never reads the gate: its gradient is exactly zero.
    EPMOE_CHECK(extra_d_logits.empty(), "a loss on random logits cannot train anything");
    std::fill_n(dgate.data<float>(), dgate.numel(), 0.0f);
    return;
  }
  Tensor d_logits = router.backward(routing, d_topk_weights);
  check_produced(config, "router logit gradient", "backward/router", d_logits.span<float>(), at_row(num_experts));
  if (!extra_d_logits.empty()) {
    EPMOE_CHECK(extra_d_logits.has_shape(d_logits.shape()));
    float* d = d_logits.data<float>();
    const float* extra = extra_d_logits.data<float>();
    for (std::int64_t i = 0; i < d_logits.numel(); ++i) d[i] += extra[i];
  }
  Router::backward_products(x, gate, d_logits.view(), dgate, dx);
  check_produced(config, "gate gradient dgate", "backward/router", dgate.span<float>(),
                 [&dgate](std::int64_t i) { return index_to_string(dgate.shape(), i); });
  check_produced(config, "input gradient dx", "backward/router", dx.span<float>(), at_row(hidden));
}

}  // namespace

MoeGradients MoeLayer::finish_backward(MoeStep& step, const MoeGradientBuffers& out) {
  Impl& layer = *impl_;
  expect_stage(layer, step.state_, MoeStep::State::Stage::backward_begun, "finish_backward");
  const MoeLayerConfig& config = layer.config;
  const std::int64_t hidden = config.hidden, ffn = config.ffn;
  const std::int64_t num_tokens = step.state_->x.dim(0), num_local = layer.dispatcher->num_local_experts();
  const std::int64_t num_experts = config.router.num_experts;
  MoeGradients grads;
  const MutableTensorView dx = output_view(config, "dx", out.dx, DType::f32, {num_tokens, hidden}, grads.dx);
  const MutableTensorView dgate =
      output_view(config, "dgate", out.dgate, DType::f32, {hidden, num_experts}, grads.dgate);
  const MutableTensorView dwi0 =
      output_view(config, "dwi0", out.dwi0, DType::f32, {num_local, hidden, ffn}, grads.dwi0);
  const MutableTensorView dwi1 =
      output_view(config, "dwi1", out.dwi1, DType::f32, {num_local, hidden, ffn}, grads.dwi1);
  const MutableTensorView dwo = output_view(config, "dwo", out.dwo, DType::f32, {num_local, ffn, hidden}, grads.dwo);
  // The step ends here, whatever happens.
  std::unique_ptr<MoeStep::State> state = std::move(step.state_);
  MoeStep::State& s = *state;
  const std::uint32_t tag_base = s.dispatch.tag_base();  // the replica gradients' tags, after the dispatch ends
  PhaseTimes& times = layer.stats.phase_seconds;
  const ExpertShape shape = layer.expert_shape();
  ep::ReplicaExchange* replicas = layer.replicas.get();
  const ExpertWeightGradients dw =
      replicas != nullptr ? expert_gradient_targets(config, *replicas, dwi0, dwi1, dwo) : ExpertWeightGradients();
  layer.stats.recomputed_bytes = 0;
  for (int c = 0; c < s.dispatch.num_chunks(); ++c) {
    if (config.remat.save_x_sorted) {
      s.rows[c] = s.saved_rows[c].restore();
    } else {
      ScopedPhase phase(times, "backward_remat_dispatch");
      s.rows[c] = s.dispatch.redispatch_rows(c);
      layer.stats.recomputed_bytes += SavedExpertRows::bytes_of(s.rows[c], hidden, config.compute_dtype);
    }
    {
      ScopedPhase phase(times, "backward_remat_experts");
      layer.stats.recomputed_bytes += recompute_activations(shape, s.rows[c], s.expert_weights, s.activations[c]);
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
                         : experts_backward(shape, s.rows[c], s.expert_weights, s.activations[c], slot_dy, dwi0, dwi1,
                                            dwo, /*accumulate=*/c > 0);
      layer.charge_prepared_weights(shape, s.rows[c].group_sizes.size(), s.expert_weights);
      check_produced(config, "expert input gradient", "backward/experts", expert_grads.slot_dx.span<float>(),
                     [c, hidden](std::int64_t i) {
                       return "slot " + std::to_string(i / hidden) + " of chunk " + std::to_string(c);
                     });
      check_produced(config, "routing weight gradient", "backward/experts", expert_grads.row_dweights,
                     at_expert_row(s.rows[c], 1, c));
    }
    // The chunk's saved state is no longer needed.
    s.rows[c] = ep::ExpertRows();
    s.saved_rows[c] = SavedExpertRows();
    s.activations[c] = ExpertActivations();
    ScopedPhase phase(times, "backward_dispatch");
    s.dispatch.return_gradients(c, std::move(expert_grads.slot_dx), std::move(expert_grads.row_dweights));
  }
  if (replicas != nullptr) {
    // Every slot's dW is written: it goes home while dx comes back and the
    // router's backward runs.
    ScopedPhase phase(times, "backward_replica_gradients");
    replicas->start_slot_gradients(tag_base);
  }
  Tensor d_topk_weights(DType::f32, {num_tokens, std::int64_t{config.router.top_k}});
  DispatchStats dispatch_stats;
  {
    ScopedPhase phase(times, "backward_dispatch");
    dispatch_stats = s.dispatch.finish_backward(dx, d_topk_weights.mutable_view());
  }
  check_produced(config, "input gradient dx", "backward/dispatch", dx.span<float>(), at_row(hidden));
  {
    ScopedPhase phase(times, "backward_router");
    router_backward(config, layer.router, s.routing, s.x, s.weights.gate, s.extra_d_logits, d_topk_weights, dgate, dx);
  }
  if (replicas != nullptr) {
    // Last: the router's backward does not need them.
    ScopedPhase phase(times, "backward_replica_gradients");
    replicas->finish_slot_gradients({dwi0.data<float>(), dwi1.data<float>(), dwo.data<float>()});
  }
  check_produced(config, "expert weight gradient dwi0", "backward/experts", dwi0.span<float>(),
                 at_weight_index(dwi0.shape()));
  check_produced(config, "expert weight gradient dwi1", "backward/experts", dwi1.span<float>(),
                 at_weight_index(dwi1.shape()));
  check_produced(config, "expert weight gradient dwo", "backward/experts", dwo.span<float>(),
                 at_weight_index(dwo.shape()));
  if (replicas != nullptr) layer.replica_buffers.resize(replicas->buffer_bytes());
  layer.record_step_stats(dispatch_stats);
  return grads;
}

MoeForwardOutput MoeLayer::forward(TensorView x, const MoeWeights& weights, const MoeStepContext& context,
                                   const MoeForwardBuffers& out) {
  impl_->own_step = MoeStep();  // a forward without its backward (inference) is simply dropped
  // A null buffer is refused before the dispatch starts (finish_forward checks the rest).
  for (const auto& [name, view] : {std::pair{"output buffer y", out.y},
                                   {"output buffer topk_ids", out.topk_ids},
                                   {"output buffer topk_weights", out.topk_weights}}) {
    check_data(impl_->config, name, view);
  }
  impl_->own_step = begin_forward(x, weights, context);
  return finish_forward(impl_->own_step, out);
}

MoeGradients MoeLayer::backward(TensorView dy, TensorView extra_d_logits, const MoeGradientBuffers& out) {
  // A null buffer is refused before the cotangents are sent (finish_backward checks the rest).
  for (const auto& [name, view] : {std::pair{"output buffer dx", out.dx},
                                   {"output buffer dgate", out.dgate},
                                   {"output buffer dwi0", out.dwi0},
                                   {"output buffer dwi1", out.dwi1},
                                   {"output buffer dwo", out.dwo}}) {
    check_data(impl_->config, name, view);
  }
  begin_backward(impl_->own_step, dy, extra_d_logits);
  return finish_backward(impl_->own_step, out);
}

}  // namespace epmoe
