#include "run/layer_rank.h"

#include <cstring>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/modelled_report.h"
#include "core/timer.h"
#include "ep/replica_verdict.h"

namespace epmoe::run {

namespace {

struct Share {
  std::int64_t first_token, num_tokens;
  int first_expert, num_experts;
};

Share share_of(const ExpertParallelSettings& settings, std::int64_t num_tokens, int r) {
  const std::int64_t first = settings.first_token(r, num_tokens);
  const int num_local = settings.num_local_experts();
  return {first, settings.first_token(r + 1, num_tokens) - first, r * num_local, num_local};
}

// Rows [begin, end) of a view that is given; an empty view stays empty.
MutableTensorView rows_of(const MutableTensorView& view, std::int64_t begin, std::int64_t end) {
  return view.raw() == nullptr && view.rank() == 0 ? view : view.rows(begin, end);
}

}  // namespace

void build_layer_rank(LayerRank& rank, transport::Communicator* comm, const ExpertParallelSettings& settings,
                      const MoeLayerConfig& config) {
  rank.layer.reset();  // before its group
  rank.group = settings.make_group(comm, kLayerTagBase, &rank.ledger);
  rank.layer = std::make_unique<MoeLayer>(config, *rank.group, &rank.ledger);
  rank.dgate_part = Tensor(DType::f32, {config.hidden, std::int64_t{config.router.num_experts}});
}

LayerOutputs rank_outputs(const LayerOutputs& out, const ExpertParallelSettings& settings, std::int64_t num_tokens,
                          int r) {
  const Share share = share_of(settings, num_tokens, r);
  const std::int64_t t0 = share.first_token, t1 = t0 + share.num_tokens;
  const std::int64_t e0 = share.first_expert, e1 = e0 + share.num_experts;
  return {.y = rows_of(out.y, t0, t1),
          .topk_ids = rows_of(out.topk_ids, t0, t1),
          .topk_weights = rows_of(out.topk_weights, t0, t1),
          .dx = rows_of(out.dx, t0, t1),
          .dgate = {},  // a part per rank, summed in rank order afterwards
          .dwi0 = rows_of(out.dwi0, e0, e1),
          .dwi1 = rows_of(out.dwi1, e0, e1),
          .dwo = rows_of(out.dwo, e0, e1)};
}

RankReport run_layer_rank(LayerRank& rank, const LayerInputs& inputs, const ExpertParallelSettings& settings, int r,
                          const LayerOutputs& out) {
  const Share share = share_of(settings, inputs.num_tokens, r);
  const std::int64_t t0 = share.first_token, t1 = t0 + share.num_tokens;
  const std::int64_t e0 = share.first_expert, e1 = e0 + share.num_experts;
  // Views of the full arrays' rows: no rank holds a copy of its inputs.
  const MoeWeights weights{.gate = inputs.gate,
                           .wi0 = inputs.wi0.rows(e0, e1),
                           .wi1 = inputs.wi1.rows(e0, e1),
                           .wo = inputs.wo.rows(e0, e1),
                           .bias = inputs.bias.value_or(TensorView())};
  MoeLayer& layer = *rank.layer;
  const ModelledClock* const clock = this_thread_modelled_clock();
  ModelledMark modelled_start, modelled_forward_end;
  if (clock != nullptr) modelled_start = modelled_mark(*clock);
  // On the thread's clock, as the phases are: modelled with clock=modelled,
  // so that nothing a modelled run reports depends on the host (issue 30).
  const double forward_start = this_thread_clock_seconds();
  layer.forward(inputs.x.rows(t0, t1), weights, {},
                {.y = out.y, .topk_ids = out.topk_ids, .topk_weights = out.topk_weights});
  const double forward_seconds = this_thread_clock_seconds() - forward_start;
  if (clock != nullptr) modelled_forward_end = modelled_mark(*clock);
  double backward_seconds = 0;
  // A rank may hold no tokens: its dy (0 rows) still runs the backward with the others.
  if (inputs.dy) {
    const double backward_start = this_thread_clock_seconds();
    layer.backward(
        inputs.dy->rows(t0, t1), {},
        {.dx = out.dx, .dgate = rank.dgate_part.mutable_view(), .dwi0 = out.dwi0, .dwi1 = out.dwi1, .dwo = out.dwo});
    backward_seconds = this_thread_clock_seconds() - backward_start;
  }

  RankReport report;
  if (clock != nullptr) {
    report.modelled = modelled_between(*clock, modelled_start, modelled_forward_end, modelled_mark(*clock));
  }
  const MoeStepStats& step = layer.last_step_stats();
  report.rank = r;
  report.first_token = share.first_token;
  report.num_tokens = share.num_tokens;
  report.first_expert = share.first_expert;
  report.num_experts = share.num_experts;
  report.rows_per_local_expert = step.dispatch.rows_per_local_expert;
  report.bytes_sent = step.dispatch.bytes_sent;
  report.dropped_pairs = step.dispatch.dropped_pairs;
  report.phase_seconds = layer.stats().phase_seconds;
  report.forward_seconds = forward_seconds;
  report.backward_seconds = backward_seconds;
  report.saved_activation_peak_bytes = layer.stats().saved_activation_peak_bytes;
  for (const auto& [name, entry] : rank.ledger.snapshot().by_name) {
    if (name.starts_with("saved/")) report.saved_peak_bytes_by_name[name] = entry.peak_bytes;
    if (name.starts_with("buffer/")) report.buffer_bytes_by_name[name] = entry.live_bytes;
  }
  report.recomputed_bytes = layer.stats().recomputed_bytes;
  const ReplicaStats& replicas = step.replicas;
  report.rows_per_slot = replicas.rows_per_slot;
  report.slot_experts = replicas.slot_experts;
  report.rank_loads_before = replicas.rank_loads_before;
  report.rank_loads_after = replicas.rank_loads_after;
  report.max_over_mean_before = replicas.max_over_mean_before;
  report.max_over_mean_after = replicas.max_over_mean_after;
  report.ideal_max_over_mean = replicas.ideal_max_over_mean;
  report.num_replicas = replicas.num_replicas;
  report.planner_seconds = replicas.planner_seconds;
  report.replica_verdict = ep::replica_verdict_json(replicas);
  return report;
}

void sum_in_rank_order(const std::vector<const float*>& parts, std::int64_t num_elements, float* dgate) {
  EPMOE_CHECK(!parts.empty());
  if (num_elements > 0) std::memcpy(dgate, parts[0], static_cast<std::size_t>(num_elements) * sizeof(float));
  for (std::size_t r = 1; r < parts.size(); ++r)
    for (std::int64_t i = 0; i < num_elements; ++i) dgate[i] += parts[r][i];
}

}  // namespace epmoe::run
