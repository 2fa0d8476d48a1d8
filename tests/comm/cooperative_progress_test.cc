// Cooperative progress (comm/cooperative_progress.h, issue 15), ranks as
// threads over emulated links (so collectives stay in flight while the
// caller drives them):
//  * results: the ring all-gather (equal and unequal blocks, both
//    directions, pipe 1 and 3), all_to_all_v and all_reduce give the same
//    bytes whether the caller waits or drives progress until test() is true,
//    and those bytes are the naive reference's; R in {1, 2, 3, 4, 8},
//    zero-sized inputs included;
//  * the calling thread's bookkeeping: nothing tracked after a collective
//    ended, nothing at all in modelled time, drive_progress with nothing in
//    flight makes no loan;
//  * failure: a fault injected inside rank 1's collective reaches every rank
//    (which all drive progress instead of waiting) at once; an error thrown by
//    a prologue (run on the caller's thread) reaches that rank's wait() and
//    aborts the group.
// Topology: ranks as threads over the threads transport, R in {1, 2, 3, 4, 8},
// one compute thread per rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "comm/all_gather.h"
#include "comm/all_reduce.h"
#include "comm/all_to_all_v.h"
#include "comm/cooperative_progress.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "transport/threads/launcher.h"

namespace epmoe::comm {
namespace {

using testing::random_bytes;
using testing::random_floats;
using transport::Communicator;
using transport::threads::run_ranks;
using transport::threads::ThreadsOptions;

// Slow enough links (4 GB/s, 5 us) that a 64 KiB message is in flight for
// ~20 us: the caller's drive_progress calls meet parked, due and running
// progress threads.
ThreadsOptions emulated_links() {
  ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  options.links.enabled = true;
  options.links.bandwidth_gb_per_s = 4.0;
  options.links.latency_us = 5.0;
  return options;
}

// How a rank finishes a collective: wait(), or drive_progress() until test()
// says it ended (bounded: a hang fails the test instead of blocking ctest).
enum class Finish { wait, drive };

void finish(CollectiveHandle& handle, Finish how) {
  if (how == Finish::wait) {
    handle.wait();
    return;
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!handle.test()) {
    drive_progress();
    if (std::chrono::steady_clock::now() > give_up) throw InternalError("collective did not end while driven");
  }
}

std::vector<std::byte> gather_once(Communicator& comm, const std::vector<std::int64_t>& counts, RingDirection direction,
                                   std::int64_t pipe, std::uint32_t tag, Finish how) {
  const auto input = random_bytes(7 + tag, comm.rank(), counts[comm.rank()] * 4);
  std::int64_t total = 0;
  for (std::int64_t c : counts) total += c;
  std::vector<std::byte> output(static_cast<std::size_t>(total * 4), std::byte{0xee});
  AllGatherOptions options;
  options.input = input.data();
  options.output = output.data();
  options.num_elements_by_rank = counts;
  options.direction = direction;
  options.pipe = pipe;
  options.tag = tag;
  CollectiveHandle handle = ring_all_gather(comm, options);
  finish(handle, how);
  return output;
}

class CooperativeProgress : public ::testing::TestWithParam<int> {};

TEST_P(CooperativeProgress, AllGatherGivesTheNaiveGatherWhetherWaitedOrDriven) {
  const int num_ranks = GetParam();
  // Equal, unequal with zeros, all zero, one element.
  std::vector<std::vector<std::int64_t>> layouts = {std::vector<std::int64_t>(num_ranks, 16384),
                                                    std::vector<std::int64_t>(num_ranks, 0),
                                                    std::vector<std::int64_t>(num_ranks, 1)};
  std::vector<std::int64_t> ragged;
  for (int r = 0; r < num_ranks; ++r) ragged.push_back(r % 3 == 1 ? 0 : 3000 + 517 * r);
  layouts.push_back(ragged);
  run_ranks(num_ranks, emulated_links(), [&](Communicator& comm) {
    std::uint32_t tag = 1;
    for (const auto& counts : layouts) {
      std::vector<std::byte> expected;
      for (int r = 0; r < num_ranks; ++r) {
        const auto block = random_bytes(7 + tag, r, counts[r] * 4);
        expected.insert(expected.end(), block.begin(), block.end());
      }
      for (RingDirection direction : {RingDirection::bidirectional, RingDirection::unidirectional}) {
        for (std::int64_t pipe : {1, 3}) {
          const auto waited = gather_once(comm, counts, direction, pipe, tag, Finish::wait);
          const auto driven = gather_once(comm, counts, direction, pipe, tag, Finish::drive);
          EXPECT_EQ(waited, expected) << "rank " << comm.rank() << " tag " << tag;
          EXPECT_EQ(driven, expected) << "rank " << comm.rank() << " tag " << tag << " (driven)";
        }
      }
      ++tag;
    }
    EXPECT_EQ(detail::num_in_flight(), 0);
  });
}

TEST_P(CooperativeProgress, AllToAllVGivesTheSameBytesWhetherWaitedOrDriven) {
  const int num_ranks = GetParam();
  // counts[src][dst], some zero; and all zero.
  auto count = [](int src, int dst, bool empty) -> std::int64_t {
    if (empty || (src + 2 * dst) % 4 == 1) return 0;
    return 1000 + 371 * src + 97 * dst;
  };
  run_ranks(num_ranks, emulated_links(), [&](Communicator& comm) {
    std::uint32_t tag = 20;
    for (bool empty : {false, true}) {
      std::vector<std::int64_t> send_counts;
      std::int64_t send_total = 0;
      for (int dst = 0; dst < num_ranks; ++dst) {
        send_counts.push_back(count(comm.rank(), dst, empty));
        send_total += send_counts.back();
      }
      // Rank src's input, packed by destination; the expected output packs
      // each source's block for this rank in source order.
      auto input_of = [&](int src) {
        std::int64_t total = 0;
        for (int dst = 0; dst < num_ranks; ++dst) total += count(src, dst, empty);
        return random_bytes(31 + tag, src, total * 4);
      };
      std::vector<std::byte> expected;
      std::vector<std::int64_t> expected_counts;
      for (int src = 0; src < num_ranks; ++src) {
        const auto input = input_of(src);
        std::int64_t offset = 0;
        for (int dst = 0; dst < comm.rank(); ++dst) offset += count(src, dst, empty);
        const std::int64_t n = count(src, comm.rank(), empty);
        expected.insert(expected.end(), input.begin() + offset * 4, input.begin() + (offset + n) * 4);
        expected_counts.push_back(n);
      }
      const auto input = input_of(comm.rank());
      ASSERT_EQ(static_cast<std::int64_t>(input.size()), send_total * 4);
      for (Finish how : {Finish::wait, Finish::drive}) {
        std::vector<std::byte> output(3, std::byte{0xee});  // resized by the collective
        std::vector<std::int64_t> recv_counts;
        AllToAllVOptions options;
        options.input = input.data();
        options.send_counts = send_counts;
        options.output = &output;
        options.recv_counts = &recv_counts;
        options.tag = tag;
        CollectiveHandle handle = all_to_all_v(comm, options);
        finish(handle, how);
        EXPECT_EQ(recv_counts, expected_counts) << "rank " << comm.rank() << (how == Finish::drive ? " (driven)" : "");
        EXPECT_EQ(output, expected) << "rank " << comm.rank() << (how == Finish::drive ? " (driven)" : "");
      }
      ++tag;
    }
  });
}

TEST_P(CooperativeProgress, AllReduceGivesTheSameBitsWhetherWaitedOrDriven) {
  const int num_ranks = GetParam();
  run_ranks(num_ranks, emulated_links(), [&](Communicator& comm) {
    std::uint32_t tag = 40;
    // 0 elements, fewer elements than ranks, many.
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{num_ranks > 1 ? num_ranks - 1 : 1}, std::int64_t{20011}}) {
      std::vector<double> reference(static_cast<std::size_t>(n), 0.0);
      for (int r = 0; r < num_ranks; ++r) {
        const auto x = random_floats(51 + tag, r, n);
        for (std::int64_t i = 0; i < n; ++i) reference[i] += x[i];
      }
      std::vector<std::vector<float>> results;
      for (Finish how : {Finish::wait, Finish::drive}) {
        std::vector<float> data = random_floats(51 + tag, comm.rank(), n);
        AllReduceOptions options;
        options.data = data.data();
        options.num_elements = n;
        options.tag = tag;
        CollectiveHandle handle = all_reduce(comm, options);
        finish(handle, how);
        results.push_back(std::move(data));
      }
      ASSERT_EQ(results[0].size(), results[1].size());
      // (n == 0: empty vectors may hold null pointers, which memcmp must not get)
      EXPECT_TRUE(results[0].empty() ||
                  std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)) == 0)
          << "rank " << comm.rank() << " n " << n << ": driven sums differ in their bits";
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(results[1][i], reference[i], 1e-5 * num_ranks * 2.0) << "rank " << comm.rank() << " i " << i;
      }
      ++tag;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CooperativeProgress, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "R" + std::to_string(info.param); });

TEST(CooperativeProgressBookkeeping, NothingInFlightMeansNoLoanAndModelledTimeTracksNothing) {
  EXPECT_EQ(drive_progress(), 0);  // a thread that never launched anything
  run_ranks(2, emulated_links(), [](Communicator& comm) {
    EXPECT_EQ(drive_progress(), 0);
    std::vector<float> input(64, 1.0f), output(128);
    CollectiveHandle handle =
        ring_all_gather(comm, {.input = input.data(), .output = output.data(), .num_elements_per_rank = 64, .tag = 3});
    handle.wait();
    // Ended: nothing left to lend to, and the list forgets it.
    EXPECT_EQ(detail::num_in_flight(), 0);
    EXPECT_EQ(drive_progress(), 0);
    EXPECT_EQ(drive_progress(), 0);
  });
  ThreadsOptions modelled;
  modelled.compute_threads_per_rank = 1;
  modelled.modelled.enabled = true;
  modelled.modelled.peak_flops = 1e12;
  modelled.modelled.memory_bytes_per_s = 1e15;
  run_ranks(2, modelled, [](Communicator& comm) {
    std::vector<float> input(64, 1.0f), output(128);
    CollectiveHandle handle =
        ring_all_gather(comm, {.input = input.data(), .output = output.data(), .num_elements_per_rank = 64, .tag = 4});
    // Modelled time has no cores to lend: not tracked, never lent to.
    EXPECT_EQ(detail::num_in_flight(), 0);
    EXPECT_EQ(drive_progress(), 0);
    handle.wait();
  });
}

class CooperativeProgressFailure : public ::testing::TestWithParam<int> {};

TEST_P(CooperativeProgressFailure, AFaultInsideACollectiveReachesEveryDrivingRankAtOnce) {
  const int num_ranks = GetParam();
  FaultInjector faults("1:collective");
  std::mutex mutex;
  std::vector<std::string> errors(static_cast<std::size_t>(num_ranks));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      run_ranks(num_ranks, emulated_links(),
                [&](Communicator& comm) {
                  const FaultScope scope(&faults);
                  std::vector<float> input(4096, 1.0f), output(4096 * num_ranks);
                  CollectiveHandle handle = ring_all_gather(
                      comm, {.input = input.data(), .output = output.data(), .num_elements_per_rank = 4096, .tag = 9});
                  try {
                    finish(handle, Finish::drive);  // never wait(): only drive and test
                  } catch (const std::exception& e) {
                    std::lock_guard<std::mutex> lock(mutex);
                    errors[comm.rank()] = e.what();
                    throw;
                  }
                }),
      InjectedFault);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0) << "ranks waited for their 60 s deadlines instead of the abort";
  const std::string root = "rank 1: injected fault at collective (fault_injection=1:collective)";
  for (int r = 0; r < num_ranks; ++r) {
    EXPECT_NE(errors[r].find(root), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

TEST_P(CooperativeProgressFailure, AnErrorInAPrologueReachesWaitAndAbortsTheGroup) {
  const int num_ranks = GetParam();
  std::mutex mutex;
  std::vector<std::string> errors(static_cast<std::size_t>(num_ranks));
  EXPECT_THROW(
      run_ranks(num_ranks, emulated_links(),
                [&](Communicator& comm) {
                  try {
                    if (comm.rank() == 1) {
                      CollectiveHandle handle = launch_collective(
                          comm, "test_collective tag 1", kDefaultTimeout,
                          [](transport::Deadline) { throw PeerError("prologue failed on purpose"); },
                          [](transport::Deadline) { ADD_FAILURE() << "the body ran after its prologue failed"; });
                      finish(handle, Finish::drive);
                      ADD_FAILURE() << "the prologue's error did not reach test()";
                      return;
                    }
                    // The others are in a collective rank 1 never joins: only the abort ends it.
                    std::vector<float> input(64, 1.0f), output(64 * num_ranks);
                    CollectiveHandle handle = ring_all_gather(
                        comm, {.input = input.data(), .output = output.data(), .num_elements_per_rank = 64, .tag = 2});
                    finish(handle, Finish::drive);
                  } catch (const std::exception& e) {
                    std::lock_guard<std::mutex> lock(mutex);
                    errors[comm.rank()] = e.what();
                    throw;
                  }
                }),
      PeerError);
  for (int r = 0; r < num_ranks; ++r) {
    EXPECT_NE(errors[r].find("test_collective tag 1: prologue failed on purpose"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CooperativeProgressFailure, ::testing::Values(3, 4),
                         [](const auto& info) { return "R" + std::to_string(info.param); });

}  // namespace
}  // namespace epmoe::comm
