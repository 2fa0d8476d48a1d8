#include "data/synthetic_tokens.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace epmoe {
namespace {

// Doubles in messages as the user would type them ("1.25", not "1.250000").
std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

TokenDistribution parse_token_distribution(std::string_view key, std::string_view value) {
  if (value == "uniform") return TokenDistribution::uniform;
  if (value == "zipf") return TokenDistribution::zipf;
  throw ConfigError(std::string(key) + "=" + std::string(value) + ": must be one of uniform, zipf");
}

std::string to_string(TokenDistribution distribution) {
  switch (distribution) {
    case TokenDistribution::uniform:
      return "uniform";
    case TokenDistribution::zipf:
      return "zipf";
  }
  return "?";
}

void SyntheticTokensConfig::validate() const {
  constexpr std::int64_t kMaxVocab = std::numeric_limits<std::int32_t>::max();
  if (vocab_size < 2 || vocab_size > kMaxVocab) {
    throw ConfigError("vocab_size=" + std::to_string(vocab_size) + ": must be in [2, " + std::to_string(kMaxVocab) +
                      "] (token ids are int32)");
  }
  if (seq_len < 1) throw ConfigError("seq_len=" + std::to_string(seq_len) + ": must be at least 1");
  if (!(zipf_exponent > 0.0) || !std::isfinite(zipf_exponent)) {
    throw ConfigError("zipf_exponent=" + number_text(zipf_exponent) +
                      ": must be a finite number > 0 (p(i) ∝ (i+1)^-zipf_exponent)");
  }
  if (!(repeat_probability >= 0.0 && repeat_probability < 1.0)) {
    throw ConfigError("repeat_probability=" + number_text(repeat_probability) + ": must be in [0, 1)");
  }
}

namespace {

// sum_x p(x) H(q_x), q_x = r [y = x] + (1 - r) p(y): with A = sum_y p(y) log((1-r) p(y)),
// H(q_x) = -c_x log c_x - (1 - r) (A - p(x) log((1-r) p(x))), c_x = r + (1-r) p(x).
double repeat_chain_entropy_rate(const SyntheticTokens& tokens, double r) {
  const std::int64_t vocab = tokens.config().vocab_size;
  if (r == 0.0) return tokens.entropy_nats();
  double a = 0.0;
  for (std::int64_t y = 0; y < vocab; ++y) {
    const double p = tokens.probability(y);
    a += p * std::log((1.0 - r) * p);
  }
  double rate = 0.0;
  for (std::int64_t x = 0; x < vocab; ++x) {
    const double p = tokens.probability(x);
    const double c = r + (1.0 - r) * p;
    rate += p * (-c * std::log(c) - (1.0 - r) * (a - p * std::log((1.0 - r) * p)));
  }
  return rate;
}

}  // namespace

SyntheticTokens::SyntheticTokens(SyntheticTokensConfig config) : config_(config) {
  config_.validate();
  const std::int64_t vocab = config_.vocab_size;
  if (config_.distribution == TokenDistribution::uniform) {
    entropy_nats_ = std::log(static_cast<double>(vocab));
    entropy_rate_nats_ = repeat_chain_entropy_rate(*this, config_.repeat_probability);
    return;
  }
  // Inverse-CDF table: exact sampling with one uniform draw and a binary
  // search per token, no rejection loop whose draw count would depend on the
  // values (and so no variable consumption of the generator).
  const double a = config_.zipf_exponent;
  cdf_.resize(static_cast<std::size_t>(vocab));
  double sum = 0.0;
  double weighted_log_sum = 0.0;  // sum of w_i * log(i+1), for the entropy
  for (std::int64_t i = 0; i < vocab; ++i) {
    const double log_rank = std::log(static_cast<double>(i + 1));
    const double weight = std::exp(-a * log_rank);
    sum += weight;
    weighted_log_sum += weight * log_rank;
    cdf_[static_cast<std::size_t>(i)] = sum;
  }
  zipf_normaliser_ = sum;
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;  // sum / sum is 1 already; stated so the search cannot run off the end
  // H = -sum p_i log p_i with p_i = w_i / Z and log w_i = -a log(i+1):
  // H = log Z + a * sum p_i log(i+1).
  entropy_nats_ = std::log(sum) + a * weighted_log_sum / sum;
  entropy_rate_nats_ = repeat_chain_entropy_rate(*this, config_.repeat_probability);
}

double SyntheticTokens::probability(std::int64_t id) const {
  EPMOE_CHECK(id >= 0 && id < config_.vocab_size);
  if (config_.distribution == TokenDistribution::uniform) {
    return 1.0 / static_cast<double>(config_.vocab_size);
  }
  // The same expression as the table, so probability() and the sampler agree to the last bit.
  return std::exp(-config_.zipf_exponent * std::log(static_cast<double>(id + 1))) / zipf_normaliser_;
}

std::int32_t SyntheticTokens::draw(Rng& rng) const {
  if (config_.distribution == TokenDistribution::uniform) {
    return static_cast<std::int32_t>(rng.uniform_int(static_cast<std::uint64_t>(config_.vocab_size)));
  }
  // The first id whose cumulative probability exceeds u in [0, 1).
  const double u = rng.uniform01();
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  return static_cast<std::int32_t>(it - cdf_.begin());
}

Tensor SyntheticTokens::batch(std::int64_t step, std::int64_t first_sequence, std::int64_t count) const {
  EPMOE_CHECK_GE(step, 0);
  EPMOE_CHECK_GE(first_sequence, 0);
  EPMOE_CHECK_GE(count, 0);
  const std::int64_t row_length = config_.seq_len + 1;
  Tensor tokens(DType::i32, {count, row_length});
  std::int32_t* out = tokens.data<std::int32_t>();
  const Rng step_rng = Rng(config_.seed).fork(static_cast<std::uint64_t>(step));
  for (std::int64_t row = 0; row < count; ++row) {
    Rng sequence_rng = step_rng.fork(static_cast<std::uint64_t>(first_sequence + row));
    std::int32_t* sequence = out + row * row_length;
    const double repeat = config_.repeat_probability;
    for (std::int64_t position = 0; position < row_length; ++position) {
      // With repeat = 0 no extra number is drawn: the i.i.d. stream is unchanged.
      const bool repeats = repeat > 0.0 && position > 0 && sequence_rng.uniform01() < repeat;
      sequence[position] = repeats ? sequence[position - 1] : draw(sequence_rng);
    }
  }
  return tokens;
}

}  // namespace epmoe
