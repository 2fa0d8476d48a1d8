// plan/ against the engine (ranks as threads, tests/ep/ep_harness.h):
//  * bytes: for R = 2, 3, 4, both dispatchers, fp8 tokens off / per tensor /
//    per token, token chunks 1 / 2, x_sorted saved / recomputed, every
//    collective the engine measured (count rounds, scale and count
//    all-gathers included) equals the plan's prediction exactly, and the
//    plan predicts no collective the engine did not run. The ring depends on
//    N_l only; the all-to-all on the routing, so its plan is fed the counts
//    (rows, pairs, each way) taken from the engine's own topk_ids. With
//    dynamic replicas (ring, R = 2, 3), the same besides the replica weights
//    and gradients, which the plan does not predict; the counts round that
//    plans replicas exactly for both dispatchers, priced or not, with dedup.
//  * memory: the ledger peaks of x_sorted, mlpwi_0, mlpwi_1, mlpwo equal the
//    plan's formulas at the measured row counts exactly, and the plan's
//    uniform-routing expectation within 5% for random routing over
//    4 ranks x 1024 tokens (rows per rank ~ 2048 +- 2%).
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "ep/ep_harness.h"
#include "kernels/gemm.h"
#include "plan/activation_sizes.h"
#include "plan/communication_model.h"
#include "plan/plan_config.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::EpRunResult;

std::map<std::string, double> as_map(const std::vector<plan::CollectiveBytes>& collectives) {
  std::map<std::string, double> out;
  for (const auto& c : collectives) out[c.name] = c.bytes;
  return out;
}

void expect_same_bytes(const std::map<std::string, std::int64_t>& engine, const std::map<std::string, double>& plan,
                       const std::string& what) {
  std::set<std::string> engine_names, plan_names;
  for (const auto& [name, bytes] : engine) engine_names.insert(name);
  for (const auto& [name, bytes] : plan) plan_names.insert(name);
  EXPECT_EQ(engine_names, plan_names) << what;
  for (const auto& [name, bytes] : engine) {
    if (!plan.count(name)) continue;
    EXPECT_EQ(double(bytes), plan.at(name)) << what << " " << name;
  }
}

double row_bytes(TokenFormat format, std::int64_t hidden) {
  return format == TokenFormat::f32 ? 4.0 * hidden : format == TokenFormat::fp8_tensor ? hidden : hidden + 4.0;
}

// Rows / pairs rank r exchanges with the other ranks, from the engine's routing.
plan::AllToAllTraffic measured_traffic(const std::vector<std::int32_t>& ids, int r, int num_ranks,
                                       std::int64_t tokens_per_rank, int top_k, int experts_per_rank, bool dedup) {
  plan::AllToAllTraffic t;
  t.dedup = dedup;
  for (std::int64_t token = 0; token < tokens_per_rank * num_ranks; ++token) {
    const int home = int(token / tokens_per_rank);
    std::set<int> destinations;
    std::int64_t pairs_to_r = 0, pairs_away = 0;
    for (int k = 0; k < top_k; ++k) {
      const int dest = ids[token * top_k + k] / experts_per_rank;
      if (dest == home) continue;
      destinations.insert(dest);
      pairs_away += 1;
      pairs_to_r += dest == r;
    }
    if (home == r) {
      t.pairs_sent += pairs_away;
      t.rows_sent += dedup ? destinations.size() : pairs_away;
    } else if (pairs_to_r > 0) {
      t.pairs_received += pairs_to_r;
      t.rows_received += dedup ? 1 : pairs_to_r;
    }
  }
  return t;
}

TEST(PlanVsEngine, BytesPerCollectiveAreExact) {
  const int num_experts = 12, top_k = 3;
  const std::int64_t hidden = 10, tokens_per_rank = 6;
  for (int num_ranks : {2, 3, 4})
    for (auto dispatch : {DispatchKind::ring, DispatchKind::alltoall})
      for (bool dedup : {false, true})
        for (auto format : {TokenFormat::f32, TokenFormat::fp8_tensor, TokenFormat::fp8_token})
          for (int chunks : {1, 2})
            for (bool save_x_sorted : {true, false}) {
              if (dispatch == DispatchKind::ring && dedup) continue;
              RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = num_experts, .top_k = top_k};
              const testing::MoeProblem p =
                  testing::make_problem(tokens_per_rank * num_ranks, hidden, 4, router, 80 + num_ranks);
              EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
              options.ep.dedup = dedup;
              options.ep.token_format = format;
              options.ep.num_chunks = chunks;
              options.remat.save_x_sorted = save_x_sorted;
              const EpRunResult run = testing::run_ep_layer(p, options);
              const std::vector<std::int32_t> ids(run.topk_ids.span<std::int32_t>().begin(),
                                                  run.topk_ids.span<std::int32_t>().end());
              const plan::DispatchShape shape{.num_ranks = num_ranks,
                                              .tokens_per_rank = double(tokens_per_rank),
                                              .hidden = hidden,
                                              .top_k = top_k,
                                              .num_experts = num_experts,
                                              .token_row_bytes = row_bytes(format, hidden),
                                              .activation_bytes = 4,
                                              .num_chunks = chunks,
                                              .fp8_tensor_scale = format == TokenFormat::fp8_tensor};
              for (int r = 0; r < num_ranks; ++r) {
                const std::string what = "R" + std::to_string(num_ranks) + " " + to_string(dispatch) +
                                         (dedup ? " dedup" : "") + " " + to_string(format) + " chunks " +
                                         std::to_string(chunks) + (save_x_sorted ? "" : " remat") + " rank " +
                                         std::to_string(r);
                const auto predicted =
                    dispatch == DispatchKind::ring
                        ? plan::ring_collective_bytes(shape, !save_x_sorted)
                        : plan::alltoall_collective_bytes(shape,
                                                          measured_traffic(ids, r, num_ranks, tokens_per_rank, top_k,
                                                                           num_experts / num_ranks, dedup),
                                                          !save_x_sorted);
                expect_same_bytes(run.stats[r].bytes_sent, as_map(predicted), what);
              }
            }
}

// The layer of the replica tests below: E = 12, K = 2, H = 10, 6 tokens
// per rank, one replica slot per rank, balance=dynamic; its engine run, and
// the plan's shape of it.
struct ReplicaCase {
  EpRunResult run;
  plan::DispatchShape shape;
};

ReplicaCase run_with_replicas(int num_ranks, DispatchKind dispatch, bool dedup, bool priced, std::uint64_t seed) {
  const int num_experts = 12, top_k = 2;
  const std::int64_t hidden = 10, tokens_per_rank = 6;
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = num_experts, .top_k = top_k};
  const testing::MoeProblem p = testing::make_problem(tokens_per_rank * num_ranks, hidden, 4, router, seed);
  EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
  options.ep.dedup = dedup;
  options.ep.balance = BalanceMode::dynamic;
  options.ep.redundant_slots = 1;
  if (priced) options.ep.replica_costs = {.compute_flops_per_s = 1e9, .link_bytes_per_s = 1e9, .link_latency_s = 0};
  return {testing::run_ep_layer(p, options),
          {.num_ranks = num_ranks,
           .tokens_per_rank = double(tokens_per_rank),
           .hidden = hidden,
           .top_k = top_k,
           .num_experts = num_experts,
           .token_row_bytes = 4.0 * hidden,
           .activation_bytes = 4,
           .replicas = true,
           .replicas_priced = priced}};
}

// The ring moves every token whatever the replicas do, so the plan (told
// there are replicas) predicts every collective but the replicas' weights
// and gradients, which depend on where the planner puts them.
TEST(PlanVsEngine, RingBytesWithReplicasAreExactBesidesTheReplicaTransfers) {
  for (int num_ranks : {2, 3}) {
    const ReplicaCase c = run_with_replicas(num_ranks, DispatchKind::ring, false, false, 60 + num_ranks);
    for (int r = 0; r < num_ranks; ++r) {
      std::map<std::string, std::int64_t> engine = c.run.stats[r].bytes_sent;
      EXPECT_EQ(engine.erase("forward/replica weights") + engine.erase("backward/replica gradients"), 2u);
      expect_same_bytes(engine, as_map(plan::ring_collective_bytes(c.shape, false)),
                        "ring replicas R" + std::to_string(num_ranks) + " rank " + std::to_string(r));
    }
  }
}

// The counts round that plans replicas carries E pair counts per rank; a
// priced all-to-all adds each rank's pair total and, with dedup, its rows
// per destination rank (what prices the token rows). The plan's count of it
// equals the engine's on the step that plans (step 0), R = 2, 3, 4.
TEST(PlanVsEngine, ReplicaCountsRoundBytesAreExactPricedOrNot) {
  struct Variant {
    DispatchKind dispatch;
    bool dedup, priced;
  };
  for (int num_ranks : {2, 3, 4})
    for (const Variant v : {Variant{DispatchKind::alltoall, false, false}, Variant{DispatchKind::alltoall, false, true},
                            Variant{DispatchKind::alltoall, true, true}, Variant{DispatchKind::ring, false, true}}) {
      const ReplicaCase c = run_with_replicas(num_ranks, v.dispatch, v.dedup, v.priced, 80 + num_ranks);
      const plan::DispatchShape& shape = c.shape;
      const EpRunResult& run = c.run;
      const auto predicted =
          as_map(v.dispatch == DispatchKind::ring
                     ? plan::ring_collective_bytes(shape, false)
                     : plan::alltoall_collective_bytes(shape, plan::expected_alltoall_traffic(shape, v.dedup), false));
      const std::string name = "forward/ring_all_gather replica counts";
      for (int r = 0; r < num_ranks; ++r) {
        const std::string what = "R" + std::to_string(num_ranks) + " " + to_string(v.dispatch) +
                                 (v.dedup ? " dedup" : "") + (v.priced ? " priced" : "") + " rank " + std::to_string(r);
        ASSERT_EQ(run.stats[r].bytes_sent.count(name), 1u) << what;
        EXPECT_EQ(double(run.stats[r].bytes_sent.at(name)), predicted.at(name)) << what;
      }
    }
}

plan::PlanConfig one_layer_config(int num_ranks, std::int64_t tokens_per_rank, std::int64_t hidden, std::int64_t ffn,
                                  int num_experts, int top_k) {
  plan::PlanConfig c;
  c.model = {.name = "engine-layer",
             .num_layers = 1,
             .hidden = hidden,
             .moe_ffn = ffn,
             .num_experts = num_experts,
             .top_k = top_k,
             .vocab = 1,
             .attention = {.num_heads = 1, .num_kv_heads = 1, .qk_head_dim = 1, .v_head_dim = 1}};
  c.parallel = {.ep = num_ranks, .per_device_batch_size = 1, .seq_len = tokens_per_rank};
  c.activation_type = plan::ElementType::f32;  // the engine saves f32 rows
  c.remat = plan::default_remat();
  return c;
}

TEST(PlanVsEngine, SavedActivationsMatchTheLedger) {
  const int num_ranks = 4, num_experts = 8, top_k = 2;
  const std::int64_t hidden = 8, ffn = 6, tokens_per_rank = 1024;
  RouterConfig router{.kind = RouterKind::random, .num_experts = num_experts, .top_k = top_k, .seed = 7};
  const testing::MoeProblem p = testing::make_problem(tokens_per_rank * num_ranks, hidden, ffn, router, 90);
  const std::pair<TokenFormat, plan::TokenTransfer> formats[] = {
      {TokenFormat::f32, plan::TokenTransfer::activation_dtype},
      {TokenFormat::fp8_tensor, plan::TokenTransfer::fp8_tensor},
      {TokenFormat::fp8_token, plan::TokenTransfer::fp8_token}};
  for (const auto& [format, transfer] : formats) {
    plan::PlanConfig c = one_layer_config(num_ranks, tokens_per_rank, hidden, ffn, num_experts, top_k);
    c.token_transfer = transfer;
    for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
      options.ep.token_format = format;
      const EpRunResult run = testing::run_ep_layer(p, options);
      for (int r = 0; r < num_ranks; ++r) {
        const auto& peaks = run.memory[r].peak_bytes_by_name;
        const auto& groups = run.stats[r].rows_per_local_expert;
        const double rows = double(std::accumulate(groups.begin(), groups.end(), std::int64_t{0}));
        const std::string what = to_string(dispatch) + " " + to_string(format) + " rank " + std::to_string(r);
        // Exact at the measured rows.
        EXPECT_EQ(double(peaks.at("saved/x_sorted")),
                  plan::x_sorted_bytes(rows, c.saved_row_form(), hidden, num_experts / num_ranks))
            << what;
        for (const char* name : {"mlpwi_0", "mlpwi_1", "mlpwo"})
          EXPECT_EQ(double(peaks.at(std::string("saved/") + name)),
                    plan::routed_expert_activation_bytes(name, rows, hidden, ffn, 4))
              << what << " " << name;
        // The projection (uniform routing, N_l·K rows) within 5%.
        for (const char* name : {"x_sorted", "mlpwi_0", "mlpwi_1", "mlpwo"}) {
          const double projected = plan::activation_footprint(c, name).bytes_per_device;
          const double measured = double(peaks.at(std::string("saved/") + name));
          EXPECT_NEAR(projected / measured, 1.0, 0.05) << what << " " << name;
        }
      }
    }
  }
}

// compute_dtype=bf16 with f32 tokens: x_sorted is kept in bf16, 2 bytes per
// value, and the plan (activation_type=bf16) predicts it exactly.
TEST(PlanVsEngine, Bf16OperandsKeepXSortedInBf16) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (it needs AVX-512)";
  const int num_experts = 12, top_k = 2;
  const std::int64_t hidden = 8, ffn = 6, tokens_per_rank = 64;
  RouterConfig router{.kind = RouterKind::random, .num_experts = num_experts, .top_k = top_k, .seed = 7};
  for (const int num_ranks : {1, 2, 3, 4}) {
    const testing::MoeProblem p = testing::make_problem(tokens_per_rank * num_ranks, hidden, ffn, router, 91);
    plan::PlanConfig c = one_layer_config(num_ranks, tokens_per_rank, hidden, ffn, num_experts, top_k);
    c.activation_type = plan::ElementType::bf16;
    for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      const EpRunResult run =
          testing::run_ep_layer(p, {.num_ranks = num_ranks, .dispatch = dispatch, .compute_dtype = ComputeDType::bf16});
      for (int r = 0; r < num_ranks; ++r) {
        const auto& groups = run.stats[r].rows_per_local_expert;
        const double rows = double(std::accumulate(groups.begin(), groups.end(), std::int64_t{0}));
        EXPECT_EQ(double(run.memory[r].peak_bytes_by_name.at("saved/x_sorted")),
                  plan::x_sorted_bytes(rows, c.saved_row_form(), hidden, num_experts / num_ranks))
            << to_string(dispatch) << " R" << num_ranks << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace epmoe
