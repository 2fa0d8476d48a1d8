#include "balance/load_imbalance.h"

#include <algorithm>

namespace epmoe::balance {

double LoadImbalance::mean_load() const { return num_ranks > 0 ? static_cast<double>(total_load) / num_ranks : 0.0; }

double LoadImbalance::max_over_mean() const {
  if (total_load == 0) return 1.0;
  return static_cast<double>(max_load) * num_ranks / static_cast<double>(total_load);
}

bool LoadImbalance::within(double threshold) const {
  if (total_load == 0) return true;
  return static_cast<double>(max_load) * num_ranks <= threshold * static_cast<double>(total_load);
}

std::int64_t LoadImbalance::ideal_max_load() const {
  return num_ranks > 0 ? (total_load + num_ranks - 1) / num_ranks : 0;
}

double LoadImbalance::ideal_max_over_mean() const {
  return LoadImbalance{ideal_max_load(), total_load, num_ranks}.max_over_mean();
}

LoadImbalance measure_load_imbalance(std::span<const std::int64_t> rank_loads) {
  LoadImbalance imbalance;
  imbalance.num_ranks = static_cast<int>(rank_loads.size());
  for (const std::int64_t load : rank_loads) {
    imbalance.max_load = std::max(imbalance.max_load, load);
    imbalance.total_load += load;
  }
  return imbalance;
}

}  // namespace epmoe::balance
