// `mpirun -np 4 epmoe train transport=mpi`: ranks as processes train the same
// model with the same losses as ranks=4 threads (bit for bit: the same
// algorithms, one compute thread per rank in both) and as ranks=1 (within
// 1e-5: only the order of fp32 sums differs), and a checkpoint written by
// the MPI run resumes under the threads transport.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/checkpoint_store.h"
#include "train_cli_fixture.h"

namespace epmoe::testing {
namespace {

namespace fs = std::filesystem;

class MpirunTrain : public EpmoeCli {
 protected:
  std::vector<double> train_threads(const std::string& name, std::vector<std::string> keys) {
    std::vector<std::string> arguments = {"train", "threads=1"};
    for (const std::string& key : tiny_train_keys(scratch_ / (name + ".jsonl"))) arguments.push_back(key);
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    const ProcessResult result = run_epmoe(scratch_, arguments);
    EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
    return losses_of(read_metrics_lines(scratch_ / (name + ".jsonl")));
  }
};

TEST_F(MpirunTrain, ProcessesTrainLikeThreadsAndLikeOneRank) {
  const fs::path checkpoints = scratch_ / "mpi_checkpoints";
  std::vector<std::string> argv = {EPMOE_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                                   "-np", "4", EPMOE_BINARY, "train", "transport=mpi", "threads=1",
                                   "checkpoint_every=10", "checkpoint_dir=" + checkpoints.string()};
  for (const std::string& key : tiny_train_keys(scratch_ / "mpi.jsonl")) argv.push_back(key);
  const ProcessResult result = run_program(scratch_, argv);
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stdout_text.find("epmoe train: 20 steps on 4 rank(s) (mpi"), std::string::npos)
      << result.stdout_text;
  const std::vector<double> mpi = losses_of(read_metrics_lines(scratch_ / "mpi.jsonl"));
  ASSERT_EQ(mpi.size(), 20u);

  EXPECT_EQ(train_threads("threads", {"ranks=4"}), mpi);
  EXPECT_LT(max_relative_difference(train_threads("one", {"ranks=1"}), mpi), 1e-5);

  // The MPI run's step 10, resumed by four threads.
  const fs::path copy = scratch_ / "copy";
  fs::create_directories(copy);
  fs::copy(CheckpointStore(checkpoints).step_dir(10), CheckpointStore(copy).step_dir(10), fs::copy_options::recursive);
  const std::vector<double> resumed =
      train_threads("resumed", {"ranks=4", "resume=true", "checkpoint_dir=" + copy.string()});
  EXPECT_EQ(resumed, std::vector<double>(mpi.begin() + 10, mpi.end()));  // a new metrics file: steps 11..20
}

}  // namespace
}  // namespace epmoe::testing
