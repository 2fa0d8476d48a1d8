// Ranks holding different numbers of tokens (N not divisible by R).
// Topology: R ranks as threads with tokens_by_rank {3, 5} (R=2),
// {2, 0, 7} (R=3, a rank with no tokens), {5, 1, 0, 3} (R=4), {1}x7 + {0}
// (R=8); experts E = 2R, rank r homes experts [2r, 2r+2); top_k = 3. The
// ring of experts all-gathers blocks of unequal size and reduce-scatters them
// home (comm/all_gather.h). y and all five gradients must match the
// single-rank double reference within 1e-5 (DESIGN.md §3) for every variant
// the ring has: token chunks, cotangent ring / plain, x_sorted remat; and
// fp8 tokens must give what the all-to-all gives (the same per-token or
// global scale, so the same quantised rows).
// Transport: threads (run_ep_layer), one compute thread per rank.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "ep_harness.h"
#include "expect_reference.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::EpRunResult;
using testing::ids_of;
using testing::MoeProblem;

const std::vector<std::vector<std::int64_t>>& token_splits() {
  static const std::vector<std::vector<std::int64_t>> splits = {
      {3, 5}, {2, 0, 7}, {5, 1, 0, 3}, {1, 1, 1, 1, 1, 1, 1, 0}};
  return splits;
}

MoeProblem problem_for(const std::vector<std::int64_t>& split) {
  const int num_ranks = static_cast<int>(split.size());
  const std::int64_t n = std::accumulate(split.begin(), split.end(), std::int64_t{0});
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 2 * num_ranks, .top_k = 3};
  return testing::make_problem(n, 12, 10, router, 200 + num_ranks, 0.2);
}

std::string describe(const std::vector<std::int64_t>& split) {
  std::string text = "tokens_by_rank";
  for (std::int64_t t : split) text += "_" + std::to_string(t);
  return text;
}

using testing::as_double;

TEST(UnequalTokens, RingMatchesTheDoubleReferenceForEveryVariant) {
  for (const auto& split : token_splits()) {
    const MoeProblem p = problem_for(split);
    for (int chunks : {1, 2}) {
      for (auto cotangent : {CotangentAllGather::ring, CotangentAllGather::plain}) {
        for (bool remat_dispatch : {false, true}) {
          EpRunOptions options{.num_ranks = static_cast<int>(split.size()), .dispatch = DispatchKind::ring};
          options.tokens_by_rank = split;
          options.ep.num_chunks = chunks;
          options.ep.cotangent_all_gather = cotangent;
          options.remat.save_x_sorted = !remat_dispatch;
          const std::string what = describe(split) + " chunks " + std::to_string(chunks) +
                                   (cotangent == CotangentAllGather::plain ? " cotangent plain" : "") +
                                   (remat_dispatch ? " remat x_sorted" : "");
          const EpRunResult run = testing::run_ep_layer(p, options);
          testing::expect_matches_reference(run, testing::reference_moe(p, ids_of(run.topk_ids)), what);
        }
      }
    }
  }
}

TEST(UnequalTokens, AllToAllMatchesTheDoubleReference) {
  for (const auto& split : token_splits()) {
    const MoeProblem p = problem_for(split);
    EpRunOptions options{.num_ranks = static_cast<int>(split.size()), .dispatch = DispatchKind::alltoall};
    options.tokens_by_rank = split;
    const EpRunResult run = testing::run_ep_layer(p, options);
    testing::expect_matches_reference(run, testing::reference_moe(p, ids_of(run.topk_ids)),
                                      describe(split) + " alltoall");
  }
}

TEST(UnequalTokens, RingWithFp8TokensGivesWhatTheAllToAllGives) {
  for (const auto& split : token_splits()) {
    const MoeProblem p = problem_for(split);
    for (auto format : {TokenFormat::fp8_token, TokenFormat::fp8_tensor}) {
      EpRunResult runs[2];
      for (int i = 0; i < 2; ++i) {
        EpRunOptions options{.num_ranks = static_cast<int>(split.size()),
                             .dispatch = i == 0 ? DispatchKind::ring : DispatchKind::alltoall};
        options.tokens_by_rank = split;
        options.ep.token_format = format;
        options.ep.num_chunks = 2;
        runs[i] = testing::run_ep_layer(p, options);
      }
      const std::string what = describe(split) + (format == TokenFormat::fp8_token ? " fp8_token" : " fp8_tensor");
      EXPECT_LE(testing::relative_error(runs[0].y, as_double(runs[1].y)), 1e-5) << what << " y";
      EXPECT_LE(testing::relative_error(runs[0].grads.dx, as_double(runs[1].grads.dx)), 1e-5) << what << " dx";
      EXPECT_LE(testing::relative_error(runs[0].grads.dwi0, as_double(runs[1].grads.dwi0)), 1e-5) << what << " dwi0";
      EXPECT_LE(testing::relative_error(runs[0].grads.dwo, as_double(runs[1].grads.dwo)), 1e-5) << what << " dwo";
    }
  }
}

TEST(UnequalTokens, RingCountsTheBytesItSends) {
  // R=2, tokens {3, 5}, f32 rows of H=12 floats: each rank sends only its
  // own block in the all-gathers, and the other rank's partial sums home.
  const std::vector<std::int64_t> split = {3, 5};
  const MoeProblem p = problem_for(split);
  EpRunOptions options{.num_ranks = 2, .dispatch = DispatchKind::ring};
  options.tokens_by_rank = split;
  const EpRunResult run = testing::run_ep_layer(p, options);
  for (int r = 0; r < 2; ++r) {
    const auto& bytes = run.stats[r].bytes_sent;
    EXPECT_EQ(bytes.at("forward/ring_all_gather tokens"), split[r] * 12 * 4) << "rank " << r;
    EXPECT_EQ(bytes.at("forward/reduce_scatter combine"), split[1 - r] * 12 * 4) << "rank " << r;
    EXPECT_EQ(bytes.at("backward/ring_all_gather cotangent"), split[r] * 12 * 4) << "rank " << r;
  }
}

}  // namespace
}  // namespace epmoe
