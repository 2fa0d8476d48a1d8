// Collectives on the mpi transport: one process per rank under
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np R comm_mpi_test
// (ctest runs R = 2, 3, 4). Every rank runs the same gtest cases in the same
// order on one MpiCommunicator; each checks its own result against the naive
// reference (collective_checks.h), for our algorithms and MPI's native ones.
// With --inject-failure-on-rank=r, rank r throws before the first collective:
// the job must end through MPI_Abort with "rank r failed: ..." (checked by
// ctest's PASS_REGULAR_EXPRESSION), not hang.
// Topology: mpi transport, R in {2, 3, 4} processes, the OpenMP default of
// compute threads per process.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "comm/all_gather.h"
#include "comm/all_reduce.h"
#include "comm/barrier.h"
#include "comm/cooperative_progress.h"
#include "core/error.h"
#include "transport/mpi/launcher.h"

namespace epmoe::comm {
namespace {

transport::Communicator* g_comm = nullptr;

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

TEST(CollectivesMpi, OurAlgorithmsMatchTheNaiveReference) { testing::check_everything(*g_comm, Algorithm::ring); }

TEST(CollectivesMpi, NativeAlgorithmsMatchTheNaiveReference) { testing::check_everything(*g_comm, Algorithm::native); }

TEST(CollectivesMpi, TwoCollectivesInFlightWithDifferentTags) { testing::check_two_in_flight(*g_comm, 4097); }

// Cooperative progress on MPI (comm/cooperative_progress.h): the caller
// drives instead of waiting, so the progress threads' waits poll through the
// slot (poll_sleep, no spin once lent): same bytes as waiting, and as the
// naive gather.
TEST(CollectivesMpi, DrivingProgressGivesTheSameResultsAsWaiting) {
  transport::Communicator& comm = *g_comm;
  const int num_ranks = comm.size();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{300000}}) {
    std::vector<float> expected;
    for (int r = 0; r < num_ranks; ++r) {
      const auto block = testing::random_floats(900 + n, r, n);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    const auto input = testing::random_floats(900 + n, comm.rank(), n);
    std::vector<float> reduced_waited = input, reduced_driven = input;
    for (bool drive : {false, true}) {
      std::vector<float> output(static_cast<std::size_t>(n * num_ranks), -1.0f);
      CollectiveHandle gather = ring_all_gather(
          comm, {.input = input.data(), .output = output.data(), .num_elements_per_rank = n, .tag = 30});
      std::vector<float>& reduced = drive ? reduced_driven : reduced_waited;
      CollectiveHandle reduce = all_reduce(comm, {.data = reduced.data(), .num_elements = n, .tag = 31});
      if (drive) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        bool gathered = false, summed = false;
        while (!(gathered && summed) && std::chrono::steady_clock::now() < give_up) {
          drive_progress();
          gathered = gathered || gather.test();
          summed = summed || reduce.test();
        }
        ASSERT_TRUE(gathered && summed) << "driven collectives did not end";
      } else {
        gather.wait();
        reduce.wait();
      }
      EXPECT_EQ(output, expected) << "rank " << comm.rank() << " n " << n << (drive ? " (driven)" : "");
    }
    ASSERT_EQ(reduced_waited.size(), reduced_driven.size());
    // (n == 0: empty vectors may hold null pointers, which memcmp must not get)
    EXPECT_TRUE(reduced_waited.empty() ||
                std::memcmp(reduced_waited.data(), reduced_driven.data(), reduced_waited.size() * sizeof(float)) == 0)
        << "rank " << comm.rank() << " n " << n << ": driven sums differ in their bits";
  }
}

TEST(CollectivesMpi, TimeoutNamesPeerAndTag) {
  transport::Communicator& comm = *g_comm;
  // Rank 0 waits for a message rank 1 never sends.
  if (comm.rank() == 0) {
    int value = 0;
    auto request = comm.irecv(1, 12345, &value, sizeof(value));
    const double cpu_before = thread_cpu_seconds();
    const auto wall_before = std::chrono::steady_clock::now();
    try {
      request->wait(std::chrono::milliseconds(300));
      ADD_FAILURE() << "no timeout";
    } catch (const PeerError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("rank 0: timed out after ", 0), 0u) << message;
      EXPECT_NE(message.find(" ms waiting to receive from peer 1, tag 12345"), std::string::npos) << message;
      // Rank 1 is alive (its liveness helper answers): nobody is named late.
      EXPECT_EQ(message.find("liveness probe"), std::string::npos) << message;
    }
    // Waiting backs off to 1 ms sleeps: a waiting rank costs ~1% of a core
    // on an idle machine, not the ~40% that 20 us polling cost (nor the 100%
    // of a spin). With builds on both cores each wake-up costs more: 6.4% was
    // seen (2026-12-02), so the bound sits between that and 20 us polling.
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
    EXPECT_LT(thread_cpu_seconds() - cpu_before, 0.2 * wall) << "the wait spins";
  }
  barrier(comm, BarrierOptions{.tag = 77}).wait();
}

// A rank that is stopped while another's wait times out, and resumed while
// that rank's liveness probe is still open, must still be named late (issue
// 28): when the first rank to time out aborts the job, mpirun sends SIGCONT
// to every process, and the stopped rank then answered the probes the other
// waiting ranks had open, which named nobody (or only their neighbour).
// Here rank 1 stops itself and rank 0 resumes it 200 ms into its probe, as
// mpirun would; rank 0's timeout must name rank 1.
bool process_stopped(std::int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t state = text.rfind(") ");  // "pid (name) S ...": the state follows the name
  return state != std::string::npos && state + 2 < text.size() && text[state + 2] == 'T';
}

std::vector<std::int64_t> every_ranks_pid(transport::Communicator& comm, std::uint32_t tag) {
  std::int64_t pid = ::getpid();
  std::vector<std::int64_t> pids(static_cast<std::size_t>(comm.size()));
  ring_all_gather(comm,
                  {.input = &pid, .output = pids.data(), .num_elements_per_rank = 1, .dtype = DType::i64, .tag = tag})
      .wait();
  return pids;
}

TEST(CollectivesMpi, ARankResumedWhileAProbeIsOpenIsStillNamedLate) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // Every rank skips (before any collective, so none waits for another):
  // the test's windows (a 300 ms wait, a resume 200 ms into the probe, the
  // 250 ms gap that names a rank late) assume the Release build's speed; it
  // failed once in a clean run under ASan (no probe answer within the
  // window). It runs in the Release suite under mpirun -np 2, 3 and 4.
  GTEST_SKIP() << "timing windows of 200-300 ms are meaningless under a sanitizer (5-15x slower)";
#endif
  transport::Communicator& comm = *g_comm;
  const std::vector<std::int64_t> pids = every_ranks_pid(comm, 40);
  constexpr auto kWait = std::chrono::milliseconds(300);
  if (comm.rank() == 1) {
    ::kill(::getpid(), SIGSTOP);  // until rank 0 resumes it
  } else if (comm.rank() == 0) {
    std::promise<std::chrono::steady_clock::time_point> wait_started;
    std::thread resumer([&, started = wait_started.get_future()]() mutable {
      const auto probe_begins = started.get() + kWait;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!process_stopped(pids[1]) && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_until(probe_begins + std::chrono::milliseconds(200));
      ::kill(static_cast<pid_t>(pids[1]), SIGCONT);
    });
    int value = 0;
    auto request = comm.irecv(1, 12346, &value, sizeof(value));
    wait_started.set_value(std::chrono::steady_clock::now());
    std::string message;
    try {
      request->wait(kWait);
    } catch (const PeerError& e) {
      message = e.what();
    }
    resumer.join();
    EXPECT_NE(message.find("rank 1 answered a liveness probe only after not running for"), std::string::npos)
        << message;
    EXPECT_NE(message.find("it is the late rank"), std::string::npos) << message;
  }
  barrier(comm, BarrierOptions{.tag = 78}).wait();
}

// A host that runs none of the job for a while (a loaded 2-core machine ran
// 4 ranks' liveness helpers 420-441 ms apart, once in ~200 runs of this
// binary) is not a late rank: every rank, the waiting one included, shows
// the same stall. Another process stops every rank for 400 ms (a stopped
// rank cannot resume itself), (a) just before rank 0's 300 ms wait on rank
// 1, which never sends (100 ms before it): the stall ended before the wait
// and names nobody;
// (b) 100 ms into that wait: rank 0 was not running either, so the note says
// so and names nobody. Before, both named every other rank late.
pid_t stop_every_rank_later(const std::vector<std::int64_t>& pids, const std::string& delay_s,
                            const std::string& stop_s) {
  std::ostringstream list, text;
  for (std::int64_t pid : pids) list << ' ' << pid;
  text << "sleep " << delay_s << "; kill -STOP" << list.str() << "; sleep " << stop_s << "; kill -CONT" << list.str();
  std::string script = text.str();
  std::string shell = "/bin/sh", dash_c = "-c";
  char* argv[] = {shell.data(), dash_c.data(), script.data(), nullptr};
  pid_t child = 0;
  if (::posix_spawn(&child, "/bin/sh", nullptr, nullptr, argv, environ) != 0)
    throw std::runtime_error("posix_spawn /bin/sh failed");
  return child;
}

std::string timed_out_wait_message(transport::Communicator& comm, int tag) {
  int value = 0;
  auto request = comm.irecv(1, tag, &value, sizeof(value));
  try {
    request->wait(std::chrono::milliseconds(300));
  } catch (const PeerError& e) {
    return e.what();
  }
  return "no timeout";
}

TEST(CollectivesMpi, AStarvedMachineNamesNoRankLate) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "timing windows of 100-400 ms are meaningless under a sanitizer (5-15x slower)";
#endif
  transport::Communicator& comm = *g_comm;
  const std::vector<std::int64_t> pids = every_ranks_pid(comm, 41);
  if (comm.rank() == 0) {
    int status = 0;
    const pid_t before = stop_every_rank_later(pids, "0", "0.4");
    ::waitpid(before, &status, 0);                                // this rank is stopped meanwhile too
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // every helper has run again by then
    const std::string stalled_before = timed_out_wait_message(comm, 12347);
    EXPECT_NE(stalled_before.find("waiting to receive from peer 1, tag 12347"), std::string::npos) << stalled_before;
    EXPECT_EQ(stalled_before.find("liveness probe"), std::string::npos) << stalled_before;
    EXPECT_EQ(stalled_before.find("this rank too"), std::string::npos) << stalled_before;

    const pid_t during = stop_every_rank_later(pids, "0.1", "0.4");
    const std::string stalled_during = timed_out_wait_message(comm, 12348);
    ::waitpid(during, &status, 0);
    EXPECT_NE(stalled_during.find("; this rank too was not running for "), std::string::npos) << stalled_during;
    EXPECT_EQ(stalled_during.find("liveness probe"), std::string::npos) << stalled_during;
  }
  barrier(comm, BarrierOptions{.tag = 79}).wait();
}

}  // namespace
}  // namespace epmoe::comm

int main(int argc, char** argv) {
  int failing_rank = -1;
  const std::string flag = "--inject-failure-on-rank=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag.c_str(), flag.size()) == 0) failing_rank = std::stoi(argv[i] + flag.size());
  }
  ::testing::InitGoogleTest(&argc, argv);
  int status = 0;
  epmoe::transport::mpi::run_rank(argc, argv, [&](epmoe::transport::Communicator& comm) {
    if (comm.rank() != 0) {  // one rank prints the gtest report
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    if (failing_rank >= 0) {
      if (comm.rank() == failing_rank) {
        throw std::runtime_error("injected failure on rank " + std::to_string(failing_rank));
      }
      std::vector<float> input(16, 1.0f), output(16 * comm.size());
      epmoe::comm::AllGatherOptions options;
      options.input = input.data();
      options.output = output.data();
      options.num_elements_per_rank = 16;
      epmoe::comm::ring_all_gather(comm, options).wait();  // aborted by the failing rank
      return;
    }
    epmoe::comm::g_comm = &comm;
    status = RUN_ALL_TESTS();
    // A failure on any rank fails the job: agree on the worst status.
    std::vector<float> failed(1, status != 0 ? 1.0f : 0.0f);
    epmoe::comm::AllReduceOptions reduce;
    reduce.data = failed.data();
    reduce.num_elements = 1;
    reduce.tag = 999;
    epmoe::comm::all_reduce(comm, reduce).wait();
    status = failed[0] > 0 ? 1 : 0;
    epmoe::comm::g_comm = nullptr;
  });
  return status;
}
