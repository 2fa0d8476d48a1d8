// Expert-parallel layer == the single-rank double reference across odd and
// even shapes, with more than one compute thread per rank.
// Topology: ranks as threads, threads transport, R in {2, 3}, 2 compute
// threads per rank (core/threading.h; the other EP tests run one); rank r
// holds 130 tokens (> 2 * 64, so the router's and the codec's parallel_for,
// grain 64, split across both threads) and experts [2r, 2r+2) of E = 2R,
// top_k = 3. H in {15, 16, 17, 64, 65} x F in {7, 8, 9} (N-1, N, N+1 around
// the SIMD widths), each shape on one of the four (R, dispatcher) pairs in
// turn (alltoall and ring): y and all five gradients within 1e-5 of the
// reference (DESIGN.md §3).
#include <gtest/gtest.h>

#include <string>

#include "ep_harness.h"
#include "expect_reference.h"

namespace epmoe {
namespace {

TEST(ShapeSweep, OddAndEvenShapesOnTwoComputeThreadsMatchTheReference) {
  constexpr std::int64_t kTokensPerRank = 130;
  int shape_index = 0;
  for (const std::int64_t hidden : {15, 16, 17, 64, 65})
    for (const std::int64_t ffn : {7, 8, 9}) {
      // One topology per shape, in turn, so that every (R, dispatcher) pair
      // meets odd and even H and F: the whole product took minutes under
      // TSan (OpenMP teams of 2 inside each rank thread), this takes seconds.
      const int num_ranks = 2 + shape_index % 2;
      const DispatchKind dispatch = (shape_index / 2) % 2 == 0 ? DispatchKind::alltoall : DispatchKind::ring;
      ++shape_index;
      RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 2 * num_ranks, .top_k = 3};
      const testing::MoeProblem p =
          testing::make_problem(kTokensPerRank * num_ranks, hidden, ffn, router, 900 + hidden * 16 + ffn);
      testing::EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
      options.compute_threads_per_rank = 2;
      const testing::EpRunResult run = testing::run_ep_layer(p, options);
      const std::string what = "H=" + std::to_string(hidden) + " F=" + std::to_string(ffn) +
                               " R=" + std::to_string(num_ranks) + " " + to_string(dispatch);
      testing::expect_matches_reference(run, testing::reference_moe(p, testing::ids_of(run.topk_ids)), what);
    }
}

}  // namespace
}  // namespace epmoe
