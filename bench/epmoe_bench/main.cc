// epmoe-bench: the multi-rank benchmarks (bench/collectives, bench/ep_layer)
// behind one command line, e.g. `epmoe-bench layer remat ranks=4` or
// `mpirun -np 4 epmoe-bench collectives mpi`. Exit codes as the epmoe tool's:
// 0 success, 2 bad input, 1 internal error.
#include <CLI/CLI.hpp>

#include "bench_command.h"
#include "cli/command_line.h"

int main(int argc, char** argv) {
  CLI::App app(
      "epmoe-bench: the multi-rank benchmarks of epmoe (docs/BENCHMARKS.md); verification on by default (verify=1)",
      "epmoe-bench");
  app.require_subcommand(1);
  epmoe::bench::add_bench_commands(app);
  return epmoe::cli::run_command_line(app, argc, argv, "benchmark");
}
