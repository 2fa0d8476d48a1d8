// `epmoe layer transport=mpi` under a real mpirun: ranks as processes.
//
// Topology: gen-inputs with N=24 tokens, H=8, F=12, E=12 experts, top_k=3;
// `mpirun -np 3`: process r holds tokens [8r, 8r+8) and experts [4r, 4r+4)
// and only rank 0 writes --out. Compared with the ranks=1 run (within 1e-5
// relative) and with the threads transport at ranks=3, which runs the same
// algorithm code with the same per-rank work (threads=1 in both), so it must
// give the same bits.
// Also ranks=2 as threads (threads transport, threads=1).
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/test_files.h"
#include "epmoe_cli_fixture.h"

namespace epmoe {
namespace {

using testing::entries;
using testing::EpmoeCli;
using testing::expect_outputs_match;
using testing::ProcessResult;
using testing::read_bytes;
using testing::read_metrics;
using testing::run_program;

constexpr int kProcesses = 3;

class MpirunLayer : public EpmoeCli {
 protected:
  void SetUp() override { generate_inputs({"num_tokens=24", "num_experts=12"}); }

  ProcessResult run_mpirun_layer(const std::filesystem::path& out, const std::vector<std::string>& keys) {
    std::vector<std::string> argv = {EPMOE_MPIEXEC,
                                     "--allow-run-as-root",
                                     "--oversubscribe",
                                     "--bind-to",
                                     "none",
                                     "-np",
                                     std::to_string(kProcesses),
                                     EPMOE_BINARY,
                                     "layer",
                                     "--in",
                                     in_dir().string(),
                                     "--out",
                                     out.string(),
                                     "transport=mpi",
                                     "threads=1",
                                     "top_k=3"};
    argv.insert(argv.end(), keys.begin(), keys.end());
    return run_program(scratch_, argv);
  }
};

TEST_F(MpirunLayer, ProcessesMatchOneRankAndTheThreadsTransport) {
  for (const std::vector<std::string>& dispatcher_keys : std::vector<std::vector<std::string>>{
           {"dispatch=alltoall", "dedup=true"}, {"dispatch=ring", "token_chunks=2"}}) {
    SCOPED_TRACE(dispatcher_keys[0]);
    const std::filesystem::path reference = scratch_ / "reference", threads = scratch_ / "threads",
                                mpi = scratch_ / "mpi";
    ASSERT_EQ(run_layer_into(reference, {"top_k=3"}).exit_code, 0);
    std::vector<std::string> threads_keys = {"top_k=3", "ranks=3"};
    threads_keys.insert(threads_keys.end(), dispatcher_keys.begin(), dispatcher_keys.end());
    ASSERT_EQ(run_layer_into(threads, threads_keys).exit_code, 0);

    const ProcessResult result = run_mpirun_layer(mpi, dispatcher_keys);
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
    expect_outputs_match(mpi, reference, 1e-5);
    for (const std::string& name : testing::layer_output_names()) {
      EXPECT_EQ(read_bytes(mpi / (name + ".npy")), read_bytes(threads / (name + ".npy")))
          << name << ": mpi and threads transports differ";
    }
    const nlohmann::json metrics = read_metrics(mpi);
    EXPECT_EQ(metrics["expert_parallel"]["transport"], "mpi");
    EXPECT_EQ(metrics["expert_parallel"]["ranks"], kProcesses);
    ASSERT_EQ(metrics["expert_parallel"]["per_rank"].size(), static_cast<std::size_t>(kProcesses));
    for (int r = 0; r < kProcesses; ++r) {
      EXPECT_EQ(metrics["expert_parallel"]["per_rank"][r]["rank"], r);
      EXPECT_EQ(metrics["expert_parallel"]["per_rank"][r]["first_token"], 8 * r);
    }
    EXPECT_EQ(metrics["expert_parallel"]["total"]["rows_received"], 24 * 3);
    // The staged output of rank 0 only: nothing else beside the directories.
    EXPECT_EQ(entries(scratch_.path()), (std::set<std::string>{"in", "reference", "threads", "mpi"}));
    for (const auto& dir : {reference, threads, mpi}) std::filesystem::remove_all(dir);
  }
}

TEST_F(MpirunLayer, RejectsRanksOtherThanTheWorldSize) {
  const ProcessResult result = run_mpirun_layer(out_dir(), {"ranks=2"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.stderr_text.find("epmoe: error: ranks=2: under transport=mpi the rank count is the mpirun "
                                    "world size (3); leave ranks unset or set ranks=3"),
            std::string::npos)
      << result.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
}

// A NaN inside x.npy is refused naming the file and the whole-array index,
// with the exit code the tool gives on one process: 2.
TEST_F(MpirunLayer, ANonFiniteInputExitsTwoNamingTheFile) {
  Tensor x = read_npy(in_dir() / "x.npy", DType::f32);
  x.data<float>()[x.numel() - 1] = std::numeric_limits<float>::quiet_NaN();  // the last rank's last row
  write_npy(in_dir() / "x.npy", x);
  const ProcessResult threads = run_layer_into(scratch_ / "threads", {"top_k=3", "ranks=3"});
  EXPECT_EQ(threads.exit_code, 2) << threads.stderr_text;
  const ProcessResult result = run_mpirun_layer(out_dir(), {});
  EXPECT_EQ(result.exit_code, 2) << result.stderr_text;
  EXPECT_NE(threads.stderr_text.find("x.npy[23, 7] = nan: npy inputs must be finite"), std::string::npos)
      << threads.stderr_text;
  EXPECT_NE(result.stderr_text.find("x.npy[23, 7] = nan: npy inputs must be finite"), std::string::npos)
      << result.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
}

// An error raised inside a rank after MPI_Init (here the injected fault, an
// epmoe::Error like a bad input) ends the job through MPI_Abort with the exit
// code the tool gives for it on threads: 2, not MPI_Abort's conventional 1.
TEST_F(MpirunLayer, AnErrorAfterStartupExitsWithTheCodeOfTheThreadsTransport) {
  const ProcessResult threads =
      run_layer_into(scratch_ / "threads", {"top_k=3", "ranks=3", "fault_injection=1:dispatch"});
  EXPECT_EQ(threads.exit_code, 2) << threads.stderr_text;
  const ProcessResult result = run_mpirun_layer(out_dir(), {"fault_injection=1:dispatch"});
  EXPECT_EQ(result.exit_code, 2) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("rank 1: injected fault at dispatch"), std::string::npos) << result.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
}

}  // namespace
}  // namespace epmoe
