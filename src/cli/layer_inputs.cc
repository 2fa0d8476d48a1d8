#include "cli/layer_inputs.h"

#include <string>
#include <utility>

#include "core/error.h"
#include "core/finite_check.h"
#include "data/npy.h"

namespace epmoe::cli {

LayerInputs read_layer_inputs(const std::filesystem::path& in_dir) {
  constexpr auto kAnyDim = ExpectedShape::kAnyDim;
  if (in_dir.empty()) throw FileError("--in '': the input directory path is empty");
  if (!std::filesystem::is_directory(in_dir)) {
    throw FileError("--in " + in_dir.string() +
                    (std::filesystem::exists(in_dir) ? ": not a directory (--in names the directory of .npy files)"
                                                     : ": no such directory"));
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
  // Refused here, by file and whole-array index, before any rank starts (the
  // layer checks again, but only knows its own rank's rows).
  for (const auto& [name, tensor] : {std::pair<const char*, const Tensor*>{"x.npy", &in.x},
                                     {"gate.npy", &in.gate},
                                     {"wi0.npy", &in.wi0},
                                     {"wi1.npy", &in.wi1},
                                     {"wo.npy", &in.wo}}) {
    check_finite((in_dir / name).string(), *tensor, "npy inputs must be finite");
  }
  if (in.bias) check_finite((in_dir / "bias.npy").string(), *in.bias, "npy inputs must be finite");
  if (in.dy) check_finite((in_dir / "dy.npy").string(), *in.dy, "npy inputs must be finite");
  return in;
}

void check_bias_is_used(const LayerInputs& inputs, const MoeLayerConfig& config) {
  if (inputs.bias && config.router.kind != RouterKind::sigmoid_grouped) {
    throw ConfigError("bias.npy is given but router=" + to_string(config.router.kind) +
                      " does not use a bias (only router=sigmoid_grouped does); remove the file "
                      "or choose that router");
  }
}

}  // namespace epmoe::cli
