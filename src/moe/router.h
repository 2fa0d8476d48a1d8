// Routers (DESIGN.md §4.1): from token activations x [N, H] and the gate
// [H, E] to, per token, K expert ids and K combine weights. Ties in a score
// are broken toward the lower expert id, everywhere.
//
//  * softmax_topk (Mixtral / Qwen / DeepSeek-V2): logits = x gate.
//    norm_topk_prob=true (default): top-K of the logits, softmax over those
//    K (Mixtral). norm_topk_prob=false: softmax over all E, the top-K
//    probabilities kept un-normalised (Qwen's norm_topk_prob=false).
//    n_groups > 1 is DeepSeek-V2's group-limited greedy routing
//    (topk_method=group_limited_greedy): experts form n_groups contiguous
//    groups, a group's score is the MAX softmax probability of its experts
//    (= its max logit: softmax is monotone, so groups and experts are ranked
//    on the logits, as the ungrouped top-K is), the best topk_groups groups
//    are kept and the top-K experts are chosen among them; the weights are
//    the chosen experts' probabilities as above (a softmax over all E keeps
//    DeepSeek-V2's scores = softmax(logits) over every expert). The group
//    holding the largest logit is always kept, so the softmax's max shift is
//    the chosen[0] logit either way. Finally every weight is multiplied by
//    routed_scaling_factor (as Megatron-Core's topk scaling factor and
//    DeepSeek-V3 do; DeepSeek-V2's reference code scales only when
//    norm_topk_prob=false, which is how DeepSeek-V2 itself is configured, so
//    its weights are the same). At the defaults (n_groups=1,
//    routed_scaling_factor=1) nothing changes, bit for bit.
//  * sigmoid_grouped (DeepSeek-V3): s = sigmoid(logits); selection uses
//    s + bias (bias [E] only selects, never weighs); experts form n_groups
//    contiguous groups, a group's score is the sum of its top-2 selection
//    scores (so with n_groups > 1 every group needs 2 experts: a
//    ConfigError otherwise), the best topk_groups groups are kept and the
//    top-K experts are
//    chosen among them. Weights come from the pre-bias s of the chosen
//    experts, divided by their sum when norm_topk_prob, times
//    routed_scaling_factor.
//  * random: logits drawn uniformly from a seeded generator (a performance
//    mode), then softmax_topk (groups and scaling included). The gate is not used, so its gradient is
//    exactly zero by construction; no other router has a zero dgate.
//
// The backward maps d(topk_weights) [N, K] to d(logits) [N, E]; the layer
// turns that into dgate = x^T dlogits and adds dlogits gate^T into dx, so the
// router is trained through the combine weights (never a silent zero).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <epmoe/config.h>
#include <epmoe/routing.h>

#include "core/rng.h"
#include "core/tensor.h"

namespace epmoe {

// RouterKind and RouterConfig: <epmoe/config.h>.
RouterKind parse_router_kind(std::string_view key, std::string_view value);  // ConfigError

class Router {
 public:
  explicit Router(RouterConfig config);
  const RouterConfig& config() const { return config_; }

  // x [N, H], gate [H, E], bias [E] (sigmoid_grouped; empty = zeros), all
  // f32 and C-contiguous (the caller's views, read in place).
  // The router computes in fp32 whatever the layer's compute_dtype.
  RouterOutput forward(TensorView x, TensorView gate, TensorView bias = {});

  // random only: the next forwards draw from stream `stream` of the seed
  // (Rng(seed).fork(stream)) instead of continuing the current one.
  void set_stream(std::uint64_t stream) { rng_ = Rng(config_.seed).fork(stream); }

  // d(topk_weights) [N, K] -> d(logits) [N, E], given the forward's output.
  Tensor backward(const RouterOutput& forward_output, const Tensor& d_topk_weights) const;

  // The forward's product x gate, backwards, in fp32 like it: from
  // d(logits) [N, E], dgate [H, E] = x^T d_logits and dx [N, H] +=
  // d_logits gate^T (dx holds the experts' part).
  static void backward_products(TensorView x, TensorView gate, TensorView d_logits, const MutableTensorView& dgate,
                                const MutableTensorView& dx);

 private:
  RouterConfig config_;
  Rng rng_;  // random router only; advanced by every forward
};

}  // namespace epmoe
