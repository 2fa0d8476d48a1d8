// Remat policy (ep/remat_policy.h), R = 1, 3 and 4 ranks as threads.
//  * Bit-identical gradients whether each saved name (x_sorted, mlpwi_0,
//    mlpwi_1, mlpwo) is saved or recomputed, for both dispatchers, token
//    chunks 1 and 4, fp8 tokens off and on.
//  * The ledger: with x_sorted saved its peak is the analytic size of the
//    rows a rank computes (rows·H·4 plus metadata: 8 bytes per local expert,
//    12 per row); recomputed, its peak is zero, and the bytes recomputed and
//    the extra communication are reported.
//  * With fp8 tokens x_sorted is kept as it travelled: rows·H e4m3 bytes,
//    plus 4 per row (fp8_token) or 4 per chunk (fp8_tensor), plus the
//    metadata, exactly; R = 1-4, both dispatchers, chunks, dedup, replicas.
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R in {1, 2, 3, 4}.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "ep_harness.h"
#include "expect_reference.h"

namespace epmoe {
namespace {

using testing::expect_same_bits;

using testing::EpRunOptions;
using testing::EpRunResult;
using testing::MoeProblem;

TEST(Remat, GradientsAreBitIdenticalForEverySavedName) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 12, .top_k = 3};
  const MoeProblem p = testing::make_problem(24, 16, 12, router, 51);
  const std::vector<std::pair<std::string, RematPolicy>> policies = {
      {"x_sorted", {.save_x_sorted = false}},
      {"mlpwi_0", {.save_mlpwi_0 = false}},
      {"mlpwi_1", {.save_mlpwi_1 = false}},
      {"mlpwo", {.save_mlpwo = false}},
      {"full", RematPolicy::preset("remat_policy", "full")},
      {"save_dispatch", RematPolicy::preset("remat_policy", "save_dispatch")}};
  for (int num_ranks : {1, 3, 4})
    for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring})
      for (int chunks : {1, 4})
        for (auto tokens : {TokenFormat::f32, TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
          EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
          options.ep.num_chunks = chunks;
          options.ep.token_format = tokens;
          const EpRunResult saved = testing::run_ep_layer(p, options);
          for (const auto& [name, policy] : policies) {
            options.remat = policy;
            const EpRunResult recomputed = testing::run_ep_layer(p, options);
            const std::string what = "R" + std::to_string(num_ranks) + " " + to_string(dispatch) + " chunks " +
                                     std::to_string(chunks) + " fp8 " + to_string(tokens) + " remat " + name;
            expect_same_bits(saved, recomputed, what);
            for (const auto& memory : recomputed.memory) EXPECT_GT(memory.recomputed_bytes, 0) << what;
          }
        }
}

TEST(Remat, LedgerPeakOfXSortedIsItsAnalyticSizeAndZeroWhenRecomputed) {
  const int num_ranks = 4, num_experts = 8, top_k = 2;
  const std::int64_t hidden = 16;
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = num_experts, .top_k = top_k};
  const MoeProblem p = testing::make_problem(32 * num_ranks, hidden, 12, router, 52);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
    const EpRunResult saved = testing::run_ep_layer(p, options);
    options.remat = RematPolicy::preset("remat_policy", "full");
    const EpRunResult recomputed = testing::run_ep_layer(p, options);
    for (int r = 0; r < num_ranks; ++r) {
      const std::vector<std::int64_t>& rows_per_expert = saved.stats[r].rows_per_local_expert;
      const std::int64_t rows = std::accumulate(rows_per_expert.begin(), rows_per_expert.end(), std::int64_t{0});
      const std::int64_t analytic = rows * hidden * 4 + 8 * (num_experts / num_ranks) + 12 * rows;
      EXPECT_EQ(saved.memory[r].peak_bytes_by_name.at("saved/x_sorted"), analytic) << to_string(dispatch);
      EXPECT_EQ(recomputed.memory[r].peak_bytes_by_name.count("saved/x_sorted"), 0u);
      EXPECT_EQ(recomputed.memory[r].saved_peak_bytes, 0);
      // Recomputing x_sorted re-runs the dispatch: extra bytes on the wire,
      // as many as the forward's token exchange.
      const auto& bytes = recomputed.stats[r].bytes_sent;
      const std::string forward_key =
          dispatch == DispatchKind::ring ? "forward/ring_all_gather tokens" : "forward/all_to_all_v tokens";
      const std::string remat_key = dispatch == DispatchKind::ring ? "backward/remat ring_all_gather tokens"
                                                                   : "backward/remat all_to_all_v tokens";
      EXPECT_EQ(bytes.at(remat_key), bytes.at(forward_key));
      EXPECT_EQ(saved.stats[r].bytes_sent.count(remat_key), 0u);
    }
  }
}

TEST(Remat, SavedXSortedKeepsTheFp8TransferFormatAtItsExactSize) {
  const int num_experts = 12, top_k = 2;
  const std::int64_t hidden = 16;
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = num_experts, .top_k = top_k};
  const MoeProblem p = testing::make_problem(48, hidden, 12, router, 53);
  struct Case {
    DispatchKind dispatch;
    int chunks;
    bool dedup;
    int slots;
  };
  const Case cases[] = {{DispatchKind::alltoall, 1, false, 0},
                        {DispatchKind::alltoall, 2, true, 0},
                        {DispatchKind::alltoall, 2, false, 1},
                        {DispatchKind::ring, 1, false, 0},
                        {DispatchKind::ring, 3, false, 1}};
  for (const int num_ranks : {1, 2, 3, 4})
    for (const Case& c : cases)
      for (const auto tokens : {TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
        if (c.slots > 0 && num_ranks == 1) continue;  // replicas need another rank's experts
        EpRunOptions options{.num_ranks = num_ranks, .dispatch = c.dispatch};
        options.ep.num_chunks = c.chunks;
        options.ep.dedup = c.dedup;
        options.ep.token_format = tokens;
        if (c.slots > 0) {
          options.ep.balance = BalanceMode::dynamic;
          options.ep.redundant_slots = c.slots;
        }
        const EpRunResult run = testing::run_ep_layer(p, options);
        for (int r = 0; r < num_ranks; ++r) {
          const ep::DispatchStats& stats = run.stats[r];
          std::int64_t rows =
              std::accumulate(stats.rows_per_local_expert.begin(), stats.rows_per_local_expert.end(), std::int64_t{0});
          const std::vector<std::int64_t>& slot_rows = run.replica_stats[r].rows_per_slot;
          rows = std::accumulate(slot_rows.begin(), slot_rows.end(), rows);
          const std::int64_t groups = num_experts / num_ranks + c.slots;
          const bool per_row_scale = tokens == TokenFormat::fp8_token;
          const std::int64_t expected =
              rows * (hidden + (per_row_scale ? 4 : 0) + 12) + c.chunks * (8 * groups + (per_row_scale ? 0 : 4));
          EXPECT_EQ(run.memory[r].peak_bytes_by_name.at("saved/x_sorted"), expected)
              << "R" << num_ranks << " " << to_string(c.dispatch) << " chunks " << c.chunks << " dedup " << c.dedup
              << " slots " << c.slots << " " << to_string(tokens) << " rank " << r;
        }
      }
}

}  // namespace
}  // namespace epmoe
