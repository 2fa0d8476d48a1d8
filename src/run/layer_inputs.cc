#include "run/layer_inputs.h"

#include <string>
#include <utility>

#include "core/error.h"
#include "core/finite_check.h"
#include "data/npy.h"

namespace epmoe::run {
namespace {

void check_finite_inputs(const LayerInputs& in, const LayerArrayNames& names, std::string_view rule) {
  const std::array<const TensorView*, 5> required = {&in.x, &in.gate, &in.wi0, &in.wi1, &in.wo};
  for (std::size_t i = 0; i < required.size(); ++i) check_finite(names[i], *required[i], rule);
  if (in.bias) check_finite(names[5], *in.bias, rule);
  if (in.dy) check_finite(names[6], *in.dy, rule);
}

}  // namespace

LayerInputFiles read_layer_inputs(const std::filesystem::path& in_dir) {
  constexpr auto kAnyDim = ExpectedShape::kAnyDim;
  if (in_dir.empty()) throw FileError("--in '': the input directory path is empty");
  if (!std::filesystem::is_directory(in_dir)) {
    throw FileError("--in " + in_dir.string() +
                    (std::filesystem::exists(in_dir) ? ": not a directory (--in names the directory of .npy files)"
                                                     : ": no such directory"));
  }
  const auto f32 = DType::f32;
  LayerInputFiles files;
  files.x = read_npy(in_dir / "x.npy", f32, {{kAnyDim, kAnyDim}, {"N", "H"}, ""});
  const std::int64_t n = files.x.dim(0), h = files.x.dim(1);
  files.gate = read_npy(in_dir / "gate.npy", f32, {{h, kAnyDim}, {"H", "E"}, "x.npy"});
  const std::int64_t e = files.gate.dim(1);
  files.wi0 = read_npy(in_dir / "wi0.npy", f32, {{e, h, kAnyDim}, {"E", "H", "F"}, "gate.npy and x.npy"});
  const std::int64_t f = files.wi0.dim(2);
  const std::string all_dims_source = "gate.npy, x.npy and wi0.npy";
  files.wi1 = read_npy(in_dir / "wi1.npy", f32, {{e, h, f}, {"E", "H", "F"}, all_dims_source});
  files.wo = read_npy(in_dir / "wo.npy", f32, {{e, f, h}, {"E", "F", "H"}, all_dims_source});
  if (std::filesystem::exists(in_dir / "bias.npy")) {
    files.bias = read_npy(in_dir / "bias.npy", f32, {{e}, {"E"}, "gate.npy"});
  }
  if (std::filesystem::exists(in_dir / "dy.npy")) {
    files.dy = read_npy(in_dir / "dy.npy", f32, {{n, h}, {"N", "H"}, "x.npy"});
  }
  // Refused here, by file and whole-array index, before any rank starts (the
  // layer checks again, but only knows its own rank's rows).
  LayerArrayNames names;
  const char* const files_by_array[] = {"x.npy", "gate.npy", "wi0.npy", "wi1.npy", "wo.npy", "bias.npy", "dy.npy"};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = (in_dir / files_by_array[i]).string();
  files.inputs = layer_inputs_of(files.x, files.gate, files.wi0, files.wi1, files.wo,
                                 files.bias ? files.bias->view() : TensorView(),
                                 files.dy ? files.dy->view() : TensorView(), names, "npy inputs must be finite");
  return files;
}

LayerInputs layer_inputs_of(TensorView x, TensorView gate, TensorView wi0, TensorView wi1, TensorView wo,
                            TensorView bias, TensorView dy, const LayerArrayNames& names,
                            std::string_view finite_rule) {
  const auto require = [&](const TensorView& view, std::size_t index, std::initializer_list<std::int64_t> shape,
                           const char* dims, const char* source) {
    const std::string& name = names[index];
    view.require_data(name);
    if (view.dtype() != DType::f32) {
      throw ConfigError(name + ": dtype " + std::string(dtype_name(view.dtype())) + ", expected float32");
    }
    if (!view.has_shape(shape)) {
      throw ConfigError(name + ": shape " + detail::dims_to_string(view.shape()) + ", expected " +
                        detail::dims_to_string(std::span<const std::int64_t>(shape.begin(), shape.size())) + " " +
                        dims + (*source ? " from " : "") + source);
    }
    view.require_contiguous(name);
  };
  if (x.rank() != 2) throw ConfigError(names[0] + ": shape " + detail::dims_to_string(x.shape()) + ", expected [N, H]");
  if (gate.rank() != 2)
    throw ConfigError(names[1] + ": shape " + detail::dims_to_string(gate.shape()) + ", expected [H, E]");
  if (wi0.rank() != 3)
    throw ConfigError(names[2] + ": shape " + detail::dims_to_string(wi0.shape()) + ", expected [E, H, F]");
  LayerInputs in;
  in.num_tokens = x.dim(0);
  in.hidden = x.dim(1);
  in.num_experts = gate.dim(1);
  in.ffn = wi0.dim(2);
  const std::int64_t n = in.num_tokens, h = in.hidden, e = in.num_experts, f = in.ffn;
  const std::string x_name = names[0], gate_name = names[1], wi0_name = names[2];
  require(x, 0, {n, h}, "(N, H)", "");
  require(gate, 1, {h, e}, "(H, E)", x_name.c_str());
  const std::string dims_source = gate_name + ", " + x_name + " and " + wi0_name;
  require(wi0, 2, {e, h, f}, "(E, H, F)", (gate_name + " and " + x_name).c_str());
  require(wi1, 3, {e, h, f}, "(E, H, F)", dims_source.c_str());
  require(wo, 4, {e, f, h}, "(E, F, H)", dims_source.c_str());
  in.x = x;
  in.gate = gate;
  in.wi0 = wi0;
  in.wi1 = wi1;
  in.wo = wo;
  bias.require_data(names[5]);  // a null bias of E elements is a mistake, not an absent bias
  if (!bias.empty()) {
    require(bias, 5, {e}, "(E)", gate_name.c_str());
    in.bias = bias;
  }
  if (dy.raw() != nullptr || dy.rank() > 0) {  // given: present even with no rows (N = 0)
    require(dy, 6, {n, h}, "(N, H)", x_name.c_str());
    in.dy = dy;
  }
  check_finite_inputs(in, names, finite_rule);
  return in;
}

void check_bias_is_used(const LayerInputs& inputs, const MoeLayerConfig& config) {
  if (inputs.bias && config.router.kind != RouterKind::sigmoid_grouped) {
    throw ConfigError("bias.npy is given but router=" + to_string(config.router.kind) +
                      " does not use a bias (only router=sigmoid_grouped does); remove the file "
                      "or choose that router");
  }
}

}  // namespace epmoe::run
