// Part (b) of bench_collectives, under mpirun: our collectives against MPI's
// own in the same run, same buffers. Chunk C means: all-gather C bytes per
// rank; reduce-scatter C bytes (f32) of output per rank (R*C input); all-to-all-v
// about C bytes sent per rank, split unevenly (x0.5 .. x1.5 of C/R) over peers.
// MPI runs with OpenMPI 4.1.4's defaults (tuned collectives, vader shared
// memory), the best settings we know on this machine.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_args.h"
#include "comm/all_gather.h"
#include "comm/all_to_all_v.h"
#include "comm/reduce_scatter.h"
#include "core/error.h"
#include "core/threading.h"

#ifdef EPMOE_BENCH_WITH_MPI
#include "transport/mpi/launcher.h"
#endif

namespace epmoe::bench {

#ifndef EPMOE_BENCH_WITH_MPI
int run_mpi_part(int, char**, const BenchArgs&) {
  std::fprintf(stderr, "bench collectives mpi: built without the mpi transport (EPMOE_WITH_MPI=OFF)\n");
  return 2;
}
#else
namespace {

using transport::Communicator;

void print_row(const char* collective, int num_ranks, std::int64_t chunk_bytes, const Timing& ours,
               const Timing& native, const char* native_name) {
  std::printf("| %s | %d | %s | %.3f (%.3f..%.3f) | %s %.3f (%.3f..%.3f) | %.2f |\n", collective, num_ranks,
              format_bytes(chunk_bytes).c_str(), ours.median_s * 1e3, ours.min_s * 1e3, ours.max_s * 1e3, native_name,
              native.median_s * 1e3, native.min_s * 1e3, native.max_s * 1e3, native.median_s / ours.median_s);
  std::fflush(stdout);
}

void bench_all_gather(Communicator& comm, const BenchArgs& args, std::int64_t chunk_bytes) {
  const int num_ranks = comm.size();
  std::vector<std::byte> input(chunk_bytes);
  for (std::int64_t i = 0; i < chunk_bytes; ++i) input[i] = static_cast<std::byte>((comm.rank() * 131 + i) & 0xff);
  std::vector<std::byte> ours_out(chunk_bytes * num_ranks), native_out(chunk_bytes * num_ranks);
  comm::AllGatherOptions gather;
  gather.input = input.data();
  gather.num_elements_per_rank = chunk_bytes;
  gather.dtype = DType::fp8_e4m3;
  gather.pipe = static_cast<std::int64_t>(args.number("pipe", 1));
  gather.output = ours_out.data();
  const Timing ours = measure(comm, args.timing(), [&] { comm::ring_all_gather(comm, gather).wait(); });
  gather.output = native_out.data();
  gather.algorithm = comm::Algorithm::native;
  const Timing native = measure(comm, args.timing(), [&] { comm::ring_all_gather(comm, gather).wait(); });
  if (args.verify() && ours_out != native_out) throw InternalError("bench: ring all-gather != MPI_Allgather");
  if (comm.rank() == 0)
    print_row("all-gather (bidirectional ring)", num_ranks, chunk_bytes, ours, native, "MPI_Allgather");
}

void bench_reduce_scatter(Communicator& comm, const BenchArgs& args, std::int64_t chunk_bytes) {
  const int num_ranks = comm.size();
  const std::int64_t n = chunk_bytes / 4;
  std::vector<float> input(n * num_ranks);
  for (std::int64_t i = 0; i < n * num_ranks; ++i) input[i] = static_cast<float>((i * 7 + comm.rank()) % 1000) * 1e-3f;
  std::vector<float> ours_out(n), native_out(n);
  comm::ReduceScatterOptions reduce;
  reduce.input = input.data();
  reduce.num_elements_per_rank.assign(num_ranks, n);
  reduce.output = ours_out.data();
  const Timing ours = measure(comm, args.timing(), [&] { comm::reduce_scatter(comm, reduce).wait(); });
  reduce.output = native_out.data();
  reduce.algorithm = comm::Algorithm::native;
  const Timing native = measure(comm, args.timing(), [&] { comm::reduce_scatter(comm, reduce).wait(); });
  if (args.verify()) {
    for (std::int64_t i = 0; i < n; ++i) {
      if (std::fabs(ours_out[i] - native_out[i]) > 1e-5f * num_ranks) {
        throw InternalError("bench: ring reduce-scatter differs from MPI's at " + std::to_string(i));
      }
    }
  }
  if (comm.rank() == 0)
    print_row("reduce-scatter f32 (bidirectional ring)", num_ranks, chunk_bytes, ours, native,
              "MPI_Reduce_scatter_block");
}

void bench_all_to_all_v(Communicator& comm, const BenchArgs& args, std::int64_t chunk_bytes) {
  const int num_ranks = comm.size();
  std::vector<std::int64_t> send_counts(num_ranks);
  std::int64_t total = 0;
  for (int peer = 0; peer < num_ranks; ++peer) {
    // x0.5 .. x1.5 of an even share, different for every (rank, peer) pair.
    const double factor =
        0.5 + static_cast<double>((comm.rank() * 7 + peer * 3) % num_ranks) / std::max(1, num_ranks - 1);
    send_counts[peer] = static_cast<std::int64_t>(factor * chunk_bytes / num_ranks);
    total += send_counts[peer];
  }
  std::vector<std::byte> input(total);
  for (std::int64_t i = 0; i < total; ++i) input[i] = static_cast<std::byte>((comm.rank() + i) & 0xff);
  std::vector<std::byte> ours_out, native_out;
  std::vector<std::int64_t> ours_counts, native_counts;
  comm::AllToAllVOptions exchange;
  exchange.input = input.data();
  exchange.send_counts = send_counts;
  exchange.dtype = DType::fp8_e4m3;
  exchange.output = &ours_out;
  exchange.recv_counts = &ours_counts;
  const Timing ours = measure(comm, args.timing(), [&] { comm::all_to_all_v(comm, exchange).wait(); });
  exchange.output = &native_out;
  exchange.recv_counts = &native_counts;
  exchange.algorithm = comm::Algorithm::native;
  const Timing native = measure(comm, args.timing(), [&] { comm::all_to_all_v(comm, exchange).wait(); });
  if (args.verify() && (ours_out != native_out || ours_counts != native_counts)) {
    throw InternalError("bench: all_to_all_v differs from MPI_Alltoallv");
  }
  if (comm.rank() == 0)
    print_row("all-to-all-v (pairwise, counts first)", num_ranks, chunk_bytes, ours, native,
              "MPI_Alltoall + MPI_Alltoallv");
}

}  // namespace

int run_mpi_part(int argc, char** argv, const BenchArgs& args) {
  return transport::mpi::run_rank(argc, argv, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::printf(
          "(b) mpi transport, %d processes (mpirun --oversubscribe --bind-to none, %d cores), "
          "all-gather pipe=%d; median of >= %d runs (min..max) in ms; ratio = MPI time / our time "
          "(> 1: ours faster)\n",
          comm.size(), hardware_cores(), static_cast<int>(args.number("pipe", 1)), args.timing().min_runs);
      std::printf("| collective | R | chunk | ours ms | MPI ms | MPI / ours |\n|---|---|---|---|---|---|\n");
    }
    for (std::int64_t chunk_bytes : args.sizes("chunks", "64K,1M,8M")) {
      bench_all_gather(comm, args, chunk_bytes);
      bench_reduce_scatter(comm, args, chunk_bytes);
      bench_all_to_all_v(comm, args, chunk_bytes);
    }
  });
}
#endif

}  // namespace epmoe::bench
