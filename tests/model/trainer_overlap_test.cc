// The trainer's overlapped gradient reduction (buckets started during the
// backward, model/gradient_reduction.h) against one all-reduce after the
// backward (overlap_gradient_all_reduce=false, the loop as it was): the same
// losses and the same final parameters and AdamW moments, bit for bit, at
// R = 1..4, with and without a shared expert and a load-balance loss (which
// move the forward stats exchange under the backward or not). And the
// metrics exchange that runs under the next step's forward: every record,
// in order, the same global values; a failure while completing it names
// its step and stops every rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"
#include "ep/dispatcher.h"
#include "transport/threads/launcher.h"

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

// Runs `setup` with `observer` on rank 0; returns rank 0's summary.
TrainSummary train_observed(const TrainSetup& setup, const TrainObserver& observer) {
  EpConfig ep = setup.ep;
  ep.num_experts = setup.model.layer.router.num_experts;
  ep.top_k = setup.model.layer.router.top_k;
  ep.hidden = setup.model.layer.hidden;
  ep.validate(setup.ranks);
  TrainSummary out;
  std::mutex mutex;
  transport::threads::ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  transport::threads::run_ranks(setup.ranks, options, [&](transport::Communicator& comm) {
    EpConfig group_config = ep;
    group_config.dispatch = setup.dispatch;
    group_config.tag_base = 1024;  // above the trainer's [0, 1024)
    EpGroup group(comm, group_config);
    TrainSummary summary =
        train(comm, group, setup.trainer, setup.model, comm.rank() == 0 ? observer : TrainObserver{});
    if (comm.rank() == 0) {
      std::lock_guard lock(mutex);
      out = summary;
    }
  });
  return out;
}

TEST(TrainerDeferredMetrics, EveryStepsRecordArrivesInOrderWithTheStepsValues) {
  TrainSetup setup = setup_for(4);
  std::vector<StepRecord> records;
  TrainObserver observer;
  observer.on_step = [&](const StepRecord& record) { records.push_back(record); };
  const TrainSummary summary = train_observed(setup, observer);
  ASSERT_EQ(records.size(), 8u);
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].step, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(records[i].loss, summary.losses[i]);
    // Every rank's report made it in: the gradient bytes of all 4 ranks sum
    // to the ring's 2(R-1)S for S bytes of replicated gradients.
    const MoeLmConfig& m = setup.model;
    const std::int64_t h = m.layer.hidden,
                       replicated = 2 * m.vocab_size * h + m.num_layers * (h + h * m.layer.router.num_experts) + h;
    EXPECT_EQ(records[i].bytes_sent.at("gradients/all_reduce"), 2 * 3 * 4 * replicated);
    EXPECT_GT(records[i].saved_activation_peak_bytes, 0);
  }
  EXPECT_EQ(summary.routed_pairs, 8 * records[0].routed_pairs);
}

TEST(TrainerDeferredMetrics, AnObserverFailingOnAStepsRecordNamesThatStepAndStopsEveryRank) {
  // Step 3's record is completed under step 4's forward: the error must
  // still say step 3, and the ranks waiting in step 4 must stop.
  TrainSetup setup = setup_for(4);
  TrainObserver observer;
  observer.on_step = [](const StepRecord& record) {
    if (record.step == 3) throw FileError("metrics file: disk full");
  };
  try {
    train_observed(setup, observer);
    FAIL() << "expected the observer's error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("step 3: ", 0), 0u) << message;
    EXPECT_NE(message.find("disk full"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace epmoe::testing
