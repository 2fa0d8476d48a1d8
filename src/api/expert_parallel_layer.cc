// <epmoe/layer.h> on the code that runs `epmoe layer`: the same key
// registry, the same configs, the same run across rank threads
// (run/expert_parallel_run.h), the same metrics. The caller's arrays become
// run::LayerInputs views; only the gathered outputs are copied, into the
// caller's buffers.
#include <epmoe/layer.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "run/expert_parallel_run.h"
#include "run/layer_inputs.h"
#include "run/layer_key_groups.h"
#include "run/layer_metrics.h"

namespace epmoe {

struct ExpertParallelLayer::State {
  run::ConfigValues values;
};

namespace {

constexpr char kOrigin[] = "ExpertParallelLayer";

// The caller's output buffer must have the shape and dtype of the result:
// checked before the run (ConfigError naming the output), so a wrong buffer
// costs no compute.
void check_output(const MutableTensorView& out, DType dtype, std::initializer_list<std::int64_t> shape,
                  const char* name) {
  const std::string what = std::string("LayerOutputs::") + name;
  if (out.raw() == nullptr && out.rank() == 0) {
    throw ConfigError(what + " is missing: run() writes it into the caller's buffer");
  }
  if (out.dtype() != dtype || !out.has_shape(shape)) {
    throw ConfigError(what + ": " + std::string(dtype_name(out.dtype())) + " " + detail::dims_to_string(out.shape()) +
                      ", expected " + std::string(dtype_name(dtype)) + " " +
                      detail::dims_to_string(std::span<const std::int64_t>(shape.begin(), shape.size())));
  }
  out.require_contiguous(what);
}

void require_absent(const MutableTensorView& out, const char* name) {
  if (out.raw() != nullptr || out.rank() > 0) {
    throw ConfigError(std::string("LayerOutputs::") + name +
                      " is given but LayerArrays::dy is not: without dy there is no backward to fill it");
  }
}

void copy_out(const Tensor& result, const MutableTensorView& out) {
  EPMOE_CHECK(out.has_shape(result.shape()) && out.dtype() == result.dtype(), "the output was checked before the run");
  if (result.size_bytes() > 0) std::memcpy(out.raw(), result.raw(), static_cast<std::size_t>(result.size_bytes()));
}

}  // namespace

ExpertParallelLayer::ExpertParallelLayer(const std::map<std::string, std::string>& keys)
    : state_(std::make_unique<State>()) {
  std::vector<run::KeyAssignment> assignments;
  for (const auto& [key, value] : keys) assignments.push_back({key, value, kOrigin});
  state_->values = run::layer_key_registry().parse(assignments);
  if (state_->values.get_string("transport") != "threads") {
    throw ConfigError(state_->values.setting("transport") +
                      ": ExpertParallelLayer runs its ranks as threads of this process (transport=threads); an "
                      "embedding process that uses MPI runs its own ranks");
  }
}

ExpertParallelLayer::~ExpertParallelLayer() = default;
ExpertParallelLayer::ExpertParallelLayer(ExpertParallelLayer&&) noexcept = default;
ExpertParallelLayer& ExpertParallelLayer::operator=(ExpertParallelLayer&&) noexcept = default;

int ExpertParallelLayer::top_k() const { return state_->values.get_int32("top_k"); }

std::string ExpertParallelLayer::run(const LayerArrays& arrays, const LayerOutputs& outputs) {
  const run::LayerInputs inputs =
      run::layer_inputs_of(arrays.x, arrays.gate, arrays.wi0, arrays.wi1, arrays.wo, arrays.bias, arrays.dy,
                           {"LayerArrays::x", "LayerArrays::gate", "LayerArrays::wi0", "LayerArrays::wi1",
                            "LayerArrays::wo", "LayerArrays::bias", "LayerArrays::dy"});
  const run::ConfigValues& values = state_->values;
  const MoeLayerConfig config = run::moe_layer_config_from(values, inputs.hidden, inputs.ffn, inputs.num_experts);
  run::check_bias_is_used(inputs, config);
  const run::ExpertParallelSettings settings = run::expert_parallel_settings_from(values, config);
  const std::int64_t n = inputs.num_tokens, h = inputs.hidden, e = inputs.num_experts, f = inputs.ffn;
  const std::int64_t k = config.router.top_k;
  check_output(outputs.y, DType::f32, {n, h}, "y");
  check_output(outputs.topk_ids, DType::i32, {n, k}, "topk_ids");
  check_output(outputs.topk_weights, DType::f32, {n, k}, "topk_weights");
  const std::pair<const MutableTensorView*, const char*> gradients[] = {{&outputs.dx, "dx"},
                                                                        {&outputs.dgate, "dgate"},
                                                                        {&outputs.dwi0, "dwi0"},
                                                                        {&outputs.dwi1, "dwi1"},
                                                                        {&outputs.dwo, "dwo"}};
  if (inputs.dy) {
    check_output(outputs.dx, DType::f32, {n, h}, "dx");
    check_output(outputs.dgate, DType::f32, {h, e}, "dgate");
    check_output(outputs.dwi0, DType::f32, {e, h, f}, "dwi0");
    check_output(outputs.dwi1, DType::f32, {e, h, f}, "dwi1");
    check_output(outputs.dwo, DType::f32, {e, f, h}, "dwo");
  } else {
    for (const auto& [out, name] : gradients) require_absent(*out, name);
  }

  const std::optional<run::LayerRunResult> run = run::run_layer_across_ranks(inputs, config, settings);
  EPMOE_CHECK(run.has_value(), "ranks as threads always return the gathered result");
  copy_out(run->forward.y, outputs.y);
  copy_out(run->forward.topk_ids, outputs.topk_ids);
  copy_out(run->forward.topk_weights, outputs.topk_weights);
  std::vector<std::string> names = {"y", "topk_ids", "topk_weights"};
  if (run->gradients) {
    const MoeGradients& g = *run->gradients;
    const Tensor* results[] = {&g.dx, &g.dgate, &g.dwi0, &g.dwi1, &g.dwo};
    for (std::size_t i = 0; i < std::size(gradients); ++i) {
      copy_out(*results[i], *gradients[i].first);
      names.push_back(gradients[i].second);
    }
  }
  return run::layer_metrics(values, inputs, config, settings, *run, names).dump();
}

}  // namespace epmoe
