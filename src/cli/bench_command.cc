// epmoe bench collectives|layer [part] [key=value ...]: the multi-rank
// benchmarks of bench/, in the tool (so `mpirun ... epmoe bench collectives
// mpi` works with the same binary users run). The benchmark libraries are
// linked in when the build has them (EPMOE_BUILD_BENCH).
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

#ifdef EPMOE_WITH_BENCH
#include "collectives_bench.h"
#include "ep_layer_bench.h"
#endif

namespace epmoe::cli {
namespace {

int run_bench(const std::string& which, const std::vector<std::string>& rest) {
#ifdef EPMOE_WITH_BENCH
  std::vector<std::string> arguments = {"epmoe bench " + which};
  arguments.insert(arguments.end(), rest.begin(), rest.end());
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(arguments.size());
  if (which == "collectives") return bench::run_collectives_bench(argc, argv.data());
  if (which == "layer") return bench::run_ep_layer_bench(argc, argv.data());
  throw ConfigError("bench " + which + ": unknown benchmark; one of collectives, layer");
#else
  throw ConfigError("this epmoe was built without benchmarks (EPMOE_BUILD_BENCH=OFF)");
#endif
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "bench",
      "Run a benchmark: collectives [links|overlap|mpi] (ring all-gather, reduce-scatter, all-to-all-v "
      "vs bounds and MPI), layer [remat|replicas] (expert-parallel layer per dispatcher / remat policy / dynamic replicas under Zipf skew, on emulated links)");
  auto which = std::make_shared<std::string>();
  auto rest = std::make_shared<std::vector<std::string>>();
  command->add_option("benchmark", *which, "collectives or layer")->required();
  command->add_option("arguments", *rest, "part and key=value settings of that benchmark");
  command->callback([which, rest] {
    const int status = run_bench(*which, *rest);
    if (status != 0) throw Error("bench " + *which + " exited with status " + std::to_string(status));
  });
}

}  // namespace epmoe::cli
