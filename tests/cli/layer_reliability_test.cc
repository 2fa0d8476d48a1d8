// `epmoe layer` under the failures a user meets outside the happy path:
// two runs into the same --out at once (their outputs must never mix into a
// set that looks complete: the directory holds one run's files, or the second
// run is refused, exit 2, naming the first's pid), and the fault_injection=
// test hook (a rank failing inside the dispatch fails the run with the
// injected fault's text, and nothing is written; `epmoe train` inherits the
// key from the shared layer key group).
//
// Inputs: `epmoe gen-inputs` with N=16, H=8, F=12, E=4 (epmoe_cli_fixture.h);
// run A uses top_k=1, run B top_k=2, so every output of A differs from B's.
// Topology: ranks as threads (transport=threads), R in {1, 2}, threads=1 (one
// compute thread per rank).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "data/npy.h"
#include "data/test_files.h"
#include "epmoe_cli_fixture.h"

namespace epmoe {
namespace {

using testing::EpmoeCli;
using testing::ProcessResult;
using testing::read_bytes;

// Starts `epmoe` with `arguments` (stdout/stderr into files named by
// `tag` in `scratch`) without waiting.
pid_t start_epmoe(const std::filesystem::path& log_dir, const std::string& tag, std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), EPMOE_BINARY);
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const std::string out_path = (log_dir / (tag + ".out")).string(), err_path = (log_dir / (tag + ".err")).string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The raw bytes of every output file of a layer run with dy, metrics aside
// (it holds timings).
std::vector<std::string> output_bytes(const std::filesystem::path& dir) {
  std::vector<std::string> bytes;
  for (const std::string& name : testing::layer_output_names()) bytes.push_back(read_bytes(dir / (name + ".npy")));
  return bytes;
}

TEST_F(EpmoeCli, ConcurrentRunsIntoOneOutLeaveOneRunsSetOrRefuseTheSecond) {
  generate_inputs();
  const std::filesystem::path logs = scratch_ / "logs", ref_a = scratch_ / "ref_a", ref_b = scratch_ / "ref_b";
  std::filesystem::create_directories(logs);
  ASSERT_EQ(run_layer_into(ref_a, {"top_k=1"}).exit_code, 0);
  ASSERT_EQ(run_layer_into(ref_b, {"top_k=2"}).exit_code, 0);
  const std::vector<std::string> a = output_bytes(ref_a), b = output_bytes(ref_b);
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NE(a[i], b[i]) << "the two runs must be told apart";

  constexpr int kRounds = 12;
  int refusals = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto layer_arguments = [&](const std::string& top_k) {
      return std::vector<std::string>{"layer",     "--in",          in_dir().string(), "--out", out_dir().string(),
                                      "threads=1", "top_k=" + top_k};
    };
    const pid_t run_a = start_epmoe(logs, "a", layer_arguments("1"));
    const pid_t run_b = start_epmoe(logs, "b", layer_arguments("2"));
    const int code_a = wait_exit_code(run_a), code_b = wait_exit_code(run_b);
    for (const auto& [tag, code] : {std::pair{std::string("a"), code_a}, {"b", code_b}}) {
      const std::string err = read_bytes(logs / (tag + ".err"));
      if (code == 0) continue;
      ++refusals;
      EXPECT_EQ(code, 2) << tag << ": " << err;
      EXPECT_NE(err.find("another epmoe process (pid "), std::string::npos) << err;
      EXPECT_EQ(err.find('\n'), err.size() - 1) << "not one line: " << err;
    }
    ASSERT_TRUE(code_a == 0 || code_b == 0) << "both runs refused in round " << round;
    const std::vector<std::string> now = output_bytes(out_dir());
    EXPECT_TRUE(now == a || now == b) << "round " << round << ": the outputs are a mixture of both runs";
    const nlohmann::json metrics = testing::read_metrics(out_dir());
    const std::vector<std::string>& expected = metrics["config"]["top_k"] == 1 ? a : b;
    EXPECT_EQ(now, expected) << "round " << round << ": metrics.json vouches for the other run's files";
  }
  std::printf("concurrent layer runs: %d refusals in %d rounds\n", refusals, kRounds);
  // Nothing left beside the output directory: no lock file, no staging.
  EXPECT_EQ(testing::entries(scratch_.path()), (std::set<std::string>{"in", "out", "logs", "ref_a", "ref_b"}));
}

TEST_F(EpmoeCli, RunIntoALockedOutIsRefusedBeforeItComputes) {
  generate_inputs();
  // The lock file a running epmoe holds, held here by a child process.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const std::filesystem::path lock = scratch_ / ".out.lock";
  const pid_t holder = ::fork();
  if (holder == 0) {
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    ::flock(fd, LOCK_EX);
    const std::string pid = std::to_string(::getpid());
    (void)!::write(fd, pid.data(), pid.size());
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char byte;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  const ProcessResult refused = run_layer();
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  EXPECT_EQ(refused.exit_code, 2) << refused.stderr_text;
  EXPECT_NE(refused.stderr_text.find("another epmoe process (pid " + std::to_string(holder) + ")"), std::string::npos)
      << refused.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
  // The holder died (as a crashed run does): the kernel dropped its lock.
  const ProcessResult after = run_layer();
  EXPECT_EQ(after.exit_code, 0) << after.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(lock)) << "the lock file outlived the run";
}

TEST_F(EpmoeCli, FaultInjectionFailsTheRunWithTheInjectedFaultAndWritesNothing) {
  generate_inputs();
  const ProcessResult result = run_layer({"ranks=2", "fault_injection=0:dispatch"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.stderr_text.find("injected fault at dispatch (fault_injection=0:dispatch)"), std::string::npos)
      << result.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
  EXPECT_EQ(testing::entries(scratch_.path()), (std::set<std::string>{"in"})) << "staging or lock left behind";
}

// `epmoe train` takes the key from the layer key group it shares; the
// trainer's checkpoint point fails rank 1 at its 2nd checkpoint.
TEST_F(EpmoeCli, TrainInheritsFaultInjection) {
  const auto checkpoints = scratch_ / "checkpoints";
  const ProcessResult result = testing::run_epmoe(
      scratch_, {"train", "ranks=2", "steps=3", "batch_size=2", "seq_len=8", "hidden=16", "ffn=16", "num_experts=4",
                 "vocab_size=32", "checkpoint_dir=" + checkpoints.string(), "checkpoint_every=1",
                 "metrics_file=", "progress=off", "threads=1", "fault_injection=1:checkpoint:throw:2"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.stderr_text.find("rank 1: injected fault at checkpoint (fault_injection=1:checkpoint:throw:2)"),
            std::string::npos)
      << result.stderr_text;
}

// A stopped rank on threads stops its own thread, not the process (before:
// SIGSTOP, and the run never ended): its peer times out, and the one error
// line names the stopped rank; nothing is written.
TEST_F(EpmoeCli, AStoppedRankOnThreadsEndsTheRunNamingIt) {
  generate_inputs();
  const ProcessResult result =
      testing::run_program(scratch_,
                           {EPMOE_BINARY, "layer", "--in", in_dir().string(), "--out", out_dir().string(), "threads=1",
                            "ranks=2", "comm_timeout_ms=300", "fault_injection=1:dispatch:stop"},
                           std::chrono::seconds(60));
  expect_rejected(result, {"rank 1 had stopped at dispatch (fault_injection=1:dispatch:stop)"});
}

// The benchmarks take no fault_injection (their runs install no fault scope).
TEST_F(EpmoeCli, FaultInjectionIsDocumentedAsATestHook) {
  std::vector<std::vector<std::string>> commands = {{EPMOE_BINARY, "layer"}, {EPMOE_BINARY, "train"}};
  for (const std::vector<std::string>& command : commands) {
    const ProcessResult help = testing::run_program(scratch_, {command[0], command[1], "--help"});
    EXPECT_EQ(help.exit_code, 0) << command[0] << " " << command[1];
    EXPECT_NE(help.stdout_text.find("fault_injection"), std::string::npos) << command[0] << " " << command[1];
    EXPECT_NE(help.stdout_text.find("TEST HOOK"), std::string::npos) << command[0] << " " << command[1];
  }
}

}  // namespace
}  // namespace epmoe
