// Softmax cross-entropy, row by row: the row maximum is subtracted before
// exponentiating (no overflow for any finite logits), exponentials are fp32
// (relative error < 1 ulp) and their sum and the log are double, so the loss
// keeps full precision even for large vocabularies.
#include "model/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/threading.h"

namespace epmoe {
namespace {}  // namespace

CrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale) {
  EPMOE_CHECK(logits.dtype() == DType::f32);
  // Reads the logits twice (max, exp-sum) and writes their gradient.
  const ComputeScope charge("cross_entropy", {.flops = 5.0 * logits.numel(), .bytes = 12.0 * logits.numel()});
  EPMOE_CHECK_EQ(logits.rank(), 2);
  EPMOE_CHECK(targets.dtype() == DType::i32);
  EPMOE_CHECK_EQ(targets.rank(), 1);
  const std::int64_t num_tokens = logits.dim(0), vocab = logits.dim(1);
  EPMOE_CHECK_EQ(targets.dim(0), num_tokens);
  // Serially, before the parallel region: an exception must not leave an
  // OpenMP worker.
  const std::int32_t* target = targets.data<std::int32_t>();
  for (std::int64_t n = 0; n < num_tokens; ++n) {
    EPMOE_CHECK_GE(target[n], 0);
    EPMOE_CHECK_LT(target[n], vocab);
  }

  CrossEntropy result;
  result.d_logits = Tensor(DType::f32, {num_tokens, vocab});
  if (num_tokens == 0) return result;
  const float* lp = logits.data<float>();
  float* dp = result.d_logits.data<float>();
  std::vector<double> row_loss(static_cast<std::size_t>(num_tokens));
  const std::int64_t grain = std::max<std::int64_t>(1, kElementwiseGrain / vocab);
  parallel_for(num_tokens, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t n = begin; n < end; ++n) {
      const float* row = lp + n * vocab;
      float* d_row = dp + n * vocab;
      const float row_max = *std::max_element(row, row + vocab);
      double sum = 0.0;
      for (std::int64_t j = 0; j < vocab; ++j) {
        const float e = std::exp(row[j] - row_max);
        d_row[j] = e;  // d_logits doubles as the scratch for exp
        sum += e;
      }
      row_loss[n] = double(row_max) + std::log(sum) - double(row[target[n]]);
      const double e_target = d_row[target[n]];
      const double scale_over_sum = double(grad_scale) / sum;
      for (std::int64_t j = 0; j < vocab; ++j) d_row[j] = static_cast<float>(d_row[j] * scale_over_sum);
      // One rounding for softmax(target) - 1 rather than two.
      d_row[target[n]] = static_cast<float>(e_target * scale_over_sum - double(grad_scale));
    }
  });
  for (double loss : row_loss) result.loss_sum += loss;
  return result;
}

}  // namespace epmoe
