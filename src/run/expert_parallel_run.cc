#include "run/expert_parallel_run.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "comm/all_gather.h"
#include "comm/all_gather_texts.h"
#include "core/error.h"
#include "core/memory_ledger.h"
#include "core/modelled_clock.h"
#include "core/threading.h"
#include "core/timer.h"
#include "run/rank_launcher.h"

namespace epmoe::run {
namespace {

// Collective tags (comm/tag.h): the layer's EP group takes [0,
// kEpGroupTagRange) (ep/collective_tags.h); the output gather's start above
// them and never meet its messages.
constexpr std::uint32_t kLayerTagBase = 0;
constexpr std::uint32_t kGatherTagBase = kEpGroupTagRange;
enum class GatherTag : std::uint32_t {
  y,
  topk_ids,
  topk_weights,
  dx,
  dgate,
  dwi0,
  dwi1,
  dwo,
  report_texts  // and report_texts + 1
};

// This rank's rows of x and dy and its experts' weights: views of the full
// arrays' rows (the leading dimension is tokens, or experts), so a rank
// reads its part where the inputs were loaded and no rank holds a copy.
class RankShard {
 public:
  RankShard(const LayerInputs& in, const ExpertParallelSettings& settings, int rank)
      : first_token_(settings.first_token(rank, in.num_tokens)),
        num_tokens_(settings.first_token(rank + 1, in.num_tokens) - first_token_),
        first_expert_(rank * settings.num_local_experts()),
        num_experts_(settings.num_local_experts()) {
    const std::int64_t token_end = first_token_ + num_tokens_, expert_end = first_expert_ + num_experts_;
    x_ = in.x.rows(first_token_, token_end);
    if (in.dy) dy_ = in.dy->rows(first_token_, token_end);
    weights_ = {.gate = in.gate,
                .wi0 = in.wi0.rows(first_expert_, expert_end),
                .wi1 = in.wi1.rows(first_expert_, expert_end),
                .wo = in.wo.rows(first_expert_, expert_end),
                .bias = in.bias.value_or(TensorView())};
  }

  TensorView x() const { return x_; }
  const std::optional<TensorView>& dy() const { return dy_; }  // absent: no backward
  const MoeWeights& weights() const { return weights_; }
  std::int64_t first_token() const { return first_token_; }
  std::int64_t num_tokens() const { return num_tokens_; }
  int first_expert() const { return first_expert_; }
  int num_experts() const { return num_experts_; }

 private:
  std::int64_t first_token_, num_tokens_;
  int first_expert_, num_experts_;
  TensorView x_;
  // Not an empty view for "absent": a rank may hold no tokens, and its dy
  // (0 rows) must still run the backward with the others.
  std::optional<TensorView> dy_;
  MoeWeights weights_;
};

struct RankRun {
  MoeForwardOutput forward;
  std::optional<MoeGradients> gradients;
  RankReport report;
};

// `group` charges its buffers to `ledger`, which the layer's saved
// activations go to as well.
RankRun run_rank_layer(const RankShard& shard, const MoeLayerConfig& config, EpGroup& group, MemoryLedger& ledger,
                       int rank) {
  MoeLayer layer(config, group, &ledger);
  RankRun run;
  const ModelledClock* const clock = this_thread_modelled_clock();
  ModelledMark modelled_start, modelled_forward_end;
  if (clock != nullptr) modelled_start = modelled_mark(*clock);
  Stopwatch forward_watch;
  run.forward = layer.forward(shard.x(), shard.weights());
  const double forward_seconds = forward_watch.elapsed_seconds();
  if (clock != nullptr) modelled_forward_end = modelled_mark(*clock);
  double backward_seconds = 0;
  if (shard.dy()) {
    Stopwatch backward_watch;
    run.gradients = layer.backward(*shard.dy());
    backward_seconds = backward_watch.elapsed_seconds();
  }
  if (clock != nullptr) {
    run.report.modelled = modelled_between(*clock, modelled_start, modelled_forward_end, modelled_mark(*clock));
  }

  const DispatchStats& dispatch = layer.last_step_stats().dispatch;
  RankReport& report = run.report;
  report.rank = rank;
  report.first_token = shard.first_token();
  report.num_tokens = shard.num_tokens();
  report.first_expert = shard.first_expert();
  report.num_experts = shard.num_experts();
  report.rows_per_local_expert = dispatch.rows_per_local_expert;
  report.bytes_sent = dispatch.bytes_sent;
  report.dropped_pairs = dispatch.dropped_pairs;
  report.phase_seconds = layer.stats().phase_seconds;
  report.forward_seconds = forward_seconds;
  report.backward_seconds = backward_seconds;
  report.saved_activation_peak_bytes = layer.stats().saved_activation_peak_bytes;
  for (const auto& [name, entry] : ledger.snapshot().by_name) {
    if (name.starts_with("saved/")) report.saved_peak_bytes_by_name[name] = entry.peak_bytes;
    if (name.starts_with("buffer/")) report.buffer_bytes_by_name[name] = entry.live_bytes;
  }
  report.recomputed_bytes = layer.stats().recomputed_bytes;
  const ReplicaStats& replicas = layer.last_step_stats().replicas;
  report.rows_per_slot = replicas.rows_per_slot;
  report.slot_experts = replicas.slot_experts;
  report.rank_loads_before = replicas.rank_loads_before;
  report.rank_loads_after = replicas.rank_loads_after;
  report.max_over_mean_before = replicas.max_over_mean_before;
  report.max_over_mean_after = replicas.max_over_mean_after;
  report.ideal_max_over_mean = replicas.ideal_max_over_mean;
  report.num_replicas = replicas.num_replicas;
  report.planner_seconds = replicas.planner_seconds;
  return run;
}

// --- gathering ---------------------------------------------------------------

class Gatherer {
 public:
  Gatherer(transport::Communicator& comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {}

  // Starts the all-gather of `part` (this rank's block along the leading
  // dimension) into a tensor holding every rank's block; complete after
  // wait_all(). `rows_by_rank` gives every rank's leading dimension when the
  // blocks differ (token rows with N not divisible by R); empty: all equal.
  Tensor start(const Tensor& part, GatherTag tag, const std::vector<std::int64_t>& rows_by_rank = {}) {
    Shape shape = part.shape();
    const std::int64_t row_elements = shape[0] > 0 ? part.numel() / shape[0] : 0;
    comm::AllGatherOptions options{.input = part.raw(),
                                   .dtype = part.dtype(),
                                   .tag = kGatherTagBase + static_cast<std::uint32_t>(tag),
                                   .timeout = timeout_};
    if (rows_by_rank.empty()) {
      shape[0] *= comm_.size();
      options.num_elements_per_rank = part.numel();
    } else {
      EPMOE_CHECK_EQ(static_cast<int>(rows_by_rank.size()), comm_.size());
      EPMOE_CHECK_EQ(rows_by_rank[static_cast<std::size_t>(comm_.rank())], shape[0]);
      shape[0] = 0;
      for (std::int64_t rows : rows_by_rank) {
        shape[0] += rows;
        options.num_elements_by_rank.push_back(rows * row_elements);
      }
    }
    Tensor full(part.dtype(), shape);
    options.output = full.raw();
    if (full.numel() > 0) handles_.push_back(comm::ring_all_gather(comm_, options));
    return full;
  }

  void wait_all() {
    for (comm::CollectiveHandle& handle : handles_) handle.wait();
    handles_.clear();
  }

  // Every rank's report, in rank order.
  std::vector<RankReport> reports(const RankReport& own) {
    std::vector<RankReport> all;
    const std::uint32_t tag = kGatherTagBase + static_cast<std::uint32_t>(GatherTag::report_texts);
    for (const std::string& text : comm::all_gather_texts(comm_, nlohmann::json(own).dump(), tag, timeout_)) {
      all.push_back(nlohmann::json::parse(text).get<RankReport>());
    }
    return all;
  }

 private:
  transport::Communicator& comm_;
  std::chrono::milliseconds timeout_;
  std::vector<comm::CollectiveHandle> handles_;
};

// The gate is replicated, so its gradient is the sum of every rank's part;
// summed here in rank order rather than by a ring all-reduce, whose order
// depends on R and the block, so the result is the same on every transport.
Tensor sum_in_rank_order(const Tensor& parts, int num_ranks) {
  const std::int64_t part_elements = parts.numel() / num_ranks;
  Shape shape = parts.shape();
  shape[0] /= num_ranks;
  Tensor sum(parts.dtype(), shape);
  float* out = sum.data<float>();
  if (part_elements > 0) std::memcpy(out, parts.data<float>(), static_cast<std::size_t>(sum.size_bytes()));
  for (int r = 1; r < num_ranks; ++r) {
    const float* part = parts.data<float>() + r * part_elements;
    for (std::int64_t i = 0; i < part_elements; ++i) out[i] += part[i];
  }
  return sum;
}

// Token rows of every rank, [r*N/R, (r+1)*N/R): equal when R divides N.
std::vector<std::int64_t> token_rows_by_rank(const ExpertParallelSettings& settings, std::int64_t num_tokens) {
  std::vector<std::int64_t> rows;
  for (int r = 0; r < settings.num_ranks; ++r) {
    rows.push_back(settings.first_token(r + 1, num_tokens) - settings.first_token(r, num_tokens));
  }
  return rows;
}

LayerRunResult gather_results(transport::Communicator& comm, const RankRun& run,
                              const std::vector<std::int64_t>& token_rows, std::chrono::milliseconds timeout) {
  Gatherer gatherer(comm, timeout);
  LayerRunResult result;
  result.forward.y = gatherer.start(run.forward.y, GatherTag::y, token_rows);
  result.forward.topk_ids = gatherer.start(run.forward.topk_ids, GatherTag::topk_ids, token_rows);
  result.forward.topk_weights = gatherer.start(run.forward.topk_weights, GatherTag::topk_weights, token_rows);
  Tensor dgate_parts;
  if (run.gradients) {
    const MoeGradients& g = *run.gradients;
    MoeGradients& gathered = result.gradients.emplace();
    gathered.dx = gatherer.start(g.dx, GatherTag::dx, token_rows);
    Tensor dgate_part = g.dgate.clone();
    dgate_part.reshape({1, g.dgate.dim(0), g.dgate.dim(1)});
    dgate_parts = gatherer.start(dgate_part, GatherTag::dgate);
    gatherer.wait_all();  // dgate_part must outlive its gather
    gathered.dgate = sum_in_rank_order(dgate_parts, comm.size());
    gathered.dgate.reshape(g.dgate.shape());
    gathered.dwi0 = gatherer.start(g.dwi0, GatherTag::dwi0);
    gathered.dwi1 = gatherer.start(g.dwi1, GatherTag::dwi1);
    gathered.dwo = gatherer.start(g.dwo, GatherTag::dwo);
  }
  gatherer.wait_all();
  result.ranks = gatherer.reports(run.report);
  return result;
}

// One rank of a multi-rank run, on either transport.
LayerRunResult run_and_gather(transport::Communicator& comm, const LayerInputs& inputs, const MoeLayerConfig& config,
                              const ExpertParallelSettings& settings) {
  EPMOE_CHECK_EQ(comm.size(), settings.num_ranks);
  const RankShard shard(inputs, settings, comm.rank());
  MemoryLedger ledger;  // the group's buffers and the layer's saved activations
  const std::unique_ptr<EpGroup> group = settings.make_group(&comm, kLayerTagBase, &ledger);
  const RankRun run = run_rank_layer(shard, config, *group, ledger, comm.rank());
  return gather_results(comm, run, token_rows_by_rank(settings, inputs.num_tokens), settings.ep.timeout);
}

}  // namespace

std::optional<LayerRunResult> run_layer_across_ranks(const LayerInputs& inputs, const MoeLayerConfig& config,
                                                     const ExpertParallelSettings& settings) {
  if (settings.single_rank_local()) {
    set_compute_threads(settings.compute_threads_per_rank);
    const RankShard shard(inputs, settings, 0);
    MemoryLedger ledger;
    const std::unique_ptr<EpGroup> group = settings.make_group(nullptr, kLayerTagBase, &ledger);
    RankRun run = run_rank_layer(shard, config, *group, ledger, 0);
    return LayerRunResult{std::move(run.forward), std::move(run.gradients), {std::move(run.report)}};
  }

  std::optional<LayerRunResult> result;
  launch_ranks(settings, [&](transport::Communicator& comm) {
    LayerRunResult gathered = run_and_gather(comm, inputs, config, settings);
    if (comm.rank() == 0) result = std::move(gathered);
  });
  return result;
}

}  // namespace epmoe::run
