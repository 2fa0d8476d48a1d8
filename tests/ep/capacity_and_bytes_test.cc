// All-to-all buffers and bytes, R = 3 and 4 ranks as threads.
//  * capacity_factor: per source rank and chunk, each expert takes at most
//    ceil(cf · chunk_tokens · K / E) pairs, later tokens dropped first. The
//    dropped pairs are counted exactly and contribute exactly zero: the
//    result equals the reference with those pairs removed.
//  * bytes: tokens sent to other ranks are exactly H·4 bytes per (token, k)
//    pair without dedup, and per distinct (token, destination rank) with
//    dedup; the routing words are 4·(rows + 2·entries).
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R = 4 (capacity), R = 3 (bytes).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ep/dispatcher.h"
#include "ep_harness.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::ids_of;
using testing::MoeProblem;

TEST(Capacity, DroppedPairsAreCountedAndContributeExactlyZero) {
  const int num_ranks = 4, num_experts = 8, top_k = 2;
  // Skewed: bias pushes most tokens to experts 0 and 1, so their capacity overflows.
  RouterConfig router{.kind = RouterKind::sigmoid_grouped, .num_experts = num_experts, .top_k = top_k};
  MoeProblem p = testing::make_problem(12 * num_ranks, 10, 8, router, 21, 0.1);
  p.bias.data<float>()[0] = 0.6f;
  p.bias.data<float>()[1] = 0.5f;
  for (bool dedup : {false, true}) {
    for (int chunks : {1, 2}) {
      EpRunOptions options{.num_ranks = num_ranks, .dispatch = DispatchKind::alltoall};
      options.ep.capacity_factor = 1.0;
      options.ep.dedup = dedup;
      options.ep.num_chunks = chunks;
      const testing::EpRunResult run = testing::run_ep_layer(p, options);
      const std::vector<std::int32_t> ids = ids_of(run.topk_ids);

      // The rule, replayed: per rank, per chunk, per expert in (token, k) order.
      std::vector<bool> dropped(ids.size(), false);
      std::int64_t expected_drops = 0;
      const std::int64_t tokens_per_rank = p.num_tokens / num_ranks;
      for (int r = 0; r < num_ranks; ++r)
        for (int c = 0; c < chunks; ++c) {
          const ep::ChunkRange range = ep::chunk_range(tokens_per_rank, chunks, c);
          const std::int64_t capacity =
              static_cast<std::int64_t>(std::ceil(double(range.size()) * top_k / num_experts));
          std::vector<std::int64_t> taken(num_experts, 0);
          for (std::int64_t t = range.begin; t < range.end; ++t)
            for (int k = 0; k < top_k; ++k) {
              const std::int64_t pair = (r * tokens_per_rank + t) * top_k + k;
              if (taken[ids[pair]]++ >= capacity) {
                dropped[pair] = true;
                ++expected_drops;
              }
            }
        }
      std::int64_t reported = 0;
      for (const auto& stats : run.stats) reported += stats.dropped_pairs;
      ASSERT_GT(expected_drops, 0) << "the skew must overflow some expert";
      EXPECT_EQ(reported, expected_drops);
      const testing::ReferenceResult ref = testing::reference_moe_with_drops(p, ids, dropped);
      EXPECT_LE(testing::relative_error(run.y, ref.y), 1e-5);
      EXPECT_LE(testing::relative_error(run.grads.dx, ref.dx), 1e-5);
      EXPECT_LE(testing::relative_error(run.grads.dgate, ref.dgate), 1e-5);
      EXPECT_LE(testing::relative_error(run.grads.dwi0, ref.dwi0), 1e-5);
      EXPECT_LE(testing::relative_error(run.grads.dwo, ref.dwo), 1e-5);
    }
  }
}

TEST(Bytes, TokensSentMatchPairsOrDistinctDestinations) {
  const int num_ranks = 3, num_experts = 6, top_k = 4;
  const std::int64_t hidden = 10;
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = num_experts, .top_k = top_k};
  const MoeProblem p = testing::make_problem(7 * num_ranks, hidden, 6, router, 22);
  for (bool dedup : {false, true}) {
    EpRunOptions options{.num_ranks = num_ranks, .dispatch = DispatchKind::alltoall};
    options.ep.dedup = dedup;
    const testing::EpRunResult run = testing::run_ep_layer(p, options);
    const std::vector<std::int32_t> ids = ids_of(run.topk_ids);
    const int experts_per_rank = num_experts / num_ranks;
    for (int r = 0; r < num_ranks; ++r) {
      std::int64_t remote_pairs = 0, remote_rows = 0;
      for (std::int64_t t = r * 7; t < (r + 1) * 7; ++t) {
        std::set<int> destinations;
        for (int k = 0; k < top_k; ++k) {
          const int dest = ids[t * top_k + k] / experts_per_rank;
          if (dest == r) continue;
          ++remote_pairs;
          destinations.insert(dest);
        }
        remote_rows += dedup ? static_cast<std::int64_t>(destinations.size()) : 0;
      }
      if (!dedup) remote_rows = remote_pairs;
      const auto& bytes = run.stats[r].bytes_sent;
      EXPECT_EQ(bytes.at("forward/all_to_all_v tokens"), remote_rows * hidden * 4) << "rank " << r;
      EXPECT_EQ(bytes.at("forward/all_to_all_v routing"), 4 * (remote_rows + 2 * remote_pairs)) << "rank " << r;
      EXPECT_EQ(bytes.at("backward/all_to_all_v cotangent"), remote_rows * hidden * 4) << "rank " << r;
    }
  }
}

TEST(Bytes, RingSendsEveryTokenToEveryOtherRank) {
  const int num_ranks = 4;
  const std::int64_t hidden = 8, tokens_per_rank = 5;
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 2};
  const MoeProblem p = testing::make_problem(tokens_per_rank * num_ranks, hidden, 6, router, 23);
  EpRunOptions options{.num_ranks = num_ranks, .dispatch = DispatchKind::ring};
  const testing::EpRunResult run = testing::run_ep_layer(p, options);
  for (const auto& stats : run.stats) {
    // ·N_l·H·4 bytes each way, whatever the routing.
    EXPECT_EQ(stats.bytes_sent.at("forward/ring_all_gather tokens"), (num_ranks - 1) * tokens_per_rank * hidden * 4);
    EXPECT_EQ(stats.bytes_sent.at("forward/reduce_scatter combine"), (num_ranks - 1) * tokens_per_rank * hidden * 4);
    EXPECT_EQ(stats.bytes_sent.at("backward/ring_all_gather cotangent"),
              (num_ranks - 1) * tokens_per_rank * hidden * 4);
  }
}

}  // namespace
}  // namespace epmoe
