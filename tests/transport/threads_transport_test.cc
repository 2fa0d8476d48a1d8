// The threads transport on its own: matching rules, errors, the launcher and
// the emulated-link model. Ranks are threads (run_ranks), R = 2..4.
// Topology: threads transport, one compute thread per rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "transport/threads/communicator.h"
#include "transport/threads/emulated_links.h"
#include "transport/threads/launcher.h"

namespace epmoe::transport::threads {
namespace {

using namespace std::chrono_literals;

ThreadsOptions one_thread_per_rank() {
  ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  return options;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

TEST(ThreadsTransport, MessagesWithOneTagArriveInSendOrderAndTagsAreSeparate) {
  run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
    const int peer = 1 - comm.rank();
    if (comm.rank() == 0) {
      const int values[4] = {10, 11, 20, 21};
      auto a = comm.isend(peer, 1, &values[0], 4);
      auto b = comm.isend(peer, 1, &values[1], 4);
      auto c = comm.isend(peer, 2, &values[2], 4);
      auto d = comm.isend(peer, 2, &values[3], 4);
      for (auto* request : {a.get(), b.get(), c.get(), d.get()}) request->wait(5s);
    } else {
      int received[4] = {};
      // Receives for tag 2 posted first: tags are matched separately.
      auto c = comm.irecv(peer, 2, &received[2], 4);
      auto a = comm.irecv(peer, 1, &received[0], 4);
      auto d = comm.irecv(peer, 2, &received[3], 4);
      auto b = comm.irecv(peer, 1, &received[1], 4);
      for (auto* request : {a.get(), b.get(), c.get(), d.get()}) request->wait(5s);
      EXPECT_EQ(received[0], 10);
      EXPECT_EQ(received[1], 11);
      EXPECT_EQ(received[2], 20);
      EXPECT_EQ(received[3], 21);
    }
  });
}

// Rank r sends (r + 1) * 8 + q bytes to each other rank q and 1,000 bytes to
// itself; the counter holds exactly the transfers to others, by peer.
TEST(ThreadsTransport, SentBytesCountPayloadToOtherRanksByPeer) {
  const int num_ranks = 3;
  run_ranks(num_ranks, one_thread_per_rank(), [&](Communicator& comm) {
    const int r = comm.rank();
    ASSERT_TRUE(comm.sent_bytes().has_value());
    EXPECT_EQ(comm.sent_bytes()->total, 0);
    std::vector<char> out(1000), in(1000 * num_ranks);
    std::vector<std::unique_ptr<Request>> requests;
    for (int q = 0; q < num_ranks; ++q) {
      const std::int64_t to_q = q == r ? 1000 : (r + 1) * 8 + q, from_q = q == r ? 1000 : (q + 1) * 8 + r;
      requests.push_back(comm.isend(q, 5, out.data(), to_q));
      requests.push_back(comm.irecv(q, 5, in.data() + 1000 * q, from_q));
    }
    for (auto& request : requests) request->wait(5s);
    const SentBytes sent = *comm.sent_bytes();
    ASSERT_EQ(sent.to_peer.size(), static_cast<std::size_t>(num_ranks));
    std::int64_t expected_total = 0;
    for (int q = 0; q < num_ranks; ++q) {
      const std::int64_t expected = q == r ? 0 : (r + 1) * 8 + q;
      EXPECT_EQ(sent.to_peer[q], expected) << "rank " << r << " to " << q;
      expected_total += expected;
    }
    EXPECT_EQ(sent.total, expected_total) << "rank " << r;
  });
}

TEST(ThreadsTransport, TimeoutNamesRankPeerAndTag) {
  run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
    if (comm.rank() != 0) return;
    int value = 0;
    auto request = comm.irecv(1, 77, &value, sizeof(value));
    EXPECT_FALSE(request->test());
    const auto start = Clock::now();
    try {
      request->wait(50ms);
      ADD_FAILURE() << "no timeout";
    } catch (const PeerError& e) {
      const std::string message = e.what();  // "rank 0: timed out after 50 ms waiting to ..."
      EXPECT_EQ(message.rfind("rank 0: timed out after ", 0), 0u) << message;
      EXPECT_NE(message.find(" ms waiting to receive from peer 1, tag 77"), std::string::npos) << message;
    }
    EXPECT_GE(seconds_since(start), 0.049);
    EXPECT_LT(seconds_since(start), 1.0);
  });
}

TEST(ThreadsTransport, SizeMismatchFailsBothSides) {
  run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
    std::vector<char> buffer(16);
    auto request = comm.rank() == 0 ? comm.isend(1, 3, buffer.data(), 16) : comm.irecv(0, 3, buffer.data(), 8);
    try {
      request->wait(5s);
      ADD_FAILURE() << "size mismatch not reported on rank " << comm.rank();
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("16 bytes sent, receive posted for 8"), std::string::npos) << e.what();
    }
  });
}

TEST(ThreadsTransport, AbortWakesWaitsOnEveryRankWithTheReason) {
  const auto start = Clock::now();
  EXPECT_THROW(run_ranks(3, one_thread_per_rank(),
                         [](Communicator& comm) {
                           if (comm.rank() == 2) {
                             std::this_thread::sleep_for(20ms);
                             throw std::invalid_argument("rank two gives up");
                           }
                           int value = 0;
                           auto request = comm.irecv(2, 5, &value, sizeof(value));
                           try {
                             request->wait(30s);
                           } catch (const PeerError& e) {
                             EXPECT_NE(std::string(e.what()).find("aborted while receiving from peer 2, tag 5: rank 2 "
                                                                  "failed: rank two gives up"),
                                       std::string::npos)
                                 << e.what();
                             return;
                           }
                           ADD_FAILURE() << "wait returned although rank 2 never sent";
                         }),
               std::invalid_argument);
  EXPECT_LT(seconds_since(start), 5.0) << "abort did not wake the waits";
}

TEST(ThreadsTransport, DestroyingAPendingRequestCancelsIt) {
  // Rank 0 sends only after rank 1 said (tag 5) that its abandoned receive
  // is gone and the live one is posted, so the send can only meet the live
  // one - or, were the abandoned receive still queued, that one, first.
  run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
    int value = 0;
    if (comm.rank() == 1) {
      int abandoned_value = -1;
      { auto abandoned = comm.irecv(0, 4, &abandoned_value, sizeof(abandoned_value)); }  // cancelled
      auto request = comm.irecv(0, 4, &value, sizeof(value));
      comm.isend(0, 5, nullptr, 0)->wait(5s);
      request->wait(5s);
      EXPECT_EQ(value, 42);  // the one live receive got the message
      EXPECT_EQ(abandoned_value, -1) << "the destroyed receive was written to";
    } else {
      comm.irecv(1, 5, nullptr, 0)->wait(5s);
      value = 42;
      comm.isend(1, 4, &value, sizeof(value))->wait(5s);
    }
  });
}

TEST(ThreadsTransport, CancelPendingFailsThisRanksWaitsAtOnceWithTheReason) {
  run_ranks(2, one_thread_per_rank(), [](Communicator& comm) {
    if (comm.rank() != 0) return;
    int value = 0;
    auto request = comm.irecv(1, 8, &value, sizeof(value));
    std::thread canceller([&] { comm.cancel_pending("rank 0 is failing: test"); });
    const auto start = Clock::now();
    try {
      request->wait(30s);
      ADD_FAILURE() << "wait returned although nothing was sent";
    } catch (const AbortedError& e) {
      EXPECT_NE(
          std::string(e.what()).find("rank 0: cancelled while receiving from peer 1, tag 8: rank 0 is failing: test"),
          std::string::npos)
          << e.what();
    }
    canceller.join();
    EXPECT_LT(seconds_since(start), 5.0);
    // Later waits fail too: the rank is going down.
    EXPECT_THROW(comm.irecv(1, 9, &value, sizeof(value))->wait(30s), AbortedError);
  });
}

TEST(ThreadsTransport, TimeoutNamesTheRankTheWaitIsStuckBehind) {
  // Rank 0 waits for rank 1, which waits for rank 2, which waits for no one
  // (it blocks outside the transport until rank 0 timed out).
  std::promise<void> timed_out;
  std::string message;
  run_ranks(3, one_thread_per_rank(), [&](Communicator& comm) {
    int value = 0;
    if (comm.rank() == 2) {
      timed_out.get_future().wait();
      comm.isend(1, 3, &value, sizeof(value))->wait(5s);
    } else if (comm.rank() == 1) {
      comm.irecv(2, 3, &value, sizeof(value))->wait(30s);
      comm.isend(0, 3, &value, sizeof(value))->wait(5s);
    } else {
      try {
        comm.irecv(1, 3, &value, sizeof(value))->wait(300ms);
        ADD_FAILURE() << "no timeout";
      } catch (const PeerError& e) {
        message = e.what();
      }
      timed_out.set_value();
      comm.irecv(1, 3, &value, sizeof(value))->wait(5s);  // the chain completes
    }
  });
  EXPECT_NE(message.find("waiting to receive from peer 1, tag 3; the late rank is 2"), std::string::npos) << message;
}

TEST(ThreadsTransport, LauncherSplitsComputeThreadsAcrossRanks) {
  ThreadsOptions options;  // compute_threads_per_rank = 0: cores / ranks
  const int cores = hardware_cores();
  for (int num_ranks : {1, 2, 4}) {
    std::vector<int> seen(num_ranks);
    run_ranks(num_ranks, options, [&](Communicator& comm) { seen[comm.rank()] = compute_threads(); });
    for (int threads : seen) EXPECT_EQ(threads, std::max(1, cores / num_ranks)) << "R=" << num_ranks;
  }
}

TEST(EmulatedLinks, ModelSerialisesLinksAndCountsRingHops) {
  EmulatedLinkOptions options;
  options.enabled = true;
  options.bandwidth_gb_per_s = 1.0;  // 1 byte per ns
  options.latency_us = 10.0;
  options.topology = LinkTopology::ring;
  EmulatedLinks links(4, options);
  const Clock::time_point t0{};
  using std::chrono::microseconds;
  // Neighbour: 1 MB takes 1 ms on the link, arrives 10 us later.
  const LinkTiming first = links.reserve(0, 1, 1'000'000, t0);
  EXPECT_EQ(first.send_done - t0, microseconds(1000));
  EXPECT_EQ(first.arrival - t0, microseconds(1010));
  // Same link again at t0: waits for the first message to leave.
  EXPECT_EQ(links.reserve(0, 1, 1'000'000, t0).arrival - t0, microseconds(2010));
  // Opposite direction is independent (full duplex).
  EXPECT_EQ(links.reserve(1, 0, 1'000'000, t0).arrival - t0, microseconds(1010));
  // Two hops away (a tie on R=4: clockwise 2->3->0), store-and-forward: twice latency + transfer.
  EXPECT_EQ(links.hops(3, 1), 2);
  EXPECT_EQ(links.reserve(2, 0, 1'000'000, t0).arrival - t0, microseconds(2020));
  // Validation names the field.
  options.bandwidth_gb_per_s = 0;
  EXPECT_THROW(options.validate(), ConfigError);
}

TEST(EmulatedLinks, ReceiverWaitsUntilTheModelledArrival) {
  ThreadsOptions options = one_thread_per_rank();
  options.links.enabled = true;
  options.links.bandwidth_gb_per_s = 0.5;  // 4 MB -> 8 ms
  options.links.latency_us = 100.0;
  // Taken before either rank posts: the model counts from the sender's post.
  const auto start = Clock::now();
  run_ranks(2, options, [start](Communicator& comm) {
    std::vector<char> buffer(4'000'000);
    if (comm.rank() == 0) {
      comm.isend(1, 0, buffer.data(), 4'000'000)->wait(5s);
    } else {
      comm.irecv(0, 0, buffer.data(), 4'000'000)->wait(5s);
      EXPECT_GE(seconds_since(start), 0.0081);
      EXPECT_LT(seconds_since(start), 0.5);
    }
  });
}

}  // namespace
}  // namespace epmoe::transport::threads
