// Parts (a) and (c) of bench_collectives, on the threads transport with
// emulated links (transport/threads/emulated_links.h: EMULATION, sleeping
// until the modelled arrival time). Rank threads and progress threads share
// this machine's 2 cores, so the CPU side (memcpy of every message, wake-ups)
// is real and shows in the ratio to the bound.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.h"
#include "comm/all_gather.h"
#include "comm/all_to_all_v.h"
#include "comm/cooperative_progress.h"
#include "core/error.h"
#include "transport/threads/launcher.h"

namespace epmoe::bench {
namespace {

using transport::Communicator;
using transport::threads::LinkTopology;
using transport::threads::run_ranks;
using transport::threads::ThreadsOptions;

ThreadsOptions link_options(const BenchArgs& args) {
  ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  options.links.enabled = true;
  options.links.bandwidth_gb_per_s = args.number("bandwidth_gb_s", 1.0);
  options.links.latency_us = args.number("latency_us", 2.0);
  options.links.topology = LinkTopology::ring;
  return options;
}

// Output of every rank checked against the naive gather once.
void verify_gather(const std::vector<std::byte>& output, int num_ranks, std::int64_t chunk_bytes) {
  for (int r = 0; r < num_ranks; ++r) {
    for (std::int64_t i = 0; i < chunk_bytes; i += 4093) {
      if (output[r * chunk_bytes + i] != static_cast<std::byte>((r * 131 + i) & 0xff)) {
        throw InternalError("bench: all-gather output wrong at rank block " + std::to_string(r));
      }
    }
  }
}

std::vector<std::byte> rank_chunk(int rank, std::int64_t chunk_bytes) {
  std::vector<std::byte> chunk(chunk_bytes);
  for (std::int64_t i = 0; i < chunk_bytes; ++i) chunk[i] = static_cast<std::byte>((rank * 131 + i) & 0xff);
  return chunk;
}

}  // namespace

int run_links_part(const BenchArgs& args) {
  const ThreadsOptions options = link_options(args);
  const double bandwidth = options.links.bandwidth_gb_per_s * 1e9;
  std::printf(
      "(a) ring all-gather on emulated links: ring topology, %.2f GB/s per link and direction, "
      "%.1f us latency, full duplex, pipe=%d; median of >= %d runs (min..max)\n",
      options.links.bandwidth_gb_per_s, options.links.latency_us, static_cast<int>(args.number("pipe", 1)),
      args.timing().min_runs);
  std::printf("| R | chunk | bidirectional ms | unidirectional ms | uni / bi | bound (R-1)C/(2B) ms | bi / bound |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int num_ranks : args.ints("ranks", "4,8")) {
    for (std::int64_t chunk_bytes : args.sizes("chunks", "64K,1M,8M")) {
      Timing timings[2];  // [bidirectional, unidirectional]
      for (int variant = 0; variant < 2; ++variant) {
        run_ranks(num_ranks, options, [&](Communicator& comm) {
          const std::vector<std::byte> input = rank_chunk(comm.rank(), chunk_bytes);
          std::vector<std::byte> output(chunk_bytes * num_ranks);
          comm::AllGatherOptions gather;
          gather.input = input.data();
          gather.output = output.data();
          gather.num_elements_per_rank = chunk_bytes;
          gather.dtype = DType::fp8_e4m3;  // 1-byte elements
          gather.direction = variant == 0 ? comm::RingDirection::bidirectional : comm::RingDirection::unidirectional;
          gather.pipe = static_cast<std::int64_t>(args.number("pipe", 1));
          const Timing timing = measure(comm, args.timing(), [&] { comm::ring_all_gather(comm, gather).wait(); });
          if (args.verify()) verify_gather(output, num_ranks, chunk_bytes);
          if (comm.rank() == 0) timings[variant] = timing;
        });
      }
      const double bound = (num_ranks - 1) * static_cast<double>(chunk_bytes) / (2 * bandwidth);
      std::printf("| %d | %s | %.3f (%.3f..%.3f) | %.3f (%.3f..%.3f) | %.2f | %.3f | %.2f |\n", num_ranks,
                  format_bytes(chunk_bytes).c_str(), timings[0].median_s * 1e3, timings[0].min_s * 1e3,
                  timings[0].max_s * 1e3, timings[1].median_s * 1e3, timings[1].min_s * 1e3, timings[1].max_s * 1e3,
                  timings[1].median_s / timings[0].median_s, bound * 1e3, timings[0].median_s / bound);
      std::fflush(stdout);
    }
  }
  return 0;
}

namespace {

// A compute loop that stands in for expert GEMMs: dependent FMAs on a small
// array in L1, one thread per rank, no memory traffic to compete with the
// copies. Returns a value so the work cannot be optimised away. Run in slices
// of kSliceIterations (~20 us here) that stand in for GEMM tiles; with
// `cooperative` the loop calls comm::drive_progress() between slices, as
// expert compute does (comm/cooperative_progress.h), and adds the loans made
// to *loans.
constexpr std::int64_t kSliceIterations = 4096;

float compute(std::int64_t iterations, bool cooperative = false, int* loans = nullptr) {
  float values[64];
  for (int i = 0; i < 64; ++i) values[i] = 1.0f + i * 1e-3f;
  for (std::int64_t begin = 0; begin < iterations; begin += kSliceIterations) {
    const std::int64_t end = std::min(iterations, begin + kSliceIterations);
    for (std::int64_t it = begin; it < end; ++it) {
      for (int i = 0; i < 64; ++i) values[i] = values[i] * 0.9999f + 1e-4f;
    }
    if (cooperative) {
      const int lent = comm::drive_progress();
      if (loans != nullptr) *loans += lent;
    }
  }
  float sum = 0;
  for (float v : values) sum += v;
  return sum;
}

}  // namespace

int run_overlap_part(const BenchArgs& args) {
  const ThreadsOptions options = link_options(args);
  // progress=threads: the compute loop never calls drive_progress (the
  // progress threads get a core when the scheduler gives them one);
  // cooperative: it does between slices; both (default): a row of each,
  // measured in the same ranks with the same calibration.
  const auto found = args.values.find("progress");
  const std::string progress = found == args.values.end() ? "both" : found->second;
  if (progress != "threads" && progress != "cooperative" && progress != "both") {
    throw ConfigError("bench overlap: progress=" + progress + ": must be threads, cooperative or both");
  }
  // collective=all_gather (default: the ring all-gather, whose first step
  // is posted on the caller's thread) or all_to_all_v (every rank sends
  // `chunk` to every other rank; posted by its progress thread, so only
  // drive_progress gets it going while the caller computes).
  const auto found_collective = args.values.find("collective");
  const std::string collective = found_collective == args.values.end() ? "all_gather" : found_collective->second;
  if (collective != "all_gather" && collective != "all_to_all_v") {
    throw ConfigError("bench overlap: collective=" + collective + ": must be all_gather or all_to_all_v");
  }
  const bool all_to_all = collective == "all_to_all_v";
  std::vector<bool> variants;  // cooperative?
  if (progress != "cooperative") variants.push_back(false);
  if (progress != "threads") variants.push_back(true);
  std::printf(
      "(c) overlap: async %s beside a compute loop of similar length, "
      "emulated ring links %.2f GB/s, %.1f us; all ranks compute at once (R threads on 2 cores); "
      "progress: threads = the compute loop never drives progress, cooperative = it calls "
      "comm::drive_progress() every %lld iterations\n",
      all_to_all ? "all_to_all_v (chunk to every other rank)" : "bidirectional ring all-gather",
      options.links.bandwidth_gb_per_s, options.links.latency_us, static_cast<long long>(kSliceIterations));
  std::printf(
      "| R | chunk | progress | collective ms | compute ms | both, overlapped ms | sum ms | max ms | overlapped / sum "
      "| overlapped / max | loans / run |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int num_ranks : args.ints("ranks", "2,4")) {
    for (std::int64_t chunk_bytes : args.sizes("chunks", "1M,8M")) {
      Timing gather_alone, compute_alone;
      std::vector<Timing> both(variants.size());
      std::vector<double> loans_per_run(variants.size(), 0.0);
      volatile float sink = 0;
      run_ranks(num_ranks, options, [&](Communicator& comm) {
        const std::vector<std::byte> input = rank_chunk(comm.rank(), chunk_bytes);
        std::vector<std::byte> output(chunk_bytes * num_ranks);
        comm::AllGatherOptions gather;
        gather.input = input.data();
        gather.output = output.data();
        gather.num_elements_per_rank = chunk_bytes;
        gather.dtype = DType::fp8_e4m3;
        std::vector<std::byte> exchanged;
        std::vector<std::int64_t> recv_counts;
        comm::AllToAllVOptions exchange;
        exchange.input = output.data();  // R chunks, the own one not sent
        exchange.send_counts.assign(num_ranks, chunk_bytes);
        exchange.send_counts[comm.rank()] = 0;
        exchange.dtype = DType::fp8_e4m3;
        exchange.output = &exchanged;
        exchange.recv_counts = &recv_counts;
        exchange.tag = 1;
        auto launch = [&] {
          return all_to_all ? comm::all_to_all_v(comm, exchange) : comm::ring_all_gather(comm, gather);
        };
        const Timing g = measure(comm, args.timing(), [&] { launch().wait(); });
        // Calibrate the compute loop to the all-gather's length (rank 0's
        // estimate, applied on every rank: iterations from a short probe).
        constexpr std::int64_t kProbeIterations = 200'000;  // ~1 ms on one Zen 5 core
        const Timing probe = measure(comm, args.timing(), [&] { sink = sink + compute(kProbeIterations); });
        auto iterations = static_cast<std::int64_t>(kProbeIterations * g.median_s / probe.median_s);
        // A short probe runs within one scheduler slice; a long loop shares
        // the cores with the other ranks' loops: correct once at full length.
        Timing c = measure(comm, args.timing(), [&] { sink = sink + compute(iterations); });
        iterations = static_cast<std::int64_t>(static_cast<double>(iterations) * g.median_s / c.median_s);
        c = measure(comm, args.timing(), [&] { sink = sink + compute(iterations); });
        for (std::size_t v = 0; v < variants.size(); ++v) {
          int loans = 0, runs = 0;
          const Timing b = measure(comm, args.timing(), [&] {
            comm::CollectiveHandle handle = launch();
            sink = sink + compute(iterations, variants[v], &loans);
            handle.wait();
            ++runs;
          });
          if (args.verify() && !all_to_all) verify_gather(output, num_ranks, chunk_bytes);
          if (args.verify() && all_to_all &&
              static_cast<std::int64_t>(exchanged.size()) != chunk_bytes * (num_ranks - 1)) {
            throw InternalError("bench: all_to_all_v received the wrong byte count");
          }
          if (comm.rank() == 0) {
            both[v] = b;
            loans_per_run[v] = static_cast<double>(loans) / runs;
          }
        }
        if (comm.rank() == 0) {
          gather_alone = g;
          compute_alone = c;
        }
      });
      const double sum = gather_alone.median_s + compute_alone.median_s;
      const double max = std::max(gather_alone.median_s, compute_alone.median_s);
      for (std::size_t v = 0; v < variants.size(); ++v) {
        std::printf("| %d | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.1f |\n", num_ranks,
                    format_bytes(chunk_bytes).c_str(), variants[v] ? "cooperative" : "threads",
                    gather_alone.median_s * 1e3, compute_alone.median_s * 1e3, both[v].median_s * 1e3, sum * 1e3,
                    max * 1e3, both[v].median_s / sum, both[v].median_s / max, loans_per_run[v]);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

// What comm::drive_progress() costs the compute loop that calls it: per call
// with nothing in flight, and with one all-gather in flight whose progress
// thread sleeps on a slow emulated link (parked, not due - the common case
// between GEMM tiles), counting the loans it made apart.
int run_drive_cost_part(const BenchArgs& args) {
  using Clock = std::chrono::steady_clock;
  const auto calls = static_cast<std::int64_t>(args.number("calls", 1'000'000));
  auto ns_per_call = [](Clock::time_point begin, std::int64_t n) {
    return std::chrono::duration<double, std::nano>(Clock::now() - begin).count() / static_cast<double>(n);
  };
  // Nothing in flight: the thread-local list is empty.
  Clock::time_point begin = Clock::now();
  int loans = 0;
  for (std::int64_t i = 0; i < calls; ++i) loans += comm::drive_progress();
  const double idle_ns = ns_per_call(begin, calls);
  // One all-gather of 8 MiB per rank over 0.5 GB/s links (~17 ms) in flight.
  ThreadsOptions options = link_options(args);
  options.links.bandwidth_gb_per_s = 0.5;
  double busy_ns = 0;
  std::int64_t busy_calls = 0;
  int busy_loans = 0;
  run_ranks(2, options, [&](Communicator& comm) {
    const std::int64_t chunk_bytes = 8 << 20;
    const std::vector<std::byte> input = rank_chunk(comm.rank(), chunk_bytes);
    std::vector<std::byte> output(chunk_bytes * 2);
    comm::AllGatherOptions gather;
    gather.input = input.data();
    gather.output = output.data();
    gather.num_elements_per_rank = chunk_bytes;
    gather.dtype = DType::fp8_e4m3;
    comm::CollectiveHandle handle = comm::ring_all_gather(comm, gather);
    std::int64_t n = 0;
    int lent = 0;
    const Clock::time_point start = Clock::now();
    while (!handle.test()) {
      for (int i = 0; i < 1000; ++i) lent += comm::drive_progress();
      n += 1000;
    }
    const double per_call = ns_per_call(start, n);
    if (args.verify()) verify_gather(output, 2, chunk_bytes);
    if (comm.rank() == 0) {
      busy_ns = per_call;
      busy_calls = n;
      busy_loans = lent;
    }
  });
  std::printf(
      "drive_progress cost: nothing in flight %.1f ns/call (%d loans in %lld calls); one all-gather in "
      "flight (8 MiB, 0.5 GB/s link, rank 0 of 2): %.1f ns/call over %lld calls, %d of them loans "
      "(loan time included)\n",
      idle_ns, loans, static_cast<long long>(calls), busy_ns, static_cast<long long>(busy_calls), busy_loans);
  return 0;
}

}  // namespace epmoe::bench
