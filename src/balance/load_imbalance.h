// How unevenly tokens fall on ranks: the slowest rank sets the step time of an
// expert-parallel layer, so the figure of merit is max/mean of the per-rank
// token loads (1.0 = perfectly balanced).
#pragma once

#include <cstdint>
#include <span>

namespace epmoe::balance {

struct LoadImbalance {
  std::int64_t max_load = 0;    // tokens (token, k pairs) on the busiest rank
  std::int64_t total_load = 0;  // over all ranks
  int num_ranks = 0;

  double mean_load() const;
  // max / mean; 1.0 when there is no load at all (nothing to balance).
  double max_over_mean() const;
  // max/mean <= threshold, decided as max * R <= threshold * total so that
  // every rank, evaluating the same integers, reaches the same answer.
  bool within(double threshold) const;
  // ceil(total / R): the lowest max load any split of the tokens reaches.
  std::int64_t ideal_max_load() const;
  // ideal_max_load() / mean: the max/mean no split of the tokens beats.
  double ideal_max_over_mean() const;
};

LoadImbalance measure_load_imbalance(std::span<const std::int64_t> rank_loads);

}  // namespace epmoe::balance
