// SyntheticTokens: language-model batches of token ids distributed uniform
// or Zipf-skewed (the skew is what makes some experts hot, the case the
// redundant-expert machinery exists for).
//
// Optional structure, `repeat_probability` p: each token after the first
// repeats the previous one with probability p, else it is a fresh draw. The
// chain's stationary distribution is the chosen one (a repeat keeps it, a
// draw is it), so every token is still uniform / Zipf distributed; but the
// next token now depends on the current one, so a model has something to
// learn from its input and its routing stays token-dependent (with i.i.d.
// tokens the best model ignores its input and every token routes alike).
//
// Every sequence has its own generator, Rng(seed).fork(step).fork(sequence),
// and never a global one (DESIGN.md §6): the global batch of a step is the
// same whatever the number of ranks and whichever rank generates which
// sequences, every step gets new tokens, and a resumed run regenerates
// exactly the batches it would have seen.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace epmoe {

enum class TokenDistribution { uniform, zipf };

// Throws ConfigError naming `key` and `value` when `value` is neither
// "uniform" nor "zipf".
TokenDistribution parse_token_distribution(std::string_view key, std::string_view value);
std::string to_string(TokenDistribution distribution);

struct SyntheticTokensConfig {
  std::int64_t vocab_size = 0;
  std::int64_t seq_len = 0;
  TokenDistribution distribution = TokenDistribution::zipf;
  double zipf_exponent = 1.25;      // a in p(i) ∝ (i+1)^-a
  double repeat_probability = 0.0;  // 0: i.i.d. tokens
  std::uint64_t seed = 0;

  // ConfigError naming the key: vocab_size in [2, 2^31 - 1] (ids are int32),
  // seq_len >= 1, zipf_exponent > 0 and finite, repeat_probability in [0, 1).
  void validate() const;
};

class SyntheticTokens {
 public:
  explicit SyntheticTokens(SyntheticTokensConfig config);  // validates

  const SyntheticTokensConfig& config() const { return config_; }

  // Sequences [first_sequence, first_sequence + count) of training step
  // `step`, as an i32 tensor [count, seq_len + 1]: a model's inputs are
  // columns [0, seq_len), its targets columns [1, seq_len]. Sequence s of
  // step t depends only on (seed, t, s), so one call of 8 sequences equals
  // four calls of 2. Thread-safe (const, no shared state).
  Tensor batch(std::int64_t step, std::int64_t first_sequence, std::int64_t count) const;

  // Entropy in nats of the token distribution (log(vocab_size) for
  // uniform): the loss floor of a model that predicts i.i.d. tokens
  // perfectly.
  double entropy_nats() const { return entropy_nats_; }
  // The loss floor of a model that predicts each token from the previous
  // one perfectly: the chain's entropy rate, sum_x p(x) H(next | x). Equals
  // entropy_nats() when repeat_probability is 0.
  double entropy_rate_nats() const { return entropy_rate_nats_; }

  // Probability of token `id` in [0, vocab_size); id 0 is the most frequent
  // under zipf.
  double probability(std::int64_t id) const;

 private:
  std::int32_t draw(Rng& rng) const;

  SyntheticTokensConfig config_;
  // zipf only: cdf_[i] = p(0) + ... + p(i), with cdf_.back() == 1 exactly so
  // the inverse-CDF search always lands inside the vocabulary.
  std::vector<double> cdf_;
  double zipf_normaliser_ = 1.0;  // sum over i of (i+1)^-a
  double entropy_nats_ = 0.0;
  double entropy_rate_nats_ = 0.0;
};

}  // namespace epmoe
