// epmoe balance: offline expert load balancing on per-step expert loads.
//   epmoe balance --generate FILE.npy [key=value ...]  writes Zipf-skewed loads
//                                                     (balance/load_generator.h)
//   epmoe balance --loads FILE [key=value ...]         replays balancing
//                                                     policies over them
//                                                     (balance/policy_replay.h)
// A loads file is int64 .npy [steps, E] (global (token, k) pairs per expert
// and step) or `epmoe train`'s metrics.jsonl, whose "expert_counts" hold them
// per layer (cli/metrics_loads.h; each layer replayed on its own). The replay
// prints, per policy, mean and worst max/mean rank load and the expert
// weights moved per step; --json prints the same as one JSON object for
// scripts, with every step's plan: copies (expert, rank, quota) and weight
// moves (rank, expert).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "balance/load_generator.h"
#include "balance/policy_replay.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/memory_budget.h"
#include "cli/metrics_loads.h"
#include "core/error.h"
#include "core/file_error.h"
#include "core/tensor.h"
#include "data/atomic_file.h"
#include "data/npy.h"
#include "run/balance_replay.h"
#include "run/config_keys.h"
#include "run/json_output.h"

namespace epmoe::cli {

using run::config_to_json;
using run::ConfigValues;
using run::KeyGroup;
using run::KeyRegistry;
using run::KeyType;
using run::parse_assignments;
using run::replay_key_registry;
using run::replay_policies_json;
using run::replay_settings;
using run::ReplaySettings;
using run::shape_to_json;
namespace {

constexpr char kBalanceCommand[] = "balance";

// What --json prints, under "policies" (an .npy) or "layers"[i]."policies"
// (a metrics.jsonl), kept next to the keys so --help shows it.
constexpr char kJsonHelp[] =
    "--loads FILE: a name ending in .jsonl, or a file starting with '{', is read as epmoe train's metrics.jsonl:\n"
    "  its \"expert_counts\" [layers][E], one row per step in step order; a step on several lines takes the last.\n"
    "--json (--loads): one JSON object: command, loads, source (\"npy\" or \"metrics\"), num_steps, num_experts,\n"
    "  expert_weight_bytes, config, then for an .npy \"policies\": [...] and for a metrics.jsonl num_layers,\n"
    "  superseded_lines and \"layers\": [{\"layer\": l, \"policies\": [...]}]. A policy: policy, the summary figures\n"
    "  of the table, and with plans=true \"steps\": [{\"step\": s (0-based row), \"train_step\" (metrics only),\n"
    "  max_over_mean, ideal_max_over_mean (ceil(total/R)/mean, no plan does better), reached_ideal,\n"
    "  expert_moves, active_replicas, \"copies\": [[expert, rank, quota], ...] by expert (home\n"
    "  first; eplb by rank; quotas sum to the expert's count), \"moves\": [[rank, expert], ...] the pairs that\n"
    "  receive the expert's weights in this step (held now, not in the step before; before step 0: the homes)}].\n";

KeyGroup generate_keys() {
  return {
      "with --generate: Zipf-skewed loads",
      {
          {.name = "experts",
           .type = KeyType::integer,
           .default_value = "64",
           .help = "routed experts (E)",
           .min_value = 1},
          {.name = "ranks",
           .type = KeyType::integer,
           .default_value = "8",
           .help = "ranks (R) whose tokens route; hot experts spread over them",
           .min_value = 1},
          {.name = "tokens_per_rank",
           .type = KeyType::integer,
           .default_value = "1024",
           .help = "tokens per rank per step (T)",
           .min_value = 0},
          {.name = "top_k",
           .type = KeyType::integer,
           .default_value = "8",
           .help = "distinct experts per token (K)",
           .min_value = 1},
          {.name = "steps",
           .type = KeyType::integer,
           .default_value = "200",
           .help = "steps (rows of the file)",
           .min_value = 1},
          {.name = "zipf",
           .type = KeyType::real,
           .default_value = "1.2",
           .help = "Zipf exponent s of expert popularity; 0 = uniform",
           .min_value = 0},
          {.name = "placement",
           .type = KeyType::choice,
           .default_value = "spread",
           .help = "hot experts round-robin over ranks, or all on rank 0",
           .choices = {"spread", "packed"}},
          {.name = "drift",
           .type = KeyType::choice,
           .default_value = "none",
           .help = "popularity drift: a random adjacent swap, or a rotation by one rank",
           .choices = {"none", "swap", "rotate"}},
          {.name = "drift_interval",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "steps between drift events",
           .min_value = 1},
          {.name = "seed",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "seed of the generator",
           .min_value = 0},
      },
  };
}

const KeyRegistry& generate_key_registry() {
  static const KeyRegistry registry(std::string(kBalanceCommand) + " --generate", {generate_keys()});
  return registry;
}

struct BalanceArguments {
  std::string loads_file;     // --loads
  std::string generate_file;  // --generate
  bool json = false;
  std::string report_file;  // --report
  std::vector<std::string> assignments;
};

// --- --generate ----------------------------------------------------------

// The target of --generate is checked before the (seconds-long) generation,
// so an unwritable path fails at once. A real mkdir in the directory, since
// access() answers yes to root where creating fails (/proc, read-only mounts).
void check_generate_target(const std::filesystem::path& file) {
  std::error_code error;
  const auto status = std::filesystem::status(file, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw FileError(file.string() + ": exists and is not a regular file (--generate writes an .npy file)");
  }
  const std::filesystem::path dir = std::filesystem::absolute(file).parent_path();
  if (!std::filesystem::is_directory(dir)) {
    throw FileError(file.string() + ": directory " + dir.string() +
                    " does not exist (--generate creates no directories)");
  }
  const std::filesystem::path probe = dir / (".epmoe-probe-" + std::to_string(::getpid()));
  if (::mkdir(probe.c_str(), 0700) != 0 && errno != EEXIST) {
    throw_file_error(file, "cannot create files in " + dir.string() + ": " + errno_text());
  }
  ::rmdir(probe.c_str());
}

void run_generate(const BalanceArguments& arguments) {
  const ConfigValues values = generate_key_registry().parse(parse_assignments(arguments.assignments, kBalanceCommand));
  check_generate_target(arguments.generate_file);
  balance::LoadGeneratorOptions options;
  options.num_experts = values.get_int32("experts");
  options.num_ranks = values.get_int32("ranks");
  options.num_tokens_per_rank = values.get_int("tokens_per_rank");
  options.top_k = values.get_int32("top_k");
  options.num_steps = values.get_int32("steps");
  options.zipf_exponent = values.get_float("zipf");
  options.placement = values.get_string("placement") == "packed" ? balance::HotExpertPlacement::packed
                                                                 : balance::HotExpertPlacement::spread;
  const std::string& drift = values.get_string("drift");
  options.drift = drift == "swap"     ? balance::PopularityDrift::swap
                  : drift == "rotate" ? balance::PopularityDrift::rotate
                                      : balance::PopularityDrift::none;
  options.drift_interval_steps = values.get_int32("drift_interval");
  options.seed = static_cast<std::uint64_t>(values.get_int("seed"));
  balance::validate(options);  // before the (seconds-long) generation
  // The history and the tensor written from it: two int64 [steps, E] arrays.
  check_fits_in_memory("steps=" + std::to_string(options.num_steps) + " experts=" + std::to_string(options.num_experts),
                       std::int64_t{16} * options.num_steps * options.num_experts);

  const balance::ExpertLoadHistory history = balance::generate_expert_loads(options);
  Tensor loads(DType::i64, {history.num_steps, history.num_experts});
  std::copy(history.counts.begin(), history.counts.end(), loads.data<std::int64_t>());
  write_npy(arguments.generate_file, loads);

  if (arguments.json) {
    const nlohmann::json summary = {{"command", kBalanceCommand},
                                    {"generated", arguments.generate_file},
                                    {"shape", shape_to_json(loads.shape())},
                                    {"config", config_to_json(values)}};
    std::printf("%s\n", summary.dump(2).c_str());
  } else {
    std::printf("wrote %s: int64 [%d, %d] expert loads (%d ranks x %lld tokens x top-%d per step)\n",
                arguments.generate_file.c_str(), history.num_steps, history.num_experts, options.num_ranks,
                static_cast<long long>(options.num_tokens_per_rank), options.top_k);
  }
}

// --- --loads -----------------------------------------------------------------

balance::ExpertLoadHistory read_loads(const std::string& file) {
  const Tensor loads =
      read_npy(file, DType::i64, ExpectedShape{{ExpectedShape::kAnyDim, ExpectedShape::kAnyDim}, {"steps", "E"}, ""});
  if (loads.dim(0) > std::numeric_limits<int>::max() || loads.dim(1) > std::numeric_limits<int>::max()) {
    throw FileError(file + ": shape " + shape_to_string(loads.shape()) + " has more than 2^31-1 steps or experts");
  }
  balance::ExpertLoadHistory history;
  history.num_steps = static_cast<int>(loads.dim(0));
  history.num_experts = static_cast<int>(loads.dim(1));
  if (history.num_steps == 0 || history.num_experts == 0) {
    throw FileError(file + ": shape " + shape_to_string(loads.shape()) + " has no steps or no experts");
  }
  const auto counts = loads.span<std::int64_t>();
  history.counts.assign(counts.begin(), counts.end());
  // The replay adds loads up (per rank, per step, over windows of steps) in
  // int64; a file whose total overflows would wrap to negative sums and
  // report nonsense such as max/mean 0.000. The total bounds every partial
  // sum, so checking it once suffices.
  std::int64_t total = 0;
  for (std::size_t i = 0; i < history.counts.size(); ++i) {
    const std::string index =
        "loads[" + std::to_string(i / history.num_experts) + ", " + std::to_string(i % history.num_experts) + "]";
    if (history.counts[i] < 0) {
      throw FileError(file + ": " + index + " = " + std::to_string(history.counts[i]) +
                      "; expert loads are token counts >= 0");
    }
    if (__builtin_add_overflow(total, history.counts[i], &total)) {
      throw FileError(file + ": the loads' sum overflows a 64-bit integer at " + index + " = " +
                      std::to_string(history.counts[i]) + "; expert loads are token counts (at most 2^63-1 in all)");
    }
  }
  return history;
}

// layer=: every layer (nullopt) or one, 0-based.
std::optional<int> layer_to_replay(const ConfigValues& values) {
  const std::string& text = values.get_string("layer");
  if (text == "all") return std::nullopt;
  int layer = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), layer);
  if (error != std::errc() || end != text.data() + text.size() || layer < 0) {
    throw ConfigError("layer=" + text + ": expected a layer index >= 0 or all");
  }
  return layer;
}

// One loads history to replay: an .npy's, or one layer of a metrics file.
struct LoadsToReplay {
  std::optional<int> layer;  // metrics: the layer
  const balance::ExpertLoadHistory* history = nullptr;
};

// Indented like dump(2), except that an array holding no object is written
// on one line: a step's copies and moves stay one line each.
void write_json(const nlohmann::json& value, int indent, std::string& out) {
  const auto compact = [](const nlohmann::json& v) {
    return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  bool nested = value.is_object() && !value.empty();
  if (value.is_array()) {
    for (const nlohmann::json& item : value) nested = nested || item.is_object();
  }
  if (!nested) {
    out += compact(value);
    return;
  }
  out += value.is_object() ? "{\n" : "[\n";
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!first) out += ",\n";
    first = false;
    out.append(static_cast<std::size_t>(indent + 2), ' ');
    if (value.is_object()) out += compact(it.key()) + ": ";
    write_json(*it, indent + 2, out);
  }
  out += "\n";
  out.append(static_cast<std::size_t>(indent), ' ');
  out += value.is_object() ? "}" : "]";
}

void print_table(const nlohmann::json& policies) {
  std::printf("%-8s %14s %15s %15s %9s %13s %11s %15s %16s\n", "policy", "mean max/mean", "worst max/mean",
              "mean from P", "at ideal", "moves/step", "max moves", "MB moved/step", "active replicas");
  for (const nlohmann::json& row : policies) {
    std::printf("%-8s %14.3f %15.3f %15.3f %8.0f%% %13.2f %11d %15.1f %16.1f\n",
                row["policy"].get<std::string>().c_str(), row["mean_max_over_mean"].get<double>(),
                row["worst_max_over_mean"].get<double>(), row["mean_max_over_mean_from_first_period"].get<double>(),
                100.0 * row["fraction_of_steps_at_ideal"].get<double>(),
                row["mean_expert_moves_per_step"].get<double>(), row["max_expert_moves_in_a_step"].get<int>(),
                row["mean_weight_bytes_moved_per_step"].get<double>() / 1e6, row["mean_active_replicas"].get<double>());
  }
}

// --report: the replay drawn by the Python package's report module
// (python/epmoe/report.py, matplotlib), which must be importable by
// $EPMOE_PYTHON (default python3). The replay's JSON goes to a temporary
// file beside the report; the report appears whole or not at all.
void draw_replay_report(const std::string& replay_json, const std::string& report_file) {
  const std::filesystem::path report(report_file);
  const std::filesystem::path replay = report.string() + ".replay.json";
  write_file_atomically(replay, {replay_json, "\n"});
  const char* python = std::getenv("EPMOE_PYTHON");
  const std::string interpreter = python != nullptr && *python != '\0' ? python : "python3";
  const auto quoted = [](const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  };
  const std::string command = quoted(interpreter) + " -m epmoe.report --balance " + quoted(replay.string()) +
                              " --out " + quoted(report.string());
  const int status = std::system(command.c_str());
  std::filesystem::remove(replay);
  if (status != 0) {
    throw FileError("--report " + report_file + ": " + interpreter + " -m epmoe.report failed (exit status " +
                    std::to_string(status) +
                    "); it needs the epmoe Python package (pip install . from the repository; set EPMOE_PYTHON to "
                    "the interpreter that has it)");
  }
}

void run_replay(const BalanceArguments& arguments) {
  const ConfigValues values = replay_key_registry().parse(parse_assignments(arguments.assignments, kBalanceCommand));
  const ReplaySettings replay = replay_settings(values, arguments.json || !arguments.report_file.empty());
  const balance::PolicyReplayOptions& options = replay.options;
  const double expert_weight_bytes = replay.expert_weight_bytes;
  const std::optional<int> layer = layer_to_replay(values);

  const bool from_metrics = is_metrics_file(arguments.loads_file);
  std::optional<MetricsLoads> metrics;
  balance::ExpertLoadHistory npy_history;
  std::vector<LoadsToReplay> inputs;
  if (from_metrics) {
    metrics = read_metrics_loads(arguments.loads_file, layer);
    for (std::size_t i = 0; i < metrics->layers.size(); ++i)
      inputs.push_back({metrics->layers[i], &metrics->history[i]});
  } else {
    if (layer) {
      throw ConfigError("layer=" + values.get_string("layer") + ": only a metrics.jsonl has layers; " +
                        arguments.loads_file + " is read as an .npy [steps, E] of one layer's loads");
    }
    npy_history = read_loads(arguments.loads_file);
    inputs.push_back({std::nullopt, &npy_history});
  }
  const int num_steps = inputs.front().history->num_steps, num_experts = inputs.front().history->num_experts;
  balance::validate(options, num_experts);  // every key checked before any replay

  nlohmann::json layers = nlohmann::json::array();
  for (const LoadsToReplay& input : inputs) {
    nlohmann::json policies = replay_policies_json(*input.history, replay, metrics ? &metrics->train_steps : nullptr);
    layers.push_back(
        {{"layer", input.layer ? nlohmann::json(*input.layer) : nlohmann::json()}, {"policies", std::move(policies)}});
  }

  if (arguments.json || !arguments.report_file.empty()) {
    nlohmann::json report = {{"command", kBalanceCommand},
                             {"loads", arguments.loads_file},
                             {"source", from_metrics ? "metrics" : "npy"},
                             {"num_steps", num_steps},
                             {"num_experts", num_experts},
                             {"expert_weight_bytes", expert_weight_bytes},
                             {"config", config_to_json(values)}};
    if (metrics) {
      report["num_layers"] = metrics->num_layers;
      report["superseded_lines"] = metrics->superseded_lines;
      report["layers"] = std::move(layers);
    } else {
      report["policies"] = std::move(layers[0]["policies"]);
    }
    std::string text;
    write_json(report, 0, text);
    if (!arguments.report_file.empty()) {
      draw_replay_report(text, arguments.report_file);
    } else {
      std::printf("%s\n", text.c_str());
    }
    return;
  }
  const std::string settings =
      "ranks=" + std::to_string(options.num_ranks) + " slots=" + std::to_string(options.num_redundant_slots_per_rank) +
      " window=" + std::to_string(options.window_steps) + " period=" + std::to_string(options.period_steps);
  if (!metrics) {
    std::printf("%s: %d steps, %d experts; %s rebalance_threshold=%g\n", arguments.loads_file.c_str(), num_steps,
                num_experts, settings.c_str(), options.rebalance_threshold);
    print_table(layers[0]["policies"]);
    return;
  }
  std::printf("%s: %d steps (training steps %lld-%lld), %d layer%s of %d experts; %s rebalance_threshold=%g\n",
              arguments.loads_file.c_str(), num_steps, static_cast<long long>(metrics->train_steps.front()),
              static_cast<long long>(metrics->train_steps.back()), metrics->num_layers,
              metrics->num_layers == 1 ? "" : "s", num_experts, settings.c_str(), options.rebalance_threshold);
  if (metrics->superseded_lines > 0) {
    std::printf("note: %d line(s) replaced by a later line of the same step (the last line of a step wins)\n",
                metrics->superseded_lines);
  }
  for (const nlohmann::json& entry : layers) {
    std::printf("layer %d\n", entry["layer"].get<int>());
    print_table(entry["policies"]);
  }
}

void run_balance_command(const BalanceArguments& arguments) {
  if (arguments.generate_file.empty() == arguments.loads_file.empty()) {
    throw ConfigError("give exactly one of --loads FILE.npy (replay policies) and --generate FILE.npy (write loads)");
  }
  if (!arguments.generate_file.empty()) {
    run_generate(arguments);
  } else {
    run_replay(arguments);
  }
}

}  // namespace

void add_balance_command(CLI::App& app) {
  auto arguments = std::make_shared<BalanceArguments>();
  CLI::App* command =
      app.add_subcommand(kBalanceCommand,
                         "Replay expert-balancing policies (none, eplb, dynamic, hybrid) on per-step expert loads, "
                         "or generate such loads");
  command
      ->add_option("--loads", arguments->loads_file,
                   "global expert loads to replay: int64 .npy [steps, E], or epmoe train's metrics.jsonl "
                   "(its expert_counts, per layer)")
      ->check(file_name_value());
  command->add_option("--generate", arguments->generate_file, "write Zipf-skewed loads to this .npy")
      ->check(file_name_value());
  command->add_flag("--json", arguments->json, "print the results, with every step's plan, as one JSON object (below)");
  command
      ->add_option("--report", arguments->report_file,
                   "draw the replay (max/mean per step per policy, the placement of copies) into this HTML file, "
                   "with the epmoe Python package's report module ($EPMOE_PYTHON, default python3)")
      ->check(file_name_value());
  command->add_option("assignments", arguments->assignments, "key=value settings (see Keys below)");
  command->footer(replay_key_registry().help_text() + "\n" + generate_key_registry().help_text() + "\n" + kJsonHelp);
  command->callback([arguments] { run_balance_command(*arguments); });
}

}  // namespace epmoe::cli
