// epmoe layer: one MoE layer forward (and backward when dy.npy is given) on
// arrays from .npy files, on one rank or expert-parallel over ranks=R threads
// or mpirun processes (run/expert_parallel_run.h). Everything that can be
// wrong with the keys or the files is checked before any compute (and, under
// mpirun, before MPI_Init, so every process fails alike with one line), and
// nothing is written until the results exist; outputs then appear together
// (data/staged_output_dir.h), written by one process only.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "data/npy.h"
#include "data/output_paths.h"
#include "data/staged_output_dir.h"
#include "kernels/gemm.h"
#include "run/config_keys.h"
#include "run/expert_parallel_run.h"
#include "run/json_output.h"
#include "run/layer_inputs.h"
#include "run/layer_key_groups.h"
#include "run/layer_metrics.h"
#include "run/modelled_time_report.h"
#include "run/modelled_time_settings.h"
#include "run/run_faults.h"
#include "run/yaml_overrides.h"

namespace epmoe::cli {

using run::check_bias_is_used;
using run::command_assignments;
using run::ConfigValues;
using run::expert_parallel_settings_from;
using run::ExpertParallelSettings;
using run::fault_injector_from;
using run::FaultSpecSource;
using run::layer_key_registry;
using run::layer_metrics;
using run::LayerInputFiles;
using run::LayerInputs;
using run::LayerRunResult;
using run::modelled_summary_line;
using run::moe_layer_config_from;
using run::non_empty_config_path;
using run::RankReport;
using run::read_layer_inputs;
using run::run_layer_across_ranks;
using run::TransportKind;
using run::write_json_file;
namespace {

// Which implementation ran the run's products (kernels/gemm.h): this
// process's count, so every rank's with ranks as threads and rank 0's alone
// under mpirun (all ranks run the same code on the same kind of CPU). Calls
// and FLOPs only: the primitives created depend on which OpenMP worker ran
// which group (each keeps its own), and identical runs must write identical
// metrics (clock=modelled, ModelledDeterminism).
nlohmann::json gemm_implementations() {
  nlohmann::json out = nlohmann::json::array();
  for (const GemmImplementationUse& use : gemm_implementation_census()) {
    out.push_back({{"implementation", use.implementation},
                   {"compute_dtype", to_string(use.compute_dtype)},
                   {"calls", use.calls},
                   {"gflop", static_cast<double>(use.flops) * 1e-9}});
  }
  return out;
}

constexpr char kLayerCommand[] = "layer";
constexpr char kMetricsFile[] = "metrics.json";

struct LayerArguments {
  std::string in_dir;
  std::string out_dir;
  std::string config_file;  // optional YAML of keys
  std::vector<std::string> assignments;
};

struct NamedOutput {
  std::string file_name;
  const Tensor* tensor;
};

std::vector<NamedOutput> layer_outputs(const LayerRunResult& run) {
  std::vector<NamedOutput> outputs = {{"y.npy", &run.outputs.y},
                                      {"topk_ids.npy", &run.outputs.topk_ids},
                                      {"topk_weights.npy", &run.outputs.topk_weights}};
  if (run.outputs.gradients) {
    const MoeGradients& g = *run.outputs.gradients;
    outputs.insert(outputs.end(), {{"dx.npy", &g.dx},
                                   {"dgate.npy", &g.dgate},
                                   {"dwi0.npy", &g.dwi0},
                                   {"dwi1.npy", &g.dwi1},
                                   {"dwo.npy", &g.dwo}});
  }
  return outputs;
}

// Files of an earlier run with dy that a run without dy does not replace;
// removed so they cannot pass for this run's gradients.
const std::vector<std::string> kGradientFiles = {"dx.npy", "dgate.npy", "dwi0.npy", "dwi1.npy", "dwo.npy"};

void run_layer_command(const LayerArguments& arguments) {
  // Validation: keys, then every output path (--out, trace_file), then every
  // input file, then the config rules that need the files' dimensions.
  // Nothing has been computed or written when one of these throws.
  const ConfigValues values =
      layer_key_registry().parse(command_assignments(arguments.config_file, arguments.assignments, kLayerCommand));
  check_output_paths({{"--out", arguments.out_dir, OutputPath::Kind::staged_directory},
                      {"trace_file", values.get_string("trace_file"), OutputPath::Kind::file}});
  const LayerInputFiles files = read_layer_inputs(arguments.in_dir);
  const LayerInputs& inputs = files.inputs;
  const MoeLayerConfig config = moe_layer_config_from(values, inputs.hidden, inputs.ffn, inputs.num_experts);
  check_bias_is_used(inputs, config);
  ExpertParallelSettings settings = expert_parallel_settings_from(values, config);
  const std::unique_ptr<FaultInjector> faults =
      fault_injector_from(values, settings.num_ranks, FaultSpecSource::key_or_environment);
  settings.faults = faults.get();
  std::optional<TraceRecorder> trace;
  if (!settings.trace_file.empty()) {
    trace.emplace();
    settings.trace = &*trace;
  }

  // The output directory is claimed (locked, staging created) before the
  // compute, so a second run into the same --out is refused at once rather
  // than after its work. Not under mpirun: the ranks meet in MPI_Init, and
  // rank 0 alone refusing there would leave the others waiting; rank 0
  // claims it after the compute instead.
  std::optional<StagedOutputDir> staged;
  if (settings.transport == TransportKind::threads) staged.emplace(arguments.out_dir);

  const std::optional<LayerRunResult> run = run_layer_across_ranks(inputs, config, settings);
  if (!run) return;  // an MPI rank other than 0: rank 0 writes the gathered outputs

  const std::vector<NamedOutput> outputs = layer_outputs(*run);
  if (!staged) staged.emplace(arguments.out_dir);
  std::vector<std::string> file_names;
  for (const NamedOutput& output : outputs) {
    write_npy(staged->staged_path(output.file_name), *output.tensor);
    file_names.push_back(output.file_name);
  }
  nlohmann::json metrics = layer_metrics(values, inputs, config, settings, run->ranks, file_names);
  metrics["gemm_implementations"] = gemm_implementations();
  write_json_file(staged->staged_path(kMetricsFile), metrics);
  // Before the commit: a trace that cannot be written leaves --out as it was.
  if (trace) trace->write(settings.trace_file);
  staged->commit(file_names, kMetricsFile, run->outputs.gradients ? std::vector<std::string>{} : kGradientFiles);
  // One line for a person at a terminal; the numbers live in metrics.json.
  char backward[64] = "";
  if (run->outputs.gradients)
    std::snprintf(backward, sizeof backward, ", backward %.1f ms", metrics.value("backward_seconds", 0.0) * 1e3);
  // With clock=modelled the phase times, and so the expert rate, are modelled.
  std::printf(
      "epmoe layer: N=%lld H=%lld F=%lld E=%lld K=%d on %zu rank(s): forward %.1f ms%s, "
      "experts %.1f GFLOP/s%s; %zu files + %s in %s\n",
      static_cast<long long>(inputs.num_tokens), static_cast<long long>(inputs.hidden),
      static_cast<long long>(inputs.ffn), static_cast<long long>(inputs.num_experts), config.router.top_k,
      run->ranks.size(), metrics.value("forward_seconds", 0.0) * 1e3, backward,
      metrics.value("expert_gflop_per_second", 0.0), settings.modelled.enabled ? " (modelled)" : "", file_names.size(),
      kMetricsFile, arguments.out_dir.c_str());
  if (settings.modelled.enabled) {
    std::vector<ModelledRankTime> modelled;
    for (const RankReport& report : run->ranks) modelled.push_back(report.modelled.value_or(ModelledRankTime{}));
    std::printf("  %s\n", modelled_summary_line(modelled_step(modelled), settings).c_str());
  }
  if (trace)
    std::printf("  trace: %s (%zu events; open in https://ui.perfetto.dev)\n", settings.trace_file.c_str(),
                trace->num_events());
}

}  // namespace

void add_layer_command(CLI::App& app) {
  auto arguments = std::make_shared<LayerArguments>();
  CLI::App* command =
      app.add_subcommand(kLayerCommand,
                         "Run one MoE layer forward (and backward when dy.npy is given) on .npy arrays, on one "
                         "rank or expert-parallel (ranks=R threads, or transport=mpi under mpirun)");
  command
      ->add_option("--in", arguments->in_dir,
                   "Directory with x.npy [N,H], gate.npy [H,E], wi0.npy and wi1.npy [E,H,F], "
                   "wo.npy [E,F,H]; optional bias.npy [E], dy.npy [N,H] (float32, C order). "
                   "Always the full arrays: each rank takes its own rows and experts")
      ->required();
  command
      ->add_option("--out", arguments->out_dir,
                   "Directory for y, topk_ids, topk_weights (and dx, dgate, dwi0, dwi1, dwo) "
                   ".npy and metrics.json (written last); created if missing. With ranks > 1 "
                   "the outputs are gathered into the same shapes as one rank (dgate summed)")
      ->required();
  command
      ->add_option("--config", arguments->config_file,
                   "YAML file of keys (e.g. configs/layer_example.yaml); key=value arguments "
                   "override it")
      ->check(non_empty_config_path);
  command->add_option("assignments", arguments->assignments, "key=value settings (see Keys below)");
  command->footer(layer_key_registry().help_text());
  command->callback([arguments] { run_layer_command(*arguments); });
}

}  // namespace epmoe::cli
