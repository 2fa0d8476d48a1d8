#include "moe/load_balance.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/threading.h"

namespace epmoe {

std::vector<std::int64_t> count_expert_assignments(const Tensor& topk_ids, int num_experts) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_experts), 0);
  for (const std::int32_t id : topk_ids.span<std::int32_t>()) {
    EPMOE_CHECK(id >= 0 && id < num_experts);
    ++counts[static_cast<std::size_t>(id)];
  }
  return counts;
}

void update_selection_bias(std::span<const std::int64_t> global_counts, float rate, Tensor& bias) {
  EPMOE_CHECK_EQ(bias.numel(), static_cast<std::int64_t>(global_counts.size()));
  if (global_counts.empty()) return;
  std::int64_t total = 0;
  for (const std::int64_t c : global_counts) total += c;
  // Compare count * E with the total instead of count with the mean: exact in
  // integers, so every rank takes the same sign.
  const auto num_experts = static_cast<std::int64_t>(global_counts.size());
  float* b = bias.data<float>();
  for (std::size_t e = 0; e < global_counts.size(); ++e) {
    const std::int64_t scaled = global_counts[e] * num_experts;
    if (scaled < total)
      b[e] += rate;  // under-loaded: select it more
    else if (scaled > total)
      b[e] -= rate;  // over-loaded: select it less
  }
}

LoadBalanceLossPart load_balance_loss(RouterKind kind, const Tensor& logits,
                                      std::span<const std::int64_t> global_counts, std::int64_t global_tokens,
                                      int top_k, double coef) {
  EPMOE_CHECK(kind != RouterKind::random);
  const std::int64_t num_tokens = logits.dim(0);
  const std::int64_t num_experts = logits.dim(1);
  EPMOE_CHECK_EQ(static_cast<std::int64_t>(global_counts.size()), num_experts);
  EPMOE_CHECK(global_tokens > 0 && top_k > 0);
  // g_e = dL/dP_e * (1/N) = coef * E * f_e / N: what each token's p_te is worth.
  std::vector<double> g(static_cast<std::size_t>(num_experts));
  for (std::int64_t e = 0; e < num_experts; ++e) {
    const double f = static_cast<double>(global_counts[e]) / (static_cast<double>(global_tokens) * top_k);
    g[e] = coef * static_cast<double>(num_experts) * f / static_cast<double>(global_tokens);
  }
  LoadBalanceLossPart part{0.0, Tensor(DType::f32, {num_tokens, num_experts})};
  std::vector<double> token_loss(static_cast<std::size_t>(num_tokens));
  const float* in = logits.data<float>();
  float* d = part.d_logits.data<float>();
  parallel_for(num_tokens, 64, [&](std::int64_t begin, std::int64_t end) {
    std::vector<double> p(static_cast<std::size_t>(num_experts)), a(static_cast<std::size_t>(num_experts));
    for (std::int64_t t = begin; t < end; ++t) {
      const float* row = in + t * num_experts;
      float* d_row = d + t * num_experts;
      // p and, per expert, the slope a_e of the unnormalised score (exp or sigmoid).
      double sum = 0;
      if (kind == RouterKind::softmax_topk) {
        const double max = *std::max_element(row, row + num_experts);
        for (std::int64_t e = 0; e < num_experts; ++e) sum += (p[e] = std::exp(row[e] - max));
      } else {
        for (std::int64_t e = 0; e < num_experts; ++e) {
          p[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
          a[e] = p[e] * (1.0 - p[e]);  // sigmoid'
          sum += p[e];
        }
      }
      double loss = 0, weighted = 0;  // weighted = sum_e g_e p_e
      for (std::int64_t e = 0; e < num_experts; ++e) {
        p[e] /= sum;
        loss += g[e] * p[e];
      }
      weighted = loss;
      token_loss[t] = loss;
      for (std::int64_t e = 0; e < num_experts; ++e) {
        // softmax: dL/dz_e = p_e (g_e - sum_j g_j p_j);
        // normalised sigmoid: dL/dz_e = s'_e / S (g_e - sum_j g_j p_j).
        const double slope = kind == RouterKind::softmax_topk ? p[e] : a[e] / sum;
        d_row[e] = static_cast<float>(slope * (g[e] - weighted));
      }
    }
  });
  for (const double l : token_loss) part.loss += l;  // token order: the same for any thread count
  return part;
}

}  // namespace epmoe
