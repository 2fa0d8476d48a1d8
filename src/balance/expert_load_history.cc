#include "balance/expert_load_history.h"

#include "core/error.h"

namespace epmoe::balance {

std::vector<std::int64_t> ExpertLoadHistory::window_sum(int first_step, int end_step) const {
  EPMOE_CHECK(0 <= first_step && first_step <= end_step && end_step <= num_steps);
  std::vector<std::int64_t> sums(num_experts, 0);
  for (int s = first_step; s < end_step; ++s) {
    const auto loads = step(s);
    for (int e = 0; e < num_experts; ++e) sums[e] += loads[e];
  }
  return sums;
}

}  // namespace epmoe::balance
