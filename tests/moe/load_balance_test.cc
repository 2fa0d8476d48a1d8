// Load-balance terms: the loss's value at uniform load, its d(logits)
// against central finite differences in double, per-rank parts summing to
// the whole, and the aux-loss-free bias moving against the load.
#include "moe/load_balance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

namespace epmoe {
namespace {

Tensor random_logits(std::int64_t n, std::int64_t e, std::uint64_t seed) {
  Tensor logits(DType::f32, {n, e});
  Rng rng(seed);
  for (float& v : logits.span<float>()) v = static_cast<float>(rng.normal());
  return logits;
}

TEST(LoadBalanceLoss, EqualsCoefAtUniformLoadAndProbabilities) {
  const Tensor logits = Tensor::zeros(DType::f32, {6, 4});  // p = 1/E for both kinds
  const std::vector<std::int64_t> counts = {3, 3, 3, 3};    // N*K = 6*2
  for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::sigmoid_grouped}) {
    const LoadBalanceLossPart part = load_balance_loss(kind, logits, counts, 6, 2, 0.01);
    EXPECT_NEAR(part.loss, 0.01, 1e-12);
  }
}

TEST(LoadBalanceLoss, GradientMatchesFiniteDifferences) {
  const std::int64_t n = 5, e = 6;
  const std::vector<std::int64_t> counts = {7, 1, 0, 2, 5, 5};  // N*K = 20 for N=10 K=2
  for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::sigmoid_grouped}) {
    Tensor logits = random_logits(n, e, 3);
    const LoadBalanceLossPart part = load_balance_loss(kind, logits, counts, 10, 2, 0.5);
    double max_err = 0, max_ref = 0;
    for (std::int64_t i = 0; i < n * e; ++i) {
      // The loss is a sum of per-token terms, so a step in one logit moves one
      // term; a float step of 1e-2 keeps the difference well above rounding.
      const float saved = logits.data<float>()[i];
      const float h = 1e-2f;
      logits.data<float>()[i] = saved + h;
      const double up = load_balance_loss(kind, logits, counts, 10, 2, 0.5).loss;
      logits.data<float>()[i] = saved - h;
      const double down = load_balance_loss(kind, logits, counts, 10, 2, 0.5).loss;
      logits.data<float>()[i] = saved;
      const double numeric = (up - down) / (2.0 * h);
      max_err = std::max(max_err, std::abs(numeric - part.d_logits.data<float>()[i]));
      max_ref = std::max(max_ref, std::abs(numeric));
    }
    ASSERT_GT(max_ref, 1e-4);
    EXPECT_LT(max_err / max_ref, 1e-3) << to_string(kind);  // O(h^2) truncation
  }
}

TEST(LoadBalanceLoss, RankPartsSumToTheWhole) {
  const Tensor logits = random_logits(8, 4, 9);
  const std::vector<std::int64_t> counts = {6, 2, 4, 4};
  const double whole = load_balance_loss(RouterKind::softmax_topk, logits, counts, 8, 2, 1.0).loss;
  double parts = 0;
  for (int r = 0; r < 4; ++r) {
    Tensor rows(DType::f32, {2, 4});
    for (int i = 0; i < 8; ++i) rows.data<float>()[i] = logits.data<float>()[r * 8 + i];
    parts += load_balance_loss(RouterKind::softmax_topk, rows, counts, 8, 2, 1.0).loss;
  }
  EXPECT_NEAR(parts, whole, 1e-12);
  EXPECT_GT(whole, 1.0);  // skewed counts cost more than uniform ones would
}

TEST(SelectionBias, MovesAgainstTheLoad) {
  Tensor bias = Tensor::zeros(DType::f32, {4});
  const std::vector<std::int64_t> counts = {10, 2, 4, 0};  // mean 4
  update_selection_bias(counts, 0.25f, bias);
  EXPECT_EQ(bias.data<float>()[0], -0.25f);
  EXPECT_EQ(bias.data<float>()[1], 0.25f);
  EXPECT_EQ(bias.data<float>()[2], 0.0f);  // exactly at the mean: unchanged
  EXPECT_EQ(bias.data<float>()[3], 0.25f);
}

TEST(ExpertCounts, CountsEveryPair) {
  Tensor ids(DType::i32, {3, 2});
  const std::int32_t values[] = {0, 2, 2, 1, 2, 0};
  std::copy(values, values + 6, ids.data<std::int32_t>());
  EXPECT_EQ(count_expert_assignments(ids, 4), (std::vector<std::int64_t>{2, 1, 3, 0}));
}

}  // namespace
}  // namespace epmoe
