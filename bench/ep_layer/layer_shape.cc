#include "layer_shape.h"

#include <cmath>
#include <utility>

namespace epmoe::bench {

LayerShape shape_from(const BenchArgs& args, int default_ranks) {
  return {static_cast<int>(args.number("ranks", default_ranks)),
          static_cast<std::int64_t>(args.number("tokens_per_rank", 256)),
          static_cast<std::int64_t>(args.number("hidden", 256)),
          static_cast<std::int64_t>(args.number("ffn", 128)),
          static_cast<int>(args.number("experts", 64)),
          static_cast<int>(args.number("top_k", 8))};
}

Tensor random_tensor(Shape shape, Rng& rng, double scale) {
  Tensor t(DType::f32, std::move(shape));
  for (float& v : t.span<float>()) v = static_cast<float>(rng.normal() * scale);
  return t;
}

Rng rank_rng(int rank) { return Rng(7).fork(static_cast<std::uint64_t>(rank)); }

Tensor replicated_gate(std::int64_t hidden, int num_experts) {
  Rng shared(11);
  return random_tensor({hidden, num_experts}, shared, 1.0 / std::sqrt(double(hidden)));
}

double hit_probability(int num_experts, int experts_per_rank, int top_k) {
  double miss = 1.0;
  for (int i = 0; i < top_k; ++i) miss *= double(num_experts - experts_per_rank - i) / (num_experts - i);
  return 1.0 - miss;
}

}  // namespace epmoe::bench
