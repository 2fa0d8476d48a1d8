#include "collectives_bench.h"

#include <cstdio>
#include <exception>

#include "bench_args.h"
#include "modelled_hardware.h"

namespace epmoe::bench {

int run_links_part(const BenchArgs& args);
int run_overlap_part(const BenchArgs& args);
int run_drive_cost_part(const BenchArgs& args);
int run_mpi_part(int argc, char** argv, const BenchArgs& args);
int run_modelled_links_part(const BenchArgs& args);
int run_modelled_overlap_part(const BenchArgs& args);

int run_collectives_bench(int argc, char** argv) {
  try {
    const BenchArgs args = BenchArgs::parse(argc, argv);
    if (modelled_clock(args)) {
      if (args.part == "links") return run_modelled_links_part(args);
      if (args.part == "overlap") return run_modelled_overlap_part(args);
      std::fprintf(stderr, "bench collectives: clock=modelled: part '%s' has no modelled version: links | overlap\n",
                   args.part.c_str());
      return 2;
    }
    if (args.part == "links") return run_links_part(args);
    if (args.part == "overlap") return run_overlap_part(args);
    if (args.part == "drive_cost") return run_drive_cost_part(args);
    if (args.part == "mpi") return run_mpi_part(argc, argv, args);
    std::fprintf(stderr, "bench collectives: part '%s' unknown: links | overlap | drive_cost | mpi\n",
                 args.part.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench collectives: %s\n", e.what());
    return 1;
  }
}

}  // namespace epmoe::bench
