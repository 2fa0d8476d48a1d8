#include "cli/command_line.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <vector>

#include "core/error.h"

namespace epmoe::cli {

int report_failure(const std::string& program, const std::string& kind, const std::string& message, int exit_code) {
  std::fprintf(stderr, "%s: %s: %s\n", program.c_str(), kind.c_str(), message.c_str());
  return exit_code;
}

CLI::Validator file_name_value() {
  return CLI::Validator(
      [](const std::string& value) -> std::string {
        if (value.empty() || value[0] != '-') return {};
        return "expects a file name, got '" + value + "', an option (a file whose name starts with '-': ./" + value +
               ")";
      },
      "");
}

int run_command_line(CLI::App& app, int argc, char** argv, const std::string& what) {
  const std::string program = app.get_name();
  try {
    // CLI11 reports a misspelt subcommand only as "A subcommand is required".
    const std::vector<CLI::App*> subcommands = app.get_subcommands({});
    const bool known_subcommand =
        argc > 1 && std::any_of(subcommands.begin(), subcommands.end(),
                                [&](const CLI::App* sub) { return sub->check_name(argv[1]); });
    if (argc > 1 && argv[1][0] != '-' && !known_subcommand) {
      std::string known;
      for (const CLI::App* sub : subcommands) known += (known.empty() ? "" : ", ") + sub->get_name();
      return report_failure(program, "error", "unknown " + what + " '" + std::string(argv[1]) + "'; one of " + known,
                            kExitBadInput);
    }
    app.parse(argc, argv);  // runs the chosen subcommand's callback
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: prints help to stdout
    return report_failure(program, "error", e.what(), kExitBadInput);
  } catch (const Error& e) {
    return report_failure(program, "error", e.what(), kExitBadInput);
  } catch (const InternalError& e) {
    return report_failure(program, "internal error", e.what(), kExitInternalError);
  } catch (const std::bad_alloc&) {
    return report_failure(program, "error", "out of memory", kExitInternalError);
  } catch (const std::exception& e) {
    return report_failure(program, "internal error", e.what(), kExitInternalError);
  }
}

}  // namespace epmoe::cli
