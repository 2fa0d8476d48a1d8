// A rank that fails ends the whole `mpirun -np 3 epmoe layer transport=mpi`
// job at once, with the root error's text (DESIGN.md §5).
//
// Topology: gen-inputs with N=24 tokens, H=8, F=12, E=12 experts, top_k=3;
// 3 processes, process r holds tokens [8r, 8r+8) and experts [4r, 4r+4).
// Rank 1 fails through the fault-injection hook (core/fault_injection.h,
// passed as mpirun -x EPMOE_FAULT_INJECTION=...):
//   1:collective        throws inside a collective's algorithm (messages in flight)
//   1:dispatch          throws in the dispatcher, token exchange in flight
//   1:dispatch:kill     SIGKILLs itself there
//   1:dispatch:stop     SIGSTOPs itself there: a rank that stops responding
// "At once" is judged against the timeout, not against a wall-clock figure
// of this shared machine (~0.8 s for this job without a fault when idle, but
// a 2 s bound failed under ctest -j2 beside other builds): with
// comm_timeout_ms=60000 the first three must end in under half of it, which
// only the failure's propagation can do, since every wait would otherwise
// sit out the 60 s. The stopped rank must end no earlier than its
// comm_timeout_ms and within 20 s after it (it ends; it does not hang), and
// its timeout message must name rank 1 as the late rank. The first "rank r failed:" line must
// be the root error (the injected fault), not an "aborted while ..." echo.
// Transport: mpi (3 processes), threads=1 per process.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "epmoe_cli_fixture.h"

namespace epmoe {
namespace {

using testing::EpmoeCli;
using testing::ProcessResult;
using testing::run_program;

// Long enough that no wait of a healthy rank times out while a failure
// propagates, however loaded the machine.
constexpr int kLongTimeoutMs = 60000;
constexpr double kAtOnceSeconds = kLongTimeoutMs / 2000.0;

struct TimedResult {
  ProcessResult process;
  double seconds = 0;
};

class MpirunFault : public EpmoeCli {
 protected:
  void SetUp() override { generate_inputs({"num_tokens=24", "num_experts=12"}); }

  TimedResult run_with_fault(const std::string& spec, const std::vector<std::string>& keys,
                             const std::vector<std::string>& mpirun_options = {}) {
    std::vector<std::string> argv = {
        EPMOE_MPIEXEC, "--allow-run-as-root",          "--oversubscribe", "--bind-to", "none",
        "-x",          "EPMOE_FAULT_INJECTION=" + spec};
    argv.insert(argv.end(), mpirun_options.begin(), mpirun_options.end());
    const std::vector<std::string> command = {
        "-np",           "3",         EPMOE_BINARY, "layer", "--in", in_dir().string(), "--out", out_dir().string(),
        "transport=mpi", "threads=1", "top_k=3"};
    argv.insert(argv.end(), command.begin(), command.end());
    argv.insert(argv.end(), keys.begin(), keys.end());
    const auto start = std::chrono::steady_clock::now();
    TimedResult result{run_program(scratch_, argv), 0};
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }

  // The first "epmoe: rank r: rank r failed: ..." line: the error the job
  // ended with (the fault hook's own "injected fault ...: SIGSTOP" notice
  // is not one).
  static std::string first_failure_line(const std::string& stderr_text) {
    for (std::size_t at = stderr_text.find("epmoe: rank "); at != std::string::npos;
         at = stderr_text.find("epmoe: rank ", at + 1)) {
      const std::string line = stderr_text.substr(at, stderr_text.find('\n', at) - at);
      if (line.find(" failed: ") != std::string::npos) return line;
    }
    return "";
  }
};

TEST_F(MpirunFault, AThrowEndsTheJobAtOnceWithTheRootError) {
  for (const std::string point : {"collective", "dispatch"}) {
    for (const std::string dispatch : {"ring", "alltoall"}) {
      SCOPED_TRACE(point + " dispatch=" + dispatch);
      const std::string spec = "1:" + point;
      const TimedResult result = run_with_fault(
          spec, {"dispatch=" + dispatch, "token_chunks=2", "comm_timeout_ms=" + std::to_string(kLongTimeoutMs)});
      EXPECT_NE(result.process.exit_code, 0);
      EXPECT_LT(result.seconds, kAtOnceSeconds) << "the job outlived the failure by a deadline";
      const std::string line = first_failure_line(result.process.stderr_text);
      EXPECT_NE(line.find("rank 1 failed: "), std::string::npos) << result.process.stderr_text;
      EXPECT_NE(line.find("rank 1: injected fault at " + point + " (fault_injection=" + spec + ")"), std::string::npos)
          << "not the root error: " << result.process.stderr_text;
      EXPECT_FALSE(std::filesystem::exists(out_dir()));
    }
  }
}

TEST_F(MpirunFault, AKilledRankEndsTheJobAtOnce) {
  // When a child dies of a signal, mpirun's teardown sends the others
  // SIGTERM and then waits odls_base_sigkill_timeout (1 s by default) before
  // it returns, although they die of the SIGTERM at once (measured: 1.7-1.9 s
  // for this job with the default, ~1.3 s with 0, against ~0.8 s for the
  // whole job without a fault). That second is mpirun's, not epmoe's.
  const TimedResult result =
      run_with_fault("1:dispatch:kill", {"dispatch=ring", "comm_timeout_ms=" + std::to_string(kLongTimeoutMs)},
                     {"--mca", "odls_base_sigkill_timeout", "0"});
  EXPECT_NE(result.process.exit_code, 0);
  EXPECT_LT(result.seconds, kAtOnceSeconds) << "the job outlived the killed rank by a deadline";
  EXPECT_NE(result.process.stderr_text.find("injected fault at dispatch"), std::string::npos)
      << result.process.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
}

TEST_F(MpirunFault, AStoppedRankEndsTheJobAfterTheTimeoutNamingIt) {
  constexpr int kTimeoutMs = 1500;
  const TimedResult result =
      run_with_fault("1:dispatch:stop", {"dispatch=ring", "comm_timeout_ms=" + std::to_string(kTimeoutMs)});
  EXPECT_NE(result.process.exit_code, 0);
  EXPECT_GE(result.seconds, kTimeoutMs / 1000.0) << "ended before any wait could time out";
  EXPECT_LT(result.seconds, kTimeoutMs / 1000.0 + 20.0) << "the job did not end after the timeout";
  const std::string line = first_failure_line(result.process.stderr_text);
  EXPECT_NE(line.find("timed out after"), std::string::npos) << result.process.stderr_text;
  EXPECT_NE(line.find("rank 1 did not answer a liveness probe within 500 ms: it is the late rank"), std::string::npos)
      << result.process.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(out_dir()));
}

}  // namespace
}  // namespace epmoe
