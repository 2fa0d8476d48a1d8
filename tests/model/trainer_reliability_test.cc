// The trainer under rank-count changes and faults, ranks as threads:
//  * elastic resume: a checkpoint of R ranks resumes on R' ranks (experts and
//    their AdamW moments resharded) with the losses of a run that used R'
//    ranks from the start, within 1e-5 relative (rank counts differ only in
//    the order of fp32 sums; measured ~1e-8). R=4 -> 2, 2 -> 4 with E=8; 3 ->
//    2, 2 -> 3 with E=6 (batch 12 divides over 2 and 3 ranks);
//  * a non-finite number in a checkpoint is refused naming the file and the
//    first bad element;
//  * a rank that throws between writing a checkpoint's files and committing
//    it (fault point "checkpoint") stops all 3 ranks within 2 s with its
//    error's text and leaves no step_N/ behind;
//  * an error raised inside a step (fault point "dispatch" in a layer, or an
//    observer's UsageError) names the step and keeps its type.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>

#include "core/error.h"
#include "core/fault_injection.h"
#include "data/checkpoint_store.h"
#include "data/npy.h"
#include "test_files.h"
#include "trainer_harness.h"
#include "transport/threads/launcher.h"

namespace epmoe::testing {
namespace {

namespace fs = std::filesystem;

TrainSetup elastic_setup(int ranks, int num_experts, const fs::path& dir) {
  TrainSetup setup = small_setup(ranks);
  setup.model.layer.router.num_experts = num_experts;
  setup.trainer.batch_size = 12;
  setup.trainer.checkpoint_dir = dir.string();
  setup.trainer.checkpoint_every = 10;
  setup.trainer.checkpoint_metadata = {{"compatibility", {{"hidden", 32}}}};
  return setup;
}

struct ElasticCase {
  int saved_ranks, resumed_ranks, num_experts;
  bool replicas = false;  // balance=dynamic, one slot: its planning state is reset, not resharded
};

void add_replicas(TrainSetup& setup) {
  setup.ep.balance = BalanceMode::dynamic;
  setup.ep.redundant_slots = 1;
  setup.ep.rebalance_threshold = 1.0;
}

class TrainerElasticResume : public ::testing::TestWithParam<ElasticCase> {};

TEST_P(TrainerElasticResume, LossesMatchARunOnTheNewRankCountFromTheStart) {
  const ElasticCase c = GetParam();
  ScratchDir saved, fresh;
  // Only the first 10 steps of the saving run are needed.
  TrainSetup first = elastic_setup(c.saved_ranks, c.num_experts, saved.path());
  first.trainer.steps = 10;
  first.trainer.learning_rate.total_steps = 20;  // the same schedule as the 20-step runs
  if (c.replicas) add_replicas(first);
  train_losses(first);
  ASSERT_EQ(CheckpointStore(saved.path()).latest_step(), 10);
  if (c.replicas) {
    ASSERT_TRUE(fs::exists(saved.path() / "step_00000010" / "replicated" / "layer_0.balance_state.npy"));
  }

  TrainSetup from_start = elastic_setup(c.resumed_ranks, c.num_experts, fresh.path());
  if (c.replicas) add_replicas(from_start);
  const std::vector<double> reference = train_losses(from_start);
  TrainSetup resumed = elastic_setup(c.resumed_ranks, c.num_experts, saved.path());
  if (c.replicas) add_replicas(resumed);
  resumed.trainer.resume = true;
  const std::vector<double> tail = train_losses(resumed);
  ASSERT_EQ(tail.size(), 10u);
  const double difference = max_relative_difference(tail, std::vector<double>(reference.begin() + 10, reference.end()));
  std::printf("R=%d -> R'=%d, E=%d: max relative loss difference %.2e\n", c.saved_ranks, c.resumed_ranks, c.num_experts,
              difference);
  EXPECT_LT(difference, 1e-5);
  // The resumed run's own checkpoint has R' shards.
  const nlohmann::json manifest = CheckpointStore(saved.path()).verify(20);
  EXPECT_EQ(manifest["metadata"]["num_ranks"], c.resumed_ranks);
  EXPECT_TRUE(fs::exists(saved.path() / "step_00000020" / ("rank_" + std::to_string(c.resumed_ranks - 1))));
}

INSTANTIATE_TEST_SUITE_P(RankCounts, TrainerElasticResume,
                         ::testing::Values(ElasticCase{4, 2, 8}, ElasticCase{2, 4, 8}, ElasticCase{3, 2, 6},
                                           ElasticCase{2, 3, 6}, ElasticCase{4, 2, 8, true}),
                         [](const auto& info) {
                           return "R" + std::to_string(info.param.saved_ranks) + "to" +
                                  std::to_string(info.param.resumed_ranks) + "E" +
                                  std::to_string(info.param.num_experts) + (info.param.replicas ? "Replicas" : "");
                         });

// Resharding moves every expert's rows to the right place: step 10 of R=4
// resumed on R'=2 for one step whose updates are below fp32 resolution
// (learning rate 1e-30, no decay) re-saves the experts unchanged, bit for
// bit, rank_0 = saved rank_0 ++ rank_1, rank_1 = saved rank_2 ++ rank_3.
TEST(TrainerElasticResumeState, ResavingOnTwoRanksGivesTheSameExpertsAsTheFourRankFiles) {
  ScratchDir four, two;
  TrainSetup first = elastic_setup(4, 8, four.path());
  first.trainer.steps = 10;
  first.trainer.learning_rate.total_steps = 20;
  train_losses(first);
  fs::copy(four.path() / "step_00000010", two.path() / "step_00000010", fs::copy_options::recursive);
  TrainSetup resumed = elastic_setup(2, 8, two.path());
  resumed.trainer.resume = true;
  resumed.trainer.steps = 11;
  resumed.trainer.learning_rate.peak = 1e-30;
  resumed.trainer.adamw.weight_decay = 0;
  train_losses(resumed);
  const CheckpointStore saved(four.path()), resaved(two.path());
  for (const std::string name : {"layer_0.wi0", "layer_1.wo"}) {
    const Tensor low = resaved.read_tensor(11, "rank_0/" + name + ".npy");
    const Tensor high = resaved.read_tensor(11, "rank_1/" + name + ".npy");
    for (int source = 0; source < 4; ++source) {
      const Tensor original = saved.read_tensor(10, "rank_" + std::to_string(source) + "/" + name + ".npy");
      const Tensor& target = source < 2 ? low : high;
      const std::int64_t half = target.numel() / 2;
      const float* got = target.data<float>() + (source % 2) * half;
      for (std::int64_t i = 0; i < original.numel(); ++i) {
        ASSERT_EQ(got[i], original.data<float>()[i]) << name << " of saved rank " << source << " at " << i;
      }
    }
  }
}

TEST(TrainerElasticResumeState, ANonFiniteValueInACheckpointIsRefusedNamingTheFileAndIndex) {
  ScratchDir dir;
  TrainSetup setup = elastic_setup(2, 8, dir.path());
  setup.trainer.steps = 10;
  train_losses(setup);
  // Rewrite one moment file with a NaN and fix the manifest's checksum, as a
  // bad writer would: only the finite check can catch it.
  const fs::path step_dir = dir.path() / "step_00000010";
  const std::string file = "rank_1/layer_0.wi1.adam_v.npy";
  Tensor moments = read_npy(step_dir / file, DType::f32);
  moments.data<float>()[37] = std::numeric_limits<float>::quiet_NaN();
  const fs::path staging = CheckpointStore(dir.path()).staging_dir(10);
  fs::rename(step_dir, staging);
  write_npy(staging / file, moments);
  fs::remove(staging / "manifest.json");
  const nlohmann::json metadata = setup.trainer.checkpoint_metadata;
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(staging)) {
    if (entry.is_regular_file()) files.push_back(fs::relative(entry.path(), staging).generic_string());
  }
  nlohmann::json manifest_metadata = metadata;
  manifest_metadata["num_ranks"] = 2;
  CheckpointStore(dir.path()).commit(10, files, manifest_metadata);

  setup.trainer.resume = true;
  setup.trainer.steps = 20;
  std::string message = "(no error)";
  try {
    train_losses(setup);
  } catch (const FileError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find((step_dir / file).string()), std::string::npos) << message;
  // [E_l=4, H=32, F=32]: flat 37 is [0, 1, 5].
  EXPECT_NE(message.find("element [0, 1, 5] is nan"), std::string::npos) << message;
}

// Ranks as threads, R=3 (E=6): rank 1 throws with its checkpoint files
// written and the checkpoint not committed.
TEST(TrainerFaults, ARankFailingMidCheckpointStopsEveryRankWithinTwoSecondsAndCommitsNothing) {
  ScratchDir dir;
  TrainSetup setup = elastic_setup(3, 6, dir.path());
  setup.trainer.steps = 10;
  setup.trainer.comm_timeout = std::chrono::milliseconds(60000);  // a hang would show, not time out quietly
  EpConfig ep;
  ep.num_experts = 6;
  ep.top_k = 2;
  ep.hidden = 32;
  FaultInjector faults("1:checkpoint");
  std::mutex mutex;
  std::chrono::steady_clock::time_point last_step{};
  TrainObserver observer;
  observer.on_step = [&](const StepRecord& record) {
    if (record.step == 10) last_step = std::chrono::steady_clock::now();  // just before the checkpoint
  };
  std::string message = "(no error)";
  try {
    transport::threads::run_ranks(3, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
      const FaultScope scope(&faults);
      EpConfig group_config = ep;
      group_config.dispatch = DispatchKind::alltoall;
      group_config.tag_base = 1024;  // above the trainer's [0, 1024)
      EpGroup group(comm, group_config);
      train(comm, group, setup.trainer, setup.model, observer);
    });
  } catch (const Error& e) {
    message = e.what();
  }
  const auto ended = std::chrono::steady_clock::now();
  ASSERT_NE(last_step, std::chrono::steady_clock::time_point{}) << message;
  const double seconds = std::chrono::duration<double>(ended - last_step).count();
  std::printf("every rank ended %.3f s after the faulty checkpoint began\n", seconds);
  EXPECT_LT(seconds, 2.0);
  EXPECT_NE(message.find("rank 1: injected fault at checkpoint"), std::string::npos) << message;
  EXPECT_NE(message.find("step 10: "), std::string::npos) << message;
  const CheckpointStore store(dir.path());
  EXPECT_TRUE(store.committed_steps().empty());
  EXPECT_TRUE(store.uncommitted_steps().empty());
  EXPECT_FALSE(fs::exists(store.step_dir(10)));
}

// checkpoint_committed is reached by every rank once the commit is known to
// all (only rank 0 commits): with RANK != 0 it fired never before.
TEST(TrainerFaults, CheckpointCommittedFiresOnARankOtherThanZeroAfterTheCommit) {
  ScratchDir dir;
  TrainSetup setup = elastic_setup(2, 4, dir.path());
  setup.trainer.steps = 2;
  setup.trainer.checkpoint_every = 1;
  FaultInjector faults("1:checkpoint_committed");
  setup.faults = &faults;
  std::string message = "(no error)";
  try {
    train_losses(setup);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("rank 1: injected fault at checkpoint_committed"), std::string::npos) << message;
  EXPECT_NE(message.find("step 1: "), std::string::npos) << message;
  // The fault came after the commit: step 1's checkpoint is whole, step 2 never ran.
  EXPECT_EQ(CheckpointStore(dir.path()).committed_steps(), std::vector<std::int64_t>{1});
}

TEST(TrainerFaults, AnErrorInsideALayerNamesTheStep) {
  TrainSetup setup = small_setup(2);
  // Two layers, one forward dispatch each per step: the 5th is step 3's first.
  FaultInjector faults("0:dispatch:throw:5");
  setup.faults = &faults;
  std::string message = "(no error)";
  try {
    train_losses(setup);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("step 3: ", 0), 0u) << message;
  EXPECT_NE(message.find("injected fault at dispatch"), std::string::npos) << message;
}

// Every kind of Error keeps its type when the step is put in front, not
// only the kinds a list named: an observer's UsageError (which no list had)
// reaches the caller as a UsageError whose text starts with its step.
TEST(TrainerFaults, AnyErrorKindNamesTheStepAndKeepsItsType) {
  for (const int ranks : {1, 2}) {
    TrainSetup setup = small_setup(ranks);
    setup.trainer.steps = 4;
    setup.observer.on_step = [](const StepRecord& record) {
      if (record.step == 2) throw UsageError("the observer refused this record");
    };
    std::string message = "(no error)";
    try {
      train_losses(setup);
    } catch (const UsageError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("another type: ") + e.what();
    }
    EXPECT_EQ(message, "step 2: the observer refused this record") << "ranks=" << ranks;
  }
}

}  // namespace
}  // namespace epmoe::testing
