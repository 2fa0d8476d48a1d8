// The MoE layer's checks of what it is given and of what a step produces
// (moe_layer.cc): shapes and layouts of the inputs, finiteness of inputs and
// of produced values, named in words a caller can act on ("moe layer 1:
// non-finite value in expert output (forward/experts) at row 5 of chunk 0
// (local expert 2): inf").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <epmoe/config.h>
#include <epmoe/moe_layer.h>

#include "core/tensor.h"
#include "ep/expert_rows.h"

namespace epmoe {

// "moe layer" or the config's label.
std::string layer_label(const MoeLayerConfig& config);

// A caller's view has memory for its elements (TensorView::require_data:
// UsageError naming it, "moe layer: x: null data pointer for a 16x8 view").
void check_data(const MoeLayerConfig& config, std::string_view name, TensorView tensor);
// An input the layer reads in place: has its memory (check_data), f32
// (InternalError otherwise, as for a shape) and C-contiguous (UsageError
// naming it: a caller's strided view).
void check_layout(const MoeLayerConfig& config, std::string_view name, TensorView tensor);
// x and the weights' shapes and layouts (InternalError for a shape mismatch:
// the front ends validate files and arrays first).
void check_weights(const MoeLayerConfig& config, int num_local_experts, TensorView x, const MoeWeights& weights);
// An input of the layer: refused with its name and first bad index.
void check_input(const MoeLayerConfig& config, std::string_view name, TensorView tensor);
// A caller's output buffer: its exact shape, dtype and layout (UsageError
// naming it otherwise).
void check_output(const MoeLayerConfig& config, std::string_view name, const MutableTensorView& out, DType dtype,
                  std::span<const std::int64_t> shape);

// A value the step produced: NumericError naming the layer, what, the phase
// and where(index) for the first bad element ("row 5 of chunk 0 (local
// expert 2)").
std::string non_finite_message(const MoeLayerConfig& config, std::string_view what, std::string_view phase,
                               const std::string& where, float value);
std::int64_t find_non_finite_value(std::span<const float> values);
template <typename Where>
void check_produced(const MoeLayerConfig& config, std::string_view what, std::string_view phase,
                    std::span<const float> values, Where where) {
  const std::int64_t index = find_non_finite_value(values);
  if (index >= 0) throw NumericError(non_finite_message(config, what, phase, where(index), values[index]));
}

// Ways to name an index: rows of a [rows, width] tensor; rows of one chunk's
// expert rows with their local expert; an index of a weight-shaped tensor
// [E_l, a, b].
inline auto at_row(std::int64_t width) {
  return [width](std::int64_t index) { return "row " + std::to_string(index / width); };
}
std::string expert_row_to_string(const ep::ExpertRows& rows, std::int64_t row, int chunk);
inline auto at_expert_row(const ep::ExpertRows& rows, std::int64_t width, int chunk) {
  return [&rows, width, chunk](std::int64_t index) { return expert_row_to_string(rows, index / width, chunk); };
}
std::string weight_index_to_string(std::span<const std::int64_t> shape, std::int64_t index);
inline auto at_weight_index(std::span<const std::int64_t> shape) {
  return [shape](std::int64_t index) { return weight_index_to_string(shape, index); };
}

}  // namespace epmoe
