// A failure reaches every rank at once (DESIGN.md §5), ranks as threads.
//
// Topology: R in {3, 4} ranks as threads, collective timeout 60 s (the
// default), so any rank that learns of the failure only from its own
// deadline blows the 2 s bound by far. Rank 1 fails; every rank records the
// text of the exception that ends it.
//  * mid-collective: the algorithm of rank 1's all-gather hits the injected
//    fault (fault_point "collective", its first messages posted) while rank
//    1's own thread is busy elsewhere (blocked until the others failed):
//    only an abort from inside the algorithm can wake anyone before the
//    deadlines.
//  * compute thread: rank 1 throws on its own thread with an all-gather in
//    flight that the others never join (they wait for a later one). The
//    handle's destructor must cancel rank 1's waits instead of waiting out
//    the deadline, so the launcher can abort the group with the real error.
//  * late rank: rank 2 of 3 never joins an all-gather (it blocks, outside
//    the transport, until the others have failed); the timeout message of
//    rank 0 must name rank 2, not only the neighbour rank 0 waited for.
// Transport: threads, one compute thread per rank.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/all_gather.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "one_thread_per_rank.h"
#include "transport/threads/launcher.h"

namespace epmoe::comm {
namespace {

using transport::Communicator;
using transport::threads::run_ranks;
using transport::threads::ThreadsOptions;

using testing::one_thread_per_rank;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One all-gather of 64 floats per rank into `output`.
CollectiveHandle start_gather(Communicator& comm, const std::vector<float>& input, std::vector<float>& output,
                              std::uint32_t tag) {
  output.resize(input.size() * comm.size());
  return ring_all_gather(comm, {.input = input.data(),
                                .output = output.data(),
                                .num_elements_per_rank = static_cast<std::int64_t>(input.size()),
                                .tag = tag});
}

// Runs `body` on R ranks; returns each rank's exception text ("" if none)
// and the text of the exception run_ranks rethrew.
struct Outcome {
  std::vector<std::string> rank_errors;
  std::string rethrown;
  bool rethrown_is_injected = false;
  double seconds = 0;
};

// `faults`: the run's fault injection, in scope on every rank (nullptr: none).
Outcome run_failing(int num_ranks, const std::function<void(Communicator&)>& body, FaultInjector* faults = nullptr) {
  Outcome outcome;
  outcome.rank_errors.assign(static_cast<std::size_t>(num_ranks), "");
  std::mutex mutex;
  const auto start = std::chrono::steady_clock::now();
  try {
    run_ranks(num_ranks, one_thread_per_rank(), [&](Communicator& comm) {
      const FaultScope scope(faults);
      try {
        body(comm);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        outcome.rank_errors[comm.rank()] = e.what();
        throw;
      }
    });
  } catch (const InjectedFault& e) {
    outcome.rethrown = e.what();
    outcome.rethrown_is_injected = true;
  } catch (const std::exception& e) {
    outcome.rethrown = e.what();
  }
  outcome.seconds = seconds_since(start);
  return outcome;
}

class FailurePropagation : public ::testing::TestWithParam<int> {};

TEST_P(FailurePropagation, AFaultInsideACollectiveFailsEveryRankAtOnce) {
  const int num_ranks = GetParam();
  FaultInjector faults("1:collective");
  std::promise<void> others_failed;  // rank 1's own thread is busy until then
  std::once_flag once;
  const Outcome outcome = run_failing(
      num_ranks,
      [&](Communicator& comm) {
        std::vector<float> input(64, static_cast<float>(comm.rank())), output;
        CollectiveHandle gather = start_gather(comm, input, output, 2);  // rank 1's algorithm throws
        if (comm.rank() == 1) {
          // Not waiting on the collective (computing, say): only an abort from
          // inside its algorithm can tell the others.
          others_failed.get_future().wait();
          gather.wait();
          return;
        }
        try {
          gather.wait();
        } catch (...) {
          std::call_once(once, [&] { others_failed.set_value(); });
          throw;
        }
      },
      &faults);
  EXPECT_LT(outcome.seconds, 2.0) << "ranks waited for their deadlines instead of the abort";
  const std::string root = "rank 1: injected fault at collective (fault_injection=1:collective)";
  for (int r = 0; r < num_ranks; ++r) {
    EXPECT_NE(outcome.rank_errors[r].find(root), std::string::npos) << "rank " << r << ": " << outcome.rank_errors[r];
    if (r != 1) {
      EXPECT_NE(outcome.rank_errors[r].find("rank 1 failed: ring_all_gather tag 2: " + root), std::string::npos)
          << "rank " << r << ": " << outcome.rank_errors[r];
    }
  }
  EXPECT_TRUE(outcome.rethrown_is_injected) << outcome.rethrown;
  EXPECT_NE(outcome.rethrown.find(root), std::string::npos) << outcome.rethrown;
}

TEST_P(FailurePropagation, AThrowWithACollectiveInFlightFailsEveryRankAtOnceWithTheRootError) {
  const int num_ranks = GetParam();
  const Outcome outcome = run_failing(num_ranks, [](Communicator& comm) {
    std::vector<float> input(64, 1.0f), first_out, second_out;
    if (comm.rank() == 1) {
      // The others never start tag 5: only cancelling this rank's waits lets
      // the handle's destructor return before its 60 s deadline.
      CollectiveHandle in_flight = start_gather(comm, input, first_out, 5);
      throw InjectedFault("rank 1: injected fault on the compute thread");
    }
    start_gather(comm, input, second_out, 6).wait();  // rank 1 never joins
  });
  EXPECT_LT(outcome.seconds, 2.0) << "rank 1's unwinding waited for its in-flight collective's deadline";
  EXPECT_TRUE(outcome.rethrown_is_injected) << "an abort-induced error masked the root cause: " << outcome.rethrown;
  EXPECT_EQ(outcome.rethrown, "rank 1: injected fault on the compute thread");
  for (int r = 0; r < num_ranks; ++r) {
    EXPECT_NE(outcome.rank_errors[r].find("rank 1: injected fault on the compute thread"), std::string::npos)
        << "rank " << r << ": " << outcome.rank_errors[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, FailurePropagation, ::testing::Values(3, 4),
                         [](const auto& info) { return "R" + std::to_string(info.param); });

TEST(FailurePropagationLateRank, ATimeoutNamesTheRankThatNeverJoinedNotTheNeighbour) {
  // R = 4: rank 0 receives from ranks 1 and 3; rank 2 never joins, so ranks
  // 1 and 3 wait for it, and rank 0 waits for them.
  std::promise<void> others_failed;
  std::once_flag once;
  std::mutex mutex;
  std::vector<std::string> timeouts;
  EXPECT_THROW(run_ranks(4, one_thread_per_rank(),
                         [&](Communicator& comm) {
                           if (comm.rank() == 2) {  // late: blocked outside the transport
                             others_failed.get_future().wait();
                             return;
                           }
                           std::vector<float> input(64, 1.0f), output(256);
                           try {
                             ring_all_gather(comm, {.input = input.data(),
                                                    .output = output.data(),
                                                    .num_elements_per_rank = 64,
                                                    .tag = 1,
                                                    .timeout = std::chrono::milliseconds(300)})
                                 .wait();
                           } catch (const PeerError& e) {
                             std::lock_guard<std::mutex> lock(mutex);
                             timeouts.push_back(e.what());
                             std::call_once(once, [&] { others_failed.set_value(); });
                             throw;
                           }
                           ADD_FAILURE() << "rank " << comm.rank() << " finished without rank 2";
                         }),
               PeerError);
  ASSERT_FALSE(timeouts.empty());
  // The first timeout aborts the group; its text is in every message.
  const std::string& any = timeouts.front();
  EXPECT_NE(any.find("timed out"), std::string::npos) << any;
  const bool names_rank_2 = any.find("peer 2 is not waiting for any rank: it is the late rank") != std::string::npos ||
                            any.find("the late rank is 2") != std::string::npos;
  EXPECT_TRUE(names_rank_2) << any;
}

}  // namespace
}  // namespace epmoe::comm
