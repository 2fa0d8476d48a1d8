// Warm-up + cosine learning-rate schedule.
#include "model/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <string>

#include "core/error.h"

namespace epmoe {
namespace {

template <typename T>
[[noreturn]] void bad_value(const char* key, T value, const char* rule) {
  std::ostringstream msg;
  msg << key << "=" << value << ": " << rule;
  throw ConfigError(msg.str());
}

}  // namespace

// Written as !(ok) so that NaN fails every rule.
void LrSchedule::validate() const {
  if (!(peak > 0.0 && std::isfinite(peak))) bad_value("learning_rate", peak, "must be > 0 and finite");
  if (warmup_steps < 0) bad_value("warmup_steps", warmup_steps, "must be >= 0");
  if (total_steps < 1) bad_value("steps", total_steps, "must be >= 1");
  if (!(min_ratio >= 0.0 && min_ratio <= 1.0)) bad_value("min_lr_ratio", min_ratio, "must be in [0, 1]");
}

double LrSchedule::at(std::int64_t step) const {
  EPMOE_CHECK_GE(step, 0);
  if (step < warmup_steps) return peak * double(step + 1) / double(warmup_steps);
  const std::int64_t decay_steps = total_steps - 1 - warmup_steps;
  if (decay_steps <= 0) return peak;
  const double progress = std::min(1.0, double(step - warmup_steps) / double(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  // min + (peak - min) * cosine, clamped: cos(pi) rounds to exactly -1, but
  // the clamp keeps the floor exact whatever the libm.
  const double floor = min_ratio * peak;
  return std::max(floor, floor + (peak - floor) * cosine);
}

}  // namespace epmoe
