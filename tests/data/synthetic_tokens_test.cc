// SyntheticTokens: a sequence depends only on (seed, step, sequence), so any
// split of a global batch across calls (ranks) yields the same tokens; ids
// stay in the vocabulary; the empirical token frequencies match
// probability(), tightly enough that a sample drawn with a nearby exponent
// fails the same check; entropy and validation errors are right.
//
// Frequency tests: vocab 1000, 200 sequences of 1000 tokens = 200,000 draws.
#include "data/synthetic_tokens.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace epmoe {
namespace {

SyntheticTokensConfig make_config(TokenDistribution distribution, std::int64_t vocab_size = 1000,
                                  std::int64_t seq_len = 16, double zipf_exponent = 1.25, std::uint64_t seed = 7) {
  SyntheticTokensConfig config;
  config.vocab_size = vocab_size;
  config.seq_len = seq_len;
  config.distribution = distribution;
  config.zipf_exponent = zipf_exponent;
  config.seed = seed;
  return config;
}

std::vector<std::int32_t> values(const Tensor& tensor) {
  const auto span = tensor.span<std::int32_t>();
  return {span.begin(), span.end()};
}

// Row-major concatenation of several batches' rows.
std::vector<std::int32_t> concatenated(const std::vector<const Tensor*>& parts) {
  std::vector<std::int32_t> all;
  for (const Tensor* part : parts) {
    const auto v = values(*part);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::vector<std::int64_t> token_counts(const SyntheticTokens& tokens, std::int64_t num_sequences) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(tokens.config().vocab_size), 0);
  const Tensor batch = tokens.batch(/*step=*/3, 0, num_sequences);
  for (std::int32_t id : batch.span<std::int32_t>()) ++counts.at(static_cast<std::size_t>(id));
  return counts;
}

// Largest |empirical - p| over the `num_top` most frequent ids, in binomial
// standard deviations sqrt(p (1 - p) / n). Under the right distribution this
// is below ~4.5 with probability > 0.999 for 20 ids (union bound on normal
// tails); a sample from a = 1.2 instead of 1.25 moves p(0) of vocab 1000
// from 0.258 to 0.231, about 27 deviations at n = 200,000.
double max_top_deviation_sigmas(const std::vector<std::int64_t>& counts, const SyntheticTokens& model, int num_top) {
  std::int64_t n = 0;
  for (std::int64_t c : counts) n += c;
  double worst = 0.0;
  for (int id = 0; id < num_top; ++id) {
    const double p = model.probability(id);
    const double sigma = std::sqrt(p * (1.0 - p) / static_cast<double>(n));
    worst = std::max(worst, std::abs(static_cast<double>(counts[id]) / n - p) / sigma);
  }
  return worst;
}

struct ChiSquare {
  double statistic = 0.0;
  int degrees_of_freedom = 0;
  // Mean df, standard deviation sqrt(2 df): six deviations above the mean is
  // a false alarm rate far below 1e-6 for the df here (≈ 100-1000).
  bool plausible() const { return statistic < degrees_of_freedom + 6.0 * std::sqrt(2.0 * degrees_of_freedom); }
};

// Pearson's chi-square of `counts` against model.probability(), with
// consecutive ids pooled until each bin expects at least 20 draws (the
// Zipf tail would otherwise have bins expecting < 1, where the statistic is
// not chi-square distributed).
ChiSquare chi_square(const std::vector<std::int64_t>& counts, const SyntheticTokens& model) {
  std::int64_t n = 0;
  for (std::int64_t c : counts) n += c;
  ChiSquare result;
  double expected = 0.0, observed = 0.0;
  int num_bins = 0;
  for (std::size_t id = 0; id < counts.size(); ++id) {
    expected += model.probability(static_cast<std::int64_t>(id)) * n;
    observed += counts[id];
    if (expected >= 20.0 || id + 1 == counts.size()) {
      result.statistic += (observed - expected) * (observed - expected) / expected;
      ++num_bins;
      expected = observed = 0.0;
    }
  }
  result.degrees_of_freedom = num_bins - 1;
  return result;
}

TEST(SyntheticTokens, BatchShapeAndEmptyBatch) {
  const SyntheticTokens tokens(make_config(TokenDistribution::zipf, 1000, 16));
  const Tensor batch = tokens.batch(0, 0, 5);
  EXPECT_EQ(batch.dtype(), DType::i32);
  EXPECT_EQ(batch.shape(), (Shape{5, 17}));  // inputs [0, 16), targets [1, 16]
  const Tensor empty = tokens.batch(0, 4, 0);
  EXPECT_EQ(empty.shape(), (Shape{0, 17}));
}

TEST(SyntheticTokens, SameSequencesWhateverTheSplitIntoCalls) {
  for (TokenDistribution distribution : {TokenDistribution::uniform, TokenDistribution::zipf}) {
    SCOPED_TRACE(to_string(distribution));
    const SyntheticTokens tokens(make_config(distribution));
    const Tensor whole = tokens.batch(/*step=*/5, 0, 8);
    // Four "ranks" of two sequences, generated in reverse order.
    const Tensor r3 = tokens.batch(5, 6, 2), r2 = tokens.batch(5, 4, 2), r1 = tokens.batch(5, 2, 2),
                 r0 = tokens.batch(5, 0, 2);
    EXPECT_EQ(values(whole), concatenated({&r0, &r1, &r2, &r3}));
    // An uneven split: 3 + 1 + 4.
    const Tensor a = tokens.batch(5, 0, 3), b = tokens.batch(5, 3, 1), c = tokens.batch(5, 4, 4);
    EXPECT_EQ(values(whole), concatenated({&a, &b, &c}));
    // A second object with the same config (a resumed run) regenerates the same batch.
    const SyntheticTokens resumed(make_config(distribution));
    EXPECT_EQ(values(whole), values(resumed.batch(5, 0, 8)));
  }
}

TEST(SyntheticTokens, UniformSequenceComesFromItsOwnForkedGenerator) {
  const SyntheticTokensConfig config = make_config(TokenDistribution::uniform, 1000, 32, 1.25, 99);
  const SyntheticTokens tokens(config);
  const std::int64_t step = 11, sequence = 4;
  const Tensor batch = tokens.batch(step, sequence, 1);
  Rng rng = Rng(config.seed).fork(step).fork(sequence);
  for (std::int64_t i = 0; i <= config.seq_len; ++i) {
    ASSERT_EQ(batch.data<std::int32_t>()[i], static_cast<std::int32_t>(rng.uniform_int(1000))) << "position " << i;
  }
}

TEST(SyntheticTokens, ZipfSequenceIsTheInverseCdfOfItsForkedGenerator) {
  const SyntheticTokensConfig config = make_config(TokenDistribution::zipf, 50, 64, 1.25, 3);
  const SyntheticTokens tokens(config);
  std::vector<double> cdf;
  double sum = 0.0;
  for (std::int64_t id = 0; id < config.vocab_size; ++id) cdf.push_back(sum += tokens.probability(id));
  const Tensor batch = tokens.batch(2, 9, 1);
  Rng rng = Rng(config.seed).fork(2).fork(9);
  for (std::int64_t i = 0; i <= config.seq_len; ++i) {
    const double u = rng.uniform01();
    std::int32_t expected = 0;
    while (expected + 1 < config.vocab_size && cdf[expected] <= u) ++expected;  // linear scan
    ASSERT_EQ(batch.data<std::int32_t>()[i], expected) << "position " << i << ", u " << u;
  }
}

TEST(SyntheticTokens, DifferentStepsSequencesAndSeedsDiffer) {
  for (TokenDistribution distribution : {TokenDistribution::uniform, TokenDistribution::zipf}) {
    SCOPED_TRACE(to_string(distribution));
    const SyntheticTokens tokens(make_config(distribution, 1000, 256));
    const SyntheticTokens other_seed(make_config(distribution, 1000, 256, 1.25, 8));
    const auto step0 = values(tokens.batch(0, 0, 2));
    // Fraction of positions holding the same id: about sum p^2 (0.001 for
    // uniform, 0.09 for this zipf) for independent draws, 1 for a repeat.
    const auto matches = [](const std::vector<std::int32_t>& x, const std::vector<std::int32_t>& y) {
      std::size_t same = 0;
      for (std::size_t i = 0; i < x.size(); ++i) same += x[i] == y[i];
      return static_cast<double>(same) / static_cast<double>(x.size());
    };
    EXPECT_LT(matches(step0, values(tokens.batch(1, 0, 2))), 0.2) << "step 1 repeats step 0";
    EXPECT_LT(matches(step0, values(other_seed.batch(0, 0, 2))), 0.2) << "seed 8 repeats seed 7";
    const std::vector<std::int32_t> row0(step0.begin(), step0.begin() + 257), row1(step0.begin() + 257, step0.end());
    EXPECT_LT(matches(row0, row1), 0.2) << "sequence 1 repeats sequence 0";
  }
}

TEST(SyntheticTokens, IdsStayInTheVocabularyAndReachItsEnds) {
  for (TokenDistribution distribution : {TokenDistribution::uniform, TokenDistribution::zipf}) {
    SCOPED_TRACE(to_string(distribution));
    // Vocab 7: 20,000 draws reach every id, the least likely zipf one
    // (p(6) ≈ 0.05) about 1,000 times.
    const SyntheticTokens tokens(make_config(distribution, 7, 99));
    const Tensor batch = tokens.batch(1, 0, 200);
    const auto span = batch.span<std::int32_t>();
    EXPECT_EQ(*std::min_element(span.begin(), span.end()), 0);
    EXPECT_EQ(*std::max_element(span.begin(), span.end()), 6);
  }
}

TEST(SyntheticTokens, ZipfFrequenciesMatchProbability) {
  const SyntheticTokens tokens(make_config(TokenDistribution::zipf, 1000, 999, 1.25));
  const auto counts = token_counts(tokens, 200);  // 200,000 draws
  EXPECT_LT(max_top_deviation_sigmas(counts, tokens, 20), 4.5);
  const ChiSquare chi = chi_square(counts, tokens);
  EXPECT_TRUE(chi.plausible()) << "chi-square " << chi.statistic << " with " << chi.degrees_of_freedom << " df";
  // id 0 is the most frequent, and frequencies fall with the id.
  EXPECT_GT(counts[0], counts[1]);
  EXPECT_GT(counts[1], counts[2]);
}

TEST(SyntheticTokens, FrequencyChecksRejectASampleWithANearbyExponent) {
  // The checks above must be able to fail: a sample drawn with a = 1.2 (or
  // 1.0) judged against a = 1.25's probabilities.
  const SyntheticTokens model(make_config(TokenDistribution::zipf, 1000, 999, 1.25));
  for (double wrong_exponent : {1.2, 1.0}) {
    SCOPED_TRACE(wrong_exponent);
    const SyntheticTokens wrong(make_config(TokenDistribution::zipf, 1000, 999, wrong_exponent));
    const auto counts = token_counts(wrong, 200);
    EXPECT_GT(max_top_deviation_sigmas(counts, model, 20), 4.5);
    EXPECT_FALSE(chi_square(counts, model).plausible());
  }
}

TEST(SyntheticTokens, UniformFrequenciesMatchProbability) {
  const SyntheticTokens tokens(make_config(TokenDistribution::uniform, 1000, 999));
  const auto counts = token_counts(tokens, 200);
  const ChiSquare chi = chi_square(counts, tokens);
  EXPECT_EQ(chi.degrees_of_freedom, 999);  // 200 expected per id: no pooling
  EXPECT_TRUE(chi.plausible()) << "chi-square " << chi.statistic;
  // And the same counts are far from zipf's.
  const SyntheticTokens zipf(make_config(TokenDistribution::zipf, 1000, 999));
  EXPECT_FALSE(chi_square(counts, zipf).plausible());
}

TEST(SyntheticTokens, ProbabilitiesFollowTheZipfLaw) {
  const double a = 1.25;
  const std::int64_t vocab = 1000;
  const SyntheticTokens tokens(make_config(TokenDistribution::zipf, vocab, 4, a));
  double normaliser = 0.0;
  for (std::int64_t i = 0; i < vocab; ++i) normaliser += std::pow(static_cast<double>(i + 1), -a);
  double total = 0.0;
  for (std::int64_t i = 0; i < vocab; ++i) {
    const double expected = std::pow(static_cast<double>(i + 1), -a) / normaliser;
    ASSERT_NEAR(tokens.probability(i), expected, 1e-13 * expected) << "id " << i;
    total += tokens.probability(i);
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  const SyntheticTokens uniform(make_config(TokenDistribution::uniform, vocab));
  EXPECT_DOUBLE_EQ(uniform.probability(0), 1.0 / vocab);
  EXPECT_DOUBLE_EQ(uniform.probability(vocab - 1), 1.0 / vocab);
}

TEST(SyntheticTokens, EntropyOfUniformIsLogVocab) {
  for (std::int64_t vocab : {2, 999, 1000, 1001, 50257}) {
    const SyntheticTokens tokens(make_config(TokenDistribution::uniform, vocab));
    EXPECT_NEAR(tokens.entropy_nats(), std::log(static_cast<double>(vocab)), 1e-14) << vocab;
  }
}

TEST(SyntheticTokens, EntropyOfZipfMatchesADirectSum) {
  for (double a : {0.5, 1.0, 1.25, 2.0}) {
    for (std::int64_t vocab : {2, 999, 1000, 1001}) {
      const SyntheticTokens tokens(make_config(TokenDistribution::zipf, vocab, 4, a));
      double normaliser = 0.0;
      for (std::int64_t i = 0; i < vocab; ++i) normaliser += std::pow(static_cast<double>(i + 1), -a);
      double entropy = 0.0;
      for (std::int64_t i = 0; i < vocab; ++i) {
        const double p = std::pow(static_cast<double>(i + 1), -a) / normaliser;
        entropy -= p * std::log(p);
      }
      EXPECT_NEAR(tokens.entropy_nats(), entropy, 1e-12 * entropy) << "a " << a << ", vocab " << vocab;
      // Skew lowers the loss floor below the uniform one.
      EXPECT_LT(tokens.entropy_nats(), std::log(static_cast<double>(vocab)));
    }
  }
}

void expect_config_error_naming(const SyntheticTokensConfig& config, const std::string& key) {
  try {
    config.validate();
    ADD_FAILURE() << "no ConfigError for " << key;
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(key + "=", 0), 0u) << e.what();
  }
  EXPECT_THROW(SyntheticTokens{config}, ConfigError) << "the constructor validates";
}

TEST(SyntheticTokens, ValidateNamesTheKey) {
  EXPECT_NO_THROW(make_config(TokenDistribution::zipf, 2, 1).validate());
  for (std::int64_t vocab : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, std::int64_t{1} << 31}) {
    SyntheticTokensConfig config = make_config(TokenDistribution::zipf);
    config.vocab_size = vocab;
    expect_config_error_naming(config, "vocab_size");
  }
  for (std::int64_t seq_len : {-3, 0}) {
    SyntheticTokensConfig config = make_config(TokenDistribution::uniform);
    config.seq_len = seq_len;
    expect_config_error_naming(config, "seq_len");
  }
  for (double a : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    SyntheticTokensConfig config = make_config(TokenDistribution::zipf);
    config.zipf_exponent = a;
    expect_config_error_naming(config, "zipf_exponent");
  }
}

TEST(SyntheticTokens, ParseTokenDistribution) {
  EXPECT_EQ(parse_token_distribution("data", "uniform"), TokenDistribution::uniform);
  EXPECT_EQ(parse_token_distribution("data", "zipf"), TokenDistribution::zipf);
  for (TokenDistribution d : {TokenDistribution::uniform, TokenDistribution::zipf}) {
    EXPECT_EQ(parse_token_distribution("data", to_string(d)), d);
  }
  try {
    parse_token_distribution("data.distribution", "gauss");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    for (const char* part : {"data.distribution", "gauss", "uniform", "zipf"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
  }
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

SyntheticTokensConfig repeating_config(double repeat) {
  SyntheticTokensConfig config{.vocab_size = 50,
                               .seq_len = 999,
                               .distribution = TokenDistribution::zipf,
                               .zipf_exponent = 1.25,
                               .repeat_probability = repeat,
                               .seed = 3};
  return config;
}

// Repeats keep every token Zipf distributed: the top ids' frequencies match
// probability() within 4.5 deviations of a chain whose draws are correlated
// (a repeat chain's variance is (1 + r) / (1 - r) times the i.i.d. one).
TEST(SyntheticTokensRepeat, TokensStayZipfDistributed) {
  const double r = 0.5;
  const SyntheticTokens tokens(repeating_config(r));
  std::vector<std::int64_t> counts(50, 0);
  std::int64_t n = 0;
  for (std::int64_t step = 0; step < 200; ++step) {
    const Tensor batch = tokens.batch(step, 0, 1);
    for (const std::int32_t id : batch.span<std::int32_t>()) ++counts[static_cast<std::size_t>(id)];
    n += batch.numel();
  }
  const double effective_n = static_cast<double>(n) * (1 - r) / (1 + r);
  for (int id = 0; id < 20; ++id) {
    const double p = tokens.probability(id);
    const double sigma = std::sqrt(p * (1 - p) / effective_n);
    EXPECT_LT(std::abs(static_cast<double>(counts[id]) / static_cast<double>(n) - p), 4.5 * sigma) << id;
  }
}

TEST(SyntheticTokensRepeat, NextTokenEqualsTheCurrentOneAsOftenAsTheChainSays) {
  const double r = 0.5;
  const SyntheticTokens tokens(repeating_config(r));
  double sum_p2 = 0;
  for (int id = 0; id < 50; ++id) sum_p2 += tokens.probability(id) * tokens.probability(id);
  const double expected = r + (1 - r) * sum_p2;  // a repeat, or a fresh draw of the same id
  std::int64_t same = 0, pairs = 0;
  for (std::int64_t step = 0; step < 100; ++step) {
    const Tensor batch = tokens.batch(step, 0, 1);
    const std::int32_t* t = batch.data<std::int32_t>();
    for (std::int64_t i = 1; i < batch.numel(); ++i, ++pairs) same += t[i] == t[i - 1];
  }
  const double fraction = static_cast<double>(same) / static_cast<double>(pairs);
  EXPECT_NEAR(fraction, expected, 5 * std::sqrt(expected * (1 - expected) / static_cast<double>(pairs)));
  EXPECT_GT(fraction, 0.5);  // i.i.d. Zipf tokens would repeat ~sum p^2 = 0.18 of the time
}

TEST(SyntheticTokensRepeat, EntropyRateMatchesADirectDoubleSum) {
  for (const double r : {0.0, 0.3, 0.9}) {
    const SyntheticTokens tokens(repeating_config(r));
    double rate = 0;
    for (int x = 0; x < 50; ++x) {
      double h = 0;
      for (int y = 0; y < 50; ++y) {
        const double q = (x == y ? r : 0.0) + (1 - r) * tokens.probability(y);
        h -= q * std::log(q);
      }
      rate += tokens.probability(x) * h;
    }
    EXPECT_NEAR(tokens.entropy_rate_nats(), rate, 1e-12) << r;
    if (r > 0) {
      EXPECT_LT(tokens.entropy_rate_nats(), tokens.entropy_nats());
    }
  }
}

TEST(SyntheticTokensRepeat, ValidateNamesTheKey) {
  SyntheticTokensConfig config = repeating_config(1.0);
  try {
    config.validate();
    FAIL() << "repeat_probability=1 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("repeat_probability=1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe
