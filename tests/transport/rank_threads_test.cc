// RankThreads (transport/threads/rank_threads.h): the ranks-as-threads
// launcher kept alive between runs. Each test makes one pool of R = 3 or 4
// rank threads and runs jobs on it many times: thread identity across runs,
// a ring exchange whose values change per run, a rank that throws, the
// refusal after a failure and restart(), calls out of turn, the per-run
// compute budget and trace track, and modelled time equal to run_ranks' run
// after run.
// Topology: threads transport, one compute thread per rank unless a test
// says otherwise; rank r sends to (r + 1) % R in the ring jobs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/threading.h"
#include "core/trace_recorder.h"
#include "transport/threads/launcher.h"
#include "transport/threads/rank_threads.h"

namespace epmoe::transport::threads {
namespace {

using namespace std::chrono_literals;

ThreadsOptions one_thread_per_rank() {
  ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  return options;
}

// Rank r sends `value + r` to its right neighbour and returns what its left
// neighbour sent.
int ring_shift(Communicator& comm, int value) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() + comm.size() - 1) % comm.size();
  int sent = value + comm.rank(), received = -1;
  auto recv = comm.irecv(left, 1, &received, sizeof(received));
  auto send = comm.isend(right, 1, &sent, sizeof(sent));
  send->wait(10s);
  recv->wait(10s);
  return received;
}

TEST(RankThreads, EveryRunUsesTheSameThreadPerRankAndGetsItsOwnResults) {
  constexpr int kRanks = 4;
  constexpr int kRuns = 50;
  RankThreads pool(kRanks, one_thread_per_rank());
  ASSERT_EQ(pool.size(), kRanks);
  std::vector<std::vector<std::thread::id>> ids(kRuns, std::vector<std::thread::id>(kRanks));
  std::vector<std::vector<int>> received(kRuns, std::vector<int>(kRanks, -1));
  for (int run = 0; run < kRuns; ++run) {
    pool.run([&](Communicator& comm) {
      ids[run][comm.rank()] = std::this_thread::get_id();
      received[run][comm.rank()] = ring_shift(comm, 1000 * run);
    });
  }
  std::set<std::thread::id> distinct(ids[0].begin(), ids[0].end());
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kRanks)) << "one thread per rank";
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u) << "no rank runs on the caller's thread";
  for (int run = 0; run < kRuns; ++run) {
    EXPECT_EQ(ids[run], ids[0]) << "run " << run << " ran on other threads than run 0";
    for (int rank = 0; rank < kRanks; ++rank) {
      EXPECT_EQ(received[run][rank], 1000 * run + (rank + kRanks - 1) % kRanks) << "run " << run << " rank " << rank;
    }
  }
}

TEST(RankThreads, ARankThatThrowsAbortsTheWorldEndsEveryRankAndItsErrorIsRethrown) {
  constexpr int kRanks = 4;
  constexpr int kFailingRank = 2;
  RankThreads pool(kRanks, one_thread_per_rank());
  pool.run([](Communicator& comm) { ring_shift(comm, 0); });  // a good run first: the pool is warm
  std::vector<std::string> woken_with(kRanks);
  std::atomic<int> num_ended{0};
  try {
    pool.run([&](Communicator& comm) {
      struct Ended {
        std::atomic<int>& count;
        ~Ended() { count.fetch_add(1); }
      } ended{num_ended};
      if (comm.rank() == kFailingRank) throw std::runtime_error("boom");
      // Everyone else waits for a message rank 2 never sends, with a deadline
      // far beyond the test's: only the abort can end this wait as an AbortedError.
      int value = 0;
      auto recv = comm.irecv(kFailingRank, 5, &value, sizeof(value));
      try {
        recv->wait(60s);
      } catch (const AbortedError& e) {
        woken_with[comm.rank()] = e.what();
        throw;
      }
    });
    ADD_FAILURE() << "run() returned although rank 2 threw";
  } catch (const AbortedError& e) {
    ADD_FAILURE() << "an AbortedError masked the root error: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  EXPECT_EQ(num_ended.load(), kRanks) << "every rank's job ended before run() returned";
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == kFailingRank) continue;
    EXPECT_NE(woken_with[rank].find("rank 2 failed: boom"), std::string::npos)
        << "rank " << rank << " was not woken by the abort naming rank 2: '" << woken_with[rank] << "'";
  }
  EXPECT_EQ(pool.world().abort_reason(), "rank 2 failed: boom");
  EXPECT_TRUE(pool.needs_restart());
}

TEST(RankThreads, AfterAFailureRunRefusesUntilRestartThenRunsOnTheSameThreads) {
  constexpr int kRanks = 3;
  RankThreads pool(kRanks, one_thread_per_rank());
  std::vector<std::thread::id> before(kRanks), after(kRanks);
  pool.run([&](Communicator& comm) { before[comm.rank()] = std::this_thread::get_id(); });
  EXPECT_THROW(pool.run([](Communicator& comm) {
    if (comm.rank() == 1) throw ConfigError("bad key on rank 1");
  }),
               ConfigError);
  ASSERT_TRUE(pool.needs_restart());

  std::atomic<int> num_jobs{0};
  try {
    pool.run([&](Communicator&) { num_jobs.fetch_add(1); });
    ADD_FAILURE() << "run() on an aborted world did not refuse";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("RankThreads::run: the world was aborted in an earlier run (rank 1 failed: bad key on "
                           "rank 1); call restart() for a fresh world"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(num_jobs.load(), 0) << "a refused run ran jobs";

  const ThreadsWorld* old_world = &pool.world();
  pool.restart();
  EXPECT_FALSE(pool.needs_restart());
  EXPECT_NE(&pool.world(), old_world);
  std::vector<int> received(kRanks, -1);
  pool.run([&](Communicator& comm) {
    after[comm.rank()] = std::this_thread::get_id();
    received[comm.rank()] = ring_shift(comm, 70);
  });
  EXPECT_EQ(after, before) << "restart() kept the threads";
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(received[rank], 70 + (rank + kRanks - 1) % kRanks);
}

TEST(RankThreads, CancelledWaitsInARunThatReturnedStillNeedARestart) {
  RankThreads pool(2, one_thread_per_rank());
  // Rank 0 fails its own waits and swallows the consequence: the run
  // returns, but rank 0's waits fail for good.
  pool.run([](Communicator& comm) {
    if (comm.rank() == 0) comm.cancel_pending("rank 0 gave up");
  });
  ASSERT_TRUE(pool.needs_restart());
  try {
    pool.run([](Communicator&) {});
    ADD_FAILURE() << "run() with a cancelled rank did not refuse";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0's waits were cancelled in an earlier run (rank 0 gave up)"),
              std::string::npos)
        << e.what();
  }
}

TEST(RankThreads, RunFromInsideAJobIsAUsageErrorAndAbortsTheRun) {
  RankThreads pool(2, one_thread_per_rank());
  try {
    pool.run([&](Communicator& comm) {
      if (comm.rank() == 1) pool.run([](Communicator&) {});
    });
    ADD_FAILURE() << "a nested run() was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RankThreads::run: called while a run is in progress"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.world().abort_reason().rfind("rank 1 failed: RankThreads::run: called while", 0), 0u)
      << pool.world().abort_reason();
}

TEST(RankThreads, RunAndRestartFromASecondThreadDuringARunAreRefused) {
  RankThreads pool(2, one_thread_per_rank());
  std::promise<void> job_started, other_thread_tried;
  std::future<void> tried = other_thread_tried.get_future();
  std::string run_error, restart_error;
  std::thread other([&] {
    job_started.get_future().wait();
    try {
      pool.run([](Communicator&) {});
    } catch (const UsageError& e) {
      run_error = e.what();
    }
    try {
      pool.restart();
    } catch (const UsageError& e) {
      restart_error = e.what();
    }
    other_thread_tried.set_value();
  });
  pool.run([&](Communicator& comm) {
    if (comm.rank() != 0) return;
    job_started.set_value();
    ASSERT_EQ(tried.wait_for(30s), std::future_status::ready) << "the second thread's calls did not return";
  });
  other.join();
  EXPECT_EQ(run_error.rfind("RankThreads::run: called while a run is in progress", 0), 0u) << run_error;
  EXPECT_EQ(restart_error.rfind("RankThreads::restart: called while a run is in progress", 0), 0u) << restart_error;
  EXPECT_FALSE(pool.needs_restart()) << "a refused call broke the pool";
}

TEST(RankThreads, EveryRunStartsWithTheOptionsComputeBudgetAndTraceTrack) {
  ThreadsOptions options;
  options.compute_threads_per_rank = 2;
  TraceRecorder trace;
  options.trace = &trace;
  RankThreads pool(3, options);
  for (int run = 0; run < 3; ++run) {
    std::vector<int> budget(3, -1);
    std::vector<TraceTrack> track(3);
    pool.run([&](Communicator& comm) {
      budget[comm.rank()] = compute_threads();
      track[comm.rank()] = this_thread_trace_track();
      set_compute_threads(1);  // a job changing its budget does not leak into the next run
    });
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(budget[rank], 2) << "run " << run << " rank " << rank;
      EXPECT_EQ(track[rank].recorder, &trace);
      EXPECT_EQ(track[rank].pid, rank);
    }
  }
}

TEST(RankThreads, InWallTimeAMessageMayBeSentInOneRunAndReceivedInTheNext) {
  RankThreads pool(2, one_thread_per_rank());
  const int payload = 4242;
  int received = 0;
  std::unique_ptr<Request> send;  // lives across the runs, as an owner's per-rank state does
  pool.run([&](Communicator& comm) {
    if (comm.rank() == 0) send = comm.isend(1, 3, &payload, sizeof(payload));
  });
  pool.run([&](Communicator& comm) {
    if (comm.rank() == 1) comm.irecv(0, 3, &received, sizeof(received))->wait(10s);
    if (comm.rank() == 0) send->wait(10s);
  });
  send.reset();
  EXPECT_EQ(received, payload);
}

// Modelled time: ring links of 1 GB/s and 1 us latency; compute at 1e12
// flop/s. Each rank computes (rank + 1) us, then sends (7 * peer + rank + 1)
// * 100 bytes to every other rank and receives from each; several messages
// share ring links, so the order links serve them in matters.
ThreadsOptions modelled_ring() {
  ThreadsOptions options = one_thread_per_rank();
  options.links.bandwidth_gb_per_s = 1.0;
  options.links.latency_us = 1.0;
  options.links.topology = LinkTopology::ring;
  options.modelled.enabled = true;
  options.modelled.peak_flops = 1e12;
  options.modelled.compute_efficiency = 1.0;
  options.modelled.memory_bytes_per_s = 1e15;
  return options;
}

struct ModelledRankResult {
  Picoseconds end = 0;
  ModelledTotals totals;
  bool operator==(const ModelledRankResult& other) const {
    return end == other.end && totals.compute == other.totals.compute &&
           totals.communication == other.totals.communication && totals.idle == other.totals.idle;
  }
};

void modelled_exchange(Communicator& comm, std::vector<ModelledRankResult>& results) {
  const int num_ranks = comm.size(), rank = comm.rank();
  { ComputeScope compute("work", {1e6 * (rank + 1), 0}); }
  std::vector<std::vector<char>> outgoing(num_ranks), incoming(num_ranks);
  std::vector<std::unique_ptr<Request>> requests;
  for (int peer = 0; peer < num_ranks; ++peer) {
    if (peer == rank) continue;
    outgoing[peer].assign(static_cast<std::size_t>((7 * peer + rank + 1) * 100), 'x');
    incoming[peer].resize(static_cast<std::size_t>((7 * rank + peer + 1) * 100));
    requests.push_back(comm.irecv(peer, 9, incoming[peer].data(), static_cast<std::int64_t>(incoming[peer].size())));
    requests.push_back(comm.isend(peer, 9, outgoing[peer].data(), static_cast<std::int64_t>(outgoing[peer].size())));
  }
  for (auto& request : requests) request->wait(30s);
  ModelledClock& clock = *this_thread_modelled_clock();
  results[rank] = {clock.now(), clock.totals()};
}

TEST(RankThreads, ModelledTimeOfEveryRunEqualsAFreshRunRanksToThePicosecond) {
  constexpr int kRanks = 4;
  std::vector<ModelledRankResult> fresh(kRanks);
  run_ranks(kRanks, modelled_ring(), [&](Communicator& comm) { modelled_exchange(comm, fresh); });
  ASSERT_GT(fresh[0].end, 0);
  RankThreads pool(kRanks, modelled_ring());
  for (int run = 0; run < 4; ++run) {
    std::vector<ModelledRankResult> pooled(kRanks);
    pool.run([&](Communicator& comm) {
      EXPECT_EQ(this_thread_modelled_clock(), &pool.world().timeline()->rank_clock(comm.rank()));
      modelled_exchange(comm, pooled);
    });
    for (int rank = 0; rank < kRanks; ++rank) {
      EXPECT_TRUE(pooled[rank] == fresh[rank]) << "run " << run << " rank " << rank << ": end " << pooled[rank].end
                                               << " ps, run_ranks " << fresh[rank].end << " ps";
    }
  }
}

TEST(RankThreads, InModelledTimeAMessageLeftUnmatchedIsRefusedAtTheNextRun) {
  RankThreads pool(2, modelled_ring());
  const int payload = 1;
  pool.run([&](Communicator& comm) {
    // A modelled send completes at its link time without its receive: the
    // bytes stay staged in rank 1's mailbox.
    if (comm.rank() == 0) comm.isend(1, 0x21, &payload, sizeof(payload))->wait(10s);
  });
  try {
    pool.run([](Communicator&) {});
    ADD_FAILURE() << "a run started modelled time afresh over a message of the previous run";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("a send from rank 0 to rank 1, tag 0x21, is left unmatched from the previous "
                                         "run"),
              std::string::npos)
        << e.what();
  }
}

TEST(RankThreads, BadOptionsAndRankCountsAreConfigErrors) {
  ThreadsOptions negative = one_thread_per_rank();
  negative.compute_threads_per_rank = -1;
  EXPECT_THROW(RankThreads(2, negative), ConfigError);
  EXPECT_THROW(RankThreads(0, one_thread_per_rank()), ConfigError);
}

}  // namespace
}  // namespace epmoe::transport::threads
