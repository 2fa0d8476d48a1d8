// The public <epmoe/threads_world.h>, called as an embedding program would,
// through the public headers (core/threading.h only reads the compute budget
// back). ThreadsWorld with the caller's own
// threads, and run_ranks: results per rank, the compute budget, a rank's
// error rethrown with the peers woken, bad arguments.
// Topology: threads transport, R = 1..4; rank r sends to (r + 1) % R.
#include <gtest/gtest.h>

#include <epmoe/error.h>
#include <epmoe/threads_world.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/threading.h"

namespace epmoe {
namespace {

using namespace std::chrono_literals;

// Rank r sends 10 * r + 1 to its right neighbour; returns what its left one sent.
int ring_shift(Communicator& comm) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() + comm.size() - 1) % comm.size();
  int sent = 10 * comm.rank() + 1, received = -1;
  auto recv = comm.irecv(left, 4, &received, sizeof(received));
  auto send = comm.isend(right, 4, &sent, sizeof(sent));
  send->wait(10s);
  recv->wait(10s);
  return received;
}

TEST(PublicThreadsWorld, CallersOwnThreadsExchangeThroughItsCommunicators) {
  constexpr int kRanks = 3;
  ThreadsWorld world(kRanks);
  ASSERT_EQ(world.size(), kRanks);
  std::vector<int> received(kRanks, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      Communicator& comm = world.communicator(rank);
      EXPECT_EQ(comm.rank(), rank);
      EXPECT_EQ(comm.size(), kRanks);
      EXPECT_EQ(comm.transport_name(), "threads");
      received[rank] = ring_shift(comm);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(received[rank], 10 * ((rank + kRanks - 1) % kRanks) + 1);
  EXPECT_FALSE(world.aborted());
}

TEST(PublicThreadsWorld, AnAbortWakesTheOtherRanksWaits) {
  ThreadsWorld world(2);
  std::string woken_with;
  std::thread waiter([&] {
    int value = 0;
    auto recv = world.communicator(1).irecv(0, 1, &value, sizeof(value));
    try {
      recv->wait(60s);  // only the abort can end it as an AbortedError
    } catch (const AbortedError& e) {
      woken_with = e.what();
    }
  });
  world.communicator(0).abort("rank 0 failed: no input");
  waiter.join();
  EXPECT_NE(woken_with.find("rank 0 failed: no input"), std::string::npos) << woken_with;
  EXPECT_TRUE(world.aborted());
}

TEST(PublicThreadsWorld, BadRanksAreConfigErrors) {
  EXPECT_THROW(ThreadsWorld(0), ConfigError);
  ThreadsWorld world(2);
  try {
    world.communicator(2);
    ADD_FAILURE() << "rank 2 of 2 accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "ThreadsWorld::communicator: rank 2 outside [0, 2)");
  }
  EXPECT_THROW(world.communicator(-1), ConfigError);
}

TEST(PublicRunRanks, EveryRankRunsOnceWithItsBudgetAndItsResults) {
  for (int num_ranks = 1; num_ranks <= 4; ++num_ranks) {
    std::vector<int> received(num_ranks, -1), budget(num_ranks, -1);
    run_ranks(
        num_ranks,
        [&](Communicator& comm) {
          budget[comm.rank()] = compute_threads();
          received[comm.rank()] = ring_shift(comm);
        },
        /*compute_threads_per_rank=*/2);
    for (int rank = 0; rank < num_ranks; ++rank) {
      EXPECT_EQ(received[rank], 10 * ((rank + num_ranks - 1) % num_ranks) + 1) << "R=" << num_ranks;
      EXPECT_EQ(budget[rank], 2) << "R=" << num_ranks << " rank " << rank;
    }
  }
}

TEST(PublicRunRanks, TheDefaultBudgetSplitsTheCoresOverTheRanks) {
  std::vector<int> budget(2, -1);
  run_ranks(2, [&](Communicator& comm) { budget[comm.rank()] = compute_threads(); });
  const int expected = std::max(1, hardware_cores() / 2);
  EXPECT_EQ(budget, std::vector<int>(2, expected));
}

TEST(PublicRunRanks, ARanksErrorIsRethrownAndItsPeersAreWoken) {
  std::atomic<int> woken{0};
  try {
    run_ranks(3, [&](Communicator& comm) {
      if (comm.rank() == 1) throw FileError("rank 1 cannot read experts.npy");
      int value = 0;
      auto recv = comm.irecv(1, 2, &value, sizeof(value));
      try {
        recv->wait(60s);
      } catch (const AbortedError& e) {
        if (std::string(e.what()).find("rank 1 failed: rank 1 cannot read experts.npy") != std::string::npos) ++woken;
        throw;
      }
    });
    ADD_FAILURE() << "run_ranks returned although rank 1 threw";
  } catch (const AbortedError& e) {
    ADD_FAILURE() << "an AbortedError masked the root error: " << e.what();
  } catch (const FileError& e) {
    EXPECT_STREQ(e.what(), "rank 1 cannot read experts.npy");
  }
  EXPECT_EQ(woken.load(), 2);
}

TEST(PublicRunRanks, BadArgumentsAreConfigErrors) {
  EXPECT_THROW(run_ranks(0, [](Communicator&) {}), ConfigError);
  EXPECT_THROW(run_ranks(
                   2, [](Communicator&) {}, -1),
               ConfigError);
}

}  // namespace
}  // namespace epmoe
