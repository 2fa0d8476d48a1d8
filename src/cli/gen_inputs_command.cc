// epmoe gen-inputs: random inputs for `epmoe layer`, reproducible from a seed.
// Every array comes from its own stream of one seeded epmoe::Rng (never a
// global generator), so adding an array later does not change the others.
// Scaling keeps activations O(1): x and dy ~ N(0, 1), each weight matrix
// ~ N(0, scale^2 / fan_in), so x wi0, x wi1 and the expert outputs have unit
// variance at scale=1.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/memory_budget.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/npy.h"
#include "data/staged_output_dir.h"
#include "run/config_keys.h"
#include "run/json_output.h"

namespace epmoe::cli {

using run::config_to_json;
using run::ConfigValues;
using run::KeyGroup;
using run::KeyRegistry;
using run::KeyType;
using run::parse_assignments;
using run::shape_to_json;
using run::write_json_file;
namespace {

constexpr char kGenInputsCommand[] = "gen-inputs";
constexpr char kManifestFile[] = "inputs.json";
// Selection bias of the sigmoid_grouped router: small next to the sigmoid
// scores in (0, 1), as an aux-loss-free balancer leaves it.
constexpr double kBiasStddev = 0.1;

KeyGroup gen_inputs_keys() {
  return {
      "gen-inputs",
      {
          {.name = "num_tokens", .type = KeyType::integer, .default_value = "64", .help = "tokens (N)", .min_value = 0},
          {.name = "hidden",
           .type = KeyType::integer,
           .default_value = "32",
           .help = "hidden size (H)",
           .min_value = 1},
          {.name = "ffn",
           .type = KeyType::integer,
           .default_value = "48",
           .help = "expert FFN size (F)",
           .min_value = 1},
          {.name = "num_experts",
           .type = KeyType::integer,
           .default_value = "8",
           .help = "routed experts (E)",
           .min_value = 1},
          {.name = "seed",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "seed of every array",
           .min_value = 0},
          {.name = "with_dy",
           .type = KeyType::boolean,
           .default_value = "true",
           .help = "also write dy.npy [N,H], so `epmoe layer` runs the backward"},
          {.name = "with_bias",
           .type = KeyType::boolean,
           .default_value = "false",
           .help = "also write bias.npy [E] (for router=sigmoid_grouped)"},
          {.name = "scale",
           .type = KeyType::real,
           .default_value = "1.0",
           .help = "weight stddev as a multiple of 1/sqrt(fan_in)",
           .min_value = 0,
           .min_exclusive = true},
      },
  };
}

const KeyRegistry& gen_inputs_key_registry() {
  static const KeyRegistry registry(kGenInputsCommand, {gen_inputs_keys()});
  return registry;
}

// Streams of the root generator, one per array; fixed forever so that a seed
// keeps producing the same files.
enum class InputStream : std::uint64_t { x = 0, gate = 1, wi0 = 2, wi1 = 3, wo = 4, dy = 5, bias = 6 };

Tensor normal_tensor(Shape shape, double stddev, const Rng& root, InputStream stream) {
  Rng rng = root.fork(static_cast<std::uint64_t>(stream));
  Tensor tensor(DType::f32, std::move(shape));
  for (float& value : tensor.span<float>()) value = static_cast<float>(stddev * rng.normal());
  return tensor;
}

struct GenInputsArguments {
  std::string out_dir;
  std::vector<std::string> assignments;
};

// The bytes of every array, or ConfigError naming the keys when they do not
// fit int64 or this machine's memory: the arrays are made in memory before
// any is written, so a size that cannot be held would end in an allocation
// failure (or the OOM killer) after seconds of work instead of a message.
void check_input_sizes(const ConfigValues& values) {
  const std::int64_t n = values.get_int("num_tokens"), h = values.get_int("hidden"), f = values.get_int("ffn"),
                     e = values.get_int("num_experts");
  const std::string setting = "num_tokens=" + std::to_string(n) + " hidden=" + std::to_string(h) +
                              " ffn=" + std::to_string(f) + " num_experts=" + std::to_string(e);
  // x, dy [N,H]; gate [H,E]; wi0, wi1 [E,H,F]; wo [E,F,H]; bias [E]; float32.
  std::int64_t token_elements = 0, gate_elements = 0, weight_elements = 0, total_bytes = 0;
  const bool overflows = __builtin_mul_overflow(n, h, &token_elements) ||
                         __builtin_mul_overflow(h, e, &gate_elements) ||
                         __builtin_mul_overflow(gate_elements, f, &weight_elements) ||
                         __builtin_mul_overflow(weight_elements, std::int64_t{3}, &weight_elements) ||
                         __builtin_mul_overflow(token_elements, std::int64_t{2}, &token_elements) ||
                         __builtin_add_overflow(token_elements, weight_elements, &total_bytes) ||
                         __builtin_add_overflow(total_bytes, gate_elements, &total_bytes) ||
                         __builtin_add_overflow(total_bytes, e, &total_bytes) ||
                         __builtin_mul_overflow(total_bytes, std::int64_t{4}, &total_bytes);
  if (overflows) throw ConfigError(setting + ": the arrays' sizes overflow a 64-bit byte count");
  check_fits_in_memory(setting + ": the arrays", total_bytes);
}

void run_gen_inputs_command(const GenInputsArguments& arguments) {
  const ConfigValues values =
      gen_inputs_key_registry().parse(parse_assignments(arguments.assignments, kGenInputsCommand));
  check_input_sizes(values);
  // Claimed (locked) before the arrays are made: a second gen-inputs into the
  // same --out is refused before any work.
  StagedOutputDir staged(arguments.out_dir);
  const std::int64_t n = values.get_int("num_tokens"), h = values.get_int("hidden"), f = values.get_int("ffn"),
                     e = values.get_int("num_experts");
  const double scale = values.get_float("scale");
  const Rng root(static_cast<std::uint64_t>(values.get_int("seed")));
  const double hidden_fan_in = scale / std::sqrt(static_cast<double>(h));
  const double ffn_fan_in = scale / std::sqrt(static_cast<double>(f));

  struct NamedInput {
    std::string file_name;
    Tensor tensor;
  };
  std::vector<NamedInput> inputs;
  inputs.push_back({"x.npy", normal_tensor({n, h}, 1.0, root, InputStream::x)});
  inputs.push_back({"gate.npy", normal_tensor({h, e}, hidden_fan_in, root, InputStream::gate)});
  inputs.push_back({"wi0.npy", normal_tensor({e, h, f}, hidden_fan_in, root, InputStream::wi0)});
  inputs.push_back({"wi1.npy", normal_tensor({e, h, f}, hidden_fan_in, root, InputStream::wi1)});
  inputs.push_back({"wo.npy", normal_tensor({e, f, h}, ffn_fan_in, root, InputStream::wo)});
  std::vector<std::string> obsolete_files;  // optional files of an earlier run not made now
  if (values.get_bool("with_dy")) {
    inputs.push_back({"dy.npy", normal_tensor({n, h}, 1.0, root, InputStream::dy)});
  } else {
    obsolete_files.push_back("dy.npy");
  }
  if (values.get_bool("with_bias")) {
    inputs.push_back({"bias.npy", normal_tensor({e}, kBiasStddev, root, InputStream::bias)});
  } else {
    obsolete_files.push_back("bias.npy");
  }

  std::vector<std::string> file_names;
  nlohmann::json shapes;
  for (const NamedInput& input : inputs) {
    write_npy(staged.staged_path(input.file_name), input.tensor);
    file_names.push_back(input.file_name);
    shapes[std::filesystem::path(input.file_name).stem().string()] = shape_to_json(input.tensor.shape());
  }
  // The manifest records how the files were made and marks the set complete.
  const nlohmann::json manifest = {
      {"command", kGenInputsCommand}, {"config", config_to_json(values)}, {"shapes", shapes}};
  write_json_file(staged.staged_path(kManifestFile), manifest);
  staged.commit(file_names, kManifestFile, obsolete_files);
}

}  // namespace

void add_gen_inputs_command(CLI::App& app) {
  auto arguments = std::make_shared<GenInputsArguments>();
  CLI::App* command = app.add_subcommand(
      kGenInputsCommand, "Write seeded random inputs (x, gate, wi0, wi1, wo, dy, bias .npy) for `epmoe layer`");
  command
      ->add_option("--out", arguments->out_dir,
                   "Directory for the .npy files and inputs.json (written last); created if missing")
      ->required();
  command->add_option("assignments", arguments->assignments, "key=value settings (see Keys below)");
  command->footer(gen_inputs_key_registry().help_text());
  command->callback([arguments] { run_gen_inputs_command(*arguments); });
}

}  // namespace epmoe::cli
