// The epmoe executable: dispatches to the subcommands (cli/commands.h); a
// failure is one line on stderr and an exit code (cli/command_line.h):
//   0 success, 2 bad input (keys, files, command line), 1 internal error.
#include <string>

#include <CLI/CLI.hpp>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app("epmoe: expert-parallel Mixture-of-Experts layers, forward and backward", "epmoe");
  app.require_subcommand(1);
  epmoe::cli::add_train_command(app);
  epmoe::cli::add_layer_command(app);
  epmoe::cli::add_gen_inputs_command(app);
  epmoe::cli::add_plan_command(app);
  epmoe::cli::add_balance_command(app);
  app.footer("Benchmarks: the epmoe-bench binary (epmoe-bench collectives|layer [part] [key=value ...]).");
  // The benchmarks are a binary of their own, not linked into this tool.
  if (argc > 1 && std::string(argv[1]) == "bench") {
    return epmoe::cli::report_failure(
        "epmoe", "error",
        "bench: the benchmarks moved to the epmoe-bench binary: epmoe-bench collectives|layer [part] [key=value ...]",
        epmoe::kExitBadInput);
  }
  return epmoe::cli::run_command_line(app, argc, argv, "subcommand");
}
