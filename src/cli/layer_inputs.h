// The arrays of `epmoe layer`, read from an --in directory of .npy files with
// every shape checked against the dimensions the files define: N, H from
// x.npy, E from gate.npy, F from wi0.npy. Under transport=mpi every process
// reads them (they are the full, unsharded arrays) and slices its own part.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "core/tensor.h"
#include "moe/moe_layer.h"

namespace epmoe::cli {

struct LayerInputs {
  Tensor x, gate, wi0, wi1, wo;  // [N,H], [H,E], [E,H,F], [E,H,F], [E,F,H]
  std::optional<Tensor> bias;    // [E]
  std::optional<Tensor> dy;      // [N,H]; present: the backward runs
  std::int64_t num_tokens = 0, hidden = 0, num_experts = 0, ffn = 0;
};

// FileError naming the file, its shape and the expected one.
LayerInputs read_layer_inputs(const std::filesystem::path& in_dir);

// A bias file that the router would ignore is a mistake worth stopping for:
// the user believes the run used it. ConfigError.
void check_bias_is_used(const LayerInputs& inputs, const MoeLayerConfig& config);

}  // namespace epmoe::cli
