// The per-rank key API (<epmoe/keys.h>) prices replicas as `epmoe layer`
// does on the same keys (issue 31): a per-rank group made with
// config_from_keys and the whole-world layer (what `epmoe layer` runs) plan
// the same priced replicas (the same replicas, refusals, rank loads and
// predicted cost), and their outputs have the same bits. Before the
// per-rank API derived the rates, its groups planned unpriced (balance
// whatever it costs) where `epmoe layer` priced, and the outputs differed.
//
// Topology: R = 4 ranks as threads, one compute thread each (run_ranks'
// compute_threads_per_rank = 1; threads=4 split over ranks=4 on the
// whole-world side); N = 256 tokens, H = 32, F = 48, E = 8 experts, top-2,
// router=sigmoid_grouped with a mild Zipf-1.2 selection bias (scale 0.1:
// rank loads 165, 135, 124, 88 rows, so the plan to the ideal needs a small
// run that does not pay for its slot's transfers), hot experts spread over
// the ranks (balance/routing_skew.h); balance=dynamic redundant_slots=2
// rebalance_threshold=1.0 on the all-to-all with dedup and on the ring. Rank
// r holds token rows [r*N/R, (r+1)*N/R) and experts [2r, 2r+2).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <epmoe/ep_group.h>
#include <epmoe/keys.h>
#include <epmoe/moe_layer.h>
#include <epmoe/threads_world.h>
#include <epmoe/whole_world_layer.h>

#include <nlohmann/json.hpp>

#include "balance/routing_skew.h"

namespace epmoe {
namespace {

constexpr std::int64_t kTokens = 256, kHidden = 32, kFfn = 48;
constexpr int kExperts = 8, kTopK = 2, kRanks = 4;

struct Problem {
  Problem() {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (std::vector<float>* v : {&x, &gate, &wi0, &wi1, &wo})
      for (float& value : *v) value = normal(rng);
  }
  std::vector<float> x = std::vector<float>(kTokens * kHidden), gate = std::vector<float>(kHidden * kExperts),
                     wi0 = std::vector<float>(kExperts * kHidden * kFfn),
                     wi1 = std::vector<float>(kExperts * kHidden * kFfn),
                     wo = std::vector<float>(kExperts * kFfn * kHidden);
  std::vector<float> bias = balance::zipf_selection_bias(
      {.num_experts = kExperts, .num_ranks = kRanks, .placement = balance::HotExpertPlacement::spread, .scale = 0.1});
};

struct ForwardResult {
  std::vector<float> y = std::vector<float>(kTokens * kHidden);
  std::vector<std::int32_t> topk_ids = std::vector<std::int32_t>(kTokens * kTopK);
  std::vector<float> topk_weights = std::vector<float>(kTokens * kTopK);
  ReplicaStats rank0_replicas;  // the per-rank run's (every rank plans the same)
};

std::map<std::string, std::string> layer_keys(const std::string& dispatch_keys) {
  std::map<std::string, std::string> keys = {{"top_k", std::to_string(kTopK)},
                                             {"router", "sigmoid_grouped"},
                                             {"balance", "dynamic"},
                                             {"redundant_slots", "2"},
                                             {"rebalance_threshold", "1.0"}};
  if (dispatch_keys == "ring") {
    keys["dispatch"] = "ring";
  } else {
    keys["dedup"] = "true";
  }
  return keys;
}

ForwardResult whole_world(const Problem& p, std::map<std::string, std::string> keys, nlohmann::json& balance) {
  keys["ranks"] = std::to_string(kRanks);
  keys["threads"] = std::to_string(kRanks);  // one compute thread per rank, as the per-rank run
  WholeWorldLayer layer(keys);
  ForwardResult out;
  layer.run({.x = TensorView(p.x.data(), {kTokens, kHidden}),
             .gate = TensorView(p.gate.data(), {kHidden, kExperts}),
             .wi0 = TensorView(p.wi0.data(), {kExperts, kHidden, kFfn}),
             .wi1 = TensorView(p.wi1.data(), {kExperts, kHidden, kFfn}),
             .wo = TensorView(p.wo.data(), {kExperts, kFfn, kHidden}),
             .bias = TensorView(p.bias.data(), {kExperts})},
            {.y = MutableTensorView(out.y.data(), {kTokens, kHidden}),
             .topk_ids = MutableTensorView(out.topk_ids.data(), {kTokens, kTopK}),
             .topk_weights = MutableTensorView(out.topk_weights.data(), {kTokens, kTopK})});
  balance = nlohmann::json::parse(layer.metrics_json()).at("balance");
  return out;
}

ForwardResult per_rank(const Problem& p, const std::map<std::string, std::string>& keys) {
  ForwardResult out;
  run_ranks(
      kRanks,
      [&](Communicator& comm) {
        const LayerConfigs configs = config_from_keys(keys, kHidden, kFfn, kExperts);
        EpGroup group(comm, configs.ep);
        MoeLayer layer(configs.layer, group);
        const std::int64_t t0 = kTokens * comm.rank() / kRanks, n = kTokens * (comm.rank() + 1) / kRanks - t0;
        const std::int64_t el = group.num_local_experts(), e0 = group.first_local_expert(), hf = kHidden * kFfn;
        layer.forward(TensorView(p.x.data() + t0 * kHidden, {n, kHidden}),
                      {.gate = TensorView(p.gate.data(), {kHidden, kExperts}),
                       .wi0 = TensorView(p.wi0.data() + e0 * hf, {el, kHidden, kFfn}),
                       .wi1 = TensorView(p.wi1.data() + e0 * hf, {el, kHidden, kFfn}),
                       .wo = TensorView(p.wo.data() + e0 * hf, {el, kFfn, kHidden}),
                       .bias = TensorView(p.bias.data(), {kExperts})},
                      {},
                      {.y = MutableTensorView(out.y.data() + t0 * kHidden, {n, kHidden}),
                       .topk_ids = MutableTensorView(out.topk_ids.data() + t0 * kTopK, {n, kTopK}),
                       .topk_weights = MutableTensorView(out.topk_weights.data() + t0 * kTopK, {n, kTopK})});
        if (comm.rank() == 0) out.rank0_replicas = layer.last_step_stats().replicas;
      },
      /*compute_threads_per_rank=*/1);
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(PerRankKeys, APerRankGroupPlansThePricedReplicasEpmoeLayerPlans) {
  const Problem p;
  for (const std::string dispatch : {"alltoall dedup", "ring"}) {
    const std::map<std::string, std::string> keys = layer_keys(dispatch);
    nlohmann::json priced, unpriced;
    const ForwardResult cli = whole_world(p, keys, priced);
    std::map<std::string, std::string> off_keys = keys;
    off_keys["replica_costs"] = "off";
    whole_world(p, off_keys, unpriced);
    // The case is one where pricing matters: replicas that pay are placed,
    // and the balance plan's others are refused.
    ASSERT_TRUE(priced.at("priced").get<bool>()) << dispatch << ": replica_costs=priced is the default";
    ASSERT_GT(priced.at("num_replicas").get<int>(), 0) << dispatch;
    ASSERT_GT(priced.at("refused_replicas").get<int>(), 0) << dispatch;
    ASSERT_LT(priced.at("num_replicas").get<int>(), unpriced.at("num_replicas").get<int>()) << dispatch;

    const ForwardResult rank = per_rank(p, keys);
    const ReplicaStats& stats = rank.rank0_replicas;
    EXPECT_GT(stats.predicted_cost_seconds, 0) << dispatch << ": the per-rank group priced nothing";
    EXPECT_EQ(stats.num_replicas, priced.at("num_replicas").get<int>()) << dispatch;
    EXPECT_EQ(stats.refused_replicas, priced.at("refused_replicas").get<int>()) << dispatch;
    EXPECT_EQ(stats.rank_loads_after, priced.at("rank_loads_after").get<std::vector<std::int64_t>>()) << dispatch;
    EXPECT_DOUBLE_EQ(stats.predicted_cost_seconds * 1e6, priced.at("predicted_cost_us").get<double>()) << dispatch;
    EXPECT_TRUE(same_bits(rank.y, cli.y)) << dispatch;
    EXPECT_TRUE(same_bits(rank.topk_ids, cli.topk_ids)) << dispatch;
    EXPECT_TRUE(same_bits(rank.topk_weights, cli.topk_weights)) << dispatch;
  }
}

}  // namespace
}  // namespace epmoe
