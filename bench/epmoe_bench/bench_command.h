// The subcommands of epmoe-bench: collectives and layer, each with its part
// and key=value settings validated before the benchmark runs.
#pragma once

#include <CLI/CLI.hpp>

namespace epmoe::bench {

// epmoe-bench collectives [links|overlap|mpi] [key=value ...]
// epmoe-bench layer [remat|replicas] [key=value ...]
void add_bench_commands(CLI::App& app);

}  // namespace epmoe::bench
