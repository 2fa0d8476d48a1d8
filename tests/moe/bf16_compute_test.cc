// compute_dtype=bf16: the expert GEMMs take bf16 operands (unit roundoff
// u = 2^-8) and accumulate in fp32; the router stays fp32. Two checks:
//  1. Derived bound, not tuned: the reference loop runs on BoundedValue
//     (bounded_value.h), which propagates u through every expert-GEMM
//     operand to a first-order worst-case bound per output element. Each
//     element must satisfy |got - exact| <= bound + 1e-5 * max|exact| (the
//     second term is the fp32 contract, covering fp32 accumulation and the
//     float elementwise code). The bound is tight (< 25% of max|exact|) for y
//     and the expert weight gradients; for dx and dgate, which sum
//     random-sign terms over tokens and experts, a worst-case bound is
//     looser than the values themselves (measured 0.3-16x), so:
//  2. The layer equals the double loop with exactly the same operands
//     rounded to bf16 within the fp32 contract 1e-5 (measured ~1e-7), which
//     pins down that the bf16 path rounds those operands and nothing else,
//     while the measured bf16 error itself is ~4e-3 (well above 1e-4).
#include <gtest/gtest.h>

#include <cmath>

#include <epmoe/moe_layer.h>
#include "kernels/gemm.h"
#include "reference_moe.h"
#include "single_rank_layer.h"

namespace epmoe {
namespace {

using testing::BoundedValue;
using testing::MoeProblem;

constexpr double kBf16UnitRoundoff = 1.0 / 256;  // 2^-8: 8 significand bits incl. the implicit one

struct Check {
  double worst_ratio = 0;     // max over elements of |got - exact| / allowed
  double relative_error = 0;  // max|got - exact| / max|exact|
  double relative_bound = 0;  // max bound / max|exact|
};

Check check_within_bound(const Tensor& got, const std::vector<BoundedValue>& ref) {
  double max_ref = 0, max_bound = 0, max_diff = 0;
  for (const BoundedValue& r : ref) {
    max_ref = std::max(max_ref, std::abs(r.value));
    max_bound = std::max(max_bound, r.bound);
  }
  Check c;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double diff = std::abs(double(got.data<float>()[i]) - ref[i].value);
    const double allowed = ref[i].bound + 1e-5 * max_ref;
    c.worst_ratio = std::max(c.worst_ratio, diff / allowed);
    max_diff = std::max(max_diff, diff);
  }
  c.relative_error = max_ref > 0 ? max_diff / max_ref : 0;
  c.relative_bound = max_ref > 0 ? max_bound / max_ref : 0;
  return c;
}

void expect_bf16_within_bound(const RouterConfig& router, std::int64_t n, std::int64_t h, std::int64_t f,
                              std::uint64_t seed) {
  const MoeProblem p = testing::make_problem(n, h, f, router, seed, 0.2);
  testing::SingleRankLayer layer({.hidden = h, .ffn = f, .router = router, .compute_dtype = ComputeDType::bf16});
  MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, p.bias};
  const MoeForwardOutput out = layer.forward(p.x, w);
  const MoeGradients grads = layer.backward(p.dy);
  const std::vector<std::int32_t> ids(out.topk_ids.span<std::int32_t>().begin(),
                                      out.topk_ids.span<std::int32_t>().end());
  const auto ref = testing::reference_moe_bounded(p, kBf16UnitRoundoff, ids);
  const auto emulated = testing::reference_moe_bf16_emulated(p, ids);
  EXPECT_EQ(ids, ref.topk_ids) << "the fp32 router chose differently from the exact one";

  struct Named {
    const char* name;
    const Tensor& got;
    const std::vector<BoundedValue>& bounded;
    const std::vector<double>& emulated;
    bool tight_bound;
  };
  const Named tensors[] = {{"y", out.y, ref.y, emulated.y, true},
                           {"dx", grads.dx, ref.dx, emulated.dx, false},
                           {"dgate", grads.dgate, ref.dgate, emulated.dgate, false},
                           {"dwi0", grads.dwi0, ref.dwi0, emulated.dwi0, true},
                           {"dwi1", grads.dwi1, ref.dwi1, emulated.dwi1, true},
                           {"dwo", grads.dwo, ref.dwo, emulated.dwo, true}};
  for (const Named& t : tensors) {
    const Check c = check_within_bound(t.got, t.bounded);
    EXPECT_LE(c.worst_ratio, 1.0) << t.name << ": error exceeds the derived bound (relative error " << c.relative_error
                                  << ", relative bound " << c.relative_bound << ")";
    if (t.tight_bound) {
      EXPECT_LT(c.relative_bound, 0.25) << t.name;
    }
    EXPECT_GT(c.relative_error, 1e-4) << t.name << ": bf16 rounding did not happen";
    EXPECT_LE(testing::relative_error(t.got, t.emulated), 1e-5) << t.name << " vs bf16-emulated loop";
  }
}

TEST(Bf16Compute, SoftmaxTopkWithinDerivedBound) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "this CPU has no oneDNN bf16 matmul";
  expect_bf16_within_bound({.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 2}, 48, 40, 24, 11);
  expect_bf16_within_bound({.kind = RouterKind::softmax_topk, .num_experts = 5, .top_k = 5}, 9, 13, 11, 12);
}

TEST(Bf16Compute, SigmoidGroupedWithinDerivedBound) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "this CPU has no oneDNN bf16 matmul";
  expect_bf16_within_bound({.kind = RouterKind::sigmoid_grouped,
                            .num_experts = 8,
                            .top_k = 3,
                            .n_groups = 4,
                            .topk_groups = 2,
                            .routed_scaling_factor = 2.5f},
                           33, 24, 20, 13);
}

TEST(Bf16Compute, Fp32PathMeetsTheZeroRoundoffBound) {
  // Sanity of the machinery: with u = 0 the bound collapses to the fp32
  // contract, and the f32 layer meets it.
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  const MoeProblem p = testing::make_problem(20, 16, 12, router, 5);
  testing::SingleRankLayer layer({.hidden = 16, .ffn = 12, .router = router});
  MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, {}};
  const MoeForwardOutput out = layer.forward(p.x, w);
  const auto ref = testing::reference_moe_bounded(p, 0.0);
  EXPECT_LE(check_within_bound(out.y, ref.y).worst_ratio, 1.0);
  for (const BoundedValue& v : ref.y) EXPECT_EQ(v.bound, 0.0);
}

}  // namespace
}  // namespace epmoe
