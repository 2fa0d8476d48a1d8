// A recorded (or generated) sequence of per-step global expert loads: the
// input of `epmoe balance` and of the offline policy replays. On disk it is an
// .npy int64 array [steps, E]; entry [s, e] is the number of (token, k) pairs
// routed to expert e in step s, summed over all ranks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace epmoe::balance {

struct ExpertLoadHistory {
  int num_steps = 0;
  int num_experts = 0;
  std::vector<std::int64_t> counts;  // [num_steps * num_experts], row-major

  std::span<const std::int64_t> step(int s) const {
    return std::span<const std::int64_t>(counts).subspan(static_cast<std::size_t>(s) * num_experts,
                                                         static_cast<std::size_t>(num_experts));
  }
  // Per expert, the sum over steps [first_step, end_step): EPLB's window
  // statistic (the sum orders experts exactly as the mean does, in integers).
  std::vector<std::int64_t> window_sum(int first_step, int end_step) const;
};

}  // namespace epmoe::balance
