// The arrays of one layer run, as views (LayerInputs), with every shape
// checked against the dimensions the arrays define: N, H from x, E from
// gate, F from wi0. Two sources, one set of rules:
//  * `epmoe layer --in DIR`: .npy files read into LayerInputFiles, which owns
//    them (under transport=mpi every process reads the full, unsharded
//    arrays and takes its own part);
//  * the public API (<epmoe/whole_world_layer.h>, src/api): the caller's buffers, viewed
//    in place.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <epmoe/moe_layer.h>
#include "core/finite_check.h"
#include "core/tensor.h"

namespace epmoe::run {

struct LayerInputs {
  TensorView x, gate, wi0, wi1, wo;  // [N,H], [H,E], [E,H,F], [E,H,F], [E,F,H]
  std::optional<TensorView> bias;    // [E]
  std::optional<TensorView> dy;      // [N,H]; present: the backward runs
  std::int64_t num_tokens = 0, hidden = 0, num_experts = 0, ffn = 0;
};

// The arrays of an --in directory and the views of them. Move-only; moving
// keeps the views valid (a Tensor's buffer does not move with it).
struct LayerInputFiles {
  Tensor x, gate, wi0, wi1, wo;
  std::optional<Tensor> bias, dy;
  LayerInputs inputs;
};

// FileError naming the file, its shape and the expected one.
LayerInputFiles read_layer_inputs(const std::filesystem::path& in_dir);

// The names the messages use for x, gate, wi0, wi1, wo, bias, dy.
using LayerArrayNames = std::array<std::string, 7>;

// The caller's arrays as LayerInputs: each must be f32 and C-contiguous, the
// shapes must agree (ConfigError naming the array, its shape and the
// expected one) and the values be finite (NumericError naming the array and
// the index, and `finite_rule`). A default-constructed bias or dy is absent.
LayerInputs layer_inputs_of(TensorView x, TensorView gate, TensorView wi0, TensorView wi1, TensorView wo,
                            TensorView bias, TensorView dy, const LayerArrayNames& names,
                            std::string_view finite_rule = kInputsMustBeFinite);

// A bias file that the router would ignore is a mistake worth stopping for:
// the user believes the run used it. ConfigError.
void check_bias_is_used(const LayerInputs& inputs, const MoeLayerConfig& config);

}  // namespace epmoe::run
