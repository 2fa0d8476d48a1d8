// Collectives on the threads transport: R ranks as threads of this process,
// R in {1, 2, 3, 4, 5, 8} (odd sizes find ring bugs). Every rank draws every
// rank's input from one seed, so each checks its result against a naive
// reference locally (collective_checks.h). Compute threads are 1 per rank so
// that no OpenMP region runs here (TSan reports libgomp's own barriers).
// Transport: threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "comm/all_gather.h"
#include "comm/all_reduce.h"
#include "comm/barrier.h"
#include "comm/reduce_scatter.h"
#include "comm/tag.h"
#include "core/error.h"
#include "one_thread_per_rank.h"
#include "transport/threads/launcher.h"

namespace epmoe::comm {
namespace {

using transport::Communicator;
using transport::threads::run_ranks;
using transport::threads::ThreadsOptions;

using testing::one_thread_per_rank;

class CollectivesThreads : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesThreads, EveryCollectiveMatchesTheNaiveReference) {
  run_ranks(GetParam(), one_thread_per_rank(),
            [](Communicator& comm) { testing::check_everything(comm, Algorithm::ring); });
}

TEST_P(CollectivesThreads, TwoCollectivesInFlightWithDifferentTags) {
  run_ranks(GetParam(), one_thread_per_rank(), [](Communicator& comm) { testing::check_two_in_flight(comm, 301); });
}

TEST_P(CollectivesThreads, DifferentCollectivesWithTheSameTagInFlightDoNotCollide) {
  // An all-gather and an all-reduce, both tag 5, with equal message sizes
  // (the all-reduce's blocks are the all-gather's chunks): even ranks start
  // the all-gather first and wait for both, odd ranks finish the all-reduce
  // before they start the all-gather. Without the kind in the tag (comm/tag.h)
  // the all-reduce's gather phase meets the all-gather's receives.
  const int num_ranks = GetParam();
  run_ranks(num_ranks, one_thread_per_rank(), [](Communicator& comm) {
    const int num_ranks = comm.size(), rank = comm.rank();
    const std::int64_t n = 37;
    std::vector<float> gather_input(n), gathered(n * num_ranks), reduced(n * num_ranks);
    for (std::int64_t i = 0; i < n; ++i) gather_input[i] = static_cast<float>(1000 * rank + i);
    std::fill(reduced.begin(), reduced.end(), static_cast<float>(rank + 1));
    auto start_gather = [&] {
      return ring_all_gather(
          comm, {.input = gather_input.data(), .output = gathered.data(), .num_elements_per_rank = n, .tag = 5});
    };
    auto start_reduce = [&] {
      return all_reduce(comm, {.data = reduced.data(), .num_elements = n * num_ranks, .tag = 5});
    };
    if (rank % 2 == 0) {
      CollectiveHandle gather = start_gather();
      CollectiveHandle reduce = start_reduce();
      reduce.wait();
      gather.wait();
    } else {
      start_reduce().wait();
      start_gather().wait();
    }
    const float sum = static_cast<float>(num_ranks * (num_ranks + 1) / 2);
    for (std::int64_t i = 0; i < n * num_ranks; ++i) {
      ASSERT_EQ(reduced[i], sum) << "rank " << rank << " element " << i;
      ASSERT_EQ(gathered[i], static_cast<float>(1000 * (i / n) + i % n)) << "rank " << rank << " element " << i;
    }
  });
}

TEST_P(CollectivesThreads, BarrierLetsNoRankPassBeforeAllArrived) {
  std::atomic<int> arrived{0};
  run_ranks(GetParam(), one_thread_per_rank(), [&](Communicator& comm) {
    for (int round = 0; round < 3; ++round) {
      // The last rank arrives late; nobody may leave before it.
      if (comm.rank() == comm.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      arrived.fetch_add(1);
      BarrierOptions options;
      options.tag = static_cast<std::uint32_t>(round);
      barrier(comm, options).wait();
      EXPECT_GE(arrived.load(), comm.size() * (round + 1)) << "rank " << comm.rank() << " round " << round;
      barrier(comm, BarrierOptions{.tag = 50 + static_cast<std::uint32_t>(round)}).wait();
    }
  });
}

TEST_P(CollectivesThreads, ARankThatThrowsFailsEveryRankWithItsMessage) {
  const int num_ranks = GetParam();
  if (num_ranks == 1) GTEST_SKIP() << "needs a peer";
  std::mutex mutex;
  std::vector<std::string> messages;
  try {
    run_ranks(num_ranks, one_thread_per_rank(), [&](Communicator& comm) {
      if (comm.rank() == 1) throw std::runtime_error("injected failure on rank 1");
      std::vector<float> input(64, 1.0f), output(64 * comm.size());
      AllGatherOptions options;
      options.input = input.data();
      options.output = output.data();
      options.num_elements_per_rank = 64;
      options.timeout = std::chrono::seconds(20);  // far longer than the test: abort must wake us
      try {
        ring_all_gather(comm, options).wait();
      } catch (const PeerError& e) {
        std::lock_guard<std::mutex> lock(mutex);
        messages.push_back(e.what());
        throw;
      }
    });
    FAIL() << "run_ranks returned normally";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "injected failure on rank 1");  // the first failure is rethrown
  }
  ASSERT_EQ(static_cast<int>(messages.size()), num_ranks - 1);
  for (const auto& message : messages) {
    EXPECT_NE(message.find("rank 1 failed: injected failure on rank 1"), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesThreads, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "R" + std::to_string(info.param); });

TEST(CollectivesThreadsErrors, TimeoutNamesCollectivePeerAndTag) {
  const auto started = std::chrono::steady_clock::now();
  try {
    run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
      if (comm.rank() == 1) return;  // never joins the all-gather
      std::vector<float> input(8, 1.0f), output(16);
      AllGatherOptions options;
      options.input = input.data();
      options.output = output.data();
      options.num_elements_per_rank = 8;
      options.tag = 9;
      options.timeout = std::chrono::milliseconds(100);
      ring_all_gather(comm, options).wait();
    });
    FAIL() << "expected a timeout";
  } catch (const PeerError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ring_all_gather tag 9"), std::string::npos) << message;
    EXPECT_NE(message.find("timed out"), std::string::npos) << message;
    EXPECT_NE(message.find("peer 1"), std::string::npos) << message;
    // Raw transport tag = kind all_gather << 27 | 9 << 3 | lane slot (comm/tag.h).
    const std::string lane0 = "tag " + std::to_string(make_tag(CollectiveKind::all_gather, 9, Slot::ring_clockwise));
    const std::string lane1 =
        "tag " + std::to_string(make_tag(CollectiveKind::all_gather, 9, Slot::ring_counter_clockwise));
    EXPECT_TRUE(message.find(lane0) != std::string::npos || message.find(lane1) != std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3)) << "no hang past the timeout";
}

TEST(CollectivesThreadsErrors, ProgressHappensWhileTheCallerDoesNotWait) {
  // Emulated 1 GB/s links: a 1 MiB all-gather over 4 ranks needs a few ms of
  // link time. The caller never calls wait(): it only polls test() between
  // sleeps, and the collective must still finish - on the progress thread.
  ThreadsOptions options = one_thread_per_rank();
  options.links.enabled = true;
  options.links.bandwidth_gb_per_s = 1.0;
  options.links.latency_us = 5.0;
  run_ranks(4, options, [](Communicator& comm) {
    const std::int64_t n = 256 * 1024;
    std::vector<float> input(n, static_cast<float>(comm.rank())), output(n * 4);
    AllGatherOptions gather;
    gather.input = input.data();
    gather.output = output.data();
    gather.num_elements_per_rank = n;
    CollectiveHandle handle = ring_all_gather(comm, gather);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!handle.test() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(handle.test());
    for (int r = 0; r < 4; ++r) ASSERT_EQ(output[r * n + n - 1], static_cast<float>(r));
  });
}

TEST(CollectivesThreadsErrors, BadOptionsAreConfigErrorsNamingTheField) {
  run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
    std::vector<float> buffer(16);
    AllGatherOptions gather;
    gather.input = buffer.data();
    gather.output = buffer.data();
    gather.num_elements_per_rank = 4;
    gather.pipe = 0;
    EXPECT_THROW(ring_all_gather(comm, gather), ConfigError);
    gather.pipe = 1;
    gather.tag = kMaxCollectiveTag + 1;
    EXPECT_THROW(ring_all_gather(comm, gather), ConfigError);
    gather.tag = 0;
    gather.algorithm = Algorithm::native;  // threads has no native collectives
    EXPECT_THROW(ring_all_gather(comm, gather), ConfigError);
    ReduceScatterOptions reduce;
    reduce.input = buffer.data();
    reduce.output = buffer.data();
    reduce.num_elements_per_rank = {1, -1};
    try {
      reduce_scatter(comm, reduce);
      ADD_FAILURE() << "negative count accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("num_elements_per_rank"), std::string::npos) << e.what();
    }
    reduce.num_elements_per_rank = {1};  // wrong length
    EXPECT_THROW(reduce_scatter(comm, reduce), ConfigError);
    reduce.num_elements_per_rank = {1, 1};
    reduce.dtype = DType::fp8_e4m3;  // no sums in fp8
    EXPECT_THROW(reduce_scatter(comm, reduce), ConfigError);
    reduce.dtype = DType::f32;
    reduce.wire_dtype = DType::fp8_e4m3;  // partial sums travel as f32 or bf16
    try {
      reduce_scatter(comm, reduce);
      ADD_FAILURE() << "fp8 wire accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("wire_dtype"), std::string::npos) << e.what();
    }
  });
}

// The threads transport's emulated links (wall clock) never move bytes
// faster than their model: 4 ranks, 1 MiB chunks, 0.1 GB/s full-duplex ring
// links, so a unidirectional all-gather needs at least 3 * 1 MiB / 0.1 GB/s
// = 31 ms and a bidirectional one half that. Only these lower bounds are
// asserted: a busy machine can only add to them. How much faster the
// bidirectional ring is is a speed claim: modelled exactly in
// tests/comm/modelled_time_test.cc (ModelledRing), measured on the wall
// clock by bench/ (docs/BENCHMARKS.md, Collectives (a)). A ratio asserted
// here failed under load (2026-12-07, load 10 on 2 cores).
TEST(CollectivesThreadsTiming, EmulatedLinksNeverBeatTheLinkModel) {
  ThreadsOptions options = one_thread_per_rank();
  options.links.enabled = true;
  options.links.bandwidth_gb_per_s = 0.1;
  options.links.latency_us = 2.0;
  options.links.topology = transport::threads::LinkTopology::ring;
  const std::int64_t n = 256 * 1024;
  double seconds[2] = {0, 0};
  for (int bidirectional = 0; bidirectional < 2; ++bidirectional) {
    run_ranks(4, options, [&](Communicator& comm) {
      std::vector<float> input(n, 1.0f), output(n * 4);
      AllGatherOptions gather;
      gather.input = input.data();
      gather.output = output.data();
      gather.num_elements_per_rank = n;
      gather.direction = bidirectional ? RingDirection::bidirectional : RingDirection::unidirectional;
      double best = 1e9;
      for (int repeat = 0; repeat < 2; ++repeat) {
        barrier(comm, BarrierOptions{.tag = 1}).wait();
        const auto start = std::chrono::steady_clock::now();
        ring_all_gather(comm, gather).wait();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      if (comm.rank() == 0) seconds[bidirectional] = best;
    });
  }
  const double one_way_bound = 3.0 * n * 4 / 0.1e9;
  EXPECT_GE(seconds[0], one_way_bound * 0.99) << "unidirectional beat the link model";
  EXPECT_GE(seconds[1], one_way_bound / 2 * 0.99) << "bidirectional beat the link model";
}

}  // namespace
}  // namespace epmoe::comm
