// epmoe-bench collectives|layer [part] [key=value ...]: the multi-rank
// benchmarks of bench/ behind one command line, with the keys of each in
// --help (so `mpirun ... epmoe-bench collectives mpi` works as the tool's
// subcommands do). A binary of its own: the shipped epmoe tool links no
// benchmark.
//
// The benchmarks read their keys loosely (a map of strings, std::stod on
// use), so every key is validated here first, with the key registry of the
// tool's subcommands: an unknown key or a non-number is a one-line error and
// exit code 2, not a key silently ignored or "internal error: stod".
#include "bench_command.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collectives_bench.h"
#include "core/error.h"
#include "ep_layer_bench.h"
#include "hardware/hardware.h"
#include "run/config_keys.h"

namespace epmoe::bench {
namespace {

using run::ConfigValues;
using run::KeyGroup;
using run::KeyRegistry;
using run::KeySpec;
using run::KeyType;

constexpr char kProgram[] = "epmoe-bench";

constexpr double kIntMax = std::numeric_limits<int>::max();

std::vector<KeySpec> timing_keys() {
  return {
      {.name = "min_runs",
       .type = KeyType::integer,
       .default_value = "5",
       .help = "timed runs at least",
       .min_value = 1,
       .max_value = kIntMax},
      {.name = "max_runs",
       .type = KeyType::integer,
       .default_value = "50",
       .help = "timed runs at most",
       .min_value = 1,
       .max_value = kIntMax},
      {.name = "min_seconds",
       .type = KeyType::real,
       .default_value = "0.2",
       .help = "time each measurement at least this long (layer: default 1)",
       .min_value = 0},
      {.name = "verify",
       .type = KeyType::integer,
       .default_value = "1",
       .help = "1 = check every result against a reference, 0 = skip",
       .min_value = 0,
       .max_value = 1},
  };
}

// The second clock (DESIGN.md §4.11) for both benchmarks: bench/collectives/
// modelled_hardware.h maps each hardware preset to links and device rates as
// `epmoe layer clock=modelled` does (hardware/modelled_clock_options.h). With compute modelled, every number is a
// pure function of the configuration: one run per row, no repetitions (the
// timing keys do not apply).
std::vector<KeySpec> modelled_bench_keys() {
  std::string presets;
  for (const std::string& name : hardware::hardware_preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  return {
      {.name = "clock",
       .type = KeyType::choice,
       .default_value = "wall",
       .help = "wall: time on this machine (emulated links); modelled: every rank on a virtual clock, compute "
               "and links at the hardware's rates, deterministic (one run per row)",
       .choices = {"wall", "modelled"}},
      {.name = "hardware",
       .type = KeyType::text,
       .default_value = "all",
       .help = "clock=modelled: comma-separated hardware presets (" + presets + ") or YAML files; all = every preset"},
      {.name = "compute_efficiency",
       .type = KeyType::real,
       .default_value = "0.5",
       .help = "clock=modelled: the fraction of peak bf16 FLOP/s a matmul reaches",
       .min_value = 0,
       .min_exclusive = true,
       .max_value = 1},
  };
}

KeyGroup collectives_keys() {
  KeyGroup group{
      "collectives (parts: links, overlap, mpi)",
      {
          {.name = "ranks",
           .type = KeyType::text,
           .default_value = "4,8",
           .help = "links, overlap: comma-separated rank counts, each >= 1"},
          {.name = "chunks",
           .type = KeyType::text,
           .default_value = "64K,1M,8M",
           .help = "comma-separated bytes per rank, each > 0, optional K or M suffix"},
          {.name = "bandwidth_gb_s",
           .type = KeyType::real,
           .default_value = "1",
           .help = "links, overlap: emulated GB/s per link and direction",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "latency_us",
           .type = KeyType::real,
           .default_value = "2",
           .help = "links, overlap: emulated (clock=modelled: modelled) latency per message and hop, microseconds",
           .min_value = 0},
          {.name = "pipe",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "links, mpi: ring all-gather pipeline depth",
           .min_value = 1,
           .max_value = kIntMax},
      },
  };
  for (KeySpec& key : timing_keys()) group.keys.push_back(std::move(key));
  for (KeySpec& key : modelled_bench_keys()) group.keys.push_back(std::move(key));
  return group;
}

// The tables of `epmoe-bench layer clock=modelled` (bench/ep_layer/modelled_layer_bench.cc).
const std::vector<std::string>& modelled_layer_tables() {
  static const std::vector<std::string> names = {"cotangent", "chunks", "remat", "dedup", "replicas", "fp8"};
  return names;
}

KeyGroup layer_bench_keys() {
  KeyGroup group{
      "layer (parts: none, remat, replicas)",
      {
          {.name = "ranks",
           .type = KeyType::integer,
           .default_value = "4",
           .help = "ranks (threads); clock=modelled: default 8",
           .min_value = 1,
           .max_value = 1024},
          {.name = "tokens_per_rank",
           .type = KeyType::integer,
           .default_value = "256",
           .help = "tokens per rank",
           .min_value = 1,
           .max_value = kIntMax},
          {.name = "hidden",
           .type = KeyType::integer,
           .default_value = "256",
           .help = "hidden size H",
           .min_value = 1,
           .max_value = kIntMax},
          {.name = "ffn",
           .type = KeyType::integer,
           .default_value = "128",
           .help = "expert FFN size F",
           .min_value = 1,
           .max_value = kIntMax},
          {.name = "experts",
           .type = KeyType::integer,
           .default_value = "64",
           .help = "experts E",
           .min_value = 1,
           .max_value = kIntMax},
          {.name = "top_k",
           .type = KeyType::integer,
           .default_value = "8",
           .help = "experts per token K",
           .min_value = 1,
           .max_value = kIntMax},
          {.name = "link_gbps",
           .type = KeyType::real,
           .default_value = "0.5",
           .help = "emulated GB/s per link and direction; 0 = no emulation",
           .min_value = 0},
          {.name = "link_latency_us",
           .type = KeyType::real,
           .default_value = "5",
           .help = "emulated latency per message, microseconds; clock=modelled: per message and hop, default 2 "
                   "(as epmoe layer)",
           .min_value = 0},
          {.name = "topology",
           .type = KeyType::choice,
           .default_value = "full_mesh",
           .help = "emulated links",
           .choices = {"full_mesh", "ring"}},
          {.name = "dispatch",
           .type = KeyType::choice,
           .default_value = "ring",
           .help = "remat: the dispatcher",
           .choices = {"ring", "alltoall"}},
          {.name = "repetitions",
           .type = KeyType::integer,
           .default_value = "5",
           .help = "remat: runs per policy",
           .min_value = 1,
           .max_value = kIntMax},
          {.name = "zipf",
           .type = KeyType::real,
           .default_value = "1.2",
           .help = "replicas: Zipf exponent of skew",
           .min_value = 0},
          {.name = "skew_scale",
           .type = KeyType::real,
           .default_value = "0.15",
           .help = "replicas: strength of the routing skew",
           .min_value = 0},
          {.name = "slots",
           .type = KeyType::text,
           .default_value = "1,2",
           .help = "replicas: comma-separated redundant slot counts, each >= 0"},
          {.name = "rebalance_threshold",
           .type = KeyType::real,
           .default_value = "1.05",
           .help = "replicas: stop adding replicas at this max/mean",
           .min_value = 1},
          {.name = "tables",
           .type = KeyType::text,
           .default_value = "all",
           .help = "clock=modelled, no part: comma-separated tables (cotangent, chunks, remat, dedup, replicas, "
                   "fp8) or all; the parts remat and replicas print their table"},
          {.name = "trace_file",
           .type = KeyType::text,
           .default_value = "",
           .help = "write a Chrome trace (Perfetto UI, chrome://tracing) of one forward + backward of the bench's "
                   "first configuration, every rank's phases, compute and collectives, in the run's clock (wall: "
                   "an extra untimed run before the timed ones; clock=modelled: the determinism check's first run, "
                   "ring dispatch, first preset) to this path; empty = none"},
      },
  };
  for (KeySpec& key : timing_keys()) group.keys.push_back(std::move(key));
  for (KeySpec& key : modelled_bench_keys()) group.keys.push_back(std::move(key));
  return group;
}

const KeyRegistry& collectives_key_registry() {
  static const KeyRegistry registry("collectives", {collectives_keys()}, kProgram);
  return registry;
}

const KeyRegistry& layer_bench_key_registry() {
  static const KeyRegistry registry("layer", {layer_bench_keys()}, kProgram);
  return registry;
}

// The items of a comma-separated list key; ConfigError naming the key.
std::vector<std::string> list_items(const std::string& key, const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (items.back().empty()) throw ConfigError(key + "=" + text + ": an empty item in the list");
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

// "4,8" with every item an integer in [min_value, max_value].
void check_int_list(const ConfigValues& values, const std::string& key, std::int64_t min_value,
                    std::int64_t max_value) {
  const std::string& text = values.get_string(key);
  for (const std::string& item : list_items(key, text)) {
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (error != std::errc() || end != item.data() + item.size()) {
      throw ConfigError(key + "=" + text + ": item '" + item + "' is not an integer");
    }
    if (value < min_value || value > max_value) {
      throw ConfigError(key + "=" + text + ": item " + item + " must be in [" + std::to_string(min_value) + ", " +
                        std::to_string(max_value) + "]");
    }
  }
}

// "64K,1M,8M": bytes, each > 0, with an optional K (KiB) or M (MiB) suffix.
void check_size_list(const ConfigValues& values, const std::string& key) {
  const std::string& text = values.get_string(key);
  for (const std::string& item : list_items(key, text)) {
    const char suffix = item.back();
    const std::int64_t scale = suffix == 'K' ? 1024 : suffix == 'M' ? 1024 * 1024 : 1;
    const std::size_t digits = item.size() - (scale != 1 ? 1 : 0);
    std::int64_t value = 0, bytes = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + digits, value);
    if (digits == 0 || error != std::errc() || end != item.data() + digits) {
      throw ConfigError(key + "=" + text + ": item '" + item + "' is not a byte count (e.g. 4096, 64K, 8M)");
    }
    // The benchmarks allocate buffers of R times this; 1 GiB per rank is the
    // most a benchmark on one machine can mean.
    if (value <= 0 || __builtin_mul_overflow(value, scale, &bytes) || bytes > (std::int64_t{1} << 30)) {
      throw ConfigError(key + "=" + text + ": item " + item + " must be in (0, 1024M] bytes");
    }
  }
}

// Validates `arguments` (the part and key=value settings) of `which`.
// Returns the arguments for the benchmark. No fault_injection= here: the hook
// belongs to one run's ranks (core/fault_injection.h), and the benchmarks'
// many runs install no scope, so the key would be accepted and ignored.
std::vector<std::string> validated_bench_arguments(const std::string& which, const std::vector<std::string>& rest) {
  const bool collectives = which == "collectives";
  const std::vector<std::string> parts =
      collectives ? std::vector<std::string>{"links", "overlap", "mpi"} : std::vector<std::string>{"remat", "replicas"};
  std::vector<std::string> assignment_texts, forwarded;
  std::string part;
  for (const std::string& argument : rest) {
    if (argument.find('=') != std::string::npos) {
      assignment_texts.push_back(argument);
      forwarded.push_back(argument);
      continue;
    }
    if (!part.empty()) throw ConfigError(which + ": two parts given: " + part + ", " + argument);
    if (std::find(parts.begin(), parts.end(), argument) == parts.end()) {
      std::string list;
      for (const std::string& name : parts) list += (list.empty() ? "" : ", ") + name;
      throw ConfigError(which + ": unknown part '" + argument + "'; one of " + list +
                        (collectives ? "" : " (or none)"));
    }
    part = argument;
    forwarded.push_back(argument);
  }
  const KeyRegistry& registry = collectives ? collectives_key_registry() : layer_bench_key_registry();
  const ConfigValues values = registry.parse(run::parse_assignments(assignment_texts, which, kProgram));
  if (collectives) {
    check_int_list(values, "ranks", 1, 1024);
    check_size_list(values, "chunks");
  } else {
    check_int_list(values, "slots", 0, 63);
  }
  if (values.get_string("clock") == "modelled") {
    if (part == "mpi") throw ConfigError("clock=modelled: collectives mpi runs on the wall clock (MPI processes)");
    for (const std::string& item : list_items("hardware", values.get_string("hardware"))) {
      if (item != "all") hardware::load_hardware("hardware", item);  // ConfigError naming it
    }
    if (!collectives) {
      for (const std::string& item : list_items("tables", values.get_string("tables"))) {
        const std::vector<std::string>& names = modelled_layer_tables();
        if (item != "all" && std::find(names.begin(), names.end(), item) == names.end()) {
          std::string list;
          for (const std::string& name : names) list += ", " + name;
          throw ConfigError("tables=" + values.get_string("tables") + ": unknown table '" + item + "'; one of all" +
                            list);
        }
      }
      const std::int64_t ranks = values.is_set("ranks") ? values.get_int("ranks") : 8;  // the modelled default
      if (values.get_int("experts") % ranks != 0) {
        throw ConfigError("experts=" + std::to_string(values.get_int("experts")) +
                          ": must be a multiple of ranks=" + std::to_string(ranks));
      }
    }
  } else {
    for (const char* key : {"hardware", "compute_efficiency", "tables"}) {
      if (!collectives || std::string(key) != "tables") {
        if (values.is_set(key))
          throw ConfigError(values.setting(key) + ": applies to clock=modelled only (clock=wall)");
      }
    }
  }
  if (values.get_int("min_runs") > values.get_int("max_runs")) {
    throw ConfigError("min_runs=" + std::to_string(values.get_int("min_runs")) +
                      ": must be <= max_runs=" + std::to_string(values.get_int("max_runs")));
  }
  return forwarded;
}

int run_bench(const std::string& which, const std::vector<std::string>& rest) {
  const std::vector<std::string> validated = validated_bench_arguments(which, rest);
  std::vector<std::string> arguments = {std::string(kProgram) + " " + which};
  arguments.insert(arguments.end(), validated.begin(), validated.end());
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(arguments.size());
  if (which == "collectives") return run_collectives_bench(argc, argv.data());
  return run_ep_layer_bench(argc, argv.data());
}

void add_benchmark(CLI::App& app, const std::string& which, const std::string& description,
                   const KeyRegistry& registry) {
  CLI::App* command = app.add_subcommand(which, description);
  auto rest = std::make_shared<std::vector<std::string>>();
  command->add_option("arguments", *rest, "part and key=value settings");
  command->footer(registry.help_text());
  command->callback([which, rest] {
    const int status = run_bench(which, *rest);
    if (status != 0) throw Error(which + " exited with status " + std::to_string(status));
  });
}

}  // namespace

void add_bench_commands(CLI::App& app) {
  add_benchmark(app, "collectives",
                "[links|overlap|mpi]: ring all-gather, reduce-scatter, all-to-all-v vs bounds and MPI; "
                "clock=modelled: on the modelled clock per hardware preset (docs/BENCHMARKS.md, Modelled time)",
                collectives_key_registry());
  add_benchmark(app, "layer",
                "[remat|replicas]: the expert-parallel layer per dispatcher / remat policy / dynamic replicas under "
                "Zipf skew, on emulated links; trace_file=PATH traces its first configuration; clock=modelled: on the "
                "modelled clock per hardware preset",
                layer_bench_key_registry());
}

}  // namespace epmoe::bench
