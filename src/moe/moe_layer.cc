#include "moe/moe_layer.h"

#include <utility>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"
#include "kernels/permute.h"
#include "kernels/swiglu.h"

namespace epmoe {

void MoeLayerConfig::validate() const {
  if (hidden < 1) throw ConfigError("hidden=" + std::to_string(hidden) + ": must be at least 1");
  if (ffn < 1) throw ConfigError("ffn=" + std::to_string(ffn) + ": must be at least 1");
  router.validate();
}

// What the backward needs from the forward. The four expert activations are
// the names the remat policy will choose between (save or recompute):
//   x_sorted [M, H]: the expert-sorted input rows (M = N * K),
//   mlpwi_0 / mlpwi_1 [M, F]: x_sorted wi0 and x_sorted wi1,
//   mlpwo [M, H]: the experts' outputs before the routing weights.
// x and the weights are the caller's: they must stay alive and unchanged
// until backward (the usual autograd contract).
struct MoeLayer::Saved {
  const Tensor* x = nullptr;
  MoeWeights weights;
  RouterOutput routing;
  ExpertPermutation permutation;
  Tensor x_sorted;
  Tensor mlpwi_0;
  Tensor mlpwi_1;
  Tensor mlpwo;
};

MoeLayer::MoeLayer(MoeLayerConfig config, MemoryLedger* ledger)
    : config_(std::move(config)), ledger_(ledger), router_((config_.validate(), config_.router)) {}

MoeLayer::~MoeLayer() = default;

namespace {

void check_weights(const MoeLayerConfig& config, const Tensor& x, const MoeWeights& w) {
  const std::int64_t h = config.hidden, f = config.ffn, e = config.router.num_experts;
  EPMOE_CHECK(w.gate && w.wi0 && w.wi1 && w.wo);
  EPMOE_CHECK_EQ(x.rank(), 2);
  EPMOE_CHECK_EQ(x.dim(1), h);
  EPMOE_CHECK(w.gate->shape() == (Shape{h, e}));
  EPMOE_CHECK(w.wi0->shape() == (Shape{e, h, f}));
  EPMOE_CHECK(w.wi1->shape() == (Shape{e, h, f}));
  EPMOE_CHECK(w.wo->shape() == (Shape{e, f, h}));
  if (w.bias != nullptr) EPMOE_CHECK(w.bias->shape() == (Shape{e}));
}

}  // namespace

MoeForwardOutput MoeLayer::forward(const Tensor& x, const MoeWeights& weights) {
  check_weights(config_, x, weights);
  const std::int64_t num_tokens = x.dim(0);
  const std::int64_t hidden = config_.hidden, ffn = config_.ffn;
  const int num_experts = config_.router.num_experts, top_k = config_.router.top_k;
  const std::int64_t num_pairs = num_tokens * top_k;
  const ComputeDType dtype = config_.compute_dtype;
  PhaseTimes& times = stats_.phase_seconds;
  if (ledger_ != nullptr) ledger_->reset_peaks();

  saved_ = std::make_unique<Saved>();
  Saved& s = *saved_;
  s.x = &x;
  s.weights = weights;
  {
    ScopedPhase phase(times, "route");
    s.routing = router_.forward(x, *weights.gate, weights.bias);
  }
  {
    ScopedPhase phase(times, "permute");
    s.permutation = sort_by_expert(s.routing.topk_ids.span<std::int32_t>(), num_experts);
    std::vector<std::int64_t> source_token(static_cast<std::size_t>(num_pairs));
    for (std::int64_t i = 0; i < num_pairs; ++i) source_token[i] = s.permutation.sorted_to_pair[i] / top_k;
    s.x_sorted = Tensor(DType::f32, {num_pairs, hidden}, ledger_, "saved/x_sorted");
    gather_rows(x.data<float>(), source_token, s.x_sorted.data<float>(), hidden);
  }
  stats_.tokens_per_expert = s.permutation.group_sizes;
  {
    ScopedPhase phase(times, "experts");
    const GroupedGemmShape up{s.permutation.group_sizes, hidden, ffn, dtype};
    const GroupedGemmShape down{s.permutation.group_sizes, ffn, hidden, dtype};
    s.mlpwi_0 = Tensor(DType::f32, {num_pairs, ffn}, ledger_, "saved/mlpwi_0");
    s.mlpwi_1 = Tensor(DType::f32, {num_pairs, ffn}, ledger_, "saved/mlpwi_1");
    grouped_gemm_forward(up, s.x_sorted.data<float>(), weights.wi0->data<float>(), s.mlpwi_0.data<float>());
    grouped_gemm_forward(up, s.x_sorted.data<float>(), weights.wi1->data<float>(), s.mlpwi_1.data<float>());
    Tensor activation(DType::f32, {num_pairs, ffn});
    swiglu_forward(s.mlpwi_0.data<float>(), s.mlpwi_1.data<float>(), activation.data<float>(),
                   num_pairs * ffn);
    s.mlpwo = Tensor(DType::f32, {num_pairs, hidden}, ledger_, "saved/mlpwo");
    grouped_gemm_forward(down, activation.data<float>(), weights.wo->data<float>(), s.mlpwo.data<float>());
  }

  MoeForwardOutput out{Tensor(DType::f32, {num_tokens, hidden}), s.routing.topk_ids.clone(),
                       s.routing.topk_weights.clone()};
  {
    ScopedPhase phase(times, "combine");
    // y[t] = sum_k w[t, k] * mlpwo[row of (t, k)], k in order: deterministic.
    const float* expert_out = s.mlpwo.data<float>();
    const float* routing_weights = s.routing.topk_weights.data<float>();
    const std::int64_t* pair_to_sorted = s.permutation.pair_to_sorted.data();
    float* y = out.y.data<float>();
    parallel_for(num_tokens, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        float* y_row = y + t * hidden;
        for (std::int64_t j = 0; j < hidden; ++j) y_row[j] = 0.0f;
        for (int k = 0; k < top_k; ++k) {
          const float w = routing_weights[t * top_k + k];
          const float* o_row = expert_out + pair_to_sorted[t * top_k + k] * hidden;
          for (std::int64_t j = 0; j < hidden; ++j) y_row[j] += w * o_row[j];
        }
      }
    });
  }
  if (ledger_ != nullptr) stats_.saved_activation_peak_bytes = ledger_->total_peak_bytes();
  return out;
}

MoeGradients MoeLayer::backward(const Tensor& dy) {
  EPMOE_CHECK(saved_ != nullptr);  // backward needs a forward first
  std::unique_ptr<Saved> saved = std::move(saved_);
  Saved& s = *saved;
  const Tensor& x = *s.x;
  const std::int64_t num_tokens = x.dim(0);
  const std::int64_t hidden = config_.hidden, ffn = config_.ffn;
  const int num_experts = config_.router.num_experts, top_k = config_.router.top_k;
  const std::int64_t num_pairs = num_tokens * top_k;
  const ComputeDType dtype = config_.compute_dtype;
  EPMOE_CHECK(dy.shape() == x.shape());
  PhaseTimes& times = stats_.phase_seconds;

  MoeGradients grads{Tensor(DType::f32, {num_tokens, hidden}),
                     Tensor(DType::f32, {hidden, std::int64_t{num_experts}}),
                     Tensor(DType::f32, {std::int64_t{num_experts}, hidden, ffn}),
                     Tensor(DType::f32, {std::int64_t{num_experts}, hidden, ffn}),
                     Tensor(DType::f32, {std::int64_t{num_experts}, ffn, hidden})};

  // Combine backward: d(mlpwo)[row of (t,k)] = w[t,k] dy[t], and
  // d(w[t,k]) = <dy[t], mlpwo[row of (t,k)]>.
  Tensor d_expert_out(DType::f32, {num_pairs, hidden});
  Tensor d_topk_weights(DType::f32, {num_tokens, top_k});
  {
    ScopedPhase phase(times, "backward_combine");
    const float* dy_data = dy.data<float>();
    const float* expert_out = s.mlpwo.data<float>();
    const float* routing_weights = s.routing.topk_weights.data<float>();
    const std::int64_t* pair_to_sorted = s.permutation.pair_to_sorted.data();
    float* d_out = d_expert_out.data<float>();
    float* d_w = d_topk_weights.data<float>();
    parallel_for(num_tokens, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const float* dy_row = dy_data + t * hidden;
        for (int k = 0; k < top_k; ++k) {
          const std::int64_t row = pair_to_sorted[t * top_k + k];
          const float w = routing_weights[t * top_k + k];
          const float* o_row = expert_out + row * hidden;
          float* d_row = d_out + row * hidden;
          float dot = 0.0f;
          for (std::int64_t j = 0; j < hidden; ++j) {
            d_row[j] = w * dy_row[j];
            dot += dy_row[j] * o_row[j];
          }
          d_w[t * top_k + k] = dot;
        }
      }
    });
  }

  Tensor dx_sorted(DType::f32, {num_pairs, hidden});
  {
    ScopedPhase phase(times, "backward_experts");
    const GroupedGemmShape up{s.permutation.group_sizes, hidden, ffn, dtype};
    const GroupedGemmShape down{s.permutation.group_sizes, ffn, hidden, dtype};
    Tensor activation(DType::f32, {num_pairs, ffn});
    swiglu_forward(s.mlpwi_0.data<float>(), s.mlpwi_1.data<float>(), activation.data<float>(),
                   num_pairs * ffn);
    grouped_gemm_drhs(down, activation.data<float>(), d_expert_out.data<float>(), grads.dwo.data<float>());
    Tensor d_activation(DType::f32, {num_pairs, ffn});
    grouped_gemm_dlhs(down, d_expert_out.data<float>(), s.weights.wo->data<float>(),
                      d_activation.data<float>());
    Tensor d_h0(DType::f32, {num_pairs, ffn}), d_h1(DType::f32, {num_pairs, ffn});
    swiglu_backward(s.mlpwi_0.data<float>(), s.mlpwi_1.data<float>(), d_activation.data<float>(),
                    d_h0.data<float>(), d_h1.data<float>(), num_pairs * ffn);
    grouped_gemm_drhs(up, s.x_sorted.data<float>(), d_h0.data<float>(), grads.dwi0.data<float>());
    grouped_gemm_drhs(up, s.x_sorted.data<float>(), d_h1.data<float>(), grads.dwi1.data<float>());
    grouped_gemm_dlhs(up, d_h0.data<float>(), s.weights.wi0->data<float>(), dx_sorted.data<float>());
    grouped_gemm_dlhs(up, d_h1.data<float>(), s.weights.wi1->data<float>(), dx_sorted.data<float>(),
                      /*accumulate=*/true);
  }
  {
    // Backward of the K-fold repeat: dx[t] = sum_k dx_sorted[row of (t,k)],
    // k in order (an inverse gather, no scatter-add: deterministic).
    ScopedPhase phase(times, "backward_unpermute");
    const float* dxs = dx_sorted.data<float>();
    const std::int64_t* pair_to_sorted = s.permutation.pair_to_sorted.data();
    float* dx = grads.dx.data<float>();
    parallel_for(num_tokens, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        float* dx_row = dx + t * hidden;
        for (std::int64_t j = 0; j < hidden; ++j) dx_row[j] = 0.0f;
        for (int k = 0; k < top_k; ++k) {
          const float* src = dxs + pair_to_sorted[t * top_k + k] * hidden;
          for (std::int64_t j = 0; j < hidden; ++j) dx_row[j] += src[j];
        }
      }
    });
  }
  {
    ScopedPhase phase(times, "backward_router");
    if (config_.router.kind == RouterKind::random) {
      // The random router never reads the gate: its gradient is exactly zero.
      grads.dgate.fill_zero();
    } else {
      const Tensor d_logits = router_.backward(s.routing, d_topk_weights);
      // dgate = x^T d_logits; dx += d_logits gate^T. fp32 like the router's forward.
      gemm({.a = x.data<float>(), .b = d_logits.data<float>(), .c = grads.dgate.data<float>(),
            .m = hidden, .n = num_experts, .k = num_tokens, .transpose_a = true});
      gemm({.a = d_logits.data<float>(), .b = s.weights.gate->data<float>(),
            .c = grads.dx.data<float>(), .m = num_tokens, .n = hidden, .k = num_experts,
            .transpose_b = true, .accumulate = true});
    }
  }
  return grads;
}

}  // namespace epmoe
