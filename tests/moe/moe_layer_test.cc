// Single-rank MoeLayer against the double-precision reference loop
// (reference_moe.h): output and all five gradients within relative error
// 1e-5 (max|got - ref| / max|ref| per tensor, DESIGN.md §3), over shapes that
// include N=1, K=1, K=E, E not a power of two, H and F not multiples of 8,
// for every router.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <epmoe/moe_layer.h>
#include "core/memory_ledger.h"
#include "kernels/gemm.h"
#include "reference_moe.h"
#include "single_rank_layer.h"

namespace epmoe {
namespace {

using testing::MoeProblem;
using testing::ReferenceResult;

struct Case {
  std::int64_t n, h, f;
  int e, k;
};

struct LayerRun {
  MoeForwardOutput out;
  MoeGradients grads;
};

LayerRun run_layer(const MoeProblem& p, ComputeDType dtype = ComputeDType::f32, MemoryLedger* ledger = nullptr) {
  testing::SingleRankLayer layer({.hidden = p.hidden, .ffn = p.ffn, .router = p.router, .compute_dtype = dtype},
                                 ledger);
  MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, p.bias};
  LayerRun run{layer.forward(p.x, w), {}};
  run.grads = layer.backward(p.dy);
  return run;
}

void expect_matches_reference(const MoeProblem& p, const LayerRun& run, double tolerance) {
  const std::vector<std::int32_t> ids(run.out.topk_ids.span<std::int32_t>().begin(),
                                      run.out.topk_ids.span<std::int32_t>().end());
  const ReferenceResult ref = testing::reference_moe(p, ids);
  // The layer (float) and the reference (double) choose the same experts.
  EXPECT_EQ(ids, ref.topk_ids) << "expert choice differs from the double-precision choice";
  EXPECT_LE(testing::relative_error(run.out.topk_weights, ref.topk_weights), tolerance);
  EXPECT_LE(testing::relative_error(run.out.y, ref.y), tolerance) << "y";
  EXPECT_LE(testing::relative_error(run.grads.dx, ref.dx), tolerance) << "dx";
  EXPECT_LE(testing::relative_error(run.grads.dgate, ref.dgate), tolerance) << "dgate";
  EXPECT_LE(testing::relative_error(run.grads.dwi0, ref.dwi0), tolerance) << "dwi0";
  EXPECT_LE(testing::relative_error(run.grads.dwi1, ref.dwi1), tolerance) << "dwi1";
  EXPECT_LE(testing::relative_error(run.grads.dwo, ref.dwo), tolerance) << "dwo";
}

const Case kCases[] = {
    {1, 8, 8, 4, 1},                        // N=1, K=1
    {7, 13, 11, 6, 2},                      // H, F not multiples of 8; E=6
    {33, 16, 24, 5, 5},                     // K=E, E prime
    {64, 32, 48, 8, 2},  {17, 9, 7, 3, 3},  // K=E=3
    {50, 24, 20, 12, 4}, {0, 8, 8, 4, 2},   // no tokens at all
};

class SoftmaxTopk : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(SoftmaxTopk, MatchesDoubleReference) {
  const auto [c, norm] = GetParam();
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = c.e, .top_k = c.k, .norm_topk_prob = norm};
  const MoeProblem p = testing::make_problem(c.n, c.h, c.f, router, 1000 + c.n * 7 + c.e);
  expect_matches_reference(p, run_layer(p), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxTopk, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Bool()));

// DeepSeek-V2 group-limited greedy routing (softmax_topk with groups) and
// routed_scaling_factor, against the reference's own formulation (group =
// max softmax probability).
TEST(SoftmaxTopkGrouped, MatchesDoubleReference) {
  struct Grouped {
    Case shape;
    int n_groups, topk_groups;
    float scaling;
    bool norm;
  };
  const Grouped cases[] = {{{7, 13, 11, 6, 2}, 3, 1, 1.0f, true},
                           {{33, 16, 24, 8, 4}, 4, 2, 2.5f, true},
                           {{64, 32, 48, 12, 3}, 4, 3, 16.0f, false},
                           {{20, 16, 16, 16, 6}, 8, 3, 2.5f, false},
                           {{9, 8, 8, 4, 2}, 4, 2, 1.0f, true}};  // one expert per group
  for (const Grouped& g : cases) {
    const Case c = g.shape;
    RouterConfig router{.kind = RouterKind::softmax_topk,
                        .num_experts = c.e,
                        .top_k = c.k,
                        .norm_topk_prob = g.norm,
                        .n_groups = g.n_groups,
                        .topk_groups = g.topk_groups,
                        .routed_scaling_factor = g.scaling};
    const MoeProblem p = testing::make_problem(c.n, c.h, c.f, router, 3000 + c.n + c.e);
    SCOPED_TRACE("E=" + std::to_string(c.e) + " n_groups=" + std::to_string(g.n_groups));
    expect_matches_reference(p, run_layer(p), 1e-5);
  }
}

struct GroupedCase {
  Case shape;
  int n_groups, topk_groups;
  float scaling;
  bool norm;
};

class SigmoidGrouped : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(SigmoidGrouped, MatchesDoubleReference) {
  const GroupedCase g = GetParam();
  const Case c = g.shape;
  RouterConfig router{.kind = RouterKind::sigmoid_grouped,
                      .num_experts = c.e,
                      .top_k = c.k,
                      .norm_topk_prob = g.norm,
                      .n_groups = g.n_groups,
                      .topk_groups = g.topk_groups,
                      .routed_scaling_factor = g.scaling};
  const MoeProblem p = testing::make_problem(c.n, c.h, c.f, router, 2000 + c.n + c.e, /*bias=*/0.3);
  expect_matches_reference(p, run_layer(p), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SigmoidGrouped,
                         ::testing::Values(GroupedCase{{1, 8, 8, 4, 1}, 1, 1, 1.0f, true},
                                           GroupedCase{{7, 13, 11, 6, 2}, 3, 2, 2.5f, true},   // DeepSeek-like scaling
                                           GroupedCase{{33, 16, 24, 8, 4}, 4, 2, 2.5f, true},  // K = all of 2 groups
                                           GroupedCase{{64, 32, 48, 12, 3}, 4, 3, 1.0f, false},  // no normalisation
                                           GroupedCase{{17, 9, 7, 5, 5}, 1, 1, 1.0f, true},      // K=E
                                           GroupedCase{{20, 16, 16, 16, 6}, 8, 4, 2.5f, true}));

TEST(RandomRouter, MatchesReferenceAndGateGradientIsExactlyZero) {
  RouterConfig router{.kind = RouterKind::random, .num_experts = 7, .top_k = 3, .seed = 5};
  const MoeProblem p = testing::make_problem(40, 12, 10, router, 77);
  testing::SingleRankLayer layer({.hidden = p.hidden, .ffn = p.ffn, .router = p.router});
  MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, {}};
  const MoeForwardOutput out = layer.forward(p.x, w);
  const MoeGradients grads = layer.backward(p.dy);
  // Recover the random logits' choices: the reference is told the ids, and the
  // weights must be a softmax over K (sum to 1).
  const auto ids = out.topk_ids.span<std::int32_t>();
  for (std::int64_t t = 0; t < 40; ++t) {
    float sum = 0;
    for (int k = 0; k < 3; ++k) sum += out.topk_weights.data<float>()[t * 3 + k];
    EXPECT_NEAR(sum, 1.0f, 1e-6);
  }
  for (float v : grads.dgate.span<float>()) ASSERT_EQ(v, 0.0f);
  // Different tokens get different experts (the draw is not constant).
  bool varied = false;
  for (std::int64_t t = 1; t < 40; ++t) varied |= ids[t * 3] != ids[0];
  EXPECT_TRUE(varied);
}

// The step context's stream decides the draws, whatever the layer drew
// before: a resumed run (a fresh layer) draws what an uninterrupted one did.
TEST(RandomRouter, AStreamInTheStepContextDrawsTheSameIdsOnAnyLayer) {
  RouterConfig router{.kind = RouterKind::random, .num_experts = 7, .top_k = 3, .seed = 5};
  const MoeProblem p = testing::make_problem(40, 12, 10, router, 77);
  const MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, {}};
  const auto ids = [&](testing::SingleRankLayer& layer, std::optional<std::uint64_t> stream) {
    const Tensor out = layer.forward(p.x, w, {.random_router_stream = stream}).topk_ids;
    return std::vector<std::int32_t>(out.span<std::int32_t>().begin(), out.span<std::int32_t>().end());
  };
  testing::SingleRankLayer used({.hidden = p.hidden, .ffn = p.ffn, .router = p.router});
  testing::SingleRankLayer fresh({.hidden = p.hidden, .ffn = p.ffn, .router = p.router});
  ids(used, std::nullopt);
  ids(used, 3);
  const std::vector<std::int32_t> seven = ids(used, 7);
  EXPECT_EQ(ids(fresh, 7), seven);
  EXPECT_NE(ids(fresh, std::nullopt), seven);  // no stream: the generator goes on
  EXPECT_NE(ids(fresh, 8), seven);
  EXPECT_EQ(ids(fresh, 7), seven);
}

TEST(MoeLayer, SameInputsSameBits) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 2};
  const MoeProblem p = testing::make_problem(100, 24, 40, router, 9);
  const LayerRun a = run_layer(p), b = run_layer(p);
  auto same = [](const Tensor& x, const Tensor& y) {
    return std::equal(x.span<float>().begin(), x.span<float>().end(), y.span<float>().begin());
  };
  EXPECT_TRUE(same(a.out.y, b.out.y));
  EXPECT_TRUE(same(a.grads.dx, b.grads.dx));
  EXPECT_TRUE(same(a.grads.dgate, b.grads.dgate));
  EXPECT_TRUE(same(a.grads.dwo, b.grads.dwo));
}

TEST(MoeLayer, DgateIsNotZero) {
  // The known MaxText gap: a custom combine that drops the routing-weight
  // gradient. Here it must flow.
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  const MoeProblem p = testing::make_problem(16, 8, 8, router, 3);
  const LayerRun run = run_layer(p);
  double norm = 0;
  for (float v : run.grads.dgate.span<float>()) norm += double(v) * v;
  EXPECT_GT(norm, 1e-6);
}

TEST(MoeLayer, SavedActivationsGoThroughTheLedger) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = testing::make_problem(10, 8, 6, router, 4);
  MemoryLedger ledger;
  run_layer(p, ComputeDType::f32, &ledger);
  const std::int64_t pairs = 10 * 2;
  // x_sorted: the rows plus their metadata (group sizes, and per row its
  // weight (4 bytes) and slot (8 bytes)).
  EXPECT_EQ(ledger.peak_bytes("saved/x_sorted"), pairs * 8 * 4 + 4 * 8 + pairs * (4 + 8));
  EXPECT_EQ(ledger.peak_bytes("saved/mlpwi_0"), pairs * 6 * 4);
  EXPECT_EQ(ledger.peak_bytes("saved/mlpwi_1"), pairs * 6 * 4);
  EXPECT_EQ(ledger.peak_bytes("saved/mlpwo"), pairs * 8 * 4);
  EXPECT_EQ(ledger.total_live_bytes(), 0);  // released by backward
}

// The kernels' per-version forms of the expert weights are memory the layer
// charges to "buffer/prepared expert weights": here (f32, H = 9, F = 256,
// E = 2, K = 2, so both experts get all 40 rows) the up projection's
// copies of wi0_e and wi1_e off the 32-byte grid (kernels/gemm.h; every
// [9, 256] matrix starts on the grid, 40 >= 32 rows, 256 >= 256 columns),
// and no other (wo's forward has 9 columns; the backward's products
// transpose W or have no version). They are made once per weight version:
// the same version again prepares nothing, an in-place update under a new
// version prepares them again, replacing the old ones (the charge does not
// grow), and the step computes with the new values: the bits of a fresh
// layer with nothing kept.
TEST(MoeLayer, PreparedWeightsChargedAndRebuiltOnlyForANewVersion) {
  if (f32_gemm_backend() != F32GemmBackend::onednn) GTEST_SKIP() << "EPMOE_F32_GEMM=openblas keeps no copies";
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 2, .top_k = 2};
  MoeProblem p = testing::make_problem(40, 9, 256, router, 5);
  clear_gemm_weight_cache();
  MemoryLedger ledger;
  testing::SingleRankLayer layer({.hidden = p.hidden, .ffn = p.ffn, .router = p.router}, &ledger);
  const MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, p.bias};
  auto step = [&](std::optional<std::uint64_t> version) {
    MoeForwardOutput out = layer.forward(p.x, w, {.weight_version = version});
    layer.backward(p.dy);
    return out;
  };
  auto preparations = [] { return gemm_weight_cache_stats().preparations; };
  const std::int64_t copies = 2 * 2, copy_bytes = p.hidden * p.ffn * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t before = preparations();
  step(1);
  EXPECT_EQ(preparations() - before, copies);
  EXPECT_EQ(ledger.live_bytes("buffer/prepared expert weights"), copies * copy_bytes);
  const std::int64_t first = preparations();
  step(1);
  EXPECT_EQ(preparations(), first) << "the same version prepared again";
  EXPECT_EQ(ledger.live_bytes("buffer/prepared expert weights"), copies * copy_bytes);

  for (Tensor* t : {&p.wi0, &p.wi1})  // the optimizer's step, in the same buffers
    for (float& v : t->span<float>()) v = 0.75f * v - 0.01f;
  const MoeForwardOutput updated = step(2);
  EXPECT_EQ(preparations() - first, copies) << "a new version was not prepared again";
  EXPECT_EQ(ledger.live_bytes("buffer/prepared expert weights"), copies * copy_bytes);
  clear_gemm_weight_cache();
  const LayerRun fresh = run_layer(p);
  EXPECT_TRUE(testing::same_bits(updated.y, fresh.out.y)) << "the old version's copies were used";
  clear_gemm_weight_cache();
}

}  // namespace
}  // namespace epmoe
