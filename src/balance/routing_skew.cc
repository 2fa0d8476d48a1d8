#include "balance/routing_skew.h"

#include <cmath>

namespace epmoe::balance {

std::vector<float> zipf_selection_bias(const RoutingSkewOptions& options) {
  LoadGeneratorOptions generator;
  generator.num_experts = options.num_experts;
  generator.num_ranks = options.num_ranks;
  generator.top_k = 1;
  generator.zipf_exponent = options.zipf_exponent;
  generator.placement = options.placement;
  const std::vector<int> expert_of_rank = initial_expert_of_popularity_rank(generator);
  std::vector<float> bias(static_cast<std::size_t>(options.num_experts), 0.0f);
  for (std::size_t i = 0; i < expert_of_rank.size(); ++i)
    bias[expert_of_rank[i]] =
        static_cast<float>(-options.scale * options.zipf_exponent * std::log(static_cast<double>(i + 1)));
  return bias;
}

}  // namespace epmoe::balance
