#include "moe/layer_checks.h"

#include "core/finite_check.h"

namespace epmoe {

std::string layer_label(const MoeLayerConfig& config) {
  return config.label.empty() ? std::string("moe layer") : config.label;
}

void check_data(const MoeLayerConfig& config, std::string_view name, TensorView tensor) {
  tensor.require_data(layer_label(config) + ": " + std::string(name));
}

void check_layout(const MoeLayerConfig& config, std::string_view name, TensorView tensor) {
  check_data(config, name, tensor);
  EPMOE_CHECK(tensor.dtype() == DType::f32);
  tensor.require_contiguous(layer_label(config) + ": " + std::string(name));
}

void check_weights(const MoeLayerConfig& config, int num_local_experts, TensorView x, const MoeWeights& w) {
  const std::int64_t h = config.hidden, f = config.ffn, e = config.router.num_experts;
  const std::int64_t el = num_local_experts;
  // Before anything below reads one: a caller's null pointer is named.
  for (const auto& [name, view] :
       {std::pair{"x", x}, {"gate", w.gate}, {"wi0", w.wi0}, {"wi1", w.wi1}, {"wo", w.wo}, {"bias", w.bias}}) {
    check_data(config, name, view);
  }
  EPMOE_CHECK(w.gate.raw() && w.wi0.raw() && w.wi1.raw() && w.wo.raw());
  EPMOE_CHECK_EQ(x.rank(), 2);
  EPMOE_CHECK_EQ(x.dim(1), h);
  EPMOE_CHECK((w.gate.has_shape({h, e})));
  EPMOE_CHECK((w.wi0.has_shape({el, h, f})));
  EPMOE_CHECK((w.wi1.has_shape({el, h, f})));
  EPMOE_CHECK((w.wo.has_shape({el, f, h})));
  if (!w.bias.empty()) EPMOE_CHECK((w.bias.has_shape({e})));
  check_layout(config, "x", x);
  check_layout(config, "gate", w.gate);
  check_layout(config, "wi0", w.wi0);
  check_layout(config, "wi1", w.wi1);
  check_layout(config, "wo", w.wo);
  if (!w.bias.empty()) check_layout(config, "bias", w.bias);
}

void check_input(const MoeLayerConfig& config, std::string_view name, TensorView tensor) {
  check_finite(layer_label(config) + ": " + std::string(name), tensor);
}

void check_output(const MoeLayerConfig& config, std::string_view name, const MutableTensorView& out, DType dtype,
                  std::span<const std::int64_t> shape) {
  const std::string what = layer_label(config) + ": output buffer " + std::string(name);
  out.require_data(what);
  if (out.dtype() != dtype || !out.has_shape(shape)) {
    throw UsageError(what + " is " + std::string(dtype_name(out.dtype())) + " " + detail::dims_to_string(out.shape()) +
                     ", expected " + std::string(dtype_name(dtype)) + " " + detail::dims_to_string(shape));
  }
  out.require_contiguous(what);
}

std::int64_t find_non_finite_value(std::span<const float> values) { return find_non_finite(values); }

std::string non_finite_message(const MoeLayerConfig& config, std::string_view what, std::string_view phase,
                               const std::string& where, float value) {
  return layer_label(config) + ": non-finite value in " + std::string(what) + " (" + std::string(phase) + ") at " +
         where + ": " + value_to_string(value);
}

std::string expert_row_to_string(const ep::ExpertRows& rows, std::int64_t row, int chunk) {
  std::int64_t expert = 0, end = 0;
  while (expert < static_cast<std::int64_t>(rows.group_sizes.size()) && row >= end + rows.group_sizes[expert])
    end += rows.group_sizes[expert++];
  return "row " + std::to_string(row) + " of chunk " + std::to_string(chunk) + " (local expert " +
         std::to_string(expert) + ")";
}

std::string weight_index_to_string(std::span<const std::int64_t> shape, std::int64_t index) {
  return index_to_string(shape, index) + " (local expert " + std::to_string(index / (shape[1] * shape[2])) + ")";
}

}  // namespace epmoe
