// The dispatchers' buffers kept across steps are charged to the layer's
// ledger ("buffer/dispatch", "buffer/replica slots"), R = 1, 2, 3 ranks as
// threads, both dispatchers, with and without replicas and with a rank
// holding no tokens; the "saved" group stays the activations alone.
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R in {1, 2, 3}.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "ep_harness.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::EpRunResult;
using testing::MoeProblem;

std::int64_t live(const testing::RankMemory& memory, const std::string& name) {
  auto it = memory.live_bytes_by_name.find(name);
  return it == memory.live_bytes_by_name.end() ? 0 : it->second;
}

std::int64_t sent(const ep::DispatchStats& stats, const std::string& name) {
  auto it = stats.bytes_sent.find(name);
  return it == stats.bytes_sent.end() ? 0 : it->second;
}

TEST(DispatcherBuffers, AreChargedToTheLedgerOutsideTheSavedGroup) {
  const std::int64_t hidden = 16, ffn = 12;
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  const MoeProblem p = testing::make_problem(30, hidden, ffn, router, 5);
  for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    for (const int num_ranks : {1, 2, 3}) {
      for (const int slots : {0, 1}) {
        if (slots > 0 && num_ranks == 1) continue;  // replicas need another rank's experts
        EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
        if (num_ranks == 3) options.tokens_by_rank = {0, 18, 12};  // rank 0 holds no tokens
        if (slots > 0) {
          options.ep.balance = BalanceMode::dynamic;
          options.ep.redundant_slots = slots;
        }
        const EpRunResult run = testing::run_ep_layer(p, options);
        const std::string prefix =
            dispatch == DispatchKind::ring ? "forward/ring_all_gather " : "forward/all_to_all_v ";
        for (int r = 0; r < num_ranks; ++r) {
          SCOPED_TRACE(to_string(dispatch) + " R=" + std::to_string(num_ranks) + " slots=" + std::to_string(slots) +
                       " rank " + std::to_string(r));
          const testing::RankMemory& memory = run.memory[r];
          // The buffers hold at least the tokens and routing words this rank
          // sent (the all-to-all's send messages, the ring's gathered rows).
          const std::int64_t buffers = live(memory, "buffer/dispatch");
          EXPECT_GT(buffers, 0);
          EXPECT_GE(buffers, sent(run.stats[r], prefix + "tokens") + sent(run.stats[r], prefix + "routing"));
          // Replica slots: three weight and three gradient matrices per slot.
          const std::int64_t slot_bytes = live(memory, "buffer/replica slots");
          if (slots > 0) {
            EXPECT_GE(slot_bytes, 6 * slots * hidden * ffn * 4);
          } else {
            EXPECT_EQ(slot_bytes, 0);
          }
          // The saved group is the activations alone (never above the sum
          // of their peaks, which buffers in it would break); the total
          // holds the buffers too.
          std::int64_t largest_saved = 0, sum_of_saved = 0;
          for (const auto& [name, bytes] : memory.peak_bytes_by_name)
            if (name.starts_with("saved/")) {
              largest_saved = std::max(largest_saved, bytes);
              sum_of_saved += bytes;
            }
          EXPECT_GE(memory.saved_peak_bytes, largest_saved);
          EXPECT_LE(memory.saved_peak_bytes, sum_of_saved);
          EXPECT_GE(memory.total_peak_bytes, memory.saved_peak_bytes);
          EXPECT_GE(memory.total_peak_bytes, buffers + slot_bytes);
        }
      }
    }
  }
}

}  // namespace
}  // namespace epmoe
