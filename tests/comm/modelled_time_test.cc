// Modelled time (clock=modelled, transport/threads/virtual_timeline.h) under
// the collectives: ranks as threads, R in 2..8, compute charged through
// ComputeScope at round device rates so that every expected time is an exact
// integer number of picoseconds. Modelled time is deterministic, so every
// check here is an equality.
// Topology: threads transport, R in {2, 3, 4, 5, 8}, one compute thread per
// rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/all_gather.h"
#include "comm/all_to_all_v.h"
#include "core/error.h"
#include "core/modelled_clock.h"
#include "hardware/hardware.h"
#include "hardware/modelled_clock_options.h"
#include "transport/threads/launcher.h"

namespace epmoe::comm {
namespace {

using transport::Communicator;
using transport::threads::LinkTopology;
using transport::threads::run_ranks;
using transport::threads::ThreadsOptions;

constexpr double kBandwidth = 1e9;  // bytes/s: 4000 bytes take 4 us
constexpr double kLatencyUs = 1.0;
constexpr double kPeakFlops = 1e12;  // at efficiency 1: 1e6 flops take 1 us

ThreadsOptions modelled(LinkTopology topology = LinkTopology::full_mesh) {
  ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  options.links.bandwidth_gb_per_s = kBandwidth / 1e9;
  options.links.latency_us = kLatencyUs;
  options.links.topology = topology;
  options.modelled.enabled = true;
  options.modelled.peak_flops = kPeakFlops;
  options.modelled.compute_efficiency = 1.0;
  options.modelled.memory_bytes_per_s = 1e15;
  return options;
}

Picoseconds us(double microseconds) { return seconds_to_picoseconds(microseconds * 1e-6); }
Picoseconds serialise(std::int64_t bytes) { return seconds_to_picoseconds(static_cast<double>(bytes) / kBandwidth); }

void compute_for_us(double microseconds) { ComputeScope scope("work", {microseconds * 1e6, 0}); }

struct RankTimes {
  Picoseconds end = 0;
  ModelledTotals totals;
  std::vector<ModelledCollective> collectives;
};

// Each rank: compute_us(rank), then an all-gather of `elements` floats per
// rank, overlapped with overlap_us of compute before the wait.
std::vector<RankTimes> all_gather_run(int num_ranks, std::int64_t elements, RingDirection direction,
                                      LinkTopology topology = LinkTopology::full_mesh, double overlap_us = 0) {
  std::vector<RankTimes> times(static_cast<std::size_t>(num_ranks));
  run_ranks(num_ranks, modelled(topology), [&](Communicator& comm) {
    std::vector<float> input(static_cast<std::size_t>(elements), static_cast<float>(comm.rank()));
    std::vector<float> output(static_cast<std::size_t>(elements * comm.size()));
    CollectiveHandle handle = ring_all_gather(comm, {.input = input.data(),
                                                     .output = output.data(),
                                                     .num_elements_per_rank = elements,
                                                     .direction = direction,
                                                     .tag = 7});
    if (overlap_us > 0) compute_for_us(overlap_us);
    handle.wait();
    ModelledClock& clock = *this_thread_modelled_clock();
    times[static_cast<std::size_t>(comm.rank())] = {clock.now(), clock.totals(), clock.collectives(0)};
  });
  return times;
}

class ModelledRing : public ::testing::TestWithParam<int> {};

TEST_P(ModelledRing, BidirectionalAllGatherTakesTheBoundPlusOneLatencyPerStep) {
  const int R = GetParam();
  // 2000 floats halve into 1000 + 1000; 2001 into 1001 + 1000 (the longer
  // half sets the pace); 1 float cannot halve and goes clockwise alone.
  for (const std::int64_t elements : {std::int64_t{2000}, std::int64_t{2001}, std::int64_t{1}}) {
    const std::int64_t longer_half = (elements + 1) / 2;
    // At R=2 both neighbours are one rank and both halves share the one link
    // to it (a ring of two has one link each way).
    const Picoseconds expected =
        R == 2 ? serialise(longer_half * 4) + serialise((elements - longer_half) * 4) + us(kLatencyUs)
               : (R - 1) * (serialise(longer_half * 4) + us(kLatencyUs));
    for (const RankTimes& t : all_gather_run(R, elements, RingDirection::bidirectional)) {
      EXPECT_EQ(t.end, expected) << "R=" << R << " elements=" << elements;
      EXPECT_EQ(t.totals.communication, expected);
      EXPECT_EQ(t.totals.idle, 0);
      EXPECT_EQ(t.totals.compute, 0);
    }
    if (elements == 2000 && R > 2) {
      // The bound ·C/(2B), C the bytes of one rank's chunk.
      EXPECT_EQ(expected - (R - 1) * us(kLatencyUs),
                seconds_to_picoseconds((R - 1) * (elements * 4.0) / (2 * kBandwidth)));
    }
  }
}

TEST_P(ModelledRing, UnidirectionalAllGatherTakesTwiceTheSerialisation) {
  const int R = GetParam();
  const std::int64_t elements = 2000;
  const Picoseconds bidirectional = all_gather_run(R, elements, RingDirection::bidirectional)[0].end;
  const Picoseconds unidirectional = all_gather_run(R, elements, RingDirection::unidirectional)[0].end;
  const Picoseconds latencies = (R - 1) * us(kLatencyUs);
  if (R == 2) {
    EXPECT_EQ(unidirectional, bidirectional);  // one link either way
  } else {
    EXPECT_EQ(unidirectional - latencies, 2 * (bidirectional - latencies));
  }
}

TEST_P(ModelledRing, AnAllGatherBesideComputeOfEqualLengthIsHiddenCompletely) {
  const int R = GetParam();
  const std::int64_t elements = 2000;
  // 4000 bytes per half at 1 GB/s; at R=2 the halves share one link.
  const double ag_us = R == 2 ? 8.0 + kLatencyUs : (R - 1) * (4.0 + kLatencyUs);
  for (const RankTimes& t : all_gather_run(R, elements, RingDirection::bidirectional, LinkTopology::ring, ag_us)) {
    EXPECT_EQ(t.end, us(ag_us));
    EXPECT_EQ(t.totals.compute, us(ag_us));
    EXPECT_EQ(t.totals.communication, 0);
    EXPECT_EQ(t.totals.idle, 0);
    ASSERT_EQ(t.collectives.size(), 1u);
    EXPECT_EQ(t.collectives[0].exposed(), 0);
    EXPECT_EQ(t.collectives[0].duration(), us(ag_us));
  }
  // Half the compute: the other half of the all-gather is exposed.
  for (const RankTimes& t : all_gather_run(R, elements, RingDirection::bidirectional, LinkTopology::ring, ag_us / 2)) {
    EXPECT_EQ(t.end, us(ag_us));
    EXPECT_EQ(t.totals.communication, us(ag_us) - us(ag_us / 2));
    EXPECT_EQ(t.collectives[0].exposed(), us(ag_us) - us(ag_us / 2));
  }
}

TEST_P(ModelledRing, TheRankThatComputesLongestIsWaitedForAndOthersIdleTheDifference) {
  const int R = GetParam();
  const int slow = R / 2;
  std::vector<RankTimes> times(static_cast<std::size_t>(R));
  run_ranks(R, modelled(), [&](Communicator& comm) {
    compute_for_us(comm.rank() == slow ? 20.0 : 10.0);
    std::vector<float> input(static_cast<std::size_t>(100 * R), 1.0f);
    std::vector<std::byte> output;
    std::vector<std::int64_t> recv_counts;
    all_to_all_v(comm, {.input = input.data(),
                        .send_counts = std::vector<std::int64_t>(R, 100),
                        .output = &output,
                        .recv_counts = &recv_counts,
                        .tag = 3})
        .wait();
    ModelledClock& clock = *this_thread_modelled_clock();
    times[static_cast<std::size_t>(comm.rank())] = {clock.now(), clock.totals(), clock.collectives(0)};
  });
  for (int r = 0; r < R; ++r) {
    const RankTimes& t = times[static_cast<std::size_t>(r)];
    EXPECT_EQ(t.totals.compute + t.totals.communication + t.totals.idle, t.end) << "rank " << r;
    EXPECT_EQ(t.totals.idle, r == slow ? 0 : us(10.0)) << "rank " << r;
  }
}

TEST_P(ModelledRing, TheSameRunTwiceGivesTheSameTimesToThePicosecond) {
  const int R = GetParam();
  auto run = [&] {
    std::vector<Picoseconds> ends(static_cast<std::size_t>(R));
    // A ring topology makes the all-to-all's messages share links (store
    // and forward over up to R/2 hops), so the order they are served in matters.
    run_ranks(R, modelled(LinkTopology::ring), [&](Communicator& comm) {
      compute_for_us(1.0 + comm.rank());
      std::vector<float> input(static_cast<std::size_t>(37 * R), 1.0f);
      std::vector<std::byte> output;
      std::vector<std::int64_t> recv_counts;
      std::vector<std::int64_t> counts(static_cast<std::size_t>(R));
      for (int p = 0; p < R; ++p) counts[static_cast<std::size_t>(p)] = (p * 7 + comm.rank() * 3) % 37 + 1;
      std::int64_t total = 0;
      for (auto c : counts) total += c;
      input.resize(static_cast<std::size_t>(total));
      all_to_all_v(
          comm,
          {.input = input.data(), .send_counts = counts, .output = &output, .recv_counts = &recv_counts, .tag = 9})
          .wait();
      ends[static_cast<std::size_t>(comm.rank())] = this_thread_modelled_clock()->now();
    });
    return ends;
  };
  const std::vector<Picoseconds> first = run();
  for (int repeat = 0; repeat < 5; ++repeat) EXPECT_EQ(run(), first) << "repeat " << repeat;
}

TEST_P(ModelledRing, ASwitchedAllToAllRunsAtTheInjectionBandwidth) {
  // Equal messages to every peer through a switch: each rank's egress port
  // sends its R-1 messages back to back and every ingress port takes one per
  // step (the pairwise schedule is a permutation per step), so each extra
  // byte per peer costs R-1 byte times at the egress - the whole injection
  // bandwidth is used.
  const int R = GetParam();
  auto run = [&](std::int64_t per_peer) {
    Picoseconds end = 0;
    run_ranks(R, modelled(LinkTopology::switched), [&](Communicator& comm) {
      std::vector<float> input(static_cast<std::size_t>(per_peer * R), 1.0f);
      std::vector<std::byte> output;
      std::vector<std::int64_t> recv_counts;
      all_to_all_v(comm, {.input = input.data(),
                          .send_counts = std::vector<std::int64_t>(R, per_peer),
                          .output = &output,
                          .recv_counts = &recv_counts,
                          .tag = 4})
          .wait();
      if (comm.rank() == 0) end = this_thread_modelled_clock()->now();
    });
    return end;
  };
  const Picoseconds small = run(1000), large = run(2000);
  EXPECT_EQ(large - small, (R - 1) * (serialise(8000) - serialise(4000)));
}

TEST_P(ModelledRing, ARankThatThrowsMidCollectiveFailsEveryRankWithItsMessage) {
  // The others are blocked in the timeline's waits (ranks ahead in virtual
  // time wait there for the thrower's clock); the abort must wake them with
  // its text, never leave one asleep until its 20 s deadline.
  const int R = GetParam();
  std::mutex mutex;
  std::vector<std::string> messages;
  for (int repeat = 0; repeat < 20; ++repeat) {
    messages.clear();
    try {
      run_ranks(R, modelled(LinkTopology::ring), [&](Communicator& comm) {
        std::vector<float> input(2000, 1.0f), output(2000 * static_cast<std::size_t>(comm.size()));
        try {
          CollectiveHandle first = ring_all_gather(comm, {.input = input.data(),
                                                          .output = output.data(),
                                                          .num_elements_per_rank = 2000,
                                                          .tag = 1,
                                                          .timeout = std::chrono::seconds(20)});
          if (comm.rank() == R - 1) {
            compute_for_us(3.0);
            throw std::runtime_error("injected failure on the last rank");
          }
          first.wait();
          ring_all_gather(comm, {.input = input.data(),
                                 .output = output.data(),
                                 .num_elements_per_rank = 2000,
                                 .tag = 2,
                                 .timeout = std::chrono::seconds(20)})
              .wait();
        } catch (const PeerError& e) {
          std::lock_guard<std::mutex> lock(mutex);
          messages.push_back(e.what());
          throw;
        }
      });
      FAIL() << "run_ranks returned normally";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "injected failure on the last rank");
    }
    ASSERT_EQ(static_cast<int>(messages.size()), R - 1) << "repeat " << repeat;
    for (const std::string& message : messages) {
      EXPECT_NE(message.find("injected failure on the last rank"), std::string::npos) << message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ModelledRing, ::testing::Values(2, 3, 4, 5, 8));

// Issue 30: the two lanes of the bidirectional ring forward independently,
// so it is never slower than the unidirectional ring on any preset's links -
// on two_level (R > 8 GPUs) a lane that waited for the other lane's NIC hops
// took 55.3 us against 38.3 us unidirectional at R=16 on h200.
TEST(ModelledRingPresets, BidirectionalAllGatherIsNeverSlowerThanUnidirectional) {
  constexpr std::int64_t kChunkBytes = 32 * 1024;
  for (const std::string& preset : hardware::hardware_preset_names()) {
    for (const int num_ranks : {4, 8, 12, 16}) {
      const hardware::ModelledClockOptions clock =
          hardware::modelled_clock_options(hardware::load_hardware("hardware", preset), num_ranks);
      ThreadsOptions options;
      options.compute_threads_per_rank = 1;
      options.modelled = clock.time;
      options.links = clock.links;
      Picoseconds end[2] = {0, 0};  // [bidirectional, unidirectional], the latest rank
      for (const RingDirection direction : {RingDirection::bidirectional, RingDirection::unidirectional}) {
        std::mutex mutex;
        Picoseconds& latest = end[direction == RingDirection::bidirectional ? 0 : 1];
        run_ranks(num_ranks, options, [&](Communicator& comm) {
          const std::vector<std::byte> input(kChunkBytes, static_cast<std::byte>(comm.rank()));
          std::vector<std::byte> output(static_cast<std::size_t>(kChunkBytes * comm.size()));
          ring_all_gather(comm, {.input = input.data(),
                                 .output = output.data(),
                                 .num_elements_per_rank = kChunkBytes,
                                 .dtype = DType::fp8_e4m3,
                                 .direction = direction,
                                 .tag = 5})
              .wait();
          const Picoseconds now = this_thread_modelled_clock()->now();
          std::lock_guard<std::mutex> lock(mutex);
          latest = std::max(latest, now);
        });
      }
      EXPECT_LE(end[0], end[1]) << preset << " R=" << num_ranks << " ("
                                << hardware::link_topology_name(clock.links.topology) << "): bidirectional "
                                << to_seconds(end[0]) * 1e6 << " us, unidirectional " << to_seconds(end[1]) * 1e6
                                << " us";
    }
  }
}

TEST(ModelledLinks, MessagesOnOneLinkDirectionAreSerialised) {
  // Two all-gathers in flight at once share every link: at equal times the
  // one launched first goes first, so each link direction is busy without a
  // gap - 2(R-1) messages back to back - and the last arrives one latency later.
  const int R = 4;
  Picoseconds both = 0;
  run_ranks(R, modelled(LinkTopology::ring), [&](Communicator& comm) {
    std::vector<float> a(2000, 1.0f), b(2000, 2.0f), out_a(2000 * R), out_b(2000 * R);
    CollectiveHandle first =
        ring_all_gather(comm, {.input = a.data(), .output = out_a.data(), .num_elements_per_rank = 2000, .tag = 1});
    CollectiveHandle second =
        ring_all_gather(comm, {.input = b.data(), .output = out_b.data(), .num_elements_per_rank = 2000, .tag = 2});
    first.wait();
    second.wait();
    if (comm.rank() == 0) both = this_thread_modelled_clock()->now();
  });
  EXPECT_EQ(both, 2 * (R - 1) * serialise(4000) + us(kLatencyUs));
}

// Issue 28 N8: a modelled time past the clock's range (int64 picoseconds,
// ~9.2e6 s) fails the run with a ConfigError naming what overflowed, on
// every rank and at once (the others are woken, not left to their 20 s
// deadline), instead of wrapping around into a tiny or negative time.
// R = 2; what the error names is asserted, never how long it took.
std::string run_error(const ThreadsOptions& options, const std::function<void(Communicator&)>& job) {
  try {
    run_ranks(2, options, job);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a ConfigError: ") + e.what();
  }
  return "no error";
}

void all_gather_2000(Communicator& comm) {
  std::vector<float> input(2000, 1.0f), output(2000 * static_cast<std::size_t>(comm.size()));
  ring_all_gather(comm, {.input = input.data(),
                         .output = output.data(),
                         .num_elements_per_rank = 2000,
                         .tag = 3,
                         .timeout = std::chrono::seconds(20)})
      .wait();
}

TEST(ModelledClockRange, AComputeBeyondTheClockFailsTheRunNamingTheCompute) {
  const std::string error = run_error(modelled(), [](Communicator& comm) {
    if (comm.rank() == 0) ComputeScope scope("huge matmul", {1e25, 0});  // 1e13 s at 1e12 FLOP/s
    all_gather_2000(comm);
  });
  EXPECT_NE(error.find("compute 'huge matmul'"), std::string::npos) << error;
  EXPECT_NE(error.find("beyond the modelled clock's range"), std::string::npos) << error;
}

TEST(ModelledClockRange, AnOverflowInARanksLastComputeIsNotLost) {
  // Nothing on the timeline follows the compute: the rank's run ends with it.
  const std::string error = run_error(modelled(), [](Communicator& comm) {
    all_gather_2000(comm);
    if (comm.rank() == 1) ComputeScope scope("last matmul", {1e25, 0});
  });
  EXPECT_NE(error.find("rank 1: "), std::string::npos) << error;
  EXPECT_NE(error.find("compute 'last matmul'"), std::string::npos) << error;
}

TEST(ModelledClockRange, AClockThatPassesTheRangeFailsNamingTheSum) {
  // Two computes of 5e6 s each: each fits, their sum does not.
  const std::string error = run_error(modelled(), [](Communicator& comm) {
    if (comm.rank() == 0) {
      compute_for_us(5e12);
      compute_for_us(5e12);
    }
    all_gather_2000(comm);
  });
  EXPECT_NE(error.find("a rank's modelled clock"), std::string::npos) << error;
  EXPECT_NE(error.find("(adding compute 'work')"), std::string::npos) << error;
}

TEST(ModelledClockRange, AMessageArrivingBeyondTheClockFailsNamingIt) {
  // Rank 0's clock ends 2 s before the range does, then its half of the
  // all-gather (4000 bytes at 1 kB/s) takes 4 s on the link.
  ThreadsOptions options = modelled();
  options.links.bandwidth_gb_per_s = 1e-6;
  const std::string error = run_error(options, [](Communicator& comm) {
    if (comm.rank() == 0) compute_for_us((kMaxModelledSeconds - 2.0) * 1e6);
    all_gather_2000(comm);
  });
  EXPECT_NE(error.find("beyond the modelled clock's range"), std::string::npos) << error;
  EXPECT_NE(error.find("a message of 4000 bytes from rank 0 to rank 1"), std::string::npos) << error;
}

}  // namespace
}  // namespace epmoe::comm
