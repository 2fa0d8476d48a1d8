// all_to_all_v with known receive counts (no count round): a peer that
// sends another size than the receiver was told fails the collective on
// every rank with an error naming the peer, and bad options are refused
// before anything is sent. The payload checks with known counts are in
// collective_checks.cc (check_all_to_all_v), for threads and mpirun.
// Ranks are threads, one compute thread each.
// Topology: threads transport, R in {2, 3, 4}.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/all_to_all_v.h"
#include "comm/barrier.h"
#include "core/error.h"
#include "transport/threads/launcher.h"

namespace epmoe::comm {
namespace {

using transport::Communicator;
using transport::threads::run_ranks;
using transport::threads::ThreadsOptions;

ThreadsOptions fast_failing() {
  ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  return options;
}

TEST(AllToAllVKnownCounts, AWrongCountFailsEveryRankNamingThePeer) {
  for (const int num_ranks : {2, 3, 4}) {
    std::vector<std::string> errors(num_ranks);
    EXPECT_ANY_THROW(run_ranks(num_ranks, fast_failing(), [&](Communicator& comm) {
      // Every rank sends 2 floats to every rank, but rank 0 is told rank 1
      // sends it 3.
      std::vector<float> input(2 * num_ranks, 1.0f);
      std::vector<std::int64_t> known(num_ranks, 2);
      if (comm.rank() == 0) known[1] = 3;
      std::vector<float> output(3 * num_ranks);
      try {
        all_to_all_v(comm, {.input = input.data(),
                            .send_counts = std::vector<std::int64_t>(num_ranks, 2),
                            .known_recv_counts = &known,
                            .recv_buffer = output.data(),
                            .tag = 4,
                            .timeout = std::chrono::milliseconds(20'000)})
            .wait();
        // A rank whose own messages all matched finishes the exchange; it
        // learns of the failure at its next collective.
        barrier(comm, {.tag = 5, .timeout = std::chrono::milliseconds(20'000)}).wait();
      } catch (const Error& e) {
        errors[comm.rank()] = e.what();
        throw;
      }
    })) << num_ranks;
    for (int r = 0; r < num_ranks; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r << " did not fail";
    EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
  }
}

TEST(AllToAllVKnownCounts, BadOptionsAreRefusedBeforeSending) {
  run_ranks(2, fast_failing(), [](Communicator& comm) {
    std::vector<float> input(4, 0.0f), output(4);
    std::vector<std::int64_t> short_counts{2};
    std::vector<std::int64_t> self_differs{2, 2};
    self_differs[comm.rank()] = 1;
    const std::vector<std::int64_t> send{2, 2};
    const auto message = [&](AllToAllVOptions options) {
      try {
        all_to_all_v(comm, options).wait();
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    EXPECT_NE(message({.input = input.data(),
                       .send_counts = send,
                       .known_recv_counts = &short_counts,
                       .recv_buffer = output.data()})
                  .find("known_recv_counts has 1 entries"),
              std::string::npos);
    EXPECT_NE(message({.input = input.data(),
                       .send_counts = send,
                       .known_recv_counts = &self_differs,
                       .recv_buffer = output.data()})
                  .find("must agree"),
              std::string::npos);
    EXPECT_NE(message({.input = input.data(), .send_counts = send, .recv_buffer = output.data()})
                  .find("recv_buffer needs known_recv_counts"),
              std::string::npos);
  });
}

}  // namespace
}  // namespace epmoe::comm
