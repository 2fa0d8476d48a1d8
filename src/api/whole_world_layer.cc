// <epmoe/whole_world_layer.h> on the code that runs `epmoe layer`: the same
// key registry, the same configs, the same runner (run/whole_world_runner.h,
// kept between calls), the same metrics. The caller's arrays become
// run::LayerInputs views, and the ranks write into the caller's output
// buffers: nothing is copied in or out.
#include <epmoe/whole_world_layer.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fault_injection.h"
#include "core/trace_recorder.h"
#include "data/output_paths.h"
#include "run/layer_inputs.h"
#include "run/layer_key_groups.h"
#include "run/layer_metrics.h"
#include "run/run_faults.h"
#include "run/whole_world_runner.h"

namespace epmoe {

struct WholeWorldLayer::State {
  run::ConfigValues values;
  // fault_injection= (a test hook): this layer's own, counted across its
  // calls; no other layer of the process sees it (run/run_faults.h).
  std::unique_ptr<FaultInjector> faults;
  // trace_file=: each call's timeline, written when the call succeeds.
  std::string trace_file;
  std::unique_ptr<TraceRecorder> trace;
  // Kept between calls: made at the first, again when the arrays' shape
  // changes the settings (E, H, K).
  std::unique_ptr<run::WholeWorldRunner> runner;
  // The last run, for metrics_json(): its arrays' views (only their shapes
  // and presence are read), configs, reports and output names.
  struct LastRun {
    run::LayerInputs inputs;
    MoeLayerConfig config;
    run::ExpertParallelSettings settings;
    std::vector<run::RankReport> reports;
    std::vector<std::string> output_names;
  };
  std::optional<LastRun> last;
};

namespace {

constexpr char kOrigin[] = "WholeWorldLayer";

// The caller's output buffer must have the shape and dtype of the result:
// checked before the run (ConfigError naming the output), so a wrong buffer
// costs no compute.
void check_output(const MutableTensorView& out, DType dtype, std::initializer_list<std::int64_t> shape,
                  const char* name) {
  const std::string what = std::string("LayerOutputs::") + name;
  if (out.raw() == nullptr && out.rank() == 0) {
    throw ConfigError(what + " is missing: run() writes it into the caller's buffer");
  }
  out.require_data(what);
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

}  // namespace

WholeWorldLayer::WholeWorldLayer(const std::map<std::string, std::string>& keys) : state_(std::make_unique<State>()) {
  std::vector<run::KeyAssignment> assignments;
  for (const auto& [key, value] : keys) assignments.push_back({key, value, kOrigin});
  state_->values = run::layer_key_registry().parse(assignments);
  if (state_->values.get_string("transport") != "threads") {
    throw ConfigError(state_->values.setting("transport") +
                      ": WholeWorldLayer runs its ranks as threads of this process (transport=threads); a "
                      "process that uses MPI runs the per-rank API on its own communicator "
                      "(<epmoe/mpi_communicator.h>)");
  }
  state_->faults =
      run::fault_injector_from(state_->values, state_->values.get_int32("ranks"), run::FaultSpecSource::key);
  state_->trace_file = state_->values.get_string("trace_file");
  if (!state_->trace_file.empty()) {
    check_output_paths({{"trace_file", state_->trace_file, OutputPath::Kind::file}});
    state_->trace = std::make_unique<TraceRecorder>();
  }
}

WholeWorldLayer::~WholeWorldLayer() = default;
WholeWorldLayer::WholeWorldLayer(WholeWorldLayer&&) noexcept = default;
WholeWorldLayer& WholeWorldLayer::operator=(WholeWorldLayer&&) noexcept = default;

int WholeWorldLayer::top_k() const { return state_->values.get_int32("top_k"); }

void WholeWorldLayer::run(const LayerArrays& arrays, const LayerOutputs& outputs) {
  const run::LayerInputs inputs =
      run::layer_inputs_of(arrays.x, arrays.gate, arrays.wi0, arrays.wi1, arrays.wo, arrays.bias, arrays.dy,
                           {"LayerArrays::x", "LayerArrays::gate", "LayerArrays::wi0", "LayerArrays::wi1",
                            "LayerArrays::wo", "LayerArrays::bias", "LayerArrays::dy"});
  const run::ConfigValues& values = state_->values;
  const MoeLayerConfig config = run::moe_layer_config_from(values, inputs.hidden, inputs.ffn, inputs.num_experts);
  run::check_bias_is_used(inputs, config);
  run::ExpertParallelSettings settings = run::expert_parallel_settings_from(values, config);
  State& state = *state_;
  settings.faults = state.faults.get();
  settings.trace = state.trace.get();
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

  // Again before this call's compute: the path may have changed since.
  if (state.trace) check_output_paths({{"trace_file", state.trace_file, OutputPath::Kind::file}});

  state.last.reset();
  if (state.runner == nullptr || !(state.runner->settings().ep == settings.ep)) {
    state.runner.reset();  // its threads and ranks go before the new ones come
    state.runner = std::make_unique<run::WholeWorldRunner>(settings);
  }
  if (state.trace) state.trace->clear();  // this call's timeline alone
  std::vector<run::RankReport> reports = state.runner->run(inputs, config, outputs);
  if (state.trace) state.trace->write(state.trace_file);
  std::vector<std::string> names = {"y", "topk_ids", "topk_weights"};
  if (inputs.dy)
    for (const auto& [out, name] : gradients) names.push_back(name);
  state.last = State::LastRun{inputs, config, settings, std::move(reports), std::move(names)};
}

std::string WholeWorldLayer::metrics_json() const {
  if (!state_->last) throw UsageError("WholeWorldLayer: metrics_json() before a successful run()");
  const State::LastRun& last = *state_->last;
  return run::layer_metrics(state_->values, last.inputs, last.config, last.settings, last.reports, last.output_names)
      .dump();
}

}  // namespace epmoe
