// The epmoe executable: dispatches to the subcommands (cli/commands.h) and
// maps failures to one line on stderr and an exit code:
//   0 success, 2 bad input (keys, files, command line), 1 internal error.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace {

using epmoe::kExitBadInput;
using epmoe::kExitInternalError;

int report(const std::string& kind, const std::string& message, int exit_code) {
  std::fprintf(stderr, "epmoe: %s: %s\n", kind.c_str(), message.c_str());
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("epmoe: expert-parallel Mixture-of-Experts layers, forward and backward", "epmoe");
  app.require_subcommand(1);
  epmoe::cli::add_train_command(app);
  epmoe::cli::add_layer_command(app);
  epmoe::cli::add_gen_inputs_command(app);
  epmoe::cli::add_bench_command(app);
  epmoe::cli::add_plan_command(app);
  epmoe::cli::add_balance_command(app);

  try {
    // CLI11 reports a misspelt subcommand only as "A subcommand is required".
    const std::vector<CLI::App*> subcommands = app.get_subcommands({});
    const bool known_subcommand =
        argc > 1 && std::any_of(subcommands.begin(), subcommands.end(),
                                [&](const CLI::App* sub) { return sub->check_name(argv[1]); });
    if (argc > 1 && argv[1][0] != '-' && !known_subcommand) {
      std::string known;
      for (const CLI::App* sub : subcommands) known += (known.empty() ? "" : ", ") + sub->get_name();
      return report("error", "unknown subcommand '" + std::string(argv[1]) + "'; one of " + known, kExitBadInput);
    }
    app.parse(argc, argv);  // runs the chosen subcommand's callback
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: prints help to stdout
    return report("error", e.what(), kExitBadInput);
  } catch (const epmoe::Error& e) {
    return report("error", e.what(), kExitBadInput);
  } catch (const epmoe::InternalError& e) {
    return report("internal error", e.what(), kExitInternalError);
  } catch (const std::bad_alloc&) {
    return report("error", "out of memory", kExitInternalError);
  } catch (const std::exception& e) {
    return report("internal error", e.what(), kExitInternalError);
  }
}
