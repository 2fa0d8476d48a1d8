// AdamW (Loshchilov & Hutter: Adam with decoupled weight decay), one
// parameter tensor per call. The trainer calls it for every parameter with
// the same step number; which parameters decay (matrices, not norms'
// scales, by convention) is the caller's choice.
#pragma once

#include <cstdint>
#include <span>

namespace epmoe {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;

  // ConfigError naming the key ("adam_beta1", "adam_beta2", "adam_eps",
  // "weight_decay"), its value and the rule: betas in [0, 1), eps > 0,
  // weight_decay >= 0.
  void validate() const;
};

// With t = step_number (>= 1, counted from the first update) and
// g = grad_multiplier * grad (the multiplier carries global-norm clipping):
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + (decay ? wd * p : 0))
// where the decay term uses p before this update. param, m and v are updated
// in place; all four spans have the same size (m and v start at zero). The
// bias corrections are computed in double, the elementwise update in fp32;
// it is elementwise, so bit-identical for every compute-thread budget.
void adamw_update(const AdamWConfig& config, std::int64_t step_number, double learning_rate, bool decay,
                  float grad_multiplier, std::span<float> param, std::span<const float> grad, std::span<float> m,
                  std::span<float> v);

}  // namespace epmoe
