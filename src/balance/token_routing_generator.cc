#include "balance/token_routing_generator.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"

namespace epmoe::balance {

std::vector<std::vector<std::int32_t>> generate_token_routing(const LoadGeneratorOptions& options) {
  validate(options);
  const int num_experts = options.num_experts, top_k = options.top_k;
  const std::vector<int> expert_of_rank = initial_expert_of_popularity_rank(options);
  std::vector<double> weight(num_experts), cumulative(num_experts);
  double total = 0;
  for (int i = 0; i < num_experts; ++i) {
    weight[i] = 1.0 / std::pow(static_cast<double>(i + 1), options.zipf_exponent);
    total += weight[i];
    cumulative[i] = total;
  }
  const Rng root(options.seed);
  std::vector<char> picked(static_cast<std::size_t>(num_experts), 0);
  std::vector<int> token_ranks;
  std::vector<std::vector<std::int32_t>> routing(static_cast<std::size_t>(options.num_ranks));
  for (int r = 0; r < options.num_ranks; ++r) {
    Rng rng = root.fork(static_cast<std::uint64_t>(r));
    std::vector<std::int32_t>& ids = routing[r];
    ids.reserve(static_cast<std::size_t>(options.num_tokens_per_rank * top_k));
    for (std::int64_t t = 0; t < options.num_tokens_per_rank; ++t) {
      token_ranks.clear();
      for (int k = 0; k < top_k; ++k) {
        // Redrawing a rank already picked samples the renormalised remainder
        // exactly; after 16 misses, sample the remainder directly.
        int chosen = -1;
        for (int attempt = 0; attempt < 16 && chosen < 0; ++attempt) {
          const double u = rng.uniform01() * total;
          const int drawn =
              std::min(static_cast<int>(std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin()),
                       num_experts - 1);
          if (!picked[drawn]) chosen = drawn;
        }
        if (chosen < 0) {
          double remaining = 0;
          for (int i = 0; i < num_experts; ++i)
            if (!picked[i]) remaining += weight[i];
          double u = rng.uniform01() * remaining;
          for (int i = 0; i < num_experts && chosen < 0; ++i) {
            if (picked[i]) continue;
            if (u < weight[i]) chosen = i;
            u -= weight[i];
          }
          for (int i = num_experts - 1; i >= 0 && chosen < 0; --i)
            if (!picked[i]) chosen = i;  // rounding left u above the last weight
        }
        picked[chosen] = 1;
        token_ranks.push_back(chosen);
        ids.push_back(expert_of_rank[chosen]);
      }
      for (const int i : token_ranks) picked[i] = 0;
    }
  }
  return routing;
}

}  // namespace epmoe::balance
