// epmoe layer: one MoE layer forward (and backward when dy.npy is given) on
// arrays from .npy files. Everything that can be wrong with the keys or the
// files is checked before any compute, and nothing is written until the
// results exist; outputs then appear together (data/staged_output_dir.h).
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/config_keys.h"
#include "cli/json_output.h"
#include "cli/layer_key_groups.h"
#include "cli/yaml_overrides.h"
#include "core/error.h"
#include "core/memory_ledger.h"
#include "core/timer.h"
#include "data/npy.h"
#include "data/staged_output_dir.h"
#include "moe/moe_layer.h"

namespace epmoe::cli {
namespace {

constexpr char kCommand[] = "layer";
constexpr char kMetricsFile[] = "metrics.json";
constexpr auto kAnyDim = ExpectedShape::kAnyDim;

const KeyRegistry& layer_key_registry() {
  static const KeyRegistry registry(kCommand, {moe_layer_keys(), runtime_keys()});
  return registry;
}

struct LayerArguments {
  std::string in_dir;
  std::string out_dir;
  std::string config_file;  // optional YAML of keys
  std::vector<std::string> assignments;
};

// The layer's arrays, every shape checked against N, H (from x.npy), E (from
// gate.npy) and F (from wi0.npy).
struct LayerInputs {
  Tensor x, gate, wi0, wi1, wo;
  std::optional<Tensor> bias, dy;
  std::int64_t num_tokens = 0, hidden = 0, num_experts = 0, ffn = 0;
};

LayerInputs read_layer_inputs(const std::filesystem::path& in_dir) {
  if (!std::filesystem::is_directory(in_dir)) {
    throw FileError("--in " + in_dir.string() + ": no such directory");
  }
  const auto f32 = DType::f32;
  LayerInputs in;
  in.x = read_npy(in_dir / "x.npy", f32, {{kAnyDim, kAnyDim}, {"N", "H"}, ""});
  in.num_tokens = in.x.dim(0);
  in.hidden = in.x.dim(1);
  const std::int64_t n = in.num_tokens, h = in.hidden;
  in.gate = read_npy(in_dir / "gate.npy", f32, {{h, kAnyDim}, {"H", "E"}, "x.npy"});
  in.num_experts = in.gate.dim(1);
  const std::int64_t e = in.num_experts;
  in.wi0 = read_npy(in_dir / "wi0.npy", f32, {{e, h, kAnyDim}, {"E", "H", "F"}, "gate.npy and x.npy"});
  in.ffn = in.wi0.dim(2);
  const std::int64_t f = in.ffn;
  const std::string all_dims_source = "gate.npy, x.npy and wi0.npy";
  in.wi1 = read_npy(in_dir / "wi1.npy", f32, {{e, h, f}, {"E", "H", "F"}, all_dims_source});
  in.wo = read_npy(in_dir / "wo.npy", f32, {{e, f, h}, {"E", "F", "H"}, all_dims_source});
  if (std::filesystem::exists(in_dir / "bias.npy")) {
    in.bias = read_npy(in_dir / "bias.npy", f32, {{e}, {"E"}, "gate.npy"});
  }
  if (std::filesystem::exists(in_dir / "dy.npy")) {
    in.dy = read_npy(in_dir / "dy.npy", f32, {{n, h}, {"N", "H"}, "x.npy"});
  }
  return in;
}

// A bias file that the router would ignore is a mistake worth stopping for:
// the user believes the run used it.
void check_bias_is_used(const LayerInputs& in, const MoeLayerConfig& config) {
  if (in.bias && config.router.kind != RouterKind::sigmoid_grouped) {
    throw ConfigError("bias.npy is given but router=" + to_string(config.router.kind) +
                      " does not use a bias (only router=sigmoid_grouped does); remove the file "
                      "or choose that router");
  }
}

struct NamedOutput {
  std::string file_name;
  const Tensor* tensor;
};

struct LayerRun {
  MoeForwardOutput forward;
  std::optional<MoeGradients> gradients;
  double forward_seconds = 0;
  double backward_seconds = 0;
};

LayerRun run_layer(MoeLayer& layer, const LayerInputs& in) {
  const MoeWeights weights{&in.gate, &in.wi0, &in.wi1, &in.wo, in.bias ? &*in.bias : nullptr};
  LayerRun run;
  Stopwatch forward_watch;
  run.forward = layer.forward(in.x, weights);
  run.forward_seconds = forward_watch.elapsed_seconds();
  if (in.dy) {
    Stopwatch backward_watch;
    run.gradients = layer.backward(*in.dy);
    run.backward_seconds = backward_watch.elapsed_seconds();
  }
  return run;
}

std::vector<NamedOutput> layer_outputs(const LayerRun& run) {
  std::vector<NamedOutput> outputs = {{"y.npy", &run.forward.y},
                                      {"topk_ids.npy", &run.forward.topk_ids},
                                      {"topk_weights.npy", &run.forward.topk_weights}};
  if (run.gradients) {
    const MoeGradients& g = *run.gradients;
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
const std::vector<std::string> kGradientFiles = {"dx.npy", "dgate.npy", "dwi0.npy", "dwi1.npy",
                                                 "dwo.npy"};

nlohmann::json layer_metrics(const ConfigValues& values, const LayerInputs& in, const MoeLayer& layer,
                             const LayerRun& run, const std::vector<NamedOutput>& outputs) {
  const MoeLayerStats& stats = layer.stats();
  const std::vector<std::int64_t>& tokens_per_expert = layer.dispatch_stats().rows_per_local_expert;
  const std::int64_t routed_pairs =
      std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), std::int64_t{0});
  // Per routed (token, expert) pair the SwiGLU expert runs three [1, H] x
  // [H, F]-sized GEMMs (wi0, wi1, wo) of 2*H*F flops each; the backward runs
  // two per forward GEMM (dlhs and drhs).
  const double forward_gemm_flop = 6.0 * static_cast<double>(routed_pairs) *
                                   static_cast<double>(in.hidden) * static_cast<double>(in.ffn);
  const double gemm_gflop = forward_gemm_flop * (run.gradients ? 3.0 : 1.0) / 1e9;
  const auto& phases = stats.phase_seconds.seconds();
  double expert_seconds = 0;
  for (const char* phase : {"experts", "backward_experts"}) {
    if (const auto found = phases.find(phase); found != phases.end()) expert_seconds += found->second;
  }
  const double total_seconds = run.forward_seconds + run.backward_seconds;

  nlohmann::json metrics;
  metrics["command"] = kCommand;
  metrics["config"] = config_to_json(values);
  metrics["dims"] = {{"num_tokens", in.num_tokens}, {"hidden", in.hidden},
                     {"num_experts", in.num_experts}, {"ffn", in.ffn},
                     {"top_k", layer.config().router.top_k}};
  metrics["backward"] = run.gradients.has_value();
  metrics["bias"] = in.bias.has_value();
  nlohmann::json shapes = {{"x", shape_to_json(in.x.shape())},     {"gate", shape_to_json(in.gate.shape())},
                           {"wi0", shape_to_json(in.wi0.shape())}, {"wi1", shape_to_json(in.wi1.shape())},
                           {"wo", shape_to_json(in.wo.shape())}};
  if (in.bias) shapes["bias"] = shape_to_json(in.bias->shape());
  if (in.dy) shapes["dy"] = shape_to_json(in.dy->shape());
  for (const NamedOutput& output : outputs) {
    shapes[std::filesystem::path(output.file_name).stem().string()] = shape_to_json(output.tensor->shape());
  }
  metrics["shapes"] = shapes;
  nlohmann::json output_files = nlohmann::json::array();
  for (const NamedOutput& output : outputs) output_files.push_back(output.file_name);
  metrics["output_files"] = output_files;
  metrics["tokens_per_expert"] = tokens_per_expert;
  metrics["phase_seconds"] = phases;
  metrics["forward_seconds"] = run.forward_seconds;
  metrics["backward_seconds"] = run.backward_seconds;
  metrics["total_seconds"] = total_seconds;
  // The rate is over the expert phases (GEMMs plus the SwiGLU between them),
  // so it is comparable with the grouped GEMM benchmark.
  metrics["expert_gemm_gflop"] = gemm_gflop;
  metrics["expert_seconds"] = expert_seconds;
  metrics["expert_gflop_per_second"] = expert_seconds > 0 ? gemm_gflop / expert_seconds : 0.0;
  metrics["saved_activation_peak_bytes"] = stats.saved_activation_peak_bytes;
  return metrics;
}

void run_layer_command(const LayerArguments& arguments) {
  // Validation: keys, then --out, then every input file, then the config
  // rules that need the files' dimensions. Nothing has been computed or
  // written when one of these throws.
  std::vector<KeyAssignment> assignments;
  if (!arguments.config_file.empty()) assignments = load_yaml_overrides(arguments.config_file);
  for (KeyAssignment& assignment : parse_assignments(arguments.assignments, kCommand)) {
    assignments.push_back(std::move(assignment));  // after the file: the command line wins
  }
  const ConfigValues values = layer_key_registry().parse(assignments);
  StagedOutputDir::check_usable(arguments.out_dir);
  const LayerInputs inputs = read_layer_inputs(arguments.in_dir);
  const MoeLayerConfig config =
      moe_layer_config_from(values, inputs.hidden, inputs.ffn, inputs.num_experts);
  check_bias_is_used(inputs, config);
  apply_runtime_keys(values);

  MemoryLedger ledger;
  MoeLayer layer(config, &ledger);
  const LayerRun run = run_layer(layer, inputs);

  const std::vector<NamedOutput> outputs = layer_outputs(run);
  StagedOutputDir staged(arguments.out_dir);
  std::vector<std::string> file_names;
  for (const NamedOutput& output : outputs) {
    write_npy(staged.staged_path(output.file_name), *output.tensor);
    file_names.push_back(output.file_name);
  }
  write_json_file(staged.staged_path(kMetricsFile), layer_metrics(values, inputs, layer, run, outputs));
  staged.commit(file_names, kMetricsFile, run.gradients ? std::vector<std::string>{} : kGradientFiles);
}

}  // namespace

void add_layer_command(CLI::App& app) {
  auto arguments = std::make_shared<LayerArguments>();
  CLI::App* command = app.add_subcommand(
      kCommand, "Run one MoE layer forward (and backward when dy.npy is given) on .npy arrays");
  command->add_option("--in", arguments->in_dir,
                      "Directory with x.npy [N,H], gate.npy [H,E], wi0.npy and wi1.npy [E,H,F], "
                      "wo.npy [E,F,H]; optional bias.npy [E], dy.npy [N,H] (float32, C order)")
      ->required();
  command->add_option("--out", arguments->out_dir,
                      "Directory for y, topk_ids, topk_weights (and dx, dgate, dwi0, dwi1, dwo) "
                      ".npy and metrics.json (written last); created if missing")
      ->required();
  command->add_option("--config", arguments->config_file,
                      "YAML file of keys (e.g. configs/layer_example.yaml); key=value arguments "
                      "override it");
  command->add_option("assignments", arguments->assignments, "key=value settings (see Keys below)");
  command->footer(layer_key_registry().help_text());
  command->callback([arguments] { run_layer_command(*arguments); });
}

}  // namespace epmoe::cli
