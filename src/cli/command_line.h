// What the command-line executables (epmoe, and bench/'s epmoe-bench) do in
// main() once their subcommands are added to the CLI11 app: run the one the
// arguments name, and map failures to one line on stderr and an exit code:
//   0 success, 2 bad input (keys, files, command line), 1 internal error.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace epmoe::cli {

// `what` names a subcommand in the message for an unknown one ("subcommand",
// "benchmark"). Lines start with the app's name: "epmoe: error: ...".
int run_command_line(CLI::App& app, int argc, char** argv, const std::string& what);

// Writes "PROGRAM: KIND: MESSAGE" to stderr and returns exit_code.
int report_failure(const std::string& program, const std::string& kind, const std::string& message, int exit_code);

// For an option whose value is a file name: refuses a value starting with
// '-', an option the user meant instead (CLI11 takes `--generate --help`
// as the file "--help" and writes it). Such a file is named ./-name.
CLI::Validator file_name_value();

}  // namespace epmoe::cli
