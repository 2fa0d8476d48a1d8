// The subcommands of the `epmoe` executable. Each adds itself to the CLI11
// app with its options, its key table in --help and a callback that runs it;
// main.cc only dispatches and turns exceptions into exit codes.
#pragma once

#include <CLI/CLI.hpp>

namespace epmoe::cli {

// epmoe layer --in DIR --out DIR [key=value ...]
void add_layer_command(CLI::App& app);
// epmoe train [--config FILE] [key=value ...]
void add_train_command(CLI::App& app);
// epmoe gen-inputs --out DIR [key=value ...]
void add_gen_inputs_command(CLI::App& app);
// epmoe plan [--config FILE] [--json] [key=value ...]
void add_plan_command(CLI::App& app);
// epmoe balance --loads FILE.npy | --generate FILE.npy [key=value ...] [--json]
void add_balance_command(CLI::App& app);

}  // namespace epmoe::cli
