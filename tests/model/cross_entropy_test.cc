// Softmax cross-entropy against a double loop. Topology: one caller; N = 7
// rows with V in {1, 31, 32, 33}, logits of ordinary size and logits around
// +-1e4 (where exp without the max subtracted overflows); N = 300, V = 500 for
// the thread-budget test (several parallel grains of rows).
#include "model/cross_entropy.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model_test_util.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::relative_error;

struct CeReference {
  double loss_sum = 0;
  std::vector<double> d_logits;
};

CeReference reference(const std::vector<double>& logits, const std::vector<std::int32_t>& targets, std::int64_t vocab,
                      double grad_scale) {
  CeReference ref{0.0, std::vector<double>(logits.size())};
  for (std::size_t n = 0; n < targets.size(); ++n) {
    const double* row = logits.data() + n * vocab;
    double row_max = row[0];
    for (std::int64_t j = 1; j < vocab; ++j) row_max = std::max(row_max, row[j]);
    double sum = 0;
    for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - row_max);
    ref.loss_sum += row_max + std::log(sum) - row[targets[n]];
    for (std::int64_t j = 0; j < vocab; ++j)
      ref.d_logits[n * vocab + j] = grad_scale * (std::exp(row[j] - row_max) / sum - (j == targets[n] ? 1.0 : 0.0));
  }
  return ref;
}

std::vector<std::int32_t> random_targets(std::int64_t n_tokens, std::int64_t vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> targets(n_tokens);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.uniform_int(vocab));
  return targets;
}

TEST(CrossEntropy, MatchesDouble) {
  const std::int64_t n_tokens = 7;
  const float grad_scale = 1.0f / 7.0f;
  for (float magnitude : {3.0f, 1e4f}) {
    for (std::int64_t vocab : {1, 31, 32, 33}) {
      const Tensor logits = testing::random_tensor({n_tokens, vocab}, 1, -magnitude, magnitude);
      const auto targets = random_targets(n_tokens, vocab, 2);
      const CrossEntropy got = softmax_cross_entropy(logits, testing::ids_tensor(targets), grad_scale);
      const CeReference ref = reference(testing::to_double(logits), targets, vocab, grad_scale);
      ASSERT_TRUE(std::isfinite(got.loss_sum)) << magnitude << " V=" << vocab;
      EXPECT_NEAR(got.loss_sum, ref.loss_sum, kF32RelativeTolerance * std::max(1.0, std::abs(ref.loss_sum)))
          << magnitude << " V=" << vocab;
      ASSERT_EQ(got.d_logits.shape(), (Shape{n_tokens, vocab}));
      EXPECT_LE(relative_error(got.d_logits, ref.d_logits), kF32RelativeTolerance) << magnitude << " V=" << vocab;
      if (vocab == 1) {
        EXPECT_EQ(got.loss_sum, 0.0);  // one class: probability 1, no loss
      }
    }
  }
}

// The reference d_logits is the gradient of grad_scale * loss_sum: central
// differences in double.
TEST(CrossEntropy, ReferenceGradientMatchesFiniteDifferences) {
  const std::int64_t n_tokens = 4, vocab = 9;
  const double grad_scale = 0.25;
  const auto logits = testing::to_double(testing::random_tensor({n_tokens, vocab}, 3, -3.0f, 3.0f));
  const auto targets = random_targets(n_tokens, vocab, 4);
  const auto numeric = testing::numeric_gradient(logits, [&](const std::vector<double>& l) {
    return grad_scale * reference(l, targets, vocab, grad_scale).loss_sum;
  });
  EXPECT_LE(relative_error(reference(logits, targets, vocab, grad_scale).d_logits, numeric),
            testing::kFiniteDifferenceTolerance);
}

TEST(CrossEntropy, BitIdenticalForOneAndTwoThreads) {
  const std::int64_t n_tokens = 300, vocab = 500;
  const Tensor logits = testing::random_tensor({n_tokens, vocab}, 5, -4.0f, 4.0f);
  const Tensor targets = testing::ids_tensor(random_targets(n_tokens, vocab, 6));
  auto run = [&](int threads) {
    testing::ScopedComputeThreads budget(threads);
    return softmax_cross_entropy(logits, targets, 1.0f / n_tokens);
  };
  const CrossEntropy one = run(1), two = run(2);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(one.loss_sum), std::bit_cast<std::uint64_t>(two.loss_sum));
  EXPECT_TRUE(testing::same_bits(one.d_logits, two.d_logits));
  // Uniform-ish logits: the mean loss is near log(V), a sanity bound that a
  // zero or garbage loss would fail.
  EXPECT_GT(one.loss_sum / n_tokens, 0.5 * std::log(double(vocab)));
}

TEST(CrossEntropy, ZeroTokens) {
  const std::int64_t vocab = 10;
  const CrossEntropy got = softmax_cross_entropy(Tensor(DType::f32, {0, vocab}), Tensor(DType::i32, {0}), 1.0f);
  EXPECT_EQ(got.loss_sum, 0.0);
  EXPECT_EQ(got.d_logits.shape(), (Shape{0, vocab}));
}

TEST(CrossEntropy, OutOfRangeTargetIsInternalError) {
  const std::int64_t vocab = 5;
  const Tensor logits = testing::random_tensor({2, vocab}, 7);
  EXPECT_THROW(softmax_cross_entropy(logits, testing::ids_tensor({1, 5}), 1.0f), InternalError);
  EXPECT_THROW(softmax_cross_entropy(logits, testing::ids_tensor({-1, 0}), 1.0f), InternalError);
}

}  // namespace
}  // namespace epmoe
