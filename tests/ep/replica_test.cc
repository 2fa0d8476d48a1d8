// Dynamic redundant experts (issue 6, ep/replica_exchange.h) under Zipf-skewed
// routing where the planner really places replicas:
//  * y, dx, dgate, dwi0, dwi1, dwo with replicas on equal replicas off within
//    1e-5 (relative to max|ref|) and the double reference, for both
//    dispatchers (all-to-all with and without dedup, ring of experts),
//    R in {2, 3, 4, 8}, B in {1, 2}, token chunks 1 and 2;
//  * every redundant slot and every home expert computes exactly the rows the
//    plan gave it;
//  * every replica's gradient goes home once (bytes), and the home dW equals
//    the reference's, which holds every token's contribution exactly once;
//  * replica weights are not resent while the weight version is unchanged,
//    and are resent when it changes;
//  * the exchange's statistics (ep/replica_stats.h) are each step's own:
//    rows per slot and slots refreshed do not carry over between steps;
//  * priced plans (EpConfig::replica_costs): replicas that pay are placed,
//    those that do not are refused, both match the reference; a kept
//    replica at an unchanged weight version moves no bytes; on the modelled
//    clock, a plan the planner places (hot experts packed, transfers
//    latency-bound) runs faster than no replicas;
//  * locality-first sub-quotas: every copy computes its own rank's pairs
//    first (min(quota, own count)), checked through the all-to-all's bytes;
//  * the dedup-aware replica choice (balance/dedup_aware_choice.h) under
//    packed Zipf routing with K = 4, R in {1, 2, 3, 4}: same checks, and never
//    more token bytes than the positional rule (fewer in total).
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R in {1, 2, 3, 4, 8}.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>

#include "balance/routing_skew.h"
#include "core/error.h"
#include "ep/replica_rate_probe.h"
#include "ep_harness.h"
#include "expect_reference.h"
#include "hardware/replica_cost_rates.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::EpRunResult;
using testing::ids_of;
using testing::MoeProblem;

constexpr std::int64_t kHidden = 8, kFfn = 6;

using testing::as_double;

// The router's selection bias towards Zipf-hot experts (s = 1.2), packed
// on rank 0 or spread over the ranks.
void bias_towards_hot_experts(MoeProblem& p, int num_ranks,
                              balance::HotExpertPlacement placement = balance::HotExpertPlacement::packed) {
  const int num_experts = p.router.num_experts;
  const std::vector<float> bias = balance::zipf_selection_bias(
      {.num_experts = num_experts, .num_ranks = num_ranks, .zipf_exponent = 1.2, .placement = placement, .scale = 1.0});
  for (int e = 0; e < num_experts; ++e) p.bias.data<float>()[e] = bias[e];
}

// sigmoid_grouped routing, E = 2R experts, K = 2, hot experts packed on rank 0.
MoeProblem skewed_problem(int num_ranks, balance::HotExpertPlacement placement = balance::HotExpertPlacement::packed) {
  RouterConfig router{.kind = RouterKind::sigmoid_grouped, .num_experts = 2 * num_ranks, .top_k = 2};
  MoeProblem p = testing::make_problem(16 * num_ranks, kHidden, kFfn, router, 300 + num_ranks);
  bias_towards_hot_experts(p, num_ranks, placement);
  return p;
}

void expect_close(const EpRunResult& got, const EpRunResult& want, const std::string& what) {
  EXPECT_EQ(ids_of(got.topk_ids), ids_of(want.topk_ids)) << what;
  EXPECT_LE(testing::relative_error(got.y, as_double(want.y)), 1e-5) << what << " y";
  EXPECT_LE(testing::relative_error(got.grads.dx, as_double(want.grads.dx)), 1e-5) << what << " dx";
  EXPECT_LE(testing::relative_error(got.grads.dgate, as_double(want.grads.dgate)), 1e-5) << what << " dgate";
  EXPECT_LE(testing::relative_error(got.grads.dwi0, as_double(want.grads.dwi0)), 1e-5) << what << " dwi0";
  EXPECT_LE(testing::relative_error(got.grads.dwi1, as_double(want.grads.dwi1)), 1e-5) << what << " dwi1";
  EXPECT_LE(testing::relative_error(got.grads.dwo, as_double(want.grads.dwo)), 1e-5) << what << " dwo";
}

void expect_matches_reference(const MoeProblem& p, const EpRunResult& run, const std::string& what) {
  const testing::ReferenceResult ref = testing::reference_moe(p, ids_of(run.topk_ids));
  testing::expect_matches_reference(run, ref, what);
}

// Every copy computed exactly its quota; returns the plan's replica count.
int expect_quotas_met(const EpRunResult& run, const std::string& what) {
  const int num_replicas = run.replica_stats[0].num_replicas;
  int occupied = 0;
  for (std::size_t r = 0; r < run.replica_stats.size(); ++r) {
    const ep::ReplicaStats& s = run.replica_stats[r];
    EXPECT_EQ(s.num_replicas, num_replicas) << what << " rank " << r << ": every rank has the same plan";
    EXPECT_EQ(s.rows_per_slot, s.slot_quotas) << what << " rank " << r << " slots";
    EXPECT_EQ(run.stats[r].rows_per_local_expert, s.home_quotas) << what << " rank " << r << " home experts";
    for (std::size_t b = 0; b < s.slot_experts.size(); ++b) {
      if (s.slot_experts[b] < 0) continue;
      ++occupied;
      EXPECT_GT(s.slot_quotas[b], 0) << what << " rank " << r << " slot " << b << " holds an expert but no tokens";
      EXPECT_NE(s.slot_experts[b] / static_cast<int>(s.home_quotas.size()), static_cast<int>(r))
          << what << " a replica on its own home rank";
    }
    EXPECT_EQ(std::accumulate(s.rank_loads_after.begin(), s.rank_loads_after.end(), std::int64_t{0}),
              std::accumulate(s.rank_loads_before.begin(), s.rank_loads_before.end(), std::int64_t{0}))
        << what;
    EXPECT_LE(s.max_over_mean_after, s.max_over_mean_before) << what;
  }
  EXPECT_EQ(occupied, num_replicas) << what;
  return num_replicas;
}

// Dynamic replicas as far as the slots allow (threshold 1.0), on R ranks.
EpRunOptions dynamic_replicas(int num_ranks, DispatchKind dispatch, int slots) {
  EpRunOptions on{.num_ranks = num_ranks, .dispatch = dispatch};
  on.ep.balance = BalanceMode::dynamic;
  on.ep.redundant_slots = slots;
  on.ep.rebalance_threshold = 1.0;
  return on;
}

std::int64_t total_bytes(const std::vector<ep::DispatchStats>& stats, const std::string& name) {
  std::int64_t sum = 0;
  for (const auto& s : stats) {
    const auto it = s.bytes_sent.find(name);
    if (it != s.bytes_sent.end()) sum += it->second;
  }
  return sum;
}

struct ReplicaVariant {
  DispatchKind dispatch;
  bool dedup;
};

class ReplicaEquivalence : public ::testing::TestWithParam<std::tuple<int, ReplicaVariant, int>> {};

TEST_P(ReplicaEquivalence, ReplicasOnEqualsOff) {
  const auto [num_ranks, variant, slots] = GetParam();
  const MoeProblem p = skewed_problem(num_ranks);
  for (int chunks : {1, 2}) {
    const std::string what = "chunks " + std::to_string(chunks);
    EpRunOptions off{.num_ranks = num_ranks, .dispatch = variant.dispatch};
    off.ep.dedup = variant.dedup;
    off.ep.num_chunks = chunks;
    EpRunOptions on = off;
    on.ep.balance = BalanceMode::dynamic;
    on.ep.redundant_slots = slots;
    on.ep.rebalance_threshold = 1.0;
    const EpRunResult run_off = testing::run_ep_layer(p, off);
    const EpRunResult run_on = testing::run_ep_layer(p, on);
    expect_close(run_on, run_off, what);
    expect_matches_reference(p, run_on, what);
    const int num_replicas = expect_quotas_met(run_on, what);
    ASSERT_GT(num_replicas, 0) << what << ": the skew must make the planner place replicas";
    EXPECT_LT(run_on.replica_stats[0].max_over_mean_after, run_on.replica_stats[0].max_over_mean_before) << what;
    // Each replica's weights came once from home, its gradient went home once.
    const std::int64_t expert_bytes = 3 * kHidden * kFfn * 4;
    EXPECT_EQ(total_bytes(run_on.stats, "forward/replica weights"), num_replicas * expert_bytes) << what;
    EXPECT_EQ(total_bytes(run_on.stats, "backward/replica gradients"), num_replicas * expert_bytes) << what;
    EXPECT_EQ(total_bytes(run_off.stats, "forward/replica weights"), 0) << what;
  }
}

std::string replica_variant_name(const ::testing::TestParamInfo<ReplicaEquivalence::ParamType>& info) {
  const auto [num_ranks, variant, slots] = info.param;
  return "R" + std::to_string(num_ranks) + "_" + to_string(variant.dispatch) + (variant.dedup ? "_dedup" : "") + "_B" +
         std::to_string(slots);
}

INSTANTIATE_TEST_SUITE_P(Sweep, ReplicaEquivalence,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(ReplicaVariant{DispatchKind::alltoall, false},
                                                              ReplicaVariant{DispatchKind::alltoall, true},
                                                              ReplicaVariant{DispatchKind::ring, false}),
                                            ::testing::Values(1, 2)),
                         replica_variant_name);

// The home gradient holds the replicas' contributions exactly once: the hot
// expert's tokens are split between home and replicas, yet its dW equals the
// reference's (which loops over every token once); dropping or doubling a
// replica's part would miss by that part, far above 1e-5.
TEST(Replicas, HomeGradientCountsReplicasOnce) {
  const MoeProblem p = skewed_problem(4);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpRunOptions on = dynamic_replicas(4, dispatch, 2);
    const EpRunResult run = testing::run_ep_layer(p, on);
    ASSERT_GT(expect_quotas_met(run, to_string(dispatch)), 0);
    // The hottest expert (0, packed on rank 0) is split: its home computes
    // only part of its tokens.
    std::int64_t replica_rows_of_0 = 0;
    for (const auto& s : run.replica_stats)
      for (std::size_t b = 0; b < s.slot_experts.size(); ++b)
        if (s.slot_experts[b] == 0) replica_rows_of_0 += s.rows_per_slot[b];
    EXPECT_GT(replica_rows_of_0, 0) << to_string(dispatch);
    const testing::ReferenceResult ref = testing::reference_moe(p, ids_of(run.topk_ids));
    const std::int64_t n = kHidden * kFfn;
    const Tensor dwi0_expert0 = testing::slice_rows(run.grads.dwi0, 0, 1);
    const std::vector<double> ref_expert0(ref.dwi0.begin(), ref.dwi0.begin() + n);
    EXPECT_LE(testing::relative_error(dwi0_expert0, ref_expert0), 1e-5) << to_string(dispatch);
    expect_matches_reference(p, run, to_string(dispatch));
  }
}

// Weight versions: step 1 reuses version 7 (nothing moves), step 2 brings 8.
TEST(Replicas, WeightsResentOnlyWhenVersionChanges) {
  const MoeProblem p = skewed_problem(4);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpRunOptions on = dynamic_replicas(4, dispatch, 2);
    on.weight_versions = {7, 7, 8};
    const EpRunResult run = testing::run_ep_layer(p, on);
    const int num_replicas = expect_quotas_met(run, to_string(dispatch));
    ASSERT_GT(num_replicas, 0);
    const std::int64_t expert_bytes = 3 * kHidden * kFfn * 4;
    EXPECT_EQ(total_bytes(run.step_stats[0], "forward/replica weights"), num_replicas * expert_bytes);
    EXPECT_EQ(total_bytes(run.step_stats[1], "forward/replica weights"), 0) << "unchanged version resent";
    EXPECT_EQ(total_bytes(run.step_stats[2], "forward/replica weights"), num_replicas * expert_bytes);
    for (const auto& step : run.step_stats)
      EXPECT_EQ(total_bytes(step, "backward/replica gradients"), num_replicas * expert_bytes);
    expect_matches_reference(p, run, to_string(dispatch));
  }
}

// Priced plans (issue 31, EpConfig::replica_costs) in the engine. Rows cost
// 18·H·F / 1e9 s = 0.86 us of compute (and 128 B on the all-to-all's
// links); a slot's weights and gradient 576 B each. Links at 1 GB/s with no
// latency: a slot costs 1.15 us and pays from 2 rows, so replicas are
// placed; with 1 ms of latency per message it costs 2 ms, more than every
// row of the step saves, so none is. Either way every copy computes its
// quota and the results match the double reference.
EpRunOptions priced_replicas(int num_ranks, DispatchKind dispatch, double link_latency_s) {
  EpRunOptions on = dynamic_replicas(num_ranks, dispatch, 2);
  on.ep.replica_costs = {.compute_flops_per_s = 1e9, .link_bytes_per_s = 1e9, .link_latency_s = link_latency_s};
  return on;
}

TEST(Replicas, PricedPlansPlaceWhatPaysRefuseWhatDoesNotAndMatchTheReference) {
  const MoeProblem p = skewed_problem(4);
  for (const ReplicaVariant variant :
       {ReplicaVariant{DispatchKind::alltoall, false}, ReplicaVariant{DispatchKind::alltoall, true},
        ReplicaVariant{DispatchKind::ring, false}}) {
    const std::string what = to_string(variant.dispatch) + (variant.dedup ? " dedup" : "");
    EpRunOptions cheap = priced_replicas(4, variant.dispatch, 0);
    cheap.ep.dedup = variant.dedup;
    const EpRunResult placed = testing::run_ep_layer(p, cheap);
    ASSERT_GT(expect_quotas_met(placed, what), 0) << what;
    const ep::ReplicaStats& chosen = placed.replica_stats[0];
    EXPECT_GT(chosen.predicted_saving_seconds, chosen.predicted_cost_seconds) << what;
    EXPECT_GT(chosen.predicted_cost_seconds, 0) << what;
    expect_matches_reference(p, placed, what + " cheap links");

    EpRunOptions dear = priced_replicas(4, variant.dispatch, 1e-3);
    dear.ep.dedup = variant.dedup;
    const EpRunResult refused = testing::run_ep_layer(p, dear);
    EXPECT_EQ(expect_quotas_met(refused, what), 0) << what;
    const ep::ReplicaStats& none = refused.replica_stats[0];
    EXPECT_GT(none.refused_replicas, 0) << what;
    EXPECT_LT(none.refused_saving_seconds, none.refused_cost_seconds) << what;
    EXPECT_EQ(total_bytes(refused.stats, "forward/replica weights"), 0) << what;
    EXPECT_EQ(total_bytes(refused.stats, "backward/replica gradients"), 0) << what;
    expect_matches_reference(p, refused, what + " dear links");
  }
}

// replica_costs=measured: the first plan measures the rates (a product of
// the experts' shape, two ring shifts, an all-gather of every rank's
// figures, ep/replica_rate_probe.h); every rank then prices at the same
// rates, later plans do not measure again, and the results match the double
// reference. The wall-clock figures themselves are not asserted (the machine
// is shared): only that they are positive, finite and identical on every
// rank.
TEST(Replicas, MeasuredRatesAreTheSameOnEveryRankAndMeasuredOnce) {
  for (int num_ranks : {2, 3})
    for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      const std::string what = to_string(dispatch) + " R" + std::to_string(num_ranks);
      const MoeProblem p = skewed_problem(num_ranks);
      EpRunOptions on = dynamic_replicas(num_ranks, dispatch, 1);
      on.ep.replica_costs.measure = true;
      on.weight_versions = {1, 2, 3};
      const EpRunResult run = testing::run_ep_layer(p, on);
      const ReplicaCostRates measured = run.step_replica_stats[0][0].priced_at;
      EXPECT_TRUE(measured.measure) << what;
      for (const double rate : {measured.compute_flops_per_s, measured.link_bytes_per_s, measured.link_latency_s}) {
        EXPECT_GT(rate, 0) << what;
        EXPECT_TRUE(std::isfinite(rate)) << what;
      }
      for (std::size_t step = 0; step < run.step_stats.size(); ++step) {
        const std::int64_t probe = total_bytes(run.step_stats[step], "forward/replica rate probe");
        if (step == 0) {
          EXPECT_GT(probe, 0) << what << ": the first plan measures";
        } else {
          EXPECT_EQ(probe, 0) << what << ", step " << step << ": measured once";
        }
        for (int r = 0; r < num_ranks; ++r) {
          const ep::ReplicaStats& stats = run.step_replica_stats[step][r];
          if (stats.skipped_planning) continue;
          EXPECT_EQ(stats.priced_at, measured) << what << ", step " << step << ", rank " << r;
        }
      }
      expect_matches_reference(p, run, what + " measured rates");
    }
}

TEST(ReplicaRates, TheAgreedRatesAreTheSlowestRanks) {
  const std::vector<ep::ReplicaRateProbe> probes = {
      {.compute_flops_per_s = 5e10, .link_bytes_per_s = 2e9, .link_latency_s = 3e-6},
      {.compute_flops_per_s = 4e10, .link_bytes_per_s = 9e9, .link_latency_s = 1e-6},
      {.compute_flops_per_s = 7e10, .link_bytes_per_s = 3e9, .link_latency_s = 8e-6}};
  const ReplicaCostRates rates = ep::agreed_replica_rates(probes);
  EXPECT_EQ(rates.compute_flops_per_s, 4e10);
  EXPECT_EQ(rates.link_bytes_per_s, 2e9);
  EXPECT_EQ(rates.link_latency_s, 8e-6);
  EXPECT_TRUE(rates.measure);
}

TEST(ReplicaRates, MeasuringAndSettingTheRatesIsRefused) {
  EpConfig config;
  config.num_experts = 4;
  config.top_k = 2;
  config.hidden = 8;
  config.balance = BalanceMode::dynamic;
  config.redundant_slots = 1;
  config.replica_costs.link_bytes_per_s = 1e9;
  config.replica_costs.measure = true;
  try {
    config.validate(2);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("replica_costs.link_bytes_per_s"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("measure"), std::string::npos) << e.what();
  }
}

// Stickiness in the engine: the second step at the same weight version keeps
// its replicas, moves no weight bytes, and is priced without them.
TEST(Replicas, AKeptReplicaAtTheSameWeightVersionMovesNoBytesAndCostsNoWeights) {
  const MoeProblem p = skewed_problem(4);
  EpRunOptions on = priced_replicas(4, DispatchKind::ring, 0);
  on.weight_versions = {7, 7};
  const EpRunResult run = testing::run_ep_layer(p, on);
  const ep::ReplicaStats& first = run.step_replica_stats[0][0];
  const ep::ReplicaStats& second = run.step_replica_stats[1][0];
  ASSERT_GT(first.num_replicas, 0);
  EXPECT_EQ(second.num_replicas, first.num_replicas);
  for (std::size_t r = 0; r < run.replica_stats.size(); ++r)
    EXPECT_EQ(run.step_replica_stats[1][r].slot_experts, run.step_replica_stats[0][r].slot_experts) << r;
  EXPECT_GT(total_bytes(run.step_stats[0], "forward/replica weights"), 0);
  EXPECT_EQ(total_bytes(run.step_stats[1], "forward/replica weights"), 0);
  EXPECT_EQ(second.predicted_saving_seconds, first.predicted_saving_seconds);
  EXPECT_LT(second.predicted_cost_seconds, first.predicted_cost_seconds);
  expect_matches_reference(p, run, "kept replicas");
}

// When a priced plan places nothing, the next 1, then 2, ... steps skip the
// counts round (no bytes, every pair home), then a plan looks again: steps
// plan, skip, plan, skip, skip, plan.
TEST(Replicas, RefusedPlansSkipTheCountsRoundForGrowingSpells) {
  const MoeProblem p = skewed_problem(4);
  EpRunOptions dear = priced_replicas(4, DispatchKind::alltoall, 1e-3);
  dear.ep.dedup = true;  // the dedup-aware choice must not run on a skipped step
  dear.weight_versions = {1, 2, 3, 4, 5, 6};
  const EpRunResult run = testing::run_ep_layer(p, dear);
  const std::vector<bool> skipped = {false, true, false, true, true, false};
  for (std::size_t step = 0; step < skipped.size(); ++step) {
    for (std::size_t r = 0; r < run.replica_stats.size(); ++r) {
      const ep::ReplicaStats& stats = run.step_replica_stats[step][r];
      EXPECT_EQ(stats.skipped_planning, skipped[step]) << "step " << step << " rank " << r;
      EXPECT_EQ(stats.num_replicas, 0) << "step " << step;
    }
    const std::int64_t counts_bytes = total_bytes(run.step_stats[step], "forward/ring_all_gather replica counts");
    if (skipped[step])
      EXPECT_EQ(counts_bytes, 0) << "step " << step;
    else
      EXPECT_GT(counts_bytes, 0) << "step " << step;
  }
  expect_matches_reference(p, run, "skipped planning");
}

// The b200 case of docs/BENCHMARKS.md "Priced replicas" in small, on the
// modelled clock: R = 8, hot experts packed on rank 0, switched links where
// a message's latency (2 us) is five times its bytes' time (the 12 KB of a
// replica's weights at 50 GB/s). Rank 0's port feeds seven replicas' weights
// and takes their gradients home; priced with the latency once per port (it
// runs while the next message's bytes cross), the balance plan pays and the
// step is faster than without replicas. With the latency priced per
// transfer it cost 45 us against a 25 us saving and was refused, though it
// ran 1.38x no replicas. Two training steps (new weights each), the second
// timed, each side the same.
TEST(Replicas, APricedPlanThatPlacesReplicasRunsFasterThanNoneOnTheModelledClock) {
  constexpr int kRanks = 8, kExperts = 16;
  RouterConfig router{.kind = RouterKind::sigmoid_grouped, .num_experts = kExperts, .top_k = 2};
  MoeProblem p = testing::make_problem(128 * kRanks, 16, 64, router, 31);
  bias_towards_hot_experts(p, kRanks);
  EpRunOptions off{.num_ranks = kRanks, .dispatch = DispatchKind::alltoall};
  off.modelled = {.enabled = true, .peak_flops = 2e12, .compute_efficiency = 1.0, .memory_bytes_per_s = 1e12};
  off.links = {.bandwidth_gb_per_s = 50, .latency_us = 2, .topology = transport::threads::LinkTopology::switched};
  off.weight_versions = {1, 2};
  EpRunOptions priced = off;
  priced.ep.balance = BalanceMode::dynamic;
  priced.ep.redundant_slots = 1;
  priced.ep.replica_costs = hardware::replica_cost_rates(priced.modelled, priced.links, 1);
  const EpRunResult none = testing::run_ep_layer(p, off);
  const EpRunResult placed = testing::run_ep_layer(p, priced);
  const ep::ReplicaStats& chosen = placed.replica_stats[0];
  ASSERT_GT(chosen.num_replicas, 0) << "refused: saving " << chosen.refused_saving_seconds << " s, cost "
                                    << chosen.refused_cost_seconds << " s (or the step skipped planning)";
  expect_quotas_met(placed, "priced");
  EXPECT_GT(chosen.predicted_saving_seconds, chosen.predicted_cost_seconds);
  EXPECT_LT(placed.modelled_step(1), none.modelled_step(1));
  expect_matches_reference(p, placed, "priced on the modelled clock");
}

// Recomputed x_sorted: the ring re-collects a chunk's rows with the same
// replica positions, the all-to-all re-sends the same plan.
TEST(Replicas, RematDispatchKeepsTheSameRows) {
  const MoeProblem p = skewed_problem(3, balance::HotExpertPlacement::spread);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpRunOptions on = dynamic_replicas(3, dispatch, 1);
    on.ep.num_chunks = 2;
    on.remat = RematPolicy::preset("remat", "full");
    const EpRunResult run = testing::run_ep_layer(p, on);
    expect_quotas_met(run, to_string(dispatch));
    expect_matches_reference(p, run, to_string(dispatch));
  }
}

TEST(Replicas, ConfigErrors) {
  EpConfig config{.num_experts = 8, .top_k = 2, .hidden = 4};
  config.balance = BalanceMode::periodic;
  config.balance_period = 0;
  EXPECT_THROW(config.validate(2), ConfigError);
  config.balance_period = 5;
  EXPECT_NO_THROW(config.validate(2));
  // Cost rates: finite and >= 0, the message naming the field.
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    EpConfig priced = config;
    priced.replica_costs.link_bytes_per_s = bad;
    try {
      priced.validate(2);
      ADD_FAILURE() << "link_bytes_per_s=" << bad << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("replica_costs.link_bytes_per_s"), std::string::npos) << e.what();
    }
  }
  config.balance = BalanceMode::dynamic;
  config.redundant_slots = 1;
  config.capacity_factor = 1.5;
  EXPECT_THROW(config.validate(2), ConfigError);
  config.capacity_factor = 0;
  config.rebalance_threshold = 0.5;
  EXPECT_THROW(config.validate(2), ConfigError);
  EXPECT_THROW(ep::parse_balance_mode("balance", "sometimes"), ConfigError);
}

// The exchange's statistics are each step's own, not the run's: over three
// steps on one problem (versions 7, 7, 8), every step's slots computed
// exactly that step's quotas (rows counted over all steps would be a
// multiple), and slots_refreshed counts only the step's weight transfers:
// every replica at step 0, none at step 1 (version unchanged), every one at
// step 2. Without replicas the layer reports an all-default ReplicaStats.
TEST(Replicas, StatsAreResetEveryStep) {
  const MoeProblem p = skewed_problem(4);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    const std::string what = to_string(dispatch);
    EpRunOptions on = dynamic_replicas(4, dispatch, 2);
    on.ep.num_chunks = 2;
    on.weight_versions = {7, 7, 8};
    const EpRunResult run = testing::run_ep_layer(p, on);
    const int num_replicas = expect_quotas_met(run, what);
    ASSERT_GT(num_replicas, 0) << what;
    const int expected_refreshed[] = {num_replicas, 0, num_replicas};
    ASSERT_EQ(run.step_replica_stats.size(), 3u);
    for (std::size_t step = 0; step < run.step_replica_stats.size(); ++step) {
      int refreshed = 0;
      for (std::size_t r = 0; r < run.step_replica_stats[step].size(); ++r) {
        const ep::ReplicaStats& s = run.step_replica_stats[step][r];
        EXPECT_EQ(s.num_replicas, num_replicas) << what << " step " << step << " rank " << r;
        EXPECT_EQ(s.rows_per_slot, s.slot_quotas) << what << " step " << step << " rank " << r;
        refreshed += s.slots_refreshed;
      }
      EXPECT_EQ(refreshed, expected_refreshed[step]) << what << " step " << step;
    }

    EpRunOptions off{.num_ranks = 4, .dispatch = dispatch};
    for (const ep::ReplicaStats& s : testing::run_ep_layer(p, off).replica_stats) {
      EXPECT_TRUE(s.rows_per_slot.empty() && s.slot_experts.empty() && s.rank_loads_after.empty()) << what;
      EXPECT_EQ(s.num_replicas, 0) << what;
      EXPECT_EQ(s.slots_refreshed, 0) << what;
      EXPECT_EQ(s.max_over_mean_after, 1.0) << what;
    }
  }
}

// Locality-first sub-quotas (balance/replica_plan.h) in the engine: a copy on
// rank r computes min(its quota, rank r's pairs of its expert) of rank r's own
// pairs, and only those stay on their rank. So the all-to-all without dedup
// sends exactly N·K − sum over copies of min(quota, own rank's count) token
// rows, counted from the plan's quotas in the stats and the routing.
TEST(Replicas, CopiesComputeTheirOwnRanksPairsFirst) {
  for (int num_ranks : {2, 3, 4, 8}) {
    const MoeProblem p = skewed_problem(num_ranks);
    for (int chunks : {1, 2}) {
      const std::string what = "R" + std::to_string(num_ranks) + " chunks " + std::to_string(chunks);
      EpRunOptions on = dynamic_replicas(num_ranks, DispatchKind::alltoall, 2);
      on.ep.num_chunks = chunks;
      const EpRunResult run = testing::run_ep_layer(p, on);
      ASSERT_GT(expect_quotas_met(run, what), 0) << what;
      const std::vector<std::int32_t> ids = ids_of(run.topk_ids);
      const int num_experts = p.router.num_experts, top_k = p.router.top_k;
      const int experts_per_rank = num_experts / num_ranks;
      const std::int64_t n = p.num_tokens;
      std::int64_t local = 0, local_on_slots = 0;
      for (int r = 0; r < num_ranks; ++r) {
        // Rank r's pairs per expert (the harness gives it tokens [n r / R, n (r + 1) / R)).
        std::vector<std::int64_t> count(static_cast<std::size_t>(num_experts), 0);
        for (std::int64_t t = n * r / num_ranks; t < n * (r + 1) / num_ranks; ++t)
          for (int k = 0; k < top_k; ++k) ++count[ids[t * top_k + k]];
        const ep::ReplicaStats& s = run.replica_stats[r];
        for (int j = 0; j < experts_per_rank; ++j) local += std::min(s.home_quotas[j], count[r * experts_per_rank + j]);
        for (std::size_t b = 0; b < s.slot_experts.size(); ++b)
          if (s.slot_experts[b] >= 0) local_on_slots += std::min(s.slot_quotas[b], count[s.slot_experts[b]]);
      }
      EXPECT_GT(local_on_slots, 0) << what << ": some replica's rank routes tokens to it";
      EXPECT_EQ(total_bytes(run.stats, "forward/all_to_all_v tokens"),
                (n * top_k - local - local_on_slots) * kHidden * 4)
          << what;
      expect_matches_reference(p, run, what);
    }
  }
}

// Dedup-aware replica choice (issue 13 item 2, balance/dedup_aware_choice.h):
// K = 4 of E = 4R, hot experts packed on rank 0 (Zipf s = 1.2 selection bias),
// R in {1, 2, 3, 4}, token chunks 1 and 2. For the all-to-all without dedup,
// with dedup by position and with dedup dedup-aware, and the ring: y and every
// gradient match the double reference, every copy computes exactly its quota
// (the choice keeps the per-(source, copy) counts). The dedup-aware choice
// never sends more token bytes than the positional one, and fewer in total.
MoeProblem packed_problem_k4(int num_ranks) {
  RouterConfig router{.kind = RouterKind::sigmoid_grouped, .num_experts = 4 * num_ranks, .top_k = 4};
  MoeProblem p = testing::make_problem(24 * num_ranks, kHidden, kFfn, router, 500 + num_ranks);
  bias_towards_hot_experts(p, num_ranks);
  return p;
}

TEST(Replicas, DedupAwareChoiceUnderPackedZipf) {
  struct ChoiceVariant {
    DispatchKind dispatch;
    bool dedup;
    ReplicaChoice choice;
    const char* name;
  };
  const ChoiceVariant variants[] = {
      {DispatchKind::alltoall, false, ReplicaChoice::dedup, "alltoall"},
      {DispatchKind::alltoall, true, ReplicaChoice::position, "alltoall dedup position"},
      {DispatchKind::alltoall, true, ReplicaChoice::dedup, "alltoall dedup dedup-aware"},
      {DispatchKind::ring, false, ReplicaChoice::dedup, "ring"},
  };
  std::int64_t total_position = 0, total_dedup_aware = 0;
  for (int num_ranks : {1, 2, 3, 4}) {
    const MoeProblem p = packed_problem_k4(num_ranks);
    for (int chunks : {1, 2}) {
      std::int64_t token_bytes[2] = {0, 0};  // dedup by position, dedup-aware
      for (const ChoiceVariant& v : variants) {
        const std::string what = "R" + std::to_string(num_ranks) + " chunks " + std::to_string(chunks) + " " + v.name;
        EpRunOptions on = dynamic_replicas(num_ranks, v.dispatch, 2);
        on.ep.dedup = v.dedup;
        on.ep.replica_choice = v.choice;
        on.ep.num_chunks = chunks;
        const EpRunResult run = testing::run_ep_layer(p, on);
        expect_matches_reference(p, run, what);
        const int num_replicas = expect_quotas_met(run, what);
        if (num_ranks > 1) {
          EXPECT_GT(num_replicas, 0) << what << ": the skew must make the planner place replicas";
        }
        if (v.dedup)
          token_bytes[v.choice == ReplicaChoice::dedup] = total_bytes(run.stats, "forward/all_to_all_v tokens");
      }
      EXPECT_LE(token_bytes[1], token_bytes[0]) << "R" << num_ranks << " chunks " << chunks;
      total_position += token_bytes[0];
      total_dedup_aware += token_bytes[1];
    }
  }
  EXPECT_LT(total_dedup_aware, total_position) << "the dedup-aware choice saved no row anywhere";
}

// Recomputed x_sorted with the dedup-aware choice: the all-to-all re-sends
// the rows it chose in the forward, so the copies get the same rows.
TEST(Replicas, DedupAwareChoiceRematKeepsTheSameRows) {
  const MoeProblem p = packed_problem_k4(3);
  EpRunOptions on = dynamic_replicas(3, DispatchKind::alltoall, 2);
  on.ep.dedup = true;
  on.ep.num_chunks = 2;
  on.remat = RematPolicy::preset("remat", "full");
  const EpRunResult run = testing::run_ep_layer(p, on);
  EXPECT_GT(expect_quotas_met(run, "remat"), 0);
  expect_matches_reference(p, run, "remat");
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// balance=periodic: no replicas at step 0 (no history), replicas placed from
// the window at step 1 (period 1) and held; every step still exact, and the
// placed slots get exactly their even-split quotas.
TEST(Replicas, PeriodicPlacementFromTheWindowIsExact) {
  const MoeProblem p = skewed_problem(4);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpRunOptions on{.num_ranks = 4, .dispatch = dispatch};
    on.ep.balance = BalanceMode::periodic;
    on.ep.redundant_slots = 2;
    on.ep.balance_window = 2;
    on.ep.balance_period = 1;
    on.weight_versions = {1, 1, 1};
    const EpRunResult run = testing::run_ep_layer(p, on);
    for (const auto& s : run.step_replica_stats[0]) EXPECT_EQ(s.num_replicas, 0) << "a placement before any history";
    const ep::ReplicaStats& step1 = run.step_replica_stats[1][0];
    EXPECT_GT(step1.num_replicas, 0) << to_string(dispatch);
    EXPECT_LT(step1.max_over_mean_after, step1.max_over_mean_before);
    // The same loads every step: the placement holds, so no weight moves again.
    EXPECT_EQ(total_bytes(run.step_stats[2], "forward/replica weights"), 0) << to_string(dispatch);
    EXPECT_GT(expect_quotas_met(run, to_string(dispatch)), 0);
    expect_matches_reference(p, run, to_string(dispatch));
  }
}

}  // namespace
}  // namespace epmoe
