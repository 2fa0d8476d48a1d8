#include "model/moe_lm.h"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/gemm.h"
#include "model/cross_entropy.h"
#include "model/dense_swiglu.h"
#include "model/embedding.h"
#include "model/rms_norm.h"
#include "moe/load_balance.h"

namespace epmoe {

void MoeLmConfig::validate() const {
  const auto fail = [](const std::string& message) { throw ConfigError(message); };
  if (vocab_size < 2) fail("vocab_size=" + std::to_string(vocab_size) + ": must be >= 2");
  if (num_layers < 1) fail("num_layers=" + std::to_string(num_layers) + ": must be >= 1");
  if (shared_expert_ffn < 0)
    fail("shared_expert_ffn=" + std::to_string(shared_expert_ffn) + ": must be >= 0 (0 = no shared expert)");
  if (!(norm_eps > 0)) fail("norm_eps=" + std::to_string(norm_eps) + ": must be > 0");
  if (!(init_std > 0)) fail("init_std=" + std::to_string(init_std) + ": must be > 0");
  layer.validate();
}

struct MoeLm::LayerParams {
  Parameter* norm = nullptr;
  Parameter* gate = nullptr;
  Parameter *wi0 = nullptr, *wi1 = nullptr, *wo = nullptr;                     // this rank's experts
  Parameter *shared_w0 = nullptr, *shared_w1 = nullptr, *shared_wo = nullptr;  // or null
  Buffer* selection_bias = nullptr;                                            // sigmoid_grouped only
};

// What backward needs from forward, for this rank's N_l tokens.
struct MoeLm::Activations {
  Tensor ids, targets;                   // [N_l] i32
  std::vector<Tensor> h;                 // [L + 1] residual stream [N_l, H]; h[L] enters the final norm
  std::vector<Tensor> inv_rms;           // [L + 1] [N_l]
  std::vector<Tensor> normed;            // [L] layer inputs (the MoE layer keeps a view of them)
  std::vector<MoeStep> steps;            // [L] each MoE layer's step, from its forward to its backward
  std::vector<DenseSwigluSaved> shared;  // [L] when a shared expert exists
  Tensor final_normed;                   // [N_l, H]
  Tensor d_logits;                       // [N_l, V], from the cross-entropy
};

namespace {

// FNV-1a: a stable stream id per parameter name (std::hash is not stable).
std::uint64_t stream_of(const std::string& name) {
  std::uint64_t hash = 1469598103934665603ull;
  for (const char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return hash;
}

void fill_normal(Rng rng, double std_dev, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(std_dev * rng.normal());
}

void add_into(Tensor& target, const Tensor& source) {
  EPMOE_CHECK(target.shape() == source.shape());
  float* t = target.data<float>();
  const float* s = source.data<float>();
  for (std::int64_t i = 0; i < target.numel(); ++i) t[i] += s[i];
}

}  // namespace

MoeLm::MoeLm(MoeLmConfig config, EpGroup& group, MemoryLedger* ledger)
    : config_(std::move(config)), num_ranks_(group.size()), rank_(group.rank()), ledger_(ledger) {
  config_.validate();
  const std::int64_t v = config_.vocab_size, h = config_.layer.hidden, f = config_.layer.ffn;
  const int num_experts = config_.layer.router.num_experts;
  EPMOE_CHECK(num_ranks_ >= 1 && rank_ >= 0 && rank_ < num_ranks_);
  EPMOE_CHECK_EQ(num_experts % num_ranks_, 0);  // validated by EpConfig first
  const std::int64_t local = num_experts / num_ranks_;
  embedding_ = &state_.add("embedding", {v, h}, /*replicated=*/true, /*decay=*/false);
  for (int l = 0; l < config_.num_layers; ++l) {
    const std::string prefix = "layer_" + std::to_string(l) + ".";
    LayerParams p;
    p.norm = &state_.add(prefix + "norm", {h}, true, false);
    p.gate = &state_.add(prefix + "gate", {h, num_experts}, true, true);
    p.wi0 = &state_.add(prefix + "wi0", {local, h, f}, false, true);
    p.wi1 = &state_.add(prefix + "wi1", {local, h, f}, false, true);
    p.wo = &state_.add(prefix + "wo", {local, f, h}, false, true);
    if (config_.shared_expert_ffn > 0) {
      const std::int64_t fs = config_.shared_expert_ffn;
      p.shared_w0 = &state_.add(prefix + "shared_w0", {h, fs}, true, true);
      p.shared_w1 = &state_.add(prefix + "shared_w1", {h, fs}, true, true);
      p.shared_wo = &state_.add(prefix + "shared_wo", {fs, h}, true, true);
    }
    if (config_.layer.router.kind == RouterKind::sigmoid_grouped) {
      p.selection_bias = &state_.add_buffer(prefix + "selection_bias", {num_experts});
    }
    layer_params_.push_back(p);
    MoeLayerConfig layer_config = config_.layer;
    layer_config.label = "moe layer " + std::to_string(l);  // errors inside a step name the layer
    layers_.push_back(std::make_unique<MoeLayer>(layer_config, group, ledger_));
    MoeLayer* layer = layers_.back().get();
    state_.add_state({prefix + "balance_state", [layer] { return layer->balance_state(); },
                      [layer](const std::vector<std::int64_t>& saved) { layer->restore_balance_state(saved); }});
    EPMOE_CHECK_EQ(layers_.back()->num_local_experts(), static_cast<int>(local));
  }
  final_norm_ = &state_.add("final_norm", {h}, true, false);
  head_ = &state_.add("head", {h, v}, true, true);
  initialise();
}

MoeLm::~MoeLm() = default;

Tensor* MoeLm::selection_bias(int l) {
  Buffer* bias = layer_params_.at(static_cast<std::size_t>(l)).selection_bias;
  return bias != nullptr ? &bias->value : nullptr;
}

void MoeLm::initialise() {
  const Rng root(config_.init_seed);
  const std::int64_t local = config_.layer.router.num_experts / num_ranks_;
  for (Parameter& p : state_.parameters()) {
    const bool is_norm = p.name == "final_norm" || p.name.ends_with(".norm");
    if (is_norm) {
      std::fill(p.value.data<float>(), p.value.data<float>() + p.value.numel(), 1.0f);
    } else if (p.replicated) {
      fill_normal(root.fork(stream_of(p.name)), config_.init_std, p.value.data<float>(), p.value.numel());
    } else {
      // Expert e's matrix from stream (name, e), e global: the same values
      // whichever rank holds it.
      const std::int64_t per_expert = p.value.numel() / local;
      for (std::int64_t e = 0; e < local; ++e) {
        const auto global_expert = static_cast<std::uint64_t>(rank_ * local + e);
        fill_normal(root.fork(stream_of(p.name)).fork(global_expert), config_.init_std,
                    p.value.data<float>() + e * per_expert, per_expert);
      }
    }
  }
}

LmForwardResult MoeLm::forward(const Tensor& tokens, std::int64_t global_tokens, std::int64_t step) {
  EPMOE_CHECK(tokens.dtype() == DType::i32 && tokens.rank() == 2 && tokens.dim(1) >= 2);
  const std::int64_t batch = tokens.dim(0), seq = tokens.dim(1) - 1;
  const std::int64_t n = batch * seq, h = config_.layer.hidden, v = config_.vocab_size;
  const int num_layers = config_.num_layers, num_experts = config_.layer.router.num_experts;
  global_tokens_ = global_tokens;
  saved_ = std::make_unique<Activations>();
  Activations& a = *saved_;
  a.ids = Tensor(DType::i32, {n});
  a.targets = Tensor(DType::i32, {n});
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int32_t* row = tokens.data<std::int32_t>() + b * (seq + 1);
    std::copy(row, row + seq, a.ids.data<std::int32_t>() + b * seq);
    std::copy(row + 1, row + 1 + seq, a.targets.data<std::int32_t>() + b * seq);
  }

  // Reserved: each MoE layer keeps a view of its input tensor until backward.
  a.h.reserve(static_cast<std::size_t>(num_layers) + 1);
  a.inv_rms.reserve(static_cast<std::size_t>(num_layers) + 1);
  a.normed.reserve(static_cast<std::size_t>(num_layers));
  LmForwardResult result;
  result.expert_counts.assign(static_cast<std::size_t>(num_layers * num_experts), 0);
  a.h.push_back(Tensor(DType::f32, {n, h}));
  embedding_forward(embedding_->value, a.ids, a.h[0]);
  for (int l = 0; l < num_layers; ++l) {
    LayerParams& p = layer_params_[static_cast<std::size_t>(l)];
    MoeLayer& layer = *layers_[static_cast<std::size_t>(l)];
    a.inv_rms.push_back(Tensor(DType::f32, {n}));
    a.normed.push_back(Tensor(DType::f32, {n, h}));
    rms_norm_forward(a.h[l], p.norm->value, config_.norm_eps, a.normed[l], a.inv_rms[l]);
    const MoeWeights weights{p.gate->value, p.wi0->value, p.wi1->value, p.wo->value,
                             p.selection_bias != nullptr ? p.selection_bias->value.view() : TensorView()};
    // The weights change once per step: the step names their version (from
    // 1: 0 means "no weights held"), so replica slots are refreshed once per
    // step, not once per call. Random routing draws from a stream of (step,
    // layer, rank): a resumed run draws what the uninterrupted one did.
    const MoeStepContext context{
        .weight_version = static_cast<std::uint64_t>(step) + 1,
        .random_router_stream = (static_cast<std::uint64_t>(step) * num_layers + l) * num_ranks_ + rank_};
    a.steps.push_back(layer.begin_forward(a.normed[l], weights, context));
    // The shared expert reads only the layer's input: it runs while the
    // dispatch the layer started moves the tokens.
    Tensor shared_y;
    if (p.shared_w0 != nullptr) {
      shared_y = Tensor(DType::f32, {n, h});
      a.shared.emplace_back();
      dense_swiglu_forward(a.normed[l], p.shared_w0->value, p.shared_w1->value, p.shared_wo->value, shared_y,
                           a.shared.back());
    }
    MoeForwardOutput out = layer.finish_forward(a.steps[static_cast<std::size_t>(l)]);
    const std::vector<std::int64_t> counts = count_expert_assignments(out.topk_ids, num_experts);
    std::copy(counts.begin(), counts.end(), result.expert_counts.begin() + l * num_experts);
    Tensor next = a.h[l].clone();
    add_into(next, out.y);
    if (p.shared_w0 != nullptr) add_into(next, shared_y);
    a.h.push_back(std::move(next));
  }
  a.inv_rms.push_back(Tensor(DType::f32, {n}));
  a.final_normed = Tensor(DType::f32, {n, h});
  rms_norm_forward(a.h[num_layers], final_norm_->value, config_.norm_eps, a.final_normed, a.inv_rms[num_layers]);
  Tensor logits(DType::f32, {n, v});
  gemm({.a = a.final_normed.data<float>(),
        .b = head_->value.data<float>(),
        .c = logits.data<float>(),
        .m = n,
        .n = v,
        .k = h});
  CrossEntropy ce = softmax_cross_entropy(logits, a.targets, 1.0f / static_cast<float>(global_tokens));
  a.d_logits = std::move(ce.d_logits);
  result.loss_sum = ce.loss_sum;
  return result;
}

double MoeLm::backward(const GlobalExpertCounts& global_expert_counts, double aux_loss_coef,
                       const GradientsReady& on_gradients_ready) {
  EPMOE_CHECK(saved_ != nullptr);  // a forward first
  std::unique_ptr<Activations> saved = std::move(saved_);
  Activations& a = *saved;
  const int num_layers = config_.num_layers, num_experts = config_.layer.router.num_experts;
  std::optional<std::span<const std::int64_t>> counts;  // asked for by the first layer that needs them
  const std::int64_t n = a.ids.numel(), h = config_.layer.hidden, v = config_.vocab_size;

  // Head: d(final_normed) = d_logits head^T, d(head) = final_normed^T d_logits.
  Tensor d_final(DType::f32, {n, h});
  gemm({.a = a.d_logits.data<float>(),
        .b = head_->value.data<float>(),
        .c = d_final.data<float>(),
        .m = n,
        .n = h,
        .k = v,
        .transpose_b = true});
  gemm({.a = a.final_normed.data<float>(),
        .b = a.d_logits.data<float>(),
        .c = head_->grad.data<float>(),
        .m = h,
        .n = v,
        .k = n,
        .transpose_a = true});
  Tensor d_h = Tensor::zeros(DType::f32, {n, h});  // d(loss)/d(residual stream)
  rms_norm_backward(a.h[num_layers], final_norm_->value, a.inv_rms[num_layers], d_final, d_h, final_norm_->grad);
  const auto ready = [&](std::initializer_list<Parameter*> done) {
    if (!on_gradients_ready) return;
    std::vector<Parameter*> finished;
    for (Parameter* param : done) {
      if (param != nullptr) finished.push_back(param);
    }
    on_gradients_ready(finished);
  };
  ready({final_norm_, head_});

  double aux_loss = 0;
  for (int l = num_layers - 1; l >= 0; --l) {
    LayerParams& p = layer_params_[static_cast<std::size_t>(l)];
    MoeLayer& layer = *layers_[static_cast<std::size_t>(l)];
    LoadBalanceLossPart balance;
    if (aux_loss_coef > 0) {
      if (!counts) {
        counts = global_expert_counts();
        EPMOE_CHECK_EQ(static_cast<std::int64_t>(counts->size()), static_cast<std::int64_t>(num_layers) * num_experts);
      }
      balance = load_balance_loss(
          config_.layer.router.kind, layer.routing(a.steps[static_cast<std::size_t>(l)]).logits,
          counts->subspan(static_cast<std::size_t>(l * num_experts), static_cast<std::size_t>(num_experts)),
          global_tokens_, config_.layer.router.top_k, aux_loss_coef);
      aux_loss += balance.loss;
    }
    // h_{l+1} = h_l + moe(normed) + shared(normed): d_h reaches both branches unchanged.
    // The shared expert's weight gradients run while the layer's cotangents
    // move; its dx is added after the routed one's, the order of
    // dense_swiglu_backward into the layer's dx.
    MoeStep& moe_step = a.steps[static_cast<std::size_t>(l)];
    layer.begin_backward(moe_step, d_h, aux_loss_coef > 0 ? balance.d_logits.view() : TensorView());
    DenseSwigluInputGrad shared_pending;
    if (p.shared_w0 != nullptr) {
      dense_swiglu_backward_weights(a.normed[l], p.shared_w0->value, p.shared_w1->value, p.shared_wo->value,
                                    a.shared[static_cast<std::size_t>(l)], d_h, p.shared_w0->grad, p.shared_w1->grad,
                                    p.shared_wo->grad, shared_pending);
    }
    MoeGradients g = layer.finish_backward(moe_step);
    Tensor d_normed = std::move(g.dx);
    if (p.shared_w0 != nullptr) {
      dense_swiglu_backward_input(p.shared_w0->value, p.shared_w1->value, shared_pending, d_normed);
    }
    p.gate->grad = std::move(g.dgate);
    p.wi0->grad = std::move(g.dwi0);
    p.wi1->grad = std::move(g.dwi1);
    p.wo->grad = std::move(g.dwo);
    rms_norm_backward(a.h[l], p.norm->value, a.inv_rms[l], d_normed, d_h, p.norm->grad);
    ready({p.norm, p.gate, p.wi0, p.wi1, p.wo, p.shared_w0, p.shared_w1, p.shared_wo});
  }
  embedding_backward(a.ids, d_h, embedding_->grad);
  ready({embedding_});
  return aux_loss;
}

}  // namespace epmoe
