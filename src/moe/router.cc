#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/gemm.h"

namespace epmoe {
namespace {

// Writes into `chosen` the indices of the `count` largest scores among
// `candidates`, best first; equal scores order by the lower index.
template <typename Score>
void top_indices(std::span<const Score> scores, std::span<const int> candidates, int count, std::vector<int>& chosen) {
  chosen.assign(candidates.begin(), candidates.end());
  auto better = [&scores](int a, int b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::partial_sort(chosen.begin(), chosen.begin() + count, chosen.end(), better);
  chosen.resize(static_cast<std::size_t>(count));
}

float sigmoid(float z) {
  // Branches keep exp() from overflowing for large |z|.
  if (z >= 0) return 1.0f / (1.0f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.0f + e);
}

}  // namespace

RouterKind parse_router_kind(std::string_view key, std::string_view value) {
  if (value == "softmax_topk") return RouterKind::softmax_topk;
  if (value == "sigmoid_grouped") return RouterKind::sigmoid_grouped;
  if (value == "random") return RouterKind::random;
  throw ConfigError(std::string(key) + "=" + std::string(value) +
                    ": must be one of softmax_topk, sigmoid_grouped, random");
}

std::string to_string(RouterKind kind) {
  switch (kind) {
    case RouterKind::softmax_topk:
      return "softmax_topk";
    case RouterKind::sigmoid_grouped:
      return "sigmoid_grouped";
    case RouterKind::random:
      return "random";
  }
  return "?";
}

void RouterConfig::validate() const {
  auto fail = [](const std::string& message) { throw ConfigError(message); };
  const std::string e = std::to_string(num_experts);
  if (num_experts < 1) fail("num_experts=" + e + ": must be at least 1");
  if (top_k < 1 || top_k > num_experts)
    fail("top_k=" + std::to_string(top_k) + ": must be in [1, num_experts=" + e + "]");
  // Every router honours the group and scaling keys (softmax_topk and random
  // as DeepSeek-V2's group-limited greedy routing), so every router checks them.
  if (n_groups < 1 || num_experts % n_groups != 0)
    fail("n_groups=" + std::to_string(n_groups) + ": must divide num_experts=" + e);
  if (topk_groups < 1 || topk_groups > n_groups)
    fail("topk_groups=" + std::to_string(topk_groups) + ": must be in [1, n_groups=" + std::to_string(n_groups) + "]");
  const int experts_per_group = num_experts / n_groups;
  if (top_k > topk_groups * experts_per_group)
    fail("top_k=" + std::to_string(top_k) +
         ": must be at most topk_groups * num_experts / n_groups = " + std::to_string(topk_groups * experts_per_group));
  // A single group is never scored (every token keeps it), so only real
  // groups need a second expert for the top-2 sum.
  if (kind == RouterKind::sigmoid_grouped && n_groups > 1 && experts_per_group < 2)
    fail("n_groups=" + std::to_string(n_groups) + " with num_experts=" + e +
         ": router=sigmoid_grouped scores a group by the sum of its top-2 experts, so each group needs at "
         "least 2 experts (num_experts / n_groups >= 2)");
  if (!(routed_scaling_factor > 0.0f) || !std::isfinite(routed_scaling_factor))
    fail("routed_scaling_factor=" + std::to_string(routed_scaling_factor) + ": must be a finite number > 0");
}

Router::Router(RouterConfig config) : config_(std::move(config)), rng_(config_.seed) { config_.validate(); }

RouterOutput Router::forward(TensorView x, TensorView gate, TensorView bias) {
  const std::int64_t num_tokens = x.dim(0);
  const std::int64_t hidden = x.dim(1);
  const int num_experts = config_.num_experts;
  const int top_k = config_.top_k;
  EPMOE_CHECK_EQ(gate.dim(0), hidden);
  EPMOE_CHECK_EQ(gate.dim(1), std::int64_t{num_experts});
  if (!bias.empty()) EPMOE_CHECK_EQ(bias.numel(), std::int64_t{num_experts});

  RouterOutput out{Tensor(DType::f32, {num_tokens, num_experts}), Tensor(DType::i32, {num_tokens, top_k}),
                   Tensor(DType::f32, {num_tokens, top_k})};
  float* logits = out.logits.data<float>();
  if (config_.kind == RouterKind::random) {
    // Drawn sequentially so the ids depend only on the seed and the call count.
    for (float& value : out.logits.span<float>()) value = static_cast<float>(rng_.normal());
  } else {
    // Always fp32, whatever compute_dtype says: a bf16 router flips expert
    // choices at near-ties (logit error ~ 2^-7 sqrt(H) here), and the gate
    // GEMM is E columns wide, a small share of the layer's FLOPs
    // (DeepSeek-V3 and Megatron's moe_router_dtype=fp32 make the same call).
    gemm({.a = x.data<float>(),
          .b = gate.data<float>(),
          .c = logits,
          .m = num_tokens,
          .n = num_experts,
          .k = hidden,
          .compute_dtype = ComputeDType::f32});
  }

  const float* bias_data = !bias.empty() ? bias.data<float>() : nullptr;
  std::int32_t* ids = out.topk_ids.data<std::int32_t>();
  float* weights = out.topk_weights.data<float>();
  const RouterConfig& cfg = config_;
  parallel_for(num_tokens, 64, [&](std::int64_t begin, std::int64_t end) {
    std::vector<int> all_experts(static_cast<std::size_t>(num_experts));
    std::iota(all_experts.begin(), all_experts.end(), 0);
    std::vector<int> chosen, chosen_groups, candidates, group_ids;
    std::vector<float> group_max;
    std::vector<float> scores(static_cast<std::size_t>(num_experts));
    std::vector<float> selection(static_cast<std::size_t>(num_experts));
    for (std::int64_t t = begin; t < end; ++t) {
      const float* row = logits + t * num_experts;
      std::int32_t* row_ids = ids + t * top_k;
      float* row_weights = weights + t * top_k;
      if (cfg.kind == RouterKind::sigmoid_grouped) {
        for (int e = 0; e < num_experts; ++e) {
          scores[e] = sigmoid(row[e]);
          selection[e] = scores[e] + (bias_data ? bias_data[e] : 0.0f);
        }
        const int group_size = num_experts / cfg.n_groups;
        std::vector<float> group_scores(static_cast<std::size_t>(cfg.n_groups));
        std::vector<int> group_members(static_cast<std::size_t>(group_size));
        for (int g = 0; g < cfg.n_groups; ++g) {
          std::iota(group_members.begin(), group_members.end(), g * group_size);
          top_indices<float>(selection, group_members, std::min(2, group_size), chosen);
          float sum = 0.0f;
          for (int e : chosen) sum += selection[e];
          group_scores[g] = sum;
        }
        std::vector<int> all_groups(static_cast<std::size_t>(cfg.n_groups));
        std::iota(all_groups.begin(), all_groups.end(), 0);
        top_indices<float>(group_scores, all_groups, cfg.topk_groups, chosen_groups);
        std::sort(chosen_groups.begin(), chosen_groups.end());
        candidates.clear();
        for (int g : chosen_groups)
          for (int e = g * group_size; e < (g + 1) * group_size; ++e) candidates.push_back(e);
        top_indices<float>(selection, candidates, top_k, chosen);
        float sum = 0.0f;
        for (int e : chosen) sum += scores[e];
        for (int k = 0; k < top_k; ++k) {
          const float weight = cfg.norm_topk_prob ? scores[chosen[k]] / sum : scores[chosen[k]];
          row_ids[k] = chosen[k];
          row_weights[k] = weight * cfg.routed_scaling_factor;
        }
      } else {  // softmax_topk and random
        const std::span<const float> row_logits(row, num_experts);
        if (cfg.n_groups > 1) {
          // DeepSeek-V2 group-limited greedy: a group scores its max logit.
          const int group_size = num_experts / cfg.n_groups;
          group_max.resize(static_cast<std::size_t>(cfg.n_groups));
          for (int g = 0; g < cfg.n_groups; ++g)
            group_max[g] = *std::max_element(row + g * group_size, row + (g + 1) * group_size);
          group_ids.resize(static_cast<std::size_t>(cfg.n_groups));
          std::iota(group_ids.begin(), group_ids.end(), 0);
          top_indices<float>(group_max, group_ids, cfg.topk_groups, chosen_groups);
          std::sort(chosen_groups.begin(), chosen_groups.end());
          candidates.clear();
          for (int g : chosen_groups)
            for (int e = g * group_size; e < (g + 1) * group_size; ++e) candidates.push_back(e);
          top_indices<float>(row_logits, candidates, top_k, chosen);
        } else {
          top_indices<float>(row_logits, all_experts, top_k, chosen);
        }
        // Softmax over the K (norm) or over all E, shifted by the max logit,
        // which is chosen[0] either way (its group is always kept).
        const float max_logit = row[chosen[0]];
        float denominator = 0.0f;
        if (cfg.norm_topk_prob) {
          for (int e : chosen) denominator += std::exp(row[e] - max_logit);
        } else {
          for (int e = 0; e < num_experts; ++e) denominator += std::exp(row[e] - max_logit);
        }
        for (int k = 0; k < top_k; ++k) {
          row_ids[k] = chosen[k];
          // x * 1.0f is exact: the default scaling changes no bit.
          row_weights[k] = std::exp(row[chosen[k]] - max_logit) / denominator * cfg.routed_scaling_factor;
        }
      }
    }
  });
  return out;
}

void Router::backward_products(TensorView x, TensorView gate, TensorView d_logits, const MutableTensorView& dgate,
                               const MutableTensorView& dx) {
  const std::int64_t num_tokens = x.dim(0), hidden = x.dim(1), num_experts = gate.dim(1);
  EPMOE_CHECK(d_logits.has_shape({num_tokens, num_experts}));
  EPMOE_CHECK(dgate.has_shape({hidden, num_experts}));
  EPMOE_CHECK(dx.has_shape({num_tokens, hidden}));
  gemm({.a = x.data<float>(),
        .b = d_logits.data<float>(),
        .c = dgate.data<float>(),
        .m = hidden,
        .n = num_experts,
        .k = num_tokens,
        .transpose_a = true});
  gemm({.a = d_logits.data<float>(),
        .b = gate.data<float>(),
        .c = dx.data<float>(),
        .m = num_tokens,
        .n = hidden,
        .k = num_experts,
        .transpose_b = true,
        .accumulate = true});
}

Tensor Router::backward(const RouterOutput& forward_output, const Tensor& d_topk_weights) const {
  const std::int64_t num_tokens = forward_output.logits.dim(0);
  const int num_experts = config_.num_experts;
  const int top_k = config_.top_k;
  EPMOE_CHECK_EQ(d_topk_weights.dim(0), num_tokens);
  EPMOE_CHECK_EQ(d_topk_weights.dim(1), std::int64_t{top_k});

  Tensor d_logits = Tensor::zeros(DType::f32, {num_tokens, num_experts});
  const float* logits = forward_output.logits.data<float>();
  const std::int32_t* ids = forward_output.topk_ids.data<std::int32_t>();
  const float* weights = forward_output.topk_weights.data<float>();
  const float* d_weights = d_topk_weights.data<float>();
  float* d_logits_data = d_logits.data<float>();
  const RouterConfig& cfg = config_;

  parallel_for(num_tokens, 64, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> probabilities(static_cast<std::size_t>(num_experts));
    for (std::int64_t t = begin; t < end; ++t) {
      const float* row = logits + t * num_experts;
      const std::int32_t* row_ids = ids + t * top_k;
      const float* row_weights = weights + t * top_k;
      const float* row_d_weights = d_weights + t * top_k;
      float* row_d_logits = d_logits_data + t * num_experts;
      if (cfg.kind == RouterKind::sigmoid_grouped) {
        // w_k = c * s_k / S (norm) or c * s_k; s = sigmoid(logit).
        // d s_m = c/S * (dw_m - sum_j dw_j w_j / c)   (norm), c * dw_m otherwise.
        const float scale = cfg.routed_scaling_factor;
        float weighted = 0.0f, sum_scores = 0.0f;
        for (int k = 0; k < top_k; ++k) {
          weighted += row_d_weights[k] * row_weights[k];
          sum_scores += sigmoid(row[row_ids[k]]);
        }
        for (int k = 0; k < top_k; ++k) {
          const int e = row_ids[k];
          const float s = sigmoid(row[e]);
          const float d_score = cfg.norm_topk_prob ? scale / sum_scores * (row_d_weights[k] - weighted / scale)
                                                   : scale * row_d_weights[k];
          row_d_logits[e] = d_score * s * (1.0f - s);
        }
      } else if (cfg.norm_topk_prob) {
        // w_k = c p_k, p the softmax over the K chosen logits:
        // dl_k = p_k (dp_k - sum_j p_j dp_j) with dp = c dw. Grouping only
        // selects, so it has no gradient. At c = 1, p = w and dp = dw exactly.
        const float c = cfg.routed_scaling_factor;
        float weighted = 0.0f;
        for (int k = 0; k < top_k; ++k) weighted += (row_weights[k] / c) * (c * row_d_weights[k]);
        for (int k = 0; k < top_k; ++k)
          row_d_logits[row_ids[k]] = (row_weights[k] / c) * (c * row_d_weights[k] - weighted);
      } else {
        // Softmax over all E, K of them kept: dl_e = p_e (dp_e - sum_j p_j dp_j),
        // dp_e = c dw for the chosen experts, 0 for the rest.
        const float c = cfg.routed_scaling_factor;
        float max_logit = row[row_ids[0]];
        float denominator = 0.0f;
        for (int e = 0; e < num_experts; ++e) denominator += std::exp(row[e] - max_logit);
        for (int e = 0; e < num_experts; ++e) probabilities[e] = std::exp(row[e] - max_logit) / denominator;
        float weighted = 0.0f;
        for (int k = 0; k < top_k; ++k) weighted += (row_weights[k] / c) * (c * row_d_weights[k]);
        for (int e = 0; e < num_experts; ++e) row_d_logits[e] = -probabilities[e] * weighted;
        for (int k = 0; k < top_k; ++k) row_d_logits[row_ids[k]] += (row_weights[k] / c) * (c * row_d_weights[k]);
      }
    }
  });
  return d_logits;
}

}  // namespace epmoe
