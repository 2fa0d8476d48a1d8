// The replica exchange's weight transfer (ep/replica_exchange.h) on its own,
// ranks as threads, R = 2, one expert per rank, B = 1: every (token, k) pair
// of both ranks picks expert 0 (homed on rank 0), so the plan puts expert 0's
// replica in rank 1's slot and rank 0 sends it wi0, wi1 and wo (H = 4, F = 3).
//  * compute_dtype=f32: 3·H·F·4 bytes, the slot holds the home weights bit
//    for bit;
//  * compute_dtype=bf16 (issue 31 item 2): 3·H·F·2 bytes, half of f32's, and
//    the slot holds what the experts' GEMM reads: its bf16 conversion of the
//    slot equals its bf16 conversion of the home weights, bit for bit (this
//    CPU may refuse bf16 GEMMs, compute_dtype=bf16 layers included: the
//    exchange runs no GEMM, so its bytes and bits are checked here).
//  * priced (EpConfig::replica_costs): the exchange prices the weights at
//    the bytes it sends, half as dear in bf16;
//  * replica_planning=forecast: the forecast decides whether a step looks,
//    and the planning state carries it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ep/replica_exchange.h"
#include "kernels/convert.h"
#include "transport/threads/launcher.h"

namespace epmoe::ep {
namespace {

constexpr std::int64_t kHidden = 4, kFfn = 3, kElements = kHidden * kFfn;
constexpr std::uint32_t kTagBase = 1 << 20;

EpConfig two_rank_config() {
  EpConfig config{.num_experts = 2, .top_k = 1, .hidden = kHidden, .tag_base = kTagBase};
  config.balance = BalanceMode::dynamic;
  config.redundant_slots = 1;
  config.rebalance_threshold = 1.0;
  return config;
}

// Home weights with bits below bf16's precision, so that rounding shows.
float weight_value(int rank, int part, std::int64_t i) {
  return 1.0f + 0.001f * static_cast<float>(rank * 100 + part * 20 + i) + 1e-6f;
}

struct Transferred {
  std::int64_t bytes_sent_by_home = -1;
  std::vector<float> slot[3];  // rank 1's slot 0
  std::vector<float> home[3];  // rank 0's expert 0
};

Transferred transfer(ComputeDType dtype) {
  Transferred out;
  transport::threads::run_ranks(2, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    ReplicaExchange exchange(comm, two_rank_config(), {.ffn = kFfn, .compute_dtype = dtype});
    const std::vector<std::int32_t> topk_ids(6, 0);
    exchange.plan_step(topk_ids, kTagBase, 1);
    EXPECT_EQ(exchange.plan().slot_expert(1, 0), 0);
    Tensor parts[3] = {Tensor::zeros(DType::f32, {1, kHidden, kFfn}), Tensor::zeros(DType::f32, {1, kHidden, kFfn}),
                       Tensor::zeros(DType::f32, {1, kFfn, kHidden})};
    for (int p = 0; p < 3; ++p)
      for (std::int64_t i = 0; i < kElements; ++i) parts[p].data<float>()[i] = weight_value(comm.rank(), p, i);
    exchange.start_slot_weights({parts[0].view(), parts[1].view(), parts[2].view()}, 1, kTagBase);
    const std::int64_t bytes = exchange.finish_slot_weights();
    if (comm.rank() == 0) {
      out.bytes_sent_by_home = bytes;
      for (int p = 0; p < 3; ++p) out.home[p].assign(parts[p].data<float>(), parts[p].data<float>() + kElements);
    } else {
      EXPECT_EQ(bytes, 0);
      for (int p = 0; p < 3; ++p)
        out.slot[p].assign(exchange.slot_weights(p, 0), exchange.slot_weights(p, 0) + kElements);
    }
  });
  return out;
}

TEST(ReplicaExchange, F32WeightsTravelAsTheyAre) {
  const Transferred t = transfer(ComputeDType::f32);
  EXPECT_EQ(t.bytes_sent_by_home, 3 * kElements * 4);
  for (int p = 0; p < 3; ++p) EXPECT_EQ(std::memcmp(t.slot[p].data(), t.home[p].data(), kElements * 4), 0) << p;
}

TEST(ReplicaExchange, Bf16WeightsTravelInHalfTheBytesWithTheBitsTheGemmReads) {
  const Transferred t = transfer(ComputeDType::bf16);
  EXPECT_EQ(t.bytes_sent_by_home, 3 * kElements * 2);
  bool rounded = false;
  for (int p = 0; p < 3; ++p)
    for (std::int64_t i = 0; i < kElements; ++i) {
      EXPECT_EQ(float_to_bf16(t.slot[p][i]).bits, float_to_bf16(t.home[p][i]).bits) << p << " " << i;
      EXPECT_EQ(t.slot[p][i], bf16_to_float(float_to_bf16(t.home[p][i]))) << p << " " << i;
      rounded |= t.slot[p][i] != t.home[p][i];
    }
  EXPECT_TRUE(rounded) << "the test's weights must have bits bf16 drops";
}

TEST(ReplicaExchange, PricesWeightsAtTheBytesTheySend) {
  EpConfig config = two_rank_config();
  config.replica_costs = {.compute_flops_per_s = 1e12, .link_bytes_per_s = 1e9, .link_latency_s = 0};
  transport::threads::run_ranks(1, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    config.num_experts = 1;
    const ReplicaExchange f32(comm, config, {.ffn = kFfn, .compute_dtype = ComputeDType::f32});
    const ReplicaExchange bf16(comm, config, {.ffn = kFfn, .compute_dtype = ComputeDType::bf16});
    EXPECT_DOUBLE_EQ(f32.costs().weight_seconds, 3 * kElements * 4 / 1e9);
    EXPECT_DOUBLE_EQ(bf16.costs().weight_seconds, 3 * kElements * 2 / 1e9);
    EXPECT_DOUBLE_EQ(bf16.costs().gradient_seconds, 3 * kElements * 4 / 1e9);  // gradients stay f32
    EXPECT_DOUBLE_EQ(f32.costs().row_seconds, 18.0 * kElements / 1e12);
    // The all-to-all's rows: token out, output back, cotangent out, dx back.
    EXPECT_DOUBLE_EQ(f32.costs().token_row_seconds, kHidden * 16 / 1e9);
    EXPECT_EQ(f32.costs().plan_seconds, 0);  // one rank: no counts round
  });
}

// replica_planning=forecast: a step without a forecast goes home with no
// counts round; after forecast_from on counts whose plan places a replica
// the next step looks and places it; the forecast is in the planning state
// (format 3), a format-2 state is read as no forecast, and an unknown
// format is refused naming it.
TEST(ReplicaExchange, AForecastDecidesWhetherTheNextStepLooks) {
  EpConfig config = two_rank_config();
  config.replica_planning = ReplicaPlanning::forecast;
  const std::vector<std::int32_t> topk_ids(8, 0);           // every pair of both ranks picks expert 0
  const std::vector<std::int64_t> counts = {8, 0, 8, 0};    // [R, E]: those counts
  const std::vector<std::int64_t> balanced = {4, 4, 4, 4};  // a plan on these places nothing
  transport::threads::run_ranks(2, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    ReplicaExchange exchange(comm, config, {.ffn = kFfn});
    exchange.plan_step(topk_ids, kTagBase);
    EXPECT_TRUE(exchange.stats().skipped_planning);  // no forecast yet
    EXPECT_EQ(exchange.stats().bytes_sent.count("forward/ring_all_gather replica counts"), 0u);
    exchange.forecast_from(counts);
    EXPECT_EQ(exchange.planning_state().back(), 2);  // look
    exchange.plan_step(topk_ids, kTagBase);
    EXPECT_FALSE(exchange.stats().skipped_planning);
    EXPECT_EQ(exchange.stats().num_replicas, 1);
    exchange.forecast_from(balanced);
    EXPECT_EQ(exchange.planning_state().back(), 1);  // home
    exchange.plan_step(topk_ids, kTagBase);
    EXPECT_TRUE(exchange.stats().skipped_planning);

    exchange.forecast_from(counts);
    std::vector<std::int64_t> state = exchange.planning_state();
    ASSERT_EQ(state[0], 3);
    ReplicaExchange resumed(comm, config, {.ffn = kFfn});
    resumed.restore_planning_state(state);
    EXPECT_EQ(resumed.planning_state(), state);
    state.pop_back();
    state[0] = 2;  // before the forecast: read as none
    resumed.restore_planning_state(state);
    EXPECT_EQ(resumed.planning_state().back(), 0);
    state[0] = 4;
    try {
      resumed.restore_planning_state(state);
      ADD_FAILURE() << "format 4 accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("format 4"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace epmoe::ep
