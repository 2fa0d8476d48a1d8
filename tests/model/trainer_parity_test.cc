// Loss parity of the trainer across every flag that must not change the
// math (DESIGN.md §3): the same 20-step loss curve for R = 1, 2, 3... ranks
// and for each dispatcher option, bit for bit where the arithmetic is the
// same and within 1e-5 where only the order of fp32 sums changes.
#include <gtest/gtest.h>

#include <cmath>

#include "trainer_harness.h"

namespace epmoe::testing {
namespace {

class TrainerParity : public ::testing::Test {
 protected:
  static const std::vector<double>& single_rank() {
    static const std::vector<double> losses = train_losses(small_setup(1));
    return losses;
  }
};

TEST_F(TrainerParity, LossFallsOnZipfData) {
  const std::vector<double>& losses = single_rank();
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.1);  // small init: near-uniform predictions
  EXPECT_LT(losses.back(), losses.front() - 0.5);
}

TEST_F(TrainerParity, RankCountsMatchOneRankWithin1e5) {
  for (const int ranks : {2, 4, 8}) {
    const std::vector<double> losses = train_losses(small_setup(ranks));
    EXPECT_LT(max_relative_difference(losses, single_rank()), 1e-5) << "ranks=" << ranks;
  }
}

TEST_F(TrainerParity, ThreeRanksMatchOneRankWithin1e5) {
  // An odd rank count needs E and the batch divisible by 3.
  TrainSetup one = small_setup(1);
  one.model.layer.router.num_experts = 6;
  one.trainer.batch_size = 6;
  TrainSetup three = one;
  three.ranks = 3;
  for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    three.dispatch = dispatch;
    EXPECT_LT(max_relative_difference(train_losses(three), train_losses(one)), 1e-5) << to_string(dispatch);
  }
}

TEST_F(TrainerParity, RingDispatchMatchesOneRankWithin1e5) {
  TrainSetup setup = small_setup(4);
  setup.dispatch = DispatchKind::ring;
  EXPECT_LT(max_relative_difference(train_losses(setup), single_rank()), 1e-5);
}

TEST_F(TrainerParity, SameRunSameBits) { EXPECT_EQ(train_losses(small_setup(4)), train_losses(small_setup(4))); }

TEST_F(TrainerParity, CotangentAllGatherRingAndPlainAreBitIdentical) {
  TrainSetup ring = small_setup(4);
  ring.dispatch = DispatchKind::ring;
  TrainSetup plain = ring;
  plain.ep.cotangent_all_gather = CotangentAllGather::plain;
  EXPECT_EQ(train_losses(ring), train_losses(plain));
}

TEST_F(TrainerParity, RematerialisingIsBitIdenticalToSaving) {
  for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    TrainSetup save = small_setup(4);
    save.dispatch = dispatch;
    TrainSetup remat = save;
    remat.model.layer.remat = RematPolicy::preset("remat_policy", "full");
    EXPECT_EQ(train_losses(save), train_losses(remat)) << to_string(dispatch);
  }
}

TEST_F(TrainerParity, TokenChunksMatchWithin1e5) {
  // Not bit-identical: with 4 chunks each expert's weight gradient is summed
  // chunk by chunk (4 GEMMs accumulated) instead of in one GEMM over all its
  // rows, a different fp32 summation order (docs/NUMERICS.md).
  for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    TrainSetup one = small_setup(4);
    one.dispatch = dispatch;
    TrainSetup four = one;
    four.ep.num_chunks = 4;
    EXPECT_LT(max_relative_difference(train_losses(four), train_losses(one)), 1e-5) << to_string(dispatch);
  }
}

TEST_F(TrainerParity, DedupMatchesWithin1e5) {
  TrainSetup dedup = small_setup(4);
  dedup.ep.dedup = true;
  EXPECT_LT(max_relative_difference(train_losses(dedup), single_rank()), 1e-5);
}

TEST_F(TrainerParity, DynamicAndPeriodicReplicasMatchWithin1e5) {
  for (const BalanceMode mode : {BalanceMode::dynamic, BalanceMode::periodic}) {
    TrainSetup replicas = small_setup(4);
    replicas.ep.balance = mode;
    replicas.ep.redundant_slots = 1;
    replicas.ep.rebalance_threshold = 1.0;
    replicas.ep.balance_window = 3;
    replicas.ep.balance_period = 3;
    EXPECT_LT(max_relative_difference(train_losses(replicas), single_rank()), 1e-5);
  }
}

TEST_F(TrainerParity, SharedExpertAuxLossAndSigmoidRouterTrainAcrossRanks) {
  TrainSetup one = small_setup(1);
  one.model.shared_expert_ffn = 16;
  one.model.layer.router.kind = RouterKind::sigmoid_grouped;
  one.model.layer.router.n_groups = 4;
  one.model.layer.router.topk_groups = 2;
  one.trainer.aux_loss_coef = 0.01;
  one.trainer.bias_update_rate = 1e-3;
  TrainSetup four = one;
  four.ranks = 4;
  const std::vector<double> a = train_losses(one), b = train_losses(four);
  EXPECT_LT(max_relative_difference(b, a), 1e-5);
  EXPECT_LT(a.back(), a.front() - 0.3);
}

}  // namespace
}  // namespace epmoe::testing

namespace epmoe::testing {
namespace {

// fp8 e4m3 tokens change the forward's expert inputs by up to 2^-4 relative
// per element (ep/token_codec.h), so the curves differ for real: measured
// 1.5e-3 relative at most over these 20 steps (docs/NUMERICS.md). The bound
// 1e-2 leaves room for other seeds while staying far below what the loss
// falls in the run (~18%), so a broken fp8 path cannot hide under it.
TEST(TrainerFp8Tokens, LossStaysWithinOnePercentOfF32) {
  const std::vector<double> f32 = train_losses(small_setup(4));
  for (const TokenFormat format : {TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
    for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      TrainSetup fp8 = small_setup(4);
      fp8.ep.token_format = format;
      fp8.dispatch = dispatch;
      const std::vector<double> losses = train_losses(fp8);
      const double difference = max_relative_difference(losses, f32);
      EXPECT_LT(difference, 1e-2);
      EXPECT_GT(difference, 0.0);  // the tokens really travelled as fp8
      EXPECT_LT(losses.back(), losses.front() - 0.5);
    }
  }
}

}  // namespace
}  // namespace epmoe::testing
