// bench_collectives (exposed as `epmoe-bench collectives`): our collectives
// against the link-limited bound on emulated links, against MPI's own
// collectives on the mpi transport, and overlapped with compute.
//
//   bench_collectives links     [ranks=4,8] [chunks=64K,1M,8M] [bandwidth_gb_s=1] [latency_us=2] [pipe=1]
//   bench_collectives overlap   [ranks=2,4] [chunks=1M,8M]     [bandwidth_gb_s=1] [latency_us=2]
//   mpirun -np R bench_collectives mpi      [chunks=64K,1M,8M]
//   common: min_runs=5 min_seconds=0.2 verify=1
#pragma once

namespace epmoe::bench {

int run_collectives_bench(int argc, char** argv);

}  // namespace epmoe::bench
