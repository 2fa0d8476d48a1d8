// The trainer's overlapped gradient reduction (buckets started during the
// backward, model/gradient_reduction.h) against one all-reduce after the
// backward (overlap_gradient_all_reduce=false, the loop as it was): the same
// losses and the same final parameters and AdamW moments, bit for bit, at
// R = 1..4, with and without a shared expert and a load-balance loss (which
// move the forward stats exchange under the backward or not).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "data/checkpoint_store.h"
#include "test_files.h"
#include "trainer_harness.h"

namespace epmoe::testing {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  std::vector<double> losses;
  std::map<std::string, std::uint32_t> checksums;  // every file of the final checkpoint
};

Outcome train_to_checkpoint(TrainSetup setup, bool overlap) {
  ScratchDir dir;
  setup.trainer.overlap_gradient_all_reduce = overlap;
  setup.trainer.checkpoint_dir = dir.path().string();
  setup.trainer.checkpoint_metadata = {{"compatibility", nlohmann::json::object()}};
  Outcome out;
  out.losses = train_losses(setup);
  const nlohmann::json manifest = CheckpointStore(dir.path()).verify(setup.trainer.steps);
  for (const auto& file : manifest["files"]) {
    out.checksums[file["path"].get<std::string>()] = file["crc32"].get<std::uint32_t>();
  }
  return out;
}

TrainSetup setup_for(int ranks) {
  TrainSetup setup = small_setup(ranks);
  if (ranks == 3) {  // E and the batch divisible by 3
    setup.model.layer.router.num_experts = 6;
    setup.trainer.batch_size = 6;
  }
  setup.trainer.steps = 8;
  setup.trainer.learning_rate.total_steps = 8;
  return setup;
}

TEST(TrainerOverlap, BucketedGradientReductionIsBitIdenticalToOneAllReduce) {
  for (const int ranks : {1, 2, 3, 4}) {
    const TrainSetup setup = setup_for(ranks);
    const Outcome overlapped = train_to_checkpoint(setup, true);
    const Outcome reference = train_to_checkpoint(setup, false);
    ASSERT_EQ(overlapped.losses.size(), 8u);
    EXPECT_EQ(overlapped.losses, reference.losses) << "ranks=" << ranks;
    EXPECT_FALSE(reference.checksums.empty());
    EXPECT_EQ(overlapped.checksums, reference.checksums) << "ranks=" << ranks;
  }
}

TEST(TrainerOverlap, SharedExpertAndLoadBalanceLossStayBitIdentical) {
  for (const int ranks : {2, 3, 4}) {
    TrainSetup setup = setup_for(ranks);
    setup.model.shared_expert_ffn = 16;
    setup.trainer.aux_loss_coef = 0.01;
    const Outcome overlapped = train_to_checkpoint(setup, true);
    const Outcome reference = train_to_checkpoint(setup, false);
    EXPECT_EQ(overlapped.losses, reference.losses) << "ranks=" << ranks;
    EXPECT_EQ(overlapped.checksums, reference.checksums) << "ranks=" << ranks;
  }
}

}  // namespace
}  // namespace epmoe::testing
