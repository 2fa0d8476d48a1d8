// AdamW update and its config validation.
#include "model/adamw.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/threading.h"

namespace epmoe {
namespace {

// Threads take whole blocks at fixed offsets, so an element always sits at
// the same place in the vectorised loop (vector body or remainder, which may
// round differently once the compiler fuses multiply-adds) for any thread
// count.
constexpr std::int64_t kBlock = 1024;

[[noreturn]] void bad_value(const char* key, double value, const char* rule) {
  std::ostringstream msg;
  msg << key << "=" << value << ": " << rule;
  throw ConfigError(msg.str());
}

}  // namespace

// Written as !(ok) so that NaN fails every rule.
void AdamWConfig::validate() const {
  if (!(beta1 >= 0.0 && beta1 < 1.0)) bad_value("adam_beta1", beta1, "must be in [0, 1)");
  if (!(beta2 >= 0.0 && beta2 < 1.0)) bad_value("adam_beta2", beta2, "must be in [0, 1)");
  if (!(eps > 0.0 && std::isfinite(eps))) bad_value("adam_eps", eps, "must be > 0 and finite");
  if (!(weight_decay >= 0.0 && std::isfinite(weight_decay)))
    bad_value("weight_decay", weight_decay, "must be >= 0 and finite");
}

void adamw_update(const AdamWConfig& config, std::int64_t step_number, double learning_rate, bool decay,
                  float grad_multiplier, std::span<float> param, std::span<const float> grad, std::span<float> m,
                  std::span<float> v) {
  EPMOE_CHECK_GE(step_number, 1);
  EPMOE_CHECK_EQ(grad.size(), param.size());
  EPMOE_CHECK_EQ(m.size(), param.size());
  EPMOE_CHECK_EQ(v.size(), param.size());
  // Reads param, grad, m, v and writes param, m, v: 7 words per element.
  const ComputeScope charge("adamw", {.flops = 12.0 * param.size(), .bytes = 28.0 * param.size()});
  // 1 - b^t cancels: in fp32 the rounding of b (up to 6e-8 relative) would
  // grow by b / (1 - b^t), 1000x for beta2 = 0.999 at t = 1. So the
  // corrections are formed in double and only their reciprocals rounded.
  const double t = static_cast<double>(step_number);
  const float inv_correction1 = static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, t)));
  const float inv_correction2 = static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, t)));
  const float b1 = static_cast<float>(config.beta1), b2 = static_cast<float>(config.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - config.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - config.beta2);
  const float eps = static_cast<float>(config.eps);
  const float lr = static_cast<float>(learning_rate);
  const float wd = decay ? static_cast<float>(config.weight_decay) : 0.0f;
  float* p = param.data();
  const float* g_in = grad.data();
  float* mp = m.data();
  float* vp = v.data();
  const auto size = static_cast<std::int64_t>(param.size());
  const std::int64_t num_blocks = (size + kBlock - 1) / kBlock;
  parallel_for(num_blocks, kElementwiseGrain / kBlock, [=](std::int64_t first, std::int64_t last) {
    for (std::int64_t block = first; block < last; ++block) {
      const std::int64_t begin = block * kBlock;
      const std::int64_t end = std::min(size, begin + kBlock);
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {
        const float g = g_in[i] * grad_multiplier;
        const float m_new = b1 * mp[i] + one_minus_b1 * g;
        const float v_new = b2 * vp[i] + one_minus_b2 * g * g;
        mp[i] = m_new;
        vp[i] = v_new;
        const float m_hat = m_new * inv_correction1;
        const float v_hat = v_new * inv_correction2;
        p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
      }
    }
  });
}

}  // namespace epmoe
