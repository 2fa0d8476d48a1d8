// Cost-aware replica plans (balance/replica_planner.h, ReplicaCosts; issue
// 31) on constructed loads whose costs are worked out by hand, in whole
// "seconds" so that every comparison is exact:
//  * R = 2, one expert per rank, B = 1, counts {300, 100}, a row costs 1:
//    the balance plan moves 100 rows of expert 0 to rank 1 (max 300 -> 200,
//    saving 100), for one weight transfer and one gradient transfer;
//  * the same with per-source counts, where the moved rows either newly
//    cross the link (token cost) or are rank 1's own (no token rows);
//  * R = 3, transfers on ports the token rows leave idle: priced beside the
//    rows, they cost only what they add to the busiest port;
//  * R = 4, three transfers on one port: the link's latency paid once, not
//    three times;
//  * R = 4, one hot expert: a plan that stops short of the balance target
//    nets more than the balance plan;
//  * random loads and costs: a plan is never predicted to cost more than it
//    saves, and without replicas it predicts nothing.
#include <gtest/gtest.h>

#include <vector>

#include "balance/replica_planner.h"
#include "core/rng.h"

namespace epmoe::balance {
namespace {

const std::vector<std::int64_t> kTwoRanks = {300, 100};
const std::vector<int> kTwoHomes = {0, 1};
const ReplicaPlannerOptions kTwoRanksOneSlot{2, 1, 1.0};

ReplicaCosts costs(double weight_seconds, double gradient_seconds) {
  ReplicaCosts c;
  c.row_seconds = 1;
  c.weight_seconds = weight_seconds;
  c.gradient_seconds = gradient_seconds;
  return c;
}

TEST(ReplicaCosts, PlacesAReplicaThatSavesMoreThanItCosts) {
  const ReplicaPlan plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, costs(60, 30));
  ASSERT_EQ(plan.num_replicas(), 1);
  EXPECT_EQ(plan.slot_expert(1, 0), 0);
  EXPECT_EQ(plan.after.max_load, 200);
  EXPECT_EQ(plan.predicted_saving_seconds, 100);
  EXPECT_EQ(plan.predicted_cost_seconds, 90);
  EXPECT_EQ(plan.refused_replicas, 0);
}

// Planning itself (the counts round a plan with replicas keeps paying)
// tips the balance: 90 + 20 > 100.
TEST(ReplicaCosts, APlanPaysForItsCountsRound) {
  ReplicaCosts c = costs(60, 30);
  c.plan_seconds = 20;
  const ReplicaPlan plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, c);
  EXPECT_EQ(plan.num_replicas(), 0);
  EXPECT_EQ(plan.refused_cost_seconds, 110);
  c.plan_seconds = 5;
  EXPECT_EQ(plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, c).predicted_cost_seconds, 95);
}

TEST(ReplicaCosts, RefusesAReplicaWhoseTransfersCostMoreThanItSaves) {
  const ReplicaPlan plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, costs(80, 30));
  EXPECT_EQ(plan.num_replicas(), 0);
  EXPECT_EQ(plan.after.max_load, 300);
  EXPECT_EQ(plan.predicted_saving_seconds, 0);
  EXPECT_EQ(plan.predicted_cost_seconds, 0);
  // What it refused: the balance plan's replica, saving 100 for 110.
  EXPECT_EQ(plan.refused_replicas, 1);
  EXPECT_EQ(plan.refused_saving_seconds, 100);
  EXPECT_EQ(plan.refused_cost_seconds, 110);
}

TEST(ReplicaCosts, WithoutCostsThePlanBalancesWhateverItCosts) {
  const ReplicaPlan plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot);
  EXPECT_EQ(plan.num_replicas(), 1);
  EXPECT_EQ(plan.predicted_cost_seconds, 0);
  EXPECT_EQ(plan.refused_replicas, 0);
}

// Stickiness: rank 1 held expert 0 at the previous step. With its weights
// current (inference, or another micro-batch of the same optimizer step),
// keeping it moves no weights, so the replica too dear to open pays.
TEST(ReplicaCosts, AKeptReplicaWithCurrentWeightsCostsNoWeights) {
  const std::vector<int> previous = {kEmptySlot, 0};
  ReplicaCosts kept = costs(80, 30);
  kept.previous_weights_current = true;
  const ReplicaPlan plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, previous, kept);
  ASSERT_EQ(plan.num_replicas(), 1);
  EXPECT_EQ(plan.slot_expert(1, 0), 0);
  EXPECT_EQ(plan.predicted_cost_seconds, 30);  // its gradient only

  ReplicaCosts inference = kept;
  inference.gradient_seconds = 0;
  EXPECT_EQ(plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, previous, inference).predicted_cost_seconds, 0);

  // The same slot with new weights (a training step): they move again.
  ReplicaCosts stale = kept;
  stale.previous_weights_current = false;
  EXPECT_EQ(plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, previous, stale).num_replicas(), 0);
  // Another expert in the slot is no help either.
  const std::vector<int> other = {kEmptySlot, 1};
  EXPECT_EQ(plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, other, kept).num_replicas(), 0);
}

// All-to-all token rows: with every pair of expert 0 from rank 0, the 100
// rows moved to rank 1 cross the link both ways (the busiest link goes from
// 0 to 100 rows); with them from rank 1, the replica computes rank 1's own
// pairs and the busiest link carries fewer rows than with no replicas.
TEST(ReplicaCosts, TokenRowsAReplicaAddsArePriced) {
  const std::vector<std::int64_t> from_home = {300, 0, 0, 100};  // [R, E]: rank 0's pairs of expert 0 and 1, rank 1's
  ReplicaCosts c = costs(10, 10);
  c.source_counts = from_home;
  c.token_row_seconds = 0.5;
  ReplicaPlan plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, c);
  ASSERT_EQ(plan.num_replicas(), 1);
  EXPECT_EQ(plan.predicted_cost_seconds, 10 + 10 + 100 * 0.5);

  c.token_row_seconds = 1;  // 120 > 100
  plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, c);
  EXPECT_EQ(plan.num_replicas(), 0);
  EXPECT_EQ(plan.refused_cost_seconds, 120);

  const std::vector<std::int64_t> from_receiver = {100, 0, 200, 100};
  c.source_counts = from_receiver;
  plan = plan_replicas(kTwoRanks, kTwoHomes, kTwoRanksOneSlot, {}, c);
  ASSERT_EQ(plan.num_replicas(), 1);
  EXPECT_EQ(plan.predicted_cost_seconds, 20);  // no token rows added
}

// The transfers move beside the all-to-all's rows (forward_row_seconds):
// R = 3, one expert per rank, expert 0 hot (300 pairs: 100 from rank 1, 200
// from rank 2), B = 1. The balance plan (max 167) puts a replica of expert 0
// on ranks 1 (67 rows) and 2 (66), each computing its own rank's pairs:
// rank 0's ingress goes from 300 to 167 rows, the busiest port. Saving:
// 133 rows of compute + 133 token rows at 2 = 399. Priced as exposed, the two
// replicas' transfers on rank 0's port cost 2 W + 2 G = 420: refused. Beside
// the rows, the weights leave rank 0 on its egress, which carries no token
// rows, so they add only 2 W - 167 f = 216.5 to the busiest port, the
// gradients 2 G - 167 b = 36.5: 253, placed.
TEST(ReplicaCosts, TransfersBesideTheTokenRowsCostOnlyWhatTheyAddToTheBusiestPort) {
  const std::vector<std::int64_t> counts = {300, 100, 100};
  const std::vector<int> homes = {0, 1, 2};
  const std::vector<std::int64_t> source_counts = {0, 0, 0, 100, 100, 0, 200, 0, 100};  // [R, E]
  ReplicaCosts exposed = costs(150, 60);
  exposed.source_counts = source_counts;
  exposed.token_row_seconds = 2;  // f + 3 b: the token out, and output, cotangent and dx at b
  const ReplicaPlan refused = plan_replicas(counts, homes, {3, 1, 1.0}, {}, exposed);
  EXPECT_LT(refused.num_replicas(), 2);
  EXPECT_GT(refused.after.max_load, 167);

  ReplicaCosts beside = exposed;
  beside.forward_row_seconds = 0.5;
  beside.backward_row_seconds = 0.5;
  const ReplicaPlan placed = plan_replicas(counts, homes, {3, 1, 1.0}, {}, beside);
  ASSERT_EQ(placed.num_replicas(), 2);
  EXPECT_EQ(placed.after.max_load, 167);
  EXPECT_EQ(placed.predicted_saving_seconds, 133 + 133 * 2);
  EXPECT_EQ(placed.predicted_cost_seconds, (2 * 150 - 167 * 0.5) + (2 * 60 - 167 * 0.5));

  // Transfers that fit under the busiest port's rows cost nothing at all.
  beside.weight_seconds = 40;
  beside.gradient_seconds = 40;
  EXPECT_EQ(plan_replicas(counts, homes, {3, 1, 1.0}, {}, beside).predicted_cost_seconds, 0);
}

// A transfer holds a port for its bytes only; its latency runs while the
// next message's bytes cross (ReplicaCosts::link_latency_seconds), so
// beside the rows, which pay the latency themselves, k transfers on one port
// add k times their bytes, not k times bytes and latency. R = 4, one expert
// per rank, expert 0 hot: 1000 pairs, 100 from rank 0 and 300 from each
// other rank; ranks 1-3 hold 100 pairs of their own expert each. B = 1, a
// row's compute 1, a token row 1 (f = b = 1/4 each way), a weight and a
// gradient transfer 250 each, 200 of it latency. The balance plan (max 325)
// puts 225 rows of expert 0 on each of ranks 1-3, all their own pairs:
// rank 0's ingress goes from 900 rows to 225, the busiest port. Saving:
// 675 rows of compute + 675 token rows = 1350. Rank 0's egress feeds the
// three weights and its ingress takes the three gradients, beside no rows
// of their own: with latency per transfer they add 3 * 250 - 225 / 4 =
// 693.75 each way, 1387.5 > 1350, refused (the b200 case of docs/BENCHMARKS.md
// "Priced replicas" 2026-12-07); their bytes add 3 * 50 - 225 / 4 = 93.75
// each way: 187.5, placed.
TEST(ReplicaCosts, TransfersOnOnePortPayTheLinkLatencyOnce) {
  const std::vector<std::int64_t> counts = {1000, 100, 100, 100};
  const std::vector<int> homes = {0, 1, 2, 3};
  const std::vector<std::int64_t> source_counts = {100, 0, 0,   0, 300, 100, 0, 0,
                                                   300, 0, 100, 0, 300, 0,   0, 100};  // [R, E]
  ReplicaCosts c = costs(250, 250);
  c.source_counts = source_counts;
  c.token_row_seconds = 1;
  c.forward_row_seconds = 0.25;
  c.backward_row_seconds = 0.25;
  c.link_latency_seconds = 200;
  const ReplicaPlan placed = plan_replicas(counts, homes, {4, 1, 1.0}, {}, c);
  ASSERT_EQ(placed.num_replicas(), 3);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(placed.slot_expert(r, 0), 0) << r;
  EXPECT_EQ(placed.after.max_load, 325);
  EXPECT_EQ(placed.predicted_saving_seconds, 675 + 675);
  EXPECT_EQ(placed.predicted_cost_seconds, 2 * (3 * 50 - 225 * 0.25));

  // The same transfers all bytes (no latency to overlap): refused.
  c.link_latency_seconds = 0;
  const ReplicaPlan refused = plan_replicas(counts, homes, {4, 1, 1.0}, {}, c);
  EXPECT_EQ(refused.num_replicas(), 0);
  EXPECT_EQ(refused.refused_replicas, 3);
  EXPECT_EQ(refused.refused_saving_seconds, 1350);
  EXPECT_EQ(refused.refused_cost_seconds, 2 * (3 * 250 - 225 * 0.25));
}

// One hot expert on rank 0 of 4: the balance plan (max 325) needs three
// replicas, all fed by rank 0's link (3 weight and 3 gradient transfers on
// it, 450 for a saving of 675); a plan with fewer replicas nets more.
TEST(ReplicaCosts, StopsShortOfTheBalanceTargetWhenThatNetsMore) {
  const std::vector<std::int64_t> counts = {1000, 100, 100, 100};
  const std::vector<int> homes = {0, 1, 2, 3};
  const ReplicaPlan plan = plan_replicas(counts, homes, {4, 1, 1.0}, {}, costs(100, 50));
  EXPECT_GT(plan.num_replicas(), 0);
  EXPECT_LT(plan.num_replicas(), 3);
  EXPECT_GT(plan.after.max_load, 325);
  EXPECT_GT(plan.predicted_saving_seconds, plan.predicted_cost_seconds);
  // The balance plan it refused nets less: its extra saving costs more.
  EXPECT_GT(plan.refused_replicas, 0);
  EXPECT_LT(plan.refused_saving_seconds, plan.refused_cost_seconds);
}

TEST(ReplicaCosts, NeverPredictedSlowerThanNoReplicas) {
  Rng rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    const int R = 2 + static_cast<int>(rng.next_u64() % 7), E_l = 1 + static_cast<int>(rng.next_u64() % 4);
    const int B = 1 + static_cast<int>(rng.next_u64() % 3);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(R) * E_l), source(counts.size() * R);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::int64_t>(rng.next_u64() % 50);
    for (int s = 0; s < R; ++s)
      for (std::size_t e = 0; e < counts.size(); ++e) counts[e] += source[s * counts.size() + e];
    ReplicaCosts c = costs(static_cast<double>(rng.next_u64() % 400), static_cast<double>(rng.next_u64() % 200));
    c.token_row_seconds = static_cast<double>(rng.next_u64() % 3) * 0.5;
    c.source_counts = source;
    const ReplicaPlan plan = plan_replicas(counts, contiguous_home_ranks(R * E_l, R), {R, B, 1.0}, {}, c);
    SCOPED_TRACE(testing::Message() << "trial " << trial << " R " << R << " E_l " << E_l << " B " << B);
    if (plan.num_replicas() == 0) {
      EXPECT_EQ(plan.predicted_saving_seconds, 0);
      EXPECT_EQ(plan.predicted_cost_seconds, 0);
    } else {
      EXPECT_GT(plan.predicted_saving_seconds, plan.predicted_cost_seconds);
    }
    EXPECT_LE(plan.after.max_load, plan.before.max_load);
  }
}

// The bench's case where a second slot per rank used to cost speed
// (docs/BENCHMARKS.md "Priced replicas" 2026-12-07: many tokens per expert,
// R = 8, E = 16, K = 2, hot experts packed on rank 0, all-to-all, h200):
// the step's [R, E] counts and the h200 rates the engine priced them at
// (seconds). With one slot per rank the plan places 6 replicas and nets
// 21.45 us (1.75x in the bench); with two, the balance plan feeds more
// weights from rank 0's port and nets less, and the priced fills refused
// all but one replica (net 20.8 us, 1.44x). The planner with B = 2 now also
// prices the fill at its balance target with one slot per rank, so a second
// slot never nets less here.
TEST(ReplicaCosts, ASecondSlotDoesNotNetLessThanOne) {
  const std::vector<std::int64_t> source = {
      616, 388, 296, 186, 137, 89,  84,  56,  61,  30,  32,  15,  25,  14,  12,  7,   616, 397, 268, 186, 128, 95,
      91,  73,  62,  26,  23,  26,  27,  14,  12,  4,   639, 396, 279, 181, 136, 90,  83,  66,  50,  32,  36,  22,
      14,  9,   7,   8,   623, 396, 255, 188, 146, 106, 71,  71,  55,  31,  34,  24,  19,  12,  10,  7,   581, 397,
      279, 209, 124, 99,  86,  77,  58,  37,  32,  25,  20,  11,  10,  3,   608, 403, 254, 187, 138, 106, 85,  79,
      53,  32,  30,  21,  24,  7,   11,  10,  570, 431, 264, 197, 135, 103, 91,  69,  56,  20,  41,  18,  16,  19,
      12,  6,   620, 374, 255, 182, 133, 101, 104, 90,  56,  27,  28,  33,  20,  11,  6,   8};
  constexpr int kRanks = 8, kExperts = 16;
  std::vector<std::int64_t> counts(kExperts, 0);
  for (int s = 0; s < kRanks; ++s)
    for (int e = 0; e < kExperts; ++e) counts[e] += source[static_cast<std::size_t>(s) * kExperts + e];
  const std::vector<std::int64_t> pairs(kRanks, 2048);
  ReplicaCosts c;
  c.row_seconds = 2.3855369059656219e-09;
  c.weight_seconds = c.gradient_seconds = 3.7476266666666665e-06;
  c.token_row_seconds = 9.1022222222222228e-09;
  c.forward_row_seconds = c.backward_row_seconds = 2.2755555555555557e-09;
  c.plan_seconds = 1.4002115555555554e-05;
  c.source_counts = source;
  c.source_pairs = pairs;
  const std::vector<int> homes = contiguous_home_ranks(kExperts, kRanks);
  const auto net = [](const ReplicaPlan& p) { return p.predicted_saving_seconds - p.predicted_cost_seconds; };
  const ReplicaPlan one = plan_replicas(counts, homes, {kRanks, 1, 1.05}, {}, c);
  const ReplicaPlan two = plan_replicas(counts, homes, {kRanks, 2, 1.05}, {}, c);
  EXPECT_EQ(one.num_replicas(), 6);
  EXPECT_NEAR(net(one), 21.45e-6, 0.01e-6);
  EXPECT_GE(net(two), net(one));
  EXPECT_EQ(two.num_replicas(), 6);
  EXPECT_EQ(two.after.max_load, one.after.max_load);
}

}  // namespace
}  // namespace epmoe::balance
