#include "model/trainer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "comm/all_gather.h"
#include "comm/all_reduce.h"
#include "core/error.h"
#include "core/modelled_report.h"
#include "core/timer.h"
#include "model/checkpoint.h"
#include "model/gradient_reduction.h"
#include "moe/load_balance.h"

namespace epmoe {
namespace {

// Collective tags, relative to TrainerConfig::tag_base.
enum TrainerTag : std::uint32_t {
  kForwardStats = 0,
  kGradients = 1,  // the one all-reduce (overlap_gradient_all_reduce=false)
  kBackwardStats = 2,
  kRankReports = 3,       // and 4 (all_gather_texts)
  kCheckpoint = 8,        // .. 10 (save_checkpoint's barriers)
  kGradientBuckets = 16,  // .. 16 + GradientReduction::kMaxBuckets - 1
};
static_assert(kGradientBuckets + GradientReduction::kMaxBuckets <= 1024, "TrainerConfig::tag_base's range");

double max_over_mean(const std::vector<std::int64_t>& loads) {
  if (loads.empty()) return 1.0;
  std::int64_t total = 0, max = 0;
  for (const std::int64_t l : loads) {
    total += l;
    max = std::max(max, l);
  }
  return total > 0 ? static_cast<double>(max) * static_cast<double>(loads.size()) / static_cast<double>(total) : 1.0;
}

std::int64_t bits_of(double value) { return std::bit_cast<std::int64_t>(value); }
double double_of(std::int64_t bits) { return std::bit_cast<double>(bits); }

// The MoE layers' phase times accumulate over the run; a step reports the
// difference.
std::map<std::string, double> moe_phase_totals(const MoeLm& model) {
  std::map<std::string, double> totals;
  for (int l = 0; l < model.config().num_layers; ++l) {
    for (const auto& [phase, seconds] : model.layer(l).stats().phase_seconds) {
      totals["moe/" + phase] += seconds;
    }
  }
  return totals;
}

// "step N: ..." for some N.
bool names_a_step(const std::string& what) {
  if (what.rfind("step ", 0) != 0) return false;
  std::size_t i = 5;
  while (i < what.size() && what[i] >= '0' && what[i] <= '9') ++i;
  return i > 5 && what.compare(i, 2, ": ") == 0;
}

// An error raised inside step N (a layer's non-finite check, a peer's
// failure, a checkpoint write) is rethrown, its type kept, with "step N: "
// in front, so the message says when; one that already names its step (the
// divergence check; step N's metrics exchange completing in step N + 1)
// passes unchanged, and so does a wait aborted by another rank's failure:
// its text is that rank's, step included.
[[noreturn]] void rethrow_naming_step(std::int64_t step) {
  try {
    throw;
  } catch (const transport::AbortedError&) {
    throw;
  } catch (Error& e) {
    if (!names_a_step(e.what())) e.add_context("step " + std::to_string(step) + ": ");
    throw;
  }
}

}  // namespace

void TrainerConfig::validate(int num_ranks) const {
  const auto fail = [](const std::string& message) { throw ConfigError(message); };
  if (steps < 1) fail("steps=" + std::to_string(steps) + ": must be >= 1");
  if (batch_size < 1) fail("batch_size=" + std::to_string(batch_size) + ": must be >= 1");
  if (batch_size % num_ranks != 0) {
    fail("batch_size=" + std::to_string(batch_size) + ": must be divisible by ranks=" + std::to_string(num_ranks) +
         " (each rank trains on batch_size/ranks whole sequences)");
  }
  data.validate();
  adamw.validate();
  learning_rate.validate();
  if (!(grad_clip >= 0) || !std::isfinite(grad_clip)) fail("grad_clip=" + std::to_string(grad_clip) + ": must be >= 0");
  if (!(aux_loss_coef >= 0)) fail("aux_loss_coef=" + std::to_string(aux_loss_coef) + ": must be >= 0");
  if (!(bias_update_rate >= 0)) fail("bias_update_rate=" + std::to_string(bias_update_rate) + ": must be >= 0");
  if (checkpoint_every < 0) fail("checkpoint_every=" + std::to_string(checkpoint_every) + ": must be >= 0");
  if (checkpoint_keep < 1) fail("checkpoint_keep=" + std::to_string(checkpoint_keep) + ": must be >= 1");
  if (checkpoint_dir.empty() && (resume || checkpoint_every > 0)) {
    fail(std::string(resume ? "resume=true" : "checkpoint_every=" + std::to_string(checkpoint_every)) +
         ": needs checkpoint_dir=DIR");
  }
}

std::optional<std::int64_t> checkpoint_to_resume(const TrainerConfig& config) {
  if (config.checkpoint_dir.empty()) return std::nullopt;
  const CheckpointStore store(config.checkpoint_dir);
  const std::optional<std::int64_t> latest = store.latest_step();
  // A step_N/ without a manifest past the resume point would make the run
  // fail at step N ("refusing to overwrite") after the work: named now.
  for (const std::int64_t step : store.uncommitted_steps()) {
    if (step > latest.value_or(0)) {
      throw FileError(store.step_dir(step).string() + ": a checkpoint directory without " +
                      CheckpointStore::kManifestName +
                      " (a partial copy or a damaged checkpoint: commit "
                      "never leaves one); it is not resumable and this run would stop at step " +
                      std::to_string(step) + " rather than overwrite it; remove or repair it");
    }
  }
  if (!latest) return std::nullopt;  // resume=true with nothing to resume: a fresh start
  if (!config.resume) {
    throw ConfigError("checkpoint_dir=" + config.checkpoint_dir +
                      " already holds checkpoints (newest: " + store.step_dir(*latest).string() +
                      "); pass resume=true to continue from it, or "
                      "choose another checkpoint_dir (checkpoints are never overwritten)");
  }
  check_checkpoint_compatibility(store, *latest,
                                 config.checkpoint_metadata.value("compatibility", nlohmann::json::object()));
  return latest;
}

namespace {

// One rank's run of the loop: what lives across steps (the model, the data,
// the replicated gradients' buffer, the summary). Each step is the sequence
// of small steps below, in this order; each names what it exists for.
class TrainingRun {
 public:
  TrainingRun(transport::Communicator& comm, EpGroup& group, const TrainerConfig& config,
              const MoeLmConfig& model_config, const TrainObserver& observer)
      : comm_(comm),
        config_(config),
        model_config_(model_config),
        observer_(observer),
        num_ranks_(comm.size()),
        rank_(comm.rank()),
        local_sequences_(config.batch_size / num_ranks_),
        global_tokens_(config.batch_size * config.data.seq_len),
        tags_(config.tag_base),
        timeout_(config.comm_timeout),
        model_(model_config, group, &ledger_),
        state_(model_.state()),
        data_(config.data),
        num_layers_(model_config.num_layers),
        num_experts_(model_config.layer.router.num_experts),
        update_bias_(config.bias_update_rate > 0 && model_config.layer.router.kind == RouterKind::sigmoid_grouped),
        store_(config.checkpoint_dir.empty() ? std::nullopt : std::optional<CheckpointStore>(config.checkpoint_dir)),
        checkpoint_context_{&comm, tags_ + kCheckpoint, timeout_},
        replicated_(state_.replicated_elements()),
        flat_(static_cast<std::size_t>(replicated_)) {
    // Where each replicated parameter's gradient sits in the flat buffer
    // (their order in state()), for the backward's gradients-ready calls.
    std::int64_t offset = 0;
    for (const Parameter& p : state_.parameters()) {
      if (!p.replicated) continue;
      flat_offset_[&p] = offset;
      offset += p.grad.numel();
    }
  }

  TrainSummary run() {
    const std::int64_t first_step = resume();
    if (rank_ == 0 && observer_.on_start) observer_.on_start(first_step, summary_.resumed_from);
    Stopwatch run_watch;
    for (std::int64_t step = first_step; step < config_.steps; ++step) try {
        run_step(step);
      } catch (const Error&) {
        // Step N's line still goes out when step N + 1 fails before its
        // deferred exchange completed (every rank started that exchange, so
        // it ends unless it is what failed; then the line is lost with it).
        try {
          finish_metrics();
        } catch (...) {  // the step's own error is the one to report
        }
        rethrow_naming_step(step + 1);
      }
    summary_.seconds = run_watch.elapsed_seconds();
    return summary_;
  }

 private:
  // One step's values, filled by the small steps in order.
  struct Step {
    std::int64_t index = 0;  // 0-based; the record says index + 1
    Stopwatch watch;
    // clock=modelled: marks at the step's start, after the forward (and its
    // stats exchange when the backward needs it first), and before the
    // metrics exchange.
    const ModelledClock* clock = this_thread_modelled_clock();
    ModelledMark modelled_start, modelled_forward_end;
    PhaseTimes times;
    std::map<std::string, double> moe_before;
    LmForwardResult forward;
    // The forward stats exchange: this rank's words, then every rank's.
    std::vector<std::int64_t> forward_words, all_forward_words;
    comm::CollectiveHandle forward_stats;
    bool forward_stats_done = false;
    std::vector<std::int64_t> counts;  // [L * E] global expert counts
    double loss_sum = 0;               // global cross-entropy sum
    double aux_part = 0;               // this rank's load-balance loss
    // The replicated gradients' sum over ranks, bucket by bucket (declared
    // after what its collectives read, so an error unwinds it first).
    std::optional<GradientReduction> reduction;
    double replicated_sq = 0, expert_sq = 0;
    double aux_loss = 0, grad_norm = 0, cross_entropy = 0, loss = 0;
    float clip = 1.0f;
    double lr = 0;
    bool checkpoint_now = false;
  };

  // A fresh start or the newest checkpoint's state (with notes for what an
  // elastic resume changed); returns the step the run starts from.
  std::int64_t resume() {
    const std::optional<std::int64_t> resume_from = checkpoint_to_resume(config_);
    if (resume_from) {
      const CheckpointLoad loaded = load_checkpoint(*store_, *resume_from, rank_, num_ranks_, state_);
      summary_.resumed_from = resume_from;
      if (rank_ == 0 && observer_.on_note) {
        if (loaded.saved_num_ranks != num_ranks_) {
          observer_.on_note("resharding the experts of " + store_->step_dir(*resume_from).string() + " from " +
                            std::to_string(loaded.saved_num_ranks) + " to " + std::to_string(num_ranks_) + " ranks");
        }
        for (const std::string& note : loaded.notes) observer_.on_note(note);
      }
    }
    return resume_from.value_or(0);
  }

  void run_step(std::int64_t index) {
    Step s;
    s.index = index;
    if (s.clock != nullptr) s.modelled_start = modelled_mark(*s.clock);
    s.moe_before = moe_phase_totals(model_);
    forward(s);
    start_forward_stats(s);
    // The load-balance loss's gradient needs the global counts from the last
    // layer's backward on: overlapped, the exchange completes under the
    // head's backward (backward()), else before the backward; without that
    // loss it runs under the whole backward.
    if (config_.aux_loss_coef > 0 && !config_.overlap_gradient_all_reduce) finish_forward_stats(s, true);
    if (s.clock != nullptr) s.modelled_forward_end = modelled_mark(*s.clock);
    // The previous step's metrics exchange ran under this forward.
    {
      ScopedPhase phase(s.times, "metrics_exchange");
      finish_metrics();
    }
    backward(s);
    finish_forward_stats(s, true);
    forecast_replicas(s);
    finish_gradients(s);
    check_finite(s);
    optimizer(s);
    exchange_metrics(s);
    checkpoint(s);
    ++summary_.steps_run;
  }

  // Forward on this rank's sequences [rank * B_l, (rank + 1) * B_l).
  void forward(Step& s) {
    ScopedPhase phase(s.times, "forward");
    const Tensor tokens = data_.batch(s.index, rank_ * local_sequences_, local_sequences_);
    s.forward = model_.forward(tokens, global_tokens_, s.index);
  }

  // Global expert counts (the load-balance loss, the bias update, the
  // record) and the cross-entropy sum, gathered in rank order so that every
  // rank sums them in the same order.
  void start_forward_stats(Step& s) {
    ScopedPhase phase(s.times, "forward_stats_exchange");
    s.forward_words = s.forward.expert_counts;
    s.forward_words.push_back(bits_of(s.forward.loss_sum));
    s.all_forward_words.resize(s.forward_words.size() * static_cast<std::size_t>(num_ranks_));
    s.forward_stats =
        comm::ring_all_gather(comm_, {.input = s.forward_words.data(),
                                      .output = s.all_forward_words.data(),
                                      .num_elements_per_rank = static_cast<std::int64_t>(s.forward_words.size()),
                                      .dtype = DType::i64,
                                      .tag = tags_ + kForwardStats,
                                      .timeout = timeout_});
  }
  // `timed`: a phase of its own, unless it completes inside the backward's
  // (the backward's time then includes the wait).
  void finish_forward_stats(Step& s, bool timed) {
    if (s.forward_stats_done) return;
    std::optional<ScopedPhase> phase;
    if (timed) phase.emplace(s.times, "forward_stats_exchange");
    s.forward_stats.wait();
    s.forward_stats_done = true;
    const std::size_t words = s.forward_words.size();
    s.counts.assign(s.forward.expert_counts.size(), 0);
    for (int r = 0; r < num_ranks_; ++r) {
      const std::int64_t* part = s.all_forward_words.data() + r * words;
      for (std::size_t i = 0; i < s.counts.size(); ++i) s.counts[i] += part[i];
      s.loss_sum += double_of(part[s.counts.size()]);
    }
  }

  // balance=dynamic with replica_planning=forecast: each layer's next step
  // looks for replicas only when this step's counts, which every rank holds
  // from the exchange above, say a priced plan would place some; otherwise
  // the layer skips its counts round (a look costs no collective).
  void forecast_replicas(const Step& s) {
    const std::size_t words = s.forward_words.size();
    std::vector<std::int64_t> rank_expert_counts(static_cast<std::size_t>(num_ranks_) * num_experts_);
    for (int l = 0; l < num_layers_; ++l) {
      for (int r = 0; r < num_ranks_; ++r) {
        const std::int64_t* part = s.all_forward_words.data() + r * words + l * num_experts_;
        std::copy(part, part + num_experts_, rank_expert_counts.begin() + r * num_experts_);
      }
      model_.layer(l).forecast_replicas(rank_expert_counts);
    }
  }

  // The backward, with the replicated gradients copied into the flat buffer
  // as each layer finishes them and their sum over ranks started there (the
  // head's first), so that it runs under the backward of earlier layers.
  void backward(Step& s) {
    ScopedPhase phase(s.times, "backward");
    // Asked for by the first layer whose load-balance loss needs them: after
    // the head's backward overlapped, already complete otherwise (run_step).
    const auto global_counts = [&] {
      finish_forward_stats(s, false);
      return std::span<const std::int64_t>(s.counts);
    };
    if (!config_.overlap_gradient_all_reduce) {
      s.aux_part = model_.backward(global_counts, config_.aux_loss_coef);
      return;
    }
    s.reduction.emplace(comm_, std::span<float>(flat_), tags_ + kGradientBuckets, timeout_);
    std::int64_t ready_begin = replicated_;
    s.aux_part = model_.backward(global_counts, config_.aux_loss_coef, [&](std::span<Parameter* const> done) {
      std::int64_t begin = ready_begin, end = ready_begin;
      for (Parameter* p : done) {
        if (!p->replicated) continue;
        const std::int64_t offset = flat_offset_.at(p);
        std::copy(p->grad.data<float>(), p->grad.data<float>() + p->grad.numel(), flat_.begin() + offset);
        begin = std::min(begin, offset);
        end = std::max(end, offset + p->grad.numel());
      }
      // The backward finishes parameters in the reverse of their order in
      // the buffer, so what is ready is always its tail.
      EPMOE_CHECK_EQ(end, ready_begin);
      ready_begin = begin;
      s.reduction->ready(begin);
    });
    EPMOE_CHECK_EQ(ready_begin, std::int64_t{0});
  }

  // The replicated gradients summed over ranks (identical everywhere), and
  // the global gradient norm: replicated + every rank's experts, whose
  // squares are exchanged while the last gradient buckets are in flight.
  void finish_gradients(Step& s) {
    for (const Parameter& p : state_.parameters()) {
      if (p.replicated) continue;
      for (const float g : p.grad.span<float>()) s.expert_sq += static_cast<double>(g) * g;
    }
    std::vector<std::int64_t> own = {bits_of(s.aux_part), bits_of(s.expert_sq)}, all(2 * num_ranks_);
    comm::CollectiveHandle backward_stats = comm::ring_all_gather(comm_, {.input = own.data(),
                                                                          .output = all.data(),
                                                                          .num_elements_per_rank = 2,
                                                                          .dtype = DType::i64,
                                                                          .tag = tags_ + kBackwardStats,
                                                                          .timeout = timeout_});
    {
      ScopedPhase phase(s.times, "gradient_all_reduce");
      if (s.reduction) {
        s.reduction->wait();
      } else {
        std::size_t offset = 0;
        for (const Parameter& p : state_.parameters()) {
          if (!p.replicated) continue;
          std::copy(p.grad.data<float>(), p.grad.data<float>() + p.grad.numel(), flat_.begin() + offset);
          offset += static_cast<std::size_t>(p.grad.numel());
        }
        if (num_ranks_ > 1 && replicated_ > 0) {
          comm::all_reduce(
              comm_,
              {.data = flat_.data(), .num_elements = replicated_, .tag = tags_ + kGradients, .timeout = timeout_})
              .wait();
        }
      }
    }
    for (const float g : flat_) s.replicated_sq += static_cast<double>(g) * g;
    {
      ScopedPhase phase(s.times, "backward_stats_exchange");
      backward_stats.wait();
    }
    s.expert_sq = 0;
    for (int r = 0; r < num_ranks_; ++r) {
      s.aux_loss += double_of(all[2 * r]);
      s.expert_sq += double_of(all[2 * r + 1]);
    }
    s.grad_norm = std::sqrt(s.replicated_sq + s.expert_sq);
    s.cross_entropy = s.loss_sum / static_cast<double>(global_tokens_);
    s.loss = s.cross_entropy + s.aux_loss;
  }

  // Before the update, so the parameters (and the last checkpoint) stay finite.
  void check_finite(Step& s) {
    if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
      throw Error("step " + std::to_string(s.index + 1) + ": the loss is " + std::to_string(s.loss) +
                  " and the gradient norm " + std::to_string(s.grad_norm) +
                  " (training diverged); lower learning_rate or set grad_clip");
    }
    summary_.losses.push_back(s.loss);
  }

  // Clipping by the global norm, AdamW at the step's learning rate, and the
  // aux-loss-free bias update from the global counts.
  void optimizer(Step& s) {
    s.clip = config_.grad_clip > 0 && s.grad_norm > config_.grad_clip
                 ? static_cast<float>(config_.grad_clip / s.grad_norm)
                 : 1.0f;
    s.lr = config_.learning_rate.at(s.index);
    ScopedPhase phase(s.times, "optimizer");
    std::size_t offset = 0;
    for (Parameter& p : state_.parameters()) {
      const std::size_t n = static_cast<std::size_t>(p.value.numel());
      const std::span<const float> grad = p.replicated ? std::span<const float>(flat_.data() + offset, n)
                                                       : std::span<const float>(p.grad.span<float>());
      if (p.replicated) offset += n;
      adamw_update(config_.adamw, s.index + 1, s.lr, p.decay, s.clip, p.value.span<float>(), grad,
                   p.adam_m.span<float>(), p.adam_v.span<float>());
    }
    for (int l = 0; update_bias_ && l < num_layers_; ++l) {
      update_selection_bias(std::span<const std::int64_t>(s.counts).subspan(static_cast<std::size_t>(l * num_experts_),
                                                                            static_cast<std::size_t>(num_experts_)),
                            static_cast<float>(config_.bias_update_rate), *model_.selection_bias(l));
    }
  }

  // A step's record in the making: the global values and (rank 0) its own
  // measurements, waiting for every rank's report.
  struct PendingMetrics {
    StepRecord record;  // its step names the pending step
    std::unique_ptr<StepReportExchange> exchange;
  };

  // The record of the step, and the exchange of every rank's report. When
  // no checkpoint follows and it is not the last step, the exchange runs
  // under the next step's forward and the record is completed there
  // (finish_metrics), before anything else of that step can fail; with a
  // checkpoint it completes here, so that the line goes out before the
  // checkpoint is committed.
  void exchange_metrics(Step& s) {
    auto pending = std::make_unique<PendingMetrics>();
    StepRecord& record = pending->record;
    record.step = s.index + 1;
    record.loss = s.loss;
    record.cross_entropy = s.cross_entropy;
    record.aux_loss = s.aux_loss;
    record.grad_norm = s.grad_norm;
    record.learning_rate = s.lr;
    record.routed_pairs = global_tokens_ * model_config_.layer.router.top_k * num_layers_;
    const bool last = s.index + 1 == config_.steps;
    s.checkpoint_now =
        store_ && (last || (config_.checkpoint_every > 0 && (s.index + 1) % config_.checkpoint_every == 0));
    if (s.checkpoint_now) record.checkpoint_step = s.index + 1;
    std::optional<ModelledRankTime> modelled;
    if (s.clock != nullptr) {
      modelled = modelled_between(*s.clock, s.modelled_start, s.modelled_forward_end, modelled_mark(*s.clock));
    }
    // The sum over ranks moves each element across R-1 links twice (the
    // reduce-scatter and the all-gather of the ring all-reduce, or of each
    // bucket): ranks report equal shares, rank 0 the remainder.
    const std::int64_t moved = s.reduction ? s.reduction->elements_moved_over_all_ranks()
                                           : 2 * static_cast<std::int64_t>(num_ranks_ - 1) * replicated_;
    const std::int64_t moved_bytes = 4 * moved;
    const std::int64_t grad_bytes = moved_bytes / num_ranks_ + (rank_ == 0 ? moved_bytes % num_ranks_ : 0);
    const bool deferred = !s.checkpoint_now && !last;
    {
      ScopedPhase phase(s.times, "metrics_exchange");
      pending->exchange = std::make_unique<StepReportExchange>(
          comm_, record.step, rank_step_report(model_, grad_bytes, std::move(modelled)), tags_ + kRankReports,
          timeout_);
      if (!deferred) pending->exchange->reports();
    }
    if (rank_ == 0) own_measurements(s, record);
    pending_metrics_ = std::move(pending);
    if (!deferred) finish_metrics();
  }

  // Rank 0: the step's timings (up to its metrics exchange, or through it
  // when it completes in the step), phases and loads, from this rank's view.
  void own_measurements(Step& s, StepRecord& record) {
    record.step_seconds = s.watch.elapsed_seconds();
    record.tokens_per_second = static_cast<double>(global_tokens_) / record.step_seconds;
    record.phase_seconds = s.times;
    if (previous_checkpoint_seconds_ >= 0) record.phase_seconds["checkpoint"] = previous_checkpoint_seconds_;
    for (const auto& [phase, total] : moe_phase_totals(model_)) {
      const auto before = s.moe_before.find(phase);
      record.phase_seconds[phase] = total - (before == s.moe_before.end() ? 0.0 : before->second);
    }
    for (int l = 0; l < num_layers_; ++l) {
      const std::vector<std::int64_t> layer_counts(s.counts.begin() + l * num_experts_,
                                                   s.counts.begin() + (l + 1) * num_experts_);
      record.expert_load_max_over_mean.push_back(max_over_mean(layer_counts));
      // Rows per rank with every expert at home: its experts' counts.
      std::vector<std::int64_t> rank_loads(static_cast<std::size_t>(num_ranks_), 0);
      for (int e = 0; e < num_experts_; ++e) rank_loads[e / (num_experts_ / num_ranks_)] += layer_counts[e];
      record.rank_load_max_over_mean_before.push_back(max_over_mean(rank_loads));
      record.rank_load_max_over_mean_after.push_back(max_over_mean(rank_loads));
      record.expert_counts.push_back(layer_counts);
    }
    add_replica_plans(record, model_);
  }

  // Completes the pending record from every rank's report: drops on every
  // rank (so that every rank's summary holds the run's total); rank 0 adds
  // the rest (add_rank_reports) and hands the record to the observer. The metrics line of step N goes out (flushed,
  // and fsynced when a checkpoint follows) before checkpoint N is
  // committed: a run killed right after the commit must not leave a
  // checkpoint whose step has no line, which a resume could not regenerate.
  // An error names the record's step.
  void finish_metrics() {
    if (!pending_metrics_) return;
    const std::unique_ptr<PendingMetrics> pending = std::move(pending_metrics_);
    try {
      StepRecord& record = pending->record;
      const std::vector<RankStepReport>& reports = pending->exchange->reports();
      for (const RankStepReport& report : reports) record.dropped_pairs += report.dropped_pairs;
      summary_.dropped_pairs += record.dropped_pairs;
      summary_.routed_pairs += record.routed_pairs;
      if (rank_ != 0) return;
      add_rank_reports(record, reports, global_tokens_);
      if (observer_.on_step) observer_.on_step(record);
    } catch (const Error&) {
      rethrow_naming_step(pending->record.step);
    }
  }

  // Every checkpoint_every steps and after the last; its time goes into the
  // next step's record (phase "checkpoint").
  void checkpoint(Step& s) {
    previous_checkpoint_seconds_ = -1;
    if (!s.checkpoint_now) return;
    // On the thread's clock, as the phases are: writing files charges no
    // modelled time, so a modelled run reports 0 here, not the host's time.
    const double checkpoint_start = this_thread_clock_seconds();
    nlohmann::json metadata = config_.checkpoint_metadata;
    metadata["step"] = s.index + 1;
    metadata["num_ranks"] = num_ranks_;
    metadata["loss"] = s.loss;
    save_checkpoint(*store_, s.index + 1, state_, metadata, checkpoint_context_);
    if (rank_ == 0) store_->remove_all_but_latest(config_.checkpoint_keep);
    summary_.last_checkpoint = s.index + 1;
    previous_checkpoint_seconds_ = this_thread_clock_seconds() - checkpoint_start;
  }

  transport::Communicator& comm_;
  const TrainerConfig& config_;
  const MoeLmConfig& model_config_;
  const TrainObserver& observer_;
  const int num_ranks_, rank_;
  const std::int64_t local_sequences_, global_tokens_;
  const std::uint32_t tags_;
  const std::chrono::milliseconds timeout_;
  MemoryLedger ledger_;
  MoeLm model_;
  ParameterSet& state_;
  const SyntheticTokens data_;
  const int num_layers_, num_experts_;
  const bool update_bias_;
  const std::optional<CheckpointStore> store_;
  const CheckpointContext checkpoint_context_;
  // The replicated gradients travel in one flat buffer, summed in place.
  const std::int64_t replicated_;
  std::vector<float> flat_;
  std::map<const Parameter*, std::int64_t> flat_offset_;
  std::unique_ptr<PendingMetrics> pending_metrics_;  // a step whose record is not complete
  TrainSummary summary_;
  // The checkpoint after step N is written after N's metrics line; its time
  // is reported in the line of step N + 1 (phase "checkpoint").
  double previous_checkpoint_seconds_ = -1;  // < 0: none
};

}  // namespace

TrainSummary train(transport::Communicator& comm, EpGroup& group, const TrainerConfig& config,
                   const MoeLmConfig& model_config, const TrainObserver& observer) {
  config.validate(comm.size());
  EPMOE_CHECK_EQ(model_config.vocab_size, config.data.vocab_size);
  EPMOE_CHECK_EQ(group.size(), comm.size());
  return TrainingRun(comm, group, config, model_config, observer).run();
}

}  // namespace epmoe
