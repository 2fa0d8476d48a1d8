// Expert-parallel layer == the single-rank double reference.
// Topology: R ranks as threads (R in 1, 2, 3, 4, 8); rank r holds tokens
// [r·N/R, (r+1)·N/R) (N = 6R, so 6 per rank) and experts
// [r·E/R, (r+1)·E/R) with E = 2R (E = 4 for R = 1). Token i on rank r goes
// to the ranks homing its K experts. Every dispatcher, dedup on/off, token
// chunks 1/2/4 and both routers must give y and all five gradients within
// 1e-5 of the reference (relative to max|ref|, DESIGN.md §3).
// Transport: threads (run_ep_layer), one compute thread per rank.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "ep_harness.h"
#include "expect_reference.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::EpRunResult;
using testing::ids_of;
using testing::MoeProblem;

struct Variant {
  DispatchKind dispatch;
  bool dedup;
};

class EpEquivalence : public ::testing::TestWithParam<std::tuple<int, Variant, int, RouterKind>> {};

TEST_P(EpEquivalence, MatchesDoubleReference) {
  const auto [num_ranks, variant, chunks, router_kind] = GetParam();
  const int num_experts = std::max(4, 2 * num_ranks);
  RouterConfig router{.kind = router_kind, .num_experts = num_experts, .top_k = 3};
  if (router_kind == RouterKind::sigmoid_grouped) {
    router.n_groups = 2;
    router.topk_groups = 2;
    router.routed_scaling_factor = 2.5f;
  }
  const MoeProblem p = testing::make_problem(6 * num_ranks, 12, 10, router, 100 + num_ranks, 0.2);
  EpRunOptions options{.num_ranks = num_ranks, .dispatch = variant.dispatch};
  options.ep.dedup = variant.dedup;
  options.ep.num_chunks = chunks;
  const EpRunResult run = testing::run_ep_layer(p, options);
  testing::expect_matches_reference(run, testing::reference_moe(p, ids_of(run.topk_ids)), "");
  for (const auto& stats : run.stats) EXPECT_EQ(stats.dropped_pairs, 0);
}

std::string variant_name(const ::testing::TestParamInfo<EpEquivalence::ParamType>& info) {
  const auto [num_ranks, variant, chunks, router_kind] = info.param;
  return "R" + std::to_string(num_ranks) + "_" + to_string(variant.dispatch) + (variant.dedup ? "_dedup" : "") +
         "_chunks" + std::to_string(chunks) + "_" + to_string(router_kind);
}

INSTANTIATE_TEST_SUITE_P(Sweep, EpEquivalence,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(Variant{DispatchKind::alltoall, false},
                                                              Variant{DispatchKind::alltoall, true},
                                                              Variant{DispatchKind::ring, false}),
                                            ::testing::Values(1, 2, 4),
                                            ::testing::Values(RouterKind::softmax_topk, RouterKind::sigmoid_grouped)),
                         variant_name);

// Adversarial routing through the selection-only bias of sigmoid_grouped:
// a bias of +10 on an expert makes every token choose it, -10 never.
MoeProblem skewed_problem(int num_ranks, std::int64_t tokens_per_rank, int num_experts, int top_k,
                          const std::vector<float>& bias) {
  RouterConfig router{.kind = RouterKind::sigmoid_grouped, .num_experts = num_experts, .top_k = top_k};
  MoeProblem p = testing::make_problem(tokens_per_rank * num_ranks, 8, 6, router, 7);
  for (int e = 0; e < num_experts; ++e) p.bias.data<float>()[e] = bias[e];
  return p;
}

void expect_all_dispatchers_exact(const MoeProblem& p, int num_ranks, const std::string& what) {
  for (const Variant v : {Variant{DispatchKind::alltoall, false}, Variant{DispatchKind::alltoall, true},
                          Variant{DispatchKind::ring, false}}) {
    for (int chunks : {1, 2}) {
      EpRunOptions options{.num_ranks = num_ranks, .dispatch = v.dispatch};
      options.ep.dedup = v.dedup;
      options.ep.num_chunks = chunks;
      const EpRunResult run = testing::run_ep_layer(p, options);
      testing::expect_matches_reference(
          run, testing::reference_moe(p, ids_of(run.topk_ids)),
          what + " " + to_string(v.dispatch) + (v.dedup ? " dedup" : "") + " chunks " + std::to_string(chunks));
    }
  }
}

TEST(EpAdversarial, AllTokensToOneExpert) {
  std::vector<float> bias(8, 0.0f);
  bias[5] = 10.0f;  // expert 5 lives on rank 2 of 4
  const MoeProblem p = skewed_problem(4, 5, 8, 1, bias);
  expect_all_dispatchers_exact(p, 4, "all to expert 5");
}

TEST(EpAdversarial, ARankReceivesNothingAndARankSendsNothing) {
  // 3 ranks, 2 experts each; ranks 1 and 2's experts are never chosen, so
  // rank 2 receives nothing and rank 0 sends nothing (its tokens stay home).
  std::vector<float> bias = {10.0f, 10.0f, -10.0f, -10.0f, -10.0f, -10.0f};
  const MoeProblem p = skewed_problem(3, 4, 6, 2, bias);
  expect_all_dispatchers_exact(p, 3, "experts of rank 0 only");
}

TEST(EpAdversarial, OneTokenPerRankAndKEqualsE) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 4};
  const MoeProblem p = testing::make_problem(4, 8, 6, router, 9);  // N_l = 1 on 4 ranks
  expect_all_dispatchers_exact(p, 4, "N_l=1 K=E");
}

TEST(EpAdversarial, MoreChunksThanTokens) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = testing::make_problem(2, 8, 6, router, 10);  // N_l = 1, 4 chunks: 3 are empty
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpRunOptions options{.num_ranks = 2, .dispatch = dispatch};
    options.ep.num_chunks = 4;
    const EpRunResult run = testing::run_ep_layer(p, options);
    testing::expect_matches_reference(run, testing::reference_moe(p, ids_of(run.topk_ids)), to_string(dispatch));
  }
}

}  // namespace
}  // namespace epmoe
