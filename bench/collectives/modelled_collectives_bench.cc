// `epmoe-bench collectives [links|overlap] clock=modelled`: the ring
// all-gather on the modelled clock (DESIGN.md §4.11), per hardware preset
// (bench/collectives/modelled_hardware.h). Every number is a pure function
// of the configuration: one run each, no repetitions, no spread.
//
//  links:   bidirectional vs unidirectional ring all-gather of C bytes per
//           rank, against the bandwidth bound of the ring on the preset's
//           topology - what its busiest link direction must carry, over
//           that link's bandwidth (ring_bound_seconds below) - and the
//           latency-inclusive estimates ·(C/(2B) + α) bidirectional
//           and ·(C/B + α) unidirectional (pipe=1: R-1 steps, each one
//           message per lane and direction; B the scale-up link's).
//  overlap: the async bidirectional all-gather beside charged compute of the
//           same modelled length (a ComputeScope of FLOPs): overlapped time
//           over the sum and over the max of the two.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

#include "bench_args.h"
#include "comm/all_gather.h"
#include "core/error.h"
#include "modelled_hardware.h"

namespace epmoe::bench {
namespace {

using transport::Communicator;

// The latest clock over ranks of `fn` run once on every rank (clocks start at 0).
Picoseconds modelled_run(int num_ranks, const transport::threads::ThreadsOptions& threads,
                         const std::function<void(Communicator&)>& fn) {
  std::mutex mutex;
  Picoseconds latest = 0;
  transport::threads::run_ranks(num_ranks, threads, [&](Communicator& comm) {
    fn(comm);
    const Picoseconds now = this_thread_modelled_clock()->now();
    std::lock_guard<std::mutex> lock(mutex);
    latest = std::max(latest, now);
  });
  return latest;
}

comm::AllGatherOptions gather_options(const std::vector<std::byte>& input, std::vector<std::byte>& output,
                                      std::int64_t chunk_bytes, comm::RingDirection direction, std::int64_t pipe) {
  comm::AllGatherOptions gather;
  gather.input = input.data();
  gather.output = output.data();
  gather.num_elements_per_rank = chunk_bytes;
  gather.dtype = DType::fp8_e4m3;  // 1-byte elements
  gather.direction = direction;
  gather.pipe = pipe;
  return gather;
}

// The bidirectional ring's bound on these links: every rank forwards
// halves C/2 on each lane, and the busiest link direction sets it.
//  ring, full_mesh: each lane has a link of its own: ·C/(2B);
//  switched: both lanes leave through the rank's one egress port: ·C/B;
//  two_level (groups of G < R): inside a group as switched, and at a group
//    boundary each NIC direction carries one lane, (R-1)·C/(2S) - the
//    bottleneck when S < B/2, as on every NVIDIA preset (issue 30: the
//    column used B there); groups of one send both lanes over the NIC.
double ring_bound_seconds(const transport::threads::EmulatedLinkOptions& links, int num_ranks, double chunk_bytes) {
  using transport::threads::LinkTopology;
  const double steps = num_ranks - 1, b = links.bandwidth_gb_per_s * 1e9;
  const double s = links.scale_out_bandwidth_gb_per_s * 1e9;
  switch (links.topology) {
    case LinkTopology::ring:
    case LinkTopology::full_mesh:
      return steps * chunk_bytes / (2 * b);
    case LinkTopology::switched:
      return steps * chunk_bytes / b;
    case LinkTopology::two_level:
      if (num_ranks <= links.group_size) return steps * chunk_bytes / b;
      if (links.group_size == 1) return steps * chunk_bytes / s;
      return std::max(steps * chunk_bytes / b, steps * chunk_bytes / (2 * s));
  }
  return 0;
}

}  // namespace

int run_modelled_links_part(const BenchArgs& args) {
  const std::int64_t pipe = static_cast<std::int64_t>(args.number("pipe", 1));
  std::printf("(a) ring all-gather, clock=modelled (deterministic: one run per row, no repetitions); pipe=%lld\n",
              (long long)pipe);
  for (const std::string& name : hardware_names(args)) {
    for (int num_ranks : args.ints("ranks", "4,8")) {
      const ModelledHardware hw = modelled_hardware(name, num_ranks, args.number("latency_us", 2.0), args);
      const double bandwidth = hw.threads.links.bandwidth_gb_per_s * 1e9;
      const double latency = hw.threads.links.latency_us * 1e-6;
      std::printf("\n%s, R=%d, links %s\n", hw.name.c_str(), num_ranks, describe_links(hw.threads.links).c_str());
      std::printf(
          "| chunk C | bidirectional us | unidirectional us | uni / bi | bound (busiest link) us | bi / bound "
          "| (R-1)(C/2B+a) us | (R-1)(C/B+a) us |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      for (std::int64_t chunk_bytes : args.sizes("chunks", "64K,1M,8M")) {
        Picoseconds times[2];
        for (int variant = 0; variant < 2; ++variant) {
          const auto direction =
              variant == 0 ? comm::RingDirection::bidirectional : comm::RingDirection::unidirectional;
          times[variant] = modelled_run(num_ranks, hw.threads, [&](Communicator& comm) {
            const std::vector<std::byte> input(static_cast<std::size_t>(chunk_bytes),
                                               static_cast<std::byte>(comm.rank()));
            std::vector<std::byte> output(static_cast<std::size_t>(chunk_bytes * num_ranks));
            comm::ring_all_gather(comm, gather_options(input, output, chunk_bytes, direction, pipe)).wait();
            if (args.verify()) {
              for (int r = 0; r < num_ranks; ++r) {
                if (output[static_cast<std::size_t>(r * chunk_bytes + chunk_bytes / 2)] != static_cast<std::byte>(r))
                  throw InternalError("bench: modelled all-gather output wrong at rank block " + std::to_string(r));
              }
            }
          });
        }
        const double c = static_cast<double>(chunk_bytes);
        const double bound = ring_bound_seconds(hw.threads.links, num_ranks, c);
        const double bi_estimate = (num_ranks - 1) * (c / (2 * bandwidth) + latency);
        const double uni_estimate = (num_ranks - 1) * (c / bandwidth + latency);
        const double bi = to_seconds(times[0]), uni = to_seconds(times[1]);
        std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", format_bytes(chunk_bytes).c_str(),
                    bi * 1e6, uni * 1e6, uni / bi, bound * 1e6, bi / bound, bi_estimate * 1e6, uni_estimate * 1e6);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

int run_modelled_overlap_part(const BenchArgs& args) {
  std::printf(
      "(c) overlap, clock=modelled: async bidirectional ring all-gather beside charged compute of the "
      "all-gather's modelled length (one run per row)\n");
  for (const std::string& name : hardware_names(args)) {
    for (int num_ranks : args.ints("ranks", "4,8")) {
      const ModelledHardware hw = modelled_hardware(name, num_ranks, args.number("latency_us", 2.0), args);
      const double flops_per_s = hw.peak_flops * hw.threads.modelled.compute_efficiency;
      std::printf("\n%s, R=%d, links %s\n", hw.name.c_str(), num_ranks, describe_links(hw.threads.links).c_str());
      std::printf(
          "| chunk | all-gather us | compute us | both, overlapped us | sum us | overlapped / sum | "
          "overlapped / max |\n");
      std::printf("|---|---|---|---|---|---|---|\n");
      for (std::int64_t chunk_bytes : args.sizes("chunks", "64K,1M,8M")) {
        auto run = [&](bool gather, double compute_seconds) {
          return modelled_run(num_ranks, hw.threads, [&](Communicator& comm) {
            const std::vector<std::byte> input(static_cast<std::size_t>(chunk_bytes));
            std::vector<std::byte> output(static_cast<std::size_t>(chunk_bytes * num_ranks));
            comm::CollectiveHandle handle;
            if (gather) {
              handle = comm::ring_all_gather(
                  comm, gather_options(input, output, chunk_bytes, comm::RingDirection::bidirectional, 1));
            }
            if (compute_seconds > 0) {
              ComputeScope scope("bench compute", {.flops = compute_seconds * flops_per_s});
            }
            handle.wait();
          });
        };
        const double gather = to_seconds(run(true, 0));
        const double compute = to_seconds(run(false, gather));
        const double both = to_seconds(run(true, gather));
        const double sum = gather + compute, max = std::max(gather, compute);
        std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", format_bytes(chunk_bytes).c_str(),
                    gather * 1e6, compute * 1e6, both * 1e6, sum * 1e6, both / sum, both / max);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace epmoe::bench
