// Learning-rate schedule of the trainer: linear warm-up, then cosine decay to
// a floor (the usual LLM pre-training schedule).
#pragma once

#include <cstdint>

namespace epmoe {

struct LrSchedule {
  double peak = 1e-3;             // "learning_rate"
  std::int64_t warmup_steps = 0;  // "warmup_steps"
  std::int64_t total_steps = 1;   // "steps"
  double min_ratio = 0.1;         // "min_lr_ratio": the floor is min_ratio * peak

  // ConfigError naming the key, its value and the rule: learning_rate > 0
  // (finite), warmup_steps >= 0, steps >= 1, min_lr_ratio in [0, 1].
  void validate() const;

  // The rate for 0-based step `step` (>= 0):
  //  * step < warmup_steps: peak * (step + 1) / warmup_steps, so the first
  //    step already moves and the last warm-up step is at peak;
  //  * then cosine from peak at step warmup_steps down to min_ratio * peak at
  //    step total_steps - 1, held there beyond;
  //  * when no step is left for the decay (total_steps - 1 <= warmup_steps)
  //    the rate stays at peak after warm-up.
  // Never NaN or negative for a validated schedule.
  double at(std::int64_t step) const;
};

}  // namespace epmoe
