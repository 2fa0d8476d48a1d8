// Expert load balancing terms a trainer adds around MoE layers (DESIGN.md
// §4.9), both driven by the expert counts of the whole step (all ranks):
//
//  * Aux-loss-free balancing (DeepSeek-V3, sigmoid_grouped routing): after
//    each step, bias[e] += rate * sign(mean_count - count[e]). The bias only
//    selects experts (router.h), so it steers load without touching the
//    gradients.
//  * Load-balance loss (Switch Transformer / GShard form):
//        L = coef * E * sum_e f_e * P_e,
//    f_e = count[e] / (N * K), the fraction of routed (token, expert) pairs
//    that went to e over the step's N tokens (a constant: counts have no
//    gradient), and P_e = (1/N) sum_t p_te, the mean routing probability,
//    p = softmax(logits) for softmax_topk and the normalised affinities
//    s / sum(s), s = sigmoid(logits), for sigmoid_grouped (DeepSeek-V3's
//    complementary balance loss). L = 1 * coef exactly at uniform load.
//    Under expert parallelism each rank holds some of the N tokens: its part
//    of L and its tokens' d(logits) are computed from the global f, and the
//    parts sum to L.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "moe/router.h"

namespace epmoe {

// count[e] = number of (token, k) pairs routed to expert e; ids [N, K] i32.
std::vector<std::int64_t> count_expert_assignments(const Tensor& topk_ids, int num_experts);

// bias [E] f32, updated in place from the step's global counts.
void update_selection_bias(std::span<const std::int64_t> global_counts, float rate, Tensor& bias);

struct LoadBalanceLossPart {
  double loss = 0;  // this rank's tokens' part of L
  Tensor d_logits;  // [N_local, E], d(L)/d(logits) of this rank's tokens
};

// logits [N_local, E] of this rank's tokens (the router's forward), the
// step's global counts and global token count N; router kind softmax_topk or
// sigmoid_grouped (the random router has nothing to train: InternalError).
LoadBalanceLossPart load_balance_loss(RouterKind kind, const Tensor& logits,
                                      std::span<const std::int64_t> global_counts, std::int64_t global_tokens,
                                      int top_k, double coef);

}  // namespace epmoe
