#include "balance/load_generator.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/rng.h"

namespace epmoe::balance {
namespace {

// Streams of the root generator; fixed so that a seed keeps giving the same file.
enum class GeneratorStream : std::uint64_t { tokens = 0, drift = 1 };

// Draws K distinct popularity ranks per token. Drawing from the full
// distribution and redrawing a rank already picked is exactly sampling from
// the renormalised remainder; after kRedrawsBeforeScan misses (a very skewed
// popularity with K close to E) the remainder is sampled directly instead.
class DistinctZipfSampler {
 public:
  DistinctZipfSampler(int num_experts, double exponent)
      : cumulative_(num_experts), weights_(num_experts), picked_(num_experts, 0) {
    double total = 0;
    for (int i = 0; i < num_experts; ++i) {
      weights_[i] = 1.0 / std::pow(static_cast<double>(i + 1), exponent);
      total += weights_[i];
      cumulative_[i] = total;
    }
  }

  // Appends K distinct popularity ranks to `ranks` (cleared first).
  void sample(Rng& rng, int top_k, std::vector<int>& ranks) {
    ranks.clear();
    for (int k = 0; k < top_k; ++k) {
      int rank = -1;
      for (int attempt = 0; attempt < kRedrawsBeforeScan && rank < 0; ++attempt) {
        const double u = rng.uniform01() * cumulative_.back();
        const int drawn =
            static_cast<int>(std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin());
        const int clamped = std::min(drawn, static_cast<int>(cumulative_.size()) - 1);
        if (!picked_[clamped]) rank = clamped;
      }
      if (rank < 0) rank = sample_remainder(rng);
      picked_[rank] = 1;
      ranks.push_back(rank);
    }
    for (const int rank : ranks) picked_[rank] = 0;
  }

 private:
  static constexpr int kRedrawsBeforeScan = 16;

  int sample_remainder(Rng& rng) const {
    double remaining = 0;
    int last_unpicked = -1;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      if (!picked_[i]) {
        remaining += weights_[i];
        last_unpicked = static_cast<int>(i);
      }
    }
    double u = rng.uniform01() * remaining;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      if (picked_[i]) continue;
      if (u < weights_[i]) return static_cast<int>(i);
      u -= weights_[i];
    }
    return last_unpicked;  // rounding left u just above the last weight
  }

  std::vector<double> cumulative_;
  std::vector<double> weights_;
  std::vector<char> picked_;
};

void apply_drift(PopularityDrift drift, Rng& rng, std::vector<int>& expert_of_popularity_rank) {
  const int num_experts = static_cast<int>(expert_of_popularity_rank.size());
  if (num_experts < 2) return;
  switch (drift) {
    case PopularityDrift::none:
      return;
    case PopularityDrift::swap: {
      const auto i = static_cast<std::size_t>(rng.uniform_int(static_cast<std::uint64_t>(num_experts - 1)));
      std::swap(expert_of_popularity_rank[i], expert_of_popularity_rank[i + 1]);
      return;
    }
    case PopularityDrift::rotate:
      std::rotate(expert_of_popularity_rank.begin(), expert_of_popularity_rank.begin() + 1,
                  expert_of_popularity_rank.end());
      return;
  }
}

}  // namespace

void validate(const LoadGeneratorOptions& options) {
  const auto fail = [](const std::string& message) { throw ConfigError(message); };
  if (options.num_ranks < 1) fail("ranks=" + std::to_string(options.num_ranks) + ": must be >= 1");
  if (options.num_experts < 1) fail("experts=" + std::to_string(options.num_experts) + ": must be >= 1");
  if (options.num_experts % options.num_ranks != 0) {
    fail("experts=" + std::to_string(options.num_experts) +
         " is not divisible by ranks=" + std::to_string(options.num_ranks) + " (every rank is home to E/R experts)");
  }
  if (options.top_k < 1 || options.top_k > options.num_experts) {
    fail("top_k=" + std::to_string(options.top_k) + ": must be in [1, experts=" + std::to_string(options.num_experts) +
         "] (K distinct experts per token)");
  }
  if (options.num_tokens_per_rank < 0) fail("tokens_per_rank must be >= 0");
  if (options.num_steps < 1) fail("steps=" + std::to_string(options.num_steps) + ": must be >= 1");
  // Every (token, expert) pair of the file is counted in int64, and a replay
  // sums them all: tokens_per_rank=2^63-1 wrapped to a negative token count
  // and wrote a file of zeros.
  std::int64_t pairs = 0;
  if (__builtin_mul_overflow(options.num_tokens_per_rank, std::int64_t{options.num_ranks}, &pairs) ||
      __builtin_mul_overflow(pairs, std::int64_t{options.top_k}, &pairs) ||
      __builtin_mul_overflow(pairs, std::int64_t{options.num_steps}, &pairs)) {
    fail("tokens_per_rank=" + std::to_string(options.num_tokens_per_rank) +
         " ranks=" + std::to_string(options.num_ranks) + " top_k=" + std::to_string(options.top_k) + " steps=" +
         std::to_string(options.num_steps) + ": the (token, expert) pairs of the file overflow a 64-bit count");
  }
  if (!(options.zipf_exponent >= 0) || !std::isfinite(options.zipf_exponent)) fail("zipf must be a finite number >= 0");
  if (options.drift_interval_steps < 1) fail("drift_interval must be >= 1");
}

std::vector<int> initial_expert_of_popularity_rank(const LoadGeneratorOptions& options) {
  const int num_experts = options.num_experts, num_ranks = options.num_ranks;
  const int experts_per_rank = num_experts / num_ranks;
  std::vector<int> expert_of_popularity_rank(num_experts);
  for (int i = 0; i < num_experts; ++i) {
    expert_of_popularity_rank[i] =
        options.placement == HotExpertPlacement::packed ? i : (i % num_ranks) * experts_per_rank + i / num_ranks;
  }
  return expert_of_popularity_rank;
}

ExpertLoadHistory generate_expert_loads(const LoadGeneratorOptions& options) {
  validate(options);
  ExpertLoadHistory history;
  history.num_steps = options.num_steps;
  history.num_experts = options.num_experts;
  history.counts.assign(static_cast<std::size_t>(options.num_steps) * options.num_experts, 0);

  const Rng root(options.seed);
  const Rng token_root = root.fork(static_cast<std::uint64_t>(GeneratorStream::tokens));
  Rng drift_rng = root.fork(static_cast<std::uint64_t>(GeneratorStream::drift));
  std::vector<int> expert_of_popularity_rank = initial_expert_of_popularity_rank(options);
  DistinctZipfSampler sampler(options.num_experts, options.zipf_exponent);
  std::vector<int> picked_ranks;
  const std::int64_t tokens_per_step = options.num_tokens_per_rank * options.num_ranks;

  for (int step = 0; step < options.num_steps; ++step) {
    if (step > 0 && step % options.drift_interval_steps == 0) {
      apply_drift(options.drift, drift_rng, expert_of_popularity_rank);
    }
    Rng token_rng = token_root.fork(static_cast<std::uint64_t>(step));
    std::int64_t* step_counts = history.counts.data() + static_cast<std::size_t>(step) * options.num_experts;
    for (std::int64_t token = 0; token < tokens_per_step; ++token) {
      sampler.sample(token_rng, options.top_k, picked_ranks);
      for (const int rank : picked_ranks) ++step_counts[expert_of_popularity_rank[rank]];
    }
  }
  return history;
}

}  // namespace epmoe::balance
