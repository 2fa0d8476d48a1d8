// Finite-difference gradient checks on a tiny problem (N=5, H=6, F=5, E=4,
// K=2), for every router: softmax_topk with and without norm_topk_prob,
// grouped (2 groups, 1 kept) with routed_scaling_factor, and sigmoid_grouped.
// Two layers of evidence:
//  1. the double reference's hand-derived backward against central
//     differences of its own loss sum(dy * y) (tight: 1e-6);
//  2. the float layer's gradients against central differences of the
//     float layer's loss (loose: float round-off over h = 1e-2).
// Perturbations are small enough not to change any expert choice; the test
// checks that they don't.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <epmoe/moe_layer.h>
#include "reference_moe.h"
#include "single_rank_layer.h"

namespace epmoe {
namespace {

using testing::MoeProblem;

struct Param {
  const char* name;
  std::function<Tensor&(MoeProblem&)> tensor;
  std::function<const std::vector<double>&(const testing::ReferenceResult&)> ref_grad;
  std::function<const Tensor&(const MoeGradients&)> layer_grad;
};

const std::vector<Param>& params() {
  static const std::vector<Param> list = {
      {"x", [](MoeProblem& p) -> Tensor& { return p.x; },
       [](const testing::ReferenceResult& r) -> const std::vector<double>& { return r.dx; },
       [](const MoeGradients& g) -> const Tensor& { return g.dx; }},
      {"gate", [](MoeProblem& p) -> Tensor& { return p.gate; },
       [](const testing::ReferenceResult& r) -> const std::vector<double>& { return r.dgate; },
       [](const MoeGradients& g) -> const Tensor& { return g.dgate; }},
      {"wi0", [](MoeProblem& p) -> Tensor& { return p.wi0; },
       [](const testing::ReferenceResult& r) -> const std::vector<double>& { return r.dwi0; },
       [](const MoeGradients& g) -> const Tensor& { return g.dwi0; }},
      {"wi1", [](MoeProblem& p) -> Tensor& { return p.wi1; },
       [](const testing::ReferenceResult& r) -> const std::vector<double>& { return r.dwi1; },
       [](const MoeGradients& g) -> const Tensor& { return g.dwi1; }},
      {"wo", [](MoeProblem& p) -> Tensor& { return p.wo; },
       [](const testing::ReferenceResult& r) -> const std::vector<double>& { return r.dwo; },
       [](const MoeGradients& g) -> const Tensor& { return g.dwo; }},
  };
  return list;
}

std::vector<RouterConfig> checked_routers() {
  return {{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2, .norm_topk_prob = true},
          {.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2, .norm_topk_prob = false},
          {.kind = RouterKind::sigmoid_grouped,
           .num_experts = 4,
           .top_k = 2,
           .n_groups = 2,
           .topk_groups = 2,
           .routed_scaling_factor = 2.5f},
          // DeepSeek-V2 group-limited greedy with the scaling factor: the
          // gradient through w = c * softmax must carry c.
          {.kind = RouterKind::softmax_topk,
           .num_experts = 4,
           .top_k = 2,
           .norm_topk_prob = true,
           .n_groups = 2,
           .topk_groups = 1,
           .routed_scaling_factor = 2.5f},
          {.kind = RouterKind::softmax_topk,
           .num_experts = 4,
           .top_k = 2,
           .norm_topk_prob = false,
           .n_groups = 2,
           .topk_groups = 1,
           .routed_scaling_factor = 16.0f}};
}

TEST(GradientCheck, ReferenceBackwardMatchesFiniteDifferences) {
  for (const RouterConfig& router : checked_routers()) {
    MoeProblem p = testing::make_problem(5, 6, 5, router, 31);
    const testing::ReferenceResult base = testing::reference_moe(p);
    for (const Param& param : params()) {
      Tensor& t = param.tensor(p);
      const std::vector<double>& analytic = param.ref_grad(base);
      double max_err = 0, max_grad = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        float& v = t.data<float>()[i];
        const float original = v;
        const float h = 1e-3f;
        v = original + h;
        const auto plus = testing::reference_moe(p);
        const double loss_plus = testing::reference_loss(p);
        v = original - h;
        const auto minus = testing::reference_moe(p);
        const double loss_minus = testing::reference_loss(p);
        v = original;
        ASSERT_EQ(plus.topk_ids, base.topk_ids) << "perturbation changed the routing";
        ASSERT_EQ(minus.topk_ids, base.topk_ids) << "perturbation changed the routing";
        // The step actually taken in float: (original + h) - (original - h).
        const double step = double(original + h) - double(original - h);
        const double numeric = (loss_plus - loss_minus) / step;
        max_err = std::max(max_err, std::abs(numeric - analytic[i]));
        max_grad = std::max(max_grad, std::abs(analytic[i]));
      }
      EXPECT_GT(max_grad, 0.0) << param.name;
      EXPECT_LE(max_err / max_grad, 1e-6) << to_string(router.kind) << " d" << param.name;
    }
  }
}

TEST(GradientCheck, FloatLayerMatchesFiniteDifferencesOfItsOwnLoss) {
  for (const RouterConfig& router : checked_routers()) {
    MoeProblem p = testing::make_problem(5, 6, 5, router, 32);
    auto layer_loss = [&p](MoeGradients* grads, std::vector<std::int32_t>* ids) {
      testing::SingleRankLayer layer({.hidden = p.hidden, .ffn = p.ffn, .router = p.router});
      MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, p.bias};
      MoeForwardOutput out = layer.forward(p.x, w);
      if (ids) ids->assign(out.topk_ids.span<std::int32_t>().begin(), out.topk_ids.span<std::int32_t>().end());
      double loss = 0;
      for (std::int64_t i = 0; i < out.y.numel(); ++i) loss += double(out.y.data<float>()[i]) * p.dy.data<float>()[i];
      if (grads) *grads = layer.backward(p.dy);
      return loss;
    };
    MoeGradients grads;
    std::vector<std::int32_t> base_ids, ids;
    layer_loss(&grads, &base_ids);
    for (const Param& param : params()) {
      Tensor& t = param.tensor(p);
      const Tensor& analytic = param.layer_grad(grads);
      double max_err = 0, max_grad = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        float& v = t.data<float>()[i];
        const float original = v, h = 1e-2f;
        v = original + h;
        const double plus = layer_loss(nullptr, &ids);
        ASSERT_EQ(ids, base_ids);
        v = original - h;
        const double minus = layer_loss(nullptr, &ids);
        ASSERT_EQ(ids, base_ids);
        v = original;
        const double numeric = (plus - minus) / (double(original + h) - double(original - h));
        max_err = std::max(max_err, std::abs(numeric - analytic.data<float>()[i]));
        max_grad = std::max(max_grad, std::abs(double(analytic.data<float>()[i])));
      }
      // Central differences: truncation O(h^2 |f'''|) ~ 1e-4, float round-off
      // ~ 1e-7 * |loss| / h ~ 1e-5; 2e-3 leaves room for both and still
      // catches a wrong formula (those are off by O(1)).
      EXPECT_LE(max_err / max_grad, 2e-3) << to_string(router.kind) << " d" << param.name;
    }
  }
}

}  // namespace
}  // namespace epmoe
