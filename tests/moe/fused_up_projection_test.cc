// The single-rank MoeLayer with the fused wi0|wi1 product
// (MoeLayerConfig::fuse_up_projection, kernels/swiglu_up_projection.h)
// against the unfused one: y, dx, dgate, dwi0, dwi1, dwo and the routing
// must have the same bits, and the saved activations the same ledger bytes
// (saved/mlpwi_0 and saved/mlpwi_1 at rows * F * 4 each), under every remat
// choice for mlpwi_0 / mlpwi_1 / mlpwo (one saved and the other recomputed
// included). Topology: one rank, compute budgets 1 and 2; N = 40 tokens,
// H = 17, F = 16 (a width the probe fuses on this CPU), E = 6, K = 2 with softmax routing, and K = 1
// with a selection bias that gives expert 0 more than a thread's share of
// the rows (a group that runs on all threads) and leaves others empty. A second
// step after the weights change in place checks that nothing stale is
// reused (the concatenation is keyed by pointer and version).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include <epmoe/moe_layer.h>
#include "core/memory_ledger.h"
#include "core/threading.h"
#include "reference_moe.h"
#include "single_rank_layer.h"

namespace epmoe {
namespace {

using testing::MoeProblem;

using testing::same_bits;

struct StepResult {
  MoeForwardOutput out;
  MoeGradients grads;
  std::int64_t mlpwi_0_bytes = 0, mlpwi_1_bytes = 0, peak_bytes = 0;
};

// Two steps of one layer: the second after an in-place weight update.
std::vector<StepResult> two_steps(MoeProblem& p, bool fuse, const RematPolicy& remat) {
  MemoryLedger ledger;
  testing::SingleRankLayer layer(
      {.hidden = p.hidden, .ffn = p.ffn, .router = p.router, .fuse_up_projection = fuse, .remat = remat}, &ledger);
  const MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, p.bias};
  std::vector<StepResult> steps;
  for (int step = 0; step < 2; ++step) {
    StepResult r;
    r.out = layer.forward(p.x, w);
    r.mlpwi_0_bytes = ledger.live_bytes("saved/mlpwi_0");
    r.mlpwi_1_bytes = ledger.live_bytes("saved/mlpwi_1");
    r.grads = layer.backward(p.dy);
    // The saved activations' peak: the two paths may keep different
    // per-version forms of the weights (the unfused one f32 copies off the
    // 32-byte grid, "buffer/prepared expert weights", kernels/gemm.h; the
    // fused one its concatenation), so their totals may differ.
    r.peak_bytes = ledger.group_peak_bytes("saved");
    steps.push_back(std::move(r));
    // The optimizer's step, in the same buffers.
    for (Tensor* t : {&p.wi0, &p.wi1})
      for (float& v : t->span<float>()) v = 0.75f * v - 0.01f;
  }
  return steps;
}

// (compute threads, save mlpwi_0, save mlpwi_1, save mlpwo)
class FusedUpProjectionLayer : public ::testing::TestWithParam<std::tuple<int, bool, bool, bool>> {
 protected:
  void SetUp() override { saved_threads_ = compute_threads(); }
  void TearDown() override { set_compute_threads(saved_threads_); }
  int saved_threads_ = 1;
};

TEST_P(FusedUpProjectionLayer, SameBitsAndLedgerBytesAsUnfused) {
  const auto [threads, save_0, save_1, save_o] = GetParam();
  set_compute_threads(threads);
  const RematPolicy remat{.save_x_sorted = true, .save_mlpwi_0 = save_0, .save_mlpwi_1 = save_1, .save_mlpwo = save_o};
  for (bool skewed : {false, true}) {
    SCOPED_TRACE(skewed ? "skewed" : "uniform");
    // Skewed: K = 1 and a selection bias towards expert 0, so that it holds
    // more than a thread's share of the rows (run on all threads).
    const RouterConfig router = skewed ? RouterConfig{.kind = RouterKind::sigmoid_grouped, .num_experts = 6, .top_k = 1}
                                       : RouterConfig{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
    MoeProblem unfused_problem = testing::make_problem(40, 17, 16, router, 77);
    MoeProblem fused_problem = testing::make_problem(40, 17, 16, router, 77);
    if (skewed) unfused_problem.bias.data<float>()[0] = fused_problem.bias.data<float>()[0] = 0.5f;
    const std::int64_t rows = 40 * router.top_k;
    const std::vector<StepResult> want = two_steps(unfused_problem, false, remat);
    const std::vector<StepResult> got = two_steps(fused_problem, true, remat);
    for (std::size_t step = 0; step < want.size(); ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      EXPECT_TRUE(same_bits(want[step].out.y, got[step].out.y));
      EXPECT_TRUE(same_bits(want[step].out.topk_ids, got[step].out.topk_ids));
      EXPECT_TRUE(same_bits(want[step].grads.dx, got[step].grads.dx));
      EXPECT_TRUE(same_bits(want[step].grads.dgate, got[step].grads.dgate));
      EXPECT_TRUE(same_bits(want[step].grads.dwi0, got[step].grads.dwi0));
      EXPECT_TRUE(same_bits(want[step].grads.dwi1, got[step].grads.dwi1));
      EXPECT_TRUE(same_bits(want[step].grads.dwo, got[step].grads.dwo));
      // rows * F * 4 bytes each when saved (rows = N * K), none when recomputed.
      EXPECT_EQ(got[step].mlpwi_0_bytes, save_0 ? rows * 16 * 4 : 0);
      EXPECT_EQ(got[step].mlpwi_1_bytes, save_1 ? rows * 16 * 4 : 0);
      EXPECT_EQ(want[step].mlpwi_0_bytes, got[step].mlpwi_0_bytes);
      EXPECT_EQ(want[step].mlpwi_1_bytes, got[step].mlpwi_1_bytes);
      EXPECT_EQ(want[step].peak_bytes, got[step].peak_bytes);
    }
    // The update changed the result: the second step really used new weights.
    EXPECT_FALSE(same_bits(got[0].out.y, got[1].out.y));
    if (skewed) {
      std::int64_t expert0 = 0;
      for (std::int32_t id : got[0].out.topk_ids.span<std::int32_t>()) expert0 += id == 0;
      EXPECT_GT(expert0, rows / 2) << "the skewed case must have a group above a thread's share";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RematChoices, FusedUpProjectionLayer,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

// A caller's version: unchanged version and buffers reuse the concatenation
// (the promise: same values); after an in-place update under a new version
// the result follows the new values.
TEST(FusedUpProjectionLayerVersions, CallerVersionReusedThenNewVersionFollowsNewValues) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  MoeProblem fused_problem = testing::make_problem(24, 15, 32, router, 5);
  MoeProblem unfused_problem = testing::make_problem(24, 15, 32, router, 5);
  testing::SingleRankLayer fused({.hidden = 15, .ffn = 32, .router = router, .fuse_up_projection = true});
  testing::SingleRankLayer unfused({.hidden = 15, .ffn = 32, .router = router, .fuse_up_projection = false});
  const MoeWeights fw{fused_problem.gate, fused_problem.wi0, fused_problem.wi1, fused_problem.wo, {}};
  const MoeWeights uw{unfused_problem.gate, unfused_problem.wi0, unfused_problem.wi1, unfused_problem.wo, {}};
  const Tensor y1 = fused.forward(fused_problem.x, fw, {.weight_version = 1}).y.clone();
  EXPECT_TRUE(same_bits(y1, fused.forward(fused_problem.x, fw, {.weight_version = 1}).y));
  EXPECT_TRUE(same_bits(y1, unfused.forward(unfused_problem.x, uw, {.weight_version = 1}).y));
  for (MoeProblem* p : {&fused_problem, &unfused_problem})
    for (float& v : p->wi1.span<float>()) v = -v;
  const Tensor y2 = fused.forward(fused_problem.x, fw, {.weight_version = 2}).y.clone();
  EXPECT_TRUE(same_bits(y2, unfused.forward(unfused_problem.x, uw, {.weight_version = 2}).y));
  EXPECT_FALSE(same_bits(y1, y2));
}

}  // namespace
}  // namespace epmoe
