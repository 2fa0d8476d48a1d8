// Checkpoints of the trainer: a run resumed from step 10 of 20 repeats the
// uninterrupted run bit for bit (losses and every saved tensor's checksum);
// corrupt, truncated or foreign checkpoints are refused with an error naming
// the file or key; existing checkpoints are never overwritten.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/checkpoint_store.h"
#include "test_files.h"
#include "trainer_harness.h"

namespace epmoe::testing {
namespace {

namespace fs = std::filesystem;

TrainSetup checkpointing_setup(const fs::path& dir) {
  TrainSetup setup = small_setup(4);
  setup.trainer.checkpoint_dir = dir.string();
  setup.trainer.checkpoint_every = 10;
  setup.trainer.checkpoint_keep = 5;
  setup.trainer.checkpoint_metadata = {{"compatibility", {{"hidden", 32}}}};
  return setup;
}

// The (path -> CRC-32) of a committed checkpoint's manifest.
std::map<std::string, std::uint32_t> checksums(const fs::path& dir, std::int64_t step) {
  std::map<std::string, std::uint32_t> out;
  const nlohmann::json manifest = CheckpointStore(dir).verify(step);
  for (const auto& file : manifest["files"]) {
    out[file["path"].get<std::string>()] = file["crc32"].get<std::uint32_t>();
  }
  return out;
}

template <typename ErrorType>
std::string error_of(const TrainSetup& setup) {
  try {
    train_losses(setup);
  } catch (const ErrorType& e) {
    return e.what();
  }
  return "(no error)";
}

class TrainerCheckpoint : public ::testing::Test {
 protected:
  // An uninterrupted 20-step run with checkpoints at 10 and 20, once.
  static void SetUpTestSuite() {
    uninterrupted_ = new ScratchDir();
    losses_ = new std::vector<double>(train_losses(checkpointing_setup(uninterrupted_->path())));
  }
  static void TearDownTestSuite() {
    delete uninterrupted_;
    delete losses_;
  }
  // A run that stopped after step 10: the uninterrupted run's step_10 only.
  void SetUp() override {
    fs::copy(uninterrupted_->path() / "step_00000010", interrupted_ / "step_00000010", fs::copy_options::recursive);
  }

  static ScratchDir* uninterrupted_;
  static std::vector<double>* losses_;
  ScratchDir interrupted_;
};
ScratchDir* TrainerCheckpoint::uninterrupted_ = nullptr;
std::vector<double>* TrainerCheckpoint::losses_ = nullptr;

TEST_F(TrainerCheckpoint, ResumeAfterStep10EqualsTheUninterruptedRunBitForBit) {
  TrainSetup resumed = checkpointing_setup(interrupted_.path());
  resumed.trainer.resume = true;
  const std::vector<double> tail = train_losses(resumed);
  ASSERT_EQ(tail.size(), 10u);
  EXPECT_EQ(tail, std::vector<double>(losses_->begin() + 10, losses_->end()));
  // Every parameter, moment and buffer of step 20, on every rank.
  const auto expected = checksums(uninterrupted_->path(), 20);
  EXPECT_EQ(checksums(interrupted_.path(), 20), expected);
  EXPECT_GT(expected.size(), 30u);
}

TEST_F(TrainerCheckpoint, AFlippedByteIsRefusedNamingTheFile) {
  const fs::path shard = interrupted_ / "step_00000010" / "rank_1" / "layer_0.wi0.npy";
  std::string bytes = read_bytes(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  write_bytes(shard, bytes);
  TrainSetup resumed = checkpointing_setup(interrupted_.path());
  resumed.trainer.resume = true;
  const std::string message = error_of<FileError>(resumed);
  EXPECT_NE(message.find(shard.string()), std::string::npos) << message;
  EXPECT_NE(message.find("CRC"), std::string::npos) << message;
}

TEST_F(TrainerCheckpoint, ATruncatedShardIsRefusedNamingTheFile) {
  const fs::path shard = interrupted_ / "step_00000010" / "replicated" / "head.adam_v.npy";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  TrainSetup resumed = checkpointing_setup(interrupted_.path());
  resumed.trainer.resume = true;
  const std::string message = error_of<FileError>(resumed);
  EXPECT_NE(message.find(shard.string()), std::string::npos) << message;
}

TEST_F(TrainerCheckpoint, AMissingShardIsRefusedNamingTheFile) {
  const fs::path shard = interrupted_ / "step_00000010" / "rank_3" / "layer_1.wo.adam_m.npy";
  fs::remove(shard);
  TrainSetup resumed = checkpointing_setup(interrupted_.path());
  resumed.trainer.resume = true;
  const std::string message = error_of<FileError>(resumed);
  EXPECT_NE(message.find(shard.string()), std::string::npos) << message;
}

TEST_F(TrainerCheckpoint, ExistingCheckpointsAreNeverOverwritten) {
  const auto before = checksums(interrupted_.path(), 10);
  const std::string message = error_of<ConfigError>(checkpointing_setup(interrupted_.path()));  // resume=false
  EXPECT_NE(message.find("resume=true"), std::string::npos) << message;
  EXPECT_EQ(checksums(interrupted_.path(), 10), before);
  EXPECT_FALSE(CheckpointStore(interrupted_.path()).latest_step() > 10);
}

// (The rank count is not a compatibility key: checkpoints reshard,
// trainer_reliability_test.cc.)
TEST_F(TrainerCheckpoint, ADifferentModelIsRefusedNamingTheKey) {
  TrainSetup other = checkpointing_setup(interrupted_.path());
  other.trainer.resume = true;
  other.trainer.checkpoint_metadata["compatibility"]["hidden"] = 64;
  std::string message = error_of<ConfigError>(other);
  EXPECT_NE(message.find("hidden=64"), std::string::npos) << message;
  EXPECT_NE(message.find("hidden=32"), std::string::npos) << message;
}

TEST_F(TrainerCheckpoint, KeepsTheNewestCheckpoints) {
  TrainSetup setup = checkpointing_setup(interrupted_.path());
  setup.trainer.resume = true;
  setup.trainer.checkpoint_every = 2;
  setup.trainer.checkpoint_keep = 2;
  train_losses(setup);
  EXPECT_EQ(CheckpointStore(interrupted_.path()).committed_steps(), (std::vector<std::int64_t>{18, 20}));
}

}  // namespace
}  // namespace epmoe::testing

namespace epmoe::testing {
namespace {

// With replicas, later plans depend on earlier steps (dynamic keeps an
// expert in its slot, and with replica_planning=forecast looks only when
// the last step's counts said so; periodic places from a window of counts
// every period), so the checkpoint carries that state and resuming stays
// exact.
TEST(TrainerCheckpointWithReplicas, ResumeIsBitExactForDynamicAndPeriodicBalancing) {
  const std::pair<BalanceMode, ReplicaPlanning> cases[] = {{BalanceMode::dynamic, ReplicaPlanning::exact},
                                                           {BalanceMode::dynamic, ReplicaPlanning::forecast},
                                                           {BalanceMode::periodic, ReplicaPlanning::exact}};
  for (const auto& [mode, planning] : cases) {
    SCOPED_TRACE(to_string(mode) + " " + to_string(planning));
    ScratchDir uninterrupted, interrupted;
    TrainSetup setup = checkpointing_setup(uninterrupted.path());
    setup.ep.balance = mode;
    setup.ep.replica_planning = planning;
    setup.ep.redundant_slots = 1;
    setup.ep.rebalance_threshold = 1.0;
    setup.ep.balance_window = 3;
    setup.ep.balance_period = 4;
    const std::vector<double> losses = train_losses(setup);
    fs::copy(uninterrupted.path() / "step_00000010", interrupted.path() / "step_00000010", fs::copy_options::recursive);
    EXPECT_TRUE(fs::exists(interrupted.path() / "step_00000010" / "replicated" / "layer_1.balance_state.npy"));
    setup.trainer.checkpoint_dir = interrupted.path().string();
    setup.trainer.resume = true;
    EXPECT_EQ(train_losses(setup), std::vector<double>(losses.begin() + 10, losses.end()));
    EXPECT_EQ(checksums(interrupted.path(), 20), checksums(uninterrupted.path(), 20));
  }
}

}  // namespace
}  // namespace epmoe::testing

namespace epmoe::testing {
namespace {

// The random router (a performance mode) draws from a stream of (step,
// layer, rank), not from a generator's history: a resumed run draws what
// the uninterrupted one did.
TEST(TrainerCheckpointRandomRouter, ResumeIsBitExact) {
  ScratchDir uninterrupted, interrupted;
  TrainSetup setup = checkpointing_setup(uninterrupted.path());
  setup.model.layer.router.kind = RouterKind::random;
  setup.model.layer.router.seed = 9;
  const std::vector<double> losses = train_losses(setup);
  EXPECT_LT(losses.back(), losses.front() - 0.3);  // the experts still learn
  fs::copy(uninterrupted.path() / "step_00000010", interrupted.path() / "step_00000010", fs::copy_options::recursive);
  setup.trainer.checkpoint_dir = interrupted.path().string();
  setup.trainer.resume = true;
  EXPECT_EQ(train_losses(setup), std::vector<double>(losses.begin() + 10, losses.end()));
}

}  // namespace
}  // namespace epmoe::testing
