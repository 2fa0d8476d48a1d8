// Softmax cross-entropy of the LM head's logits against the next-token
// targets (the loss of the tiny LM, DESIGN.md §4.9), with its gradient.
#pragma once

#include "core/tensor.h"

namespace epmoe {

struct CrossEntropy {
  // sum over rows of logsumexp(row) - row[target], in double. A sum, not a
  // mean: the trainer divides by the global token count (which only it
  // knows once ranks are combined).
  double loss_sum = 0;
  Tensor d_logits;  // [N, V] f32: grad_scale * (softmax(row) - onehot(target))
};

// logits [N, V] f32, targets [N] i32 in [0, V) (else InternalError: callers
// validate). grad_scale is typically 1 / (global token count), so that
// d_logits is the gradient of the mean loss. N may be 0 (loss_sum 0, d_logits
// [0, V]). loss_sum is bit-identical for every compute-thread budget: per-row
// losses are added in row order after the parallel part.
CrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale);

}  // namespace epmoe
