// The layer on the modelled clock (clock=modelled): ranks as threads, R in
// {2, 3, 4}, ring and switched links. The clock changes when things happen,
// never what is computed: every dispatcher gives the same bits on both
// clocks, and its modelled times are the same run to run. Under TSan this
// is the virtual timeline's shared state exercised by every dispatcher
// (staged sends, replica messages, collectives in flight side by side).
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank, clock=modelled; R in {2, 3, 4}.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <tuple>

#include "balance/routing_skew.h"
#include "ep_harness.h"
#include "expect_reference.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::EpRunResult;
using testing::expect_same_bits;
using testing::MoeProblem;
using transport::threads::LinkTopology;

struct ModelledVariant {
  std::string name;
  DispatchKind dispatch;
  bool dedup = false;
  int chunks = 1;
  TokenFormat tokens = TokenFormat::f32;
  int redundant_slots = 0;
};

class ModelledLayer : public ::testing::TestWithParam<std::tuple<int, LinkTopology>> {};

TEST_P(ModelledLayer, EveryDispatcherGivesTheSameBitsOnBothClocks) {
  const auto [num_ranks, topology] = GetParam();
  const int num_experts = 2 * num_ranks;
  RouterConfig router{.kind = RouterKind::sigmoid_grouped, .num_experts = num_experts, .top_k = 2};
  MoeProblem p = testing::make_problem(12 * num_ranks, 8, 6, router, 40 + num_ranks);
  const std::vector<float> bias = balance::zipf_selection_bias({.num_experts = num_experts,
                                                                .num_ranks = num_ranks,
                                                                .zipf_exponent = 1.2,
                                                                .placement = balance::HotExpertPlacement::packed,
                                                                .scale = 1.0});
  for (int e = 0; e < num_experts; ++e) p.bias.data<float>()[e] = bias[e];
  const std::vector<ModelledVariant> variants = {
      {"alltoall", DispatchKind::alltoall},
      {"alltoall dedup chunks=2", DispatchKind::alltoall, true, 2},
      {"ring fp8 chunks=2", DispatchKind::ring, false, 2, TokenFormat::fp8_token},
      {"alltoall dedup replicas", DispatchKind::alltoall, true, 1, TokenFormat::f32, 1},
      {"ring replicas", DispatchKind::ring, false, 1, TokenFormat::f32, 1},
  };
  for (const ModelledVariant& v : variants) {
    EpRunOptions options{.num_ranks = num_ranks, .dispatch = v.dispatch};
    options.ep.dedup = v.dedup;
    options.ep.num_chunks = v.chunks;
    options.ep.token_format = v.tokens;
    // A modelled-time deadlock (a sender waiting in real time for a receiver
    // behind it in virtual time: R=4 ring links did, before sends were
    // staged) fails in seconds, not at the 60 s default.
    options.ep.timeout = std::chrono::seconds(20);
    if (v.redundant_slots > 0) {
      options.ep.balance = BalanceMode::dynamic;
      options.ep.redundant_slots = v.redundant_slots;
      options.ep.rebalance_threshold = 1.0;
    }
    const EpRunResult wall = testing::run_ep_layer(p, options);
    options.modelled = {.enabled = true, .peak_flops = 1e12, .compute_efficiency = 0.5, .memory_bytes_per_s = 1e12};
    options.links.bandwidth_gb_per_s = 10;
    options.links.latency_us = 1;
    options.links.topology = topology;
    const EpRunResult modelled = testing::run_ep_layer(p, options);
    const std::string what =
        v.name + " R=" + std::to_string(num_ranks) + " " + transport::threads::link_topology_name(topology);
    expect_same_bits(modelled, wall, what);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndLinks, ModelledLayer,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(LinkTopology::ring, LinkTopology::switched)));

}  // namespace
}  // namespace epmoe
