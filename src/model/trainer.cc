#include "model/trainer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <typeinfo>

#include "comm/all_gather.h"
#include "comm/all_gather_texts.h"
#include "comm/all_reduce.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/modelled_report.h"
#include "core/timer.h"
#include "model/checkpoint.h"
#include "moe/load_balance.h"

namespace epmoe {
namespace {

// Collective tags, relative to TrainerConfig::tag_base.
enum TrainerTag : std::uint32_t {
  kForwardStats = 0,
  kGradients = 1,
  kBackwardStats = 2,
  kRankReports = 3,   // and 4 (all_gather_texts)
  kCheckpoint = 8,    // .. 10 (save_checkpoint's barriers)
};

double max_over_mean(const std::vector<std::int64_t>& loads) {
  if (loads.empty()) return 1.0;
  std::int64_t total = 0, max = 0;
  for (const std::int64_t l : loads) {
    total += l;
    max = std::max(max, l);
  }
  return total > 0 ? static_cast<double>(max) * static_cast<double>(loads.size()) / static_cast<double>(total)
                   : 1.0;
}

// Each rank's int64 vector (doubles travel as their bits), gathered in rank
// order: every sum across ranks is then formed in rank order, the same on
// every rank and every transport.
std::vector<std::int64_t> all_gather_words(transport::Communicator& comm, const std::vector<std::int64_t>& own,
                                           std::uint32_t tag, std::chrono::milliseconds timeout) {
  std::vector<std::int64_t> all(own.size() * static_cast<std::size_t>(comm.size()));
  comm::ring_all_gather(comm, {.input = own.data(), .output = all.data(),
                               .num_elements_per_rank = static_cast<std::int64_t>(own.size()),
                               .dtype = DType::i64, .tag = tag, .timeout = timeout})
      .wait();
  return all;
}

std::int64_t bits_of(double value) { return std::bit_cast<std::int64_t>(value); }
double double_of(std::int64_t bits) { return std::bit_cast<double>(bits); }

// The MoE layers' phase times accumulate over the run; a step reports the
// difference.
std::map<std::string, double> moe_phase_totals(const MoeLm& model) {
  std::map<std::string, double> totals;
  for (int l = 0; l < model.config().num_layers; ++l) {
    for (const auto& [phase, seconds] : model.layer(l).stats().phase_seconds.seconds()) {
      totals["moe/" + phase] += seconds;
    }
  }
  return totals;
}

// The ring all-reduce (fixed-order reduce-scatter + all-gather, comm/
// all_reduce.h) moves each of the R blocks R-1 hops in each phase: 2(R-1)S
// bytes over all ranks for S bytes of gradients. Ranks report equal shares;
// rank 0 takes the remainder so that the sum is exact.
std::int64_t gradient_all_reduce_bytes(std::int64_t bytes, int num_ranks, int rank) {
  const std::int64_t total = 2 * (num_ranks - 1) * bytes;
  return total / num_ranks + (rank == 0 ? total % num_ranks : 0);
}

// What one rank measured in a step, gathered to rank 0 for the record.
nlohmann::json rank_report(const MoeLm& model, std::int64_t grad_bytes, const std::optional<ModelledRankTime>& modelled) {
  std::map<std::string, std::int64_t> bytes;
  std::int64_t saved_peak = 0, dropped = 0;
  nlohmann::json after = nlohmann::json::array();
  for (int l = 0; l < model.config().num_layers; ++l) {
    const MoeLayer& layer = model.layer(l);
    for (const auto& [name, count] : layer.dispatch_stats().bytes_sent) bytes["moe/" + name] += count;
    saved_peak = std::max(saved_peak, layer.stats().saved_activation_peak_bytes);
    dropped += layer.dispatch_stats().dropped_pairs;
    // The replica plan's per-rank loads after balancing (null without replicas).
    const ep::DispatchStats& stats = layer.dispatch_stats();
    after.push_back(stats.rank_loads_after.empty() ? nlohmann::json() : nlohmann::json(stats.max_over_mean_after));
  }
  bytes["gradients/all_reduce"] = grad_bytes;
  nlohmann::json report = {{"bytes_sent", bytes}, {"saved_peak", saved_peak}, {"dropped", dropped}, {"after", after}};
  if (modelled) report["modelled"] = *modelled;
  return report;
}

// An error raised inside step N (a layer's non-finite check, a peer's
// failure, a checkpoint write) is rethrown as the same kind with "step N: "
// in front, so the message says when; one that already names its step (the
// divergence check) passes unchanged.
[[noreturn]] void rethrow_naming_step(std::int64_t step) {
  try {
    throw;
  } catch (const Error& e) {
    const std::string prefix = "step " + std::to_string(step) + ": ";
    const std::string what = e.what();
    if (what.rfind(prefix, 0) == 0) throw;
    // Rebuilt only as one of the kinds known here, matched exactly: any other
    // subclass passes as it is, because its type carries meaning (a peer
    // woken by another rank's failure is told from the root cause by its
    // type, and its text is that rank's, step included).
    const std::type_info& kind = typeid(e);
    if (kind == typeid(InjectedFault)) throw InjectedFault(prefix + what);
    if (kind == typeid(NumericError)) throw NumericError(prefix + what);
    if (kind == typeid(ConfigError)) throw ConfigError(prefix + what);
    if (kind == typeid(FileError)) throw FileError(prefix + what);
    if (kind == typeid(PeerError)) throw PeerError(prefix + what);
    if (kind == typeid(Error)) throw Error(prefix + what);
    throw;
  }
}

}  // namespace

void to_json(nlohmann::json& out, const StepRecord& r) {
  out = {{"step", r.step},
         {"loss", r.loss},
         {"cross_entropy", r.cross_entropy},
         {"aux_loss", r.aux_loss},
         {"grad_norm", r.grad_norm},
         {"learning_rate", r.learning_rate},
         {"step_seconds", r.step_seconds},
         {"tokens_per_second", r.tokens_per_second},
         {"phase_seconds", r.phase_seconds},
         {"bytes_sent", r.bytes_sent},
         {"expert_load_max_over_mean", r.expert_load_max_over_mean},
         {"rank_load_max_over_mean_before", r.rank_load_max_over_mean_before},
         {"rank_load_max_over_mean_after", r.rank_load_max_over_mean_after},
         {"expert_counts", r.expert_counts},
         {"saved_activation_peak_bytes", r.saved_activation_peak_bytes},
         {"dropped_pairs", r.dropped_pairs},
         {"routed_pairs", r.routed_pairs}};
  if (r.checkpoint_step) out["checkpoint_step"] = *r.checkpoint_step;
  if (!r.modelled.is_null()) out["modelled"] = r.modelled;
}

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
                      CheckpointStore::kManifestName + " (a partial copy or a damaged checkpoint: commit "
                      "never leaves one); it is not resumable and this run would stop at step " +
                      std::to_string(step) + " rather than overwrite it; remove or repair it");
    }
  }
  if (!latest) return std::nullopt;  // resume=true with nothing to resume: a fresh start
  if (!config.resume) {
    throw ConfigError("checkpoint_dir=" + config.checkpoint_dir + " already holds checkpoints (newest: " +
                      store.step_dir(*latest).string() + "); pass resume=true to continue from it, or "
                      "choose another checkpoint_dir (checkpoints are never overwritten)");
  }
  check_checkpoint_compatibility(store, *latest, config.checkpoint_metadata.value("compatibility", nlohmann::json::object()));
  return latest;
}

TrainSummary train(transport::Communicator& comm, const TrainerConfig& config, const MoeLmConfig& model_config,
                   const DispatcherFactory& make_dispatcher, const TrainObserver& observer) {
  const int num_ranks = comm.size(), rank = comm.rank();
  config.validate(num_ranks);
  const std::int64_t local_sequences = config.batch_size / num_ranks;
  const std::int64_t global_tokens = config.batch_size * config.data.seq_len;
  const std::uint32_t tags = config.tag_base;
  const std::chrono::milliseconds timeout = config.comm_timeout;
  EPMOE_CHECK_EQ(model_config.vocab_size, config.data.vocab_size);

  MemoryLedger ledger;
  MoeLm model(model_config, num_ranks, rank, make_dispatcher, &ledger);
  ParameterSet& state = model.state();
  const SyntheticTokens data(config.data);
  const int num_layers = model_config.num_layers, num_experts = model_config.layer.router.num_experts;
  const bool update_bias = config.bias_update_rate > 0 && model_config.layer.router.kind == RouterKind::sigmoid_grouped;

  TrainSummary summary;
  const std::optional<CheckpointStore> store =
      config.checkpoint_dir.empty() ? std::nullopt : std::optional<CheckpointStore>(config.checkpoint_dir);
  const std::optional<std::int64_t> resume_from = checkpoint_to_resume(config);
  if (resume_from) {
    const CheckpointLoad loaded = load_checkpoint(*store, *resume_from, rank, num_ranks, state);
    summary.resumed_from = resume_from;
    if (rank == 0 && observer.on_note) {
      if (loaded.saved_num_ranks != num_ranks) {
        observer.on_note("resharding the experts of " + store->step_dir(*resume_from).string() + " from " +
                         std::to_string(loaded.saved_num_ranks) + " to " + std::to_string(num_ranks) + " ranks");
      }
      for (const std::string& note : loaded.notes) observer.on_note(note);
    }
  }
  const std::int64_t first_step = resume_from.value_or(0);
  if (rank == 0 && observer.on_start) observer.on_start(first_step, resume_from);
  const CheckpointContext checkpoint_context{&comm, tags + kCheckpoint, timeout};

  // The replicated gradients travel in one flat buffer, summed in place.
  const std::int64_t replicated = state.replicated_elements();
  std::vector<float> flat(static_cast<std::size_t>(replicated));
  Stopwatch run_watch;
  // The checkpoint after step N is written after N's metrics line; its time
  // is reported in the line of step N + 1 (phase "checkpoint").
  double previous_checkpoint_seconds = -1;  // < 0: none
  for (std::int64_t step = first_step; step < config.steps; ++step) try {
    Stopwatch step_watch;
    // clock=modelled: marks at the step's start, after the forward (and its
    // stats exchange), and before the metrics exchange.
    const ModelledClock* const clock = this_thread_modelled_clock();
    ModelledMark modelled_start, modelled_forward_end;
    if (clock != nullptr) modelled_start = modelled_mark(*clock);
    PhaseTimes times;
    const std::map<std::string, double> moe_before = moe_phase_totals(model);

    // Forward on this rank's sequences [rank * B_l, (rank + 1) * B_l).
    LmForwardResult forward;
    {
      ScopedPhase phase(times, "forward");
      const Tensor tokens = data.batch(step, rank * local_sequences, local_sequences);
      forward = model.forward(tokens, global_tokens, step);
    }
    // Global expert counts and cross-entropy, summed in rank order.
    std::vector<std::int64_t> counts(forward.expert_counts.size(), 0);
    double loss_sum = 0;
    {
      ScopedPhase phase(times, "forward_stats_exchange");
      std::vector<std::int64_t> own = forward.expert_counts;
      own.push_back(bits_of(forward.loss_sum));
      const std::vector<std::int64_t> all = all_gather_words(comm, own, tags + kForwardStats, timeout);
      for (int r = 0; r < num_ranks; ++r) {
        const std::int64_t* part = all.data() + r * own.size();
        for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += part[i];
        loss_sum += double_of(part[counts.size()]);
      }
    }
    if (clock != nullptr) modelled_forward_end = modelled_mark(*clock);
    double aux_part = 0;
    {
      ScopedPhase phase(times, "backward");
      aux_part = model.backward(counts, config.aux_loss_coef);
    }
    // Replicated gradients: one all-reduce of the flat buffer.
    {
      ScopedPhase phase(times, "gradient_all_reduce");
      std::size_t offset = 0;
      for (const Parameter& p : state.parameters()) {
        if (!p.replicated) continue;
        std::copy(p.grad.data<float>(), p.grad.data<float>() + p.grad.numel(), flat.begin() + offset);
        offset += static_cast<std::size_t>(p.grad.numel());
      }
      if (num_ranks > 1 && replicated > 0) {
        comm::all_reduce(comm, {.data = flat.data(), .num_elements = replicated, .tag = tags + kGradients,
                                .timeout = timeout})
            .wait();
      }
    }
    // Global gradient norm: replicated (identical everywhere) + every rank's experts.
    double replicated_sq = 0, expert_sq = 0;
    for (const float g : flat) replicated_sq += static_cast<double>(g) * g;
    for (const Parameter& p : state.parameters()) {
      if (p.replicated) continue;
      for (const float g : p.grad.span<float>()) expert_sq += static_cast<double>(g) * g;
    }
    double aux_loss = 0;
    {
      ScopedPhase phase(times, "backward_stats_exchange");
      const std::vector<std::int64_t> all =
          all_gather_words(comm, {bits_of(aux_part), bits_of(expert_sq)}, tags + kBackwardStats, timeout);
      expert_sq = 0;
      for (int r = 0; r < num_ranks; ++r) {
        aux_loss += double_of(all[2 * r]);
        expert_sq += double_of(all[2 * r + 1]);
      }
    }
    const double grad_norm = std::sqrt(replicated_sq + expert_sq);
    const double cross_entropy = loss_sum / static_cast<double>(global_tokens);
    const double loss = cross_entropy + aux_loss;
    // Checked before the update, so the parameters (and the last checkpoint) stay finite.
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      throw Error("step " + std::to_string(step + 1) + ": the loss is " + std::to_string(loss) +
                  " and the gradient norm " + std::to_string(grad_norm) +
                  " (training diverged); lower learning_rate or set grad_clip");
    }
    summary.losses.push_back(loss);
    const float clip = config.grad_clip > 0 && grad_norm > config.grad_clip
                           ? static_cast<float>(config.grad_clip / grad_norm)
                           : 1.0f;
    const double lr = config.learning_rate.at(step);
    {
      ScopedPhase phase(times, "optimizer");
      std::size_t offset = 0;
      for (Parameter& p : state.parameters()) {
        const std::size_t n = static_cast<std::size_t>(p.value.numel());
        const std::span<const float> grad =
            p.replicated ? std::span<const float>(flat.data() + offset, n) : std::span<const float>(p.grad.span<float>());
        if (p.replicated) offset += n;
        adamw_update(config.adamw, step + 1, lr, p.decay, clip, p.value.span<float>(), grad, p.adam_m.span<float>(),
                     p.adam_v.span<float>());
      }
      for (int l = 0; update_bias && l < num_layers; ++l) {
        update_selection_bias(std::span<const std::int64_t>(counts).subspan(static_cast<std::size_t>(l * num_experts),
                                                                           static_cast<std::size_t>(num_experts)),
                              static_cast<float>(config.bias_update_rate), *model.selection_bias(l));
      }
    }


    // The record: rank 0's timings; bytes, loads and peaks from every rank.
    StepRecord record;
    record.step = step + 1;
    record.loss = loss;
    record.cross_entropy = cross_entropy;
    record.aux_loss = aux_loss;
    record.grad_norm = grad_norm;
    record.learning_rate = lr;
    std::vector<std::string> reports;
    std::optional<ModelledRankTime> modelled;
    if (clock != nullptr) modelled = modelled_between(*clock, modelled_start, modelled_forward_end, modelled_mark(*clock));
    {
      ScopedPhase phase(times, "metrics_exchange");
      reports = comm::all_gather_texts(
          comm, rank_report(model, gradient_all_reduce_bytes(replicated * 4, num_ranks, rank), modelled).dump(),
          tags + kRankReports, timeout);
    }
    // Drops on every rank (the reports reach all ranks), so every rank's
    // summary holds the run's total.
    for (const std::string& text : reports) {
      record.dropped_pairs += nlohmann::json::parse(text)["dropped"].get<std::int64_t>();
    }
    record.routed_pairs = global_tokens * model_config.layer.router.top_k * num_layers;
    summary.dropped_pairs += record.dropped_pairs;
    summary.routed_pairs += record.routed_pairs;
    const bool last = step + 1 == config.steps;
    const bool checkpoint_now =
        store && (last || (config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0));
    if (checkpoint_now) record.checkpoint_step = step + 1;
    // The metrics line of step N goes out (flushed, and fsynced when a
    // checkpoint follows) before checkpoint N is committed: a run killed
    // right after the commit must not leave a checkpoint whose step has no
    // line, which a resume could not regenerate.
    if (rank == 0) {
      record.step_seconds = step_watch.elapsed_seconds();
      record.tokens_per_second = static_cast<double>(global_tokens) / record.step_seconds;
      record.phase_seconds = times.seconds();
      if (previous_checkpoint_seconds >= 0) record.phase_seconds["checkpoint"] = previous_checkpoint_seconds;
      for (const auto& [phase, total] : moe_phase_totals(model)) {
        const auto before = moe_before.find(phase);
        record.phase_seconds[phase] = total - (before == moe_before.end() ? 0.0 : before->second);
      }
      for (int l = 0; l < num_layers; ++l) {
        const std::vector<std::int64_t> layer_counts(counts.begin() + l * num_experts,
                                                     counts.begin() + (l + 1) * num_experts);
        record.expert_load_max_over_mean.push_back(max_over_mean(layer_counts));
        // Rows per rank with every expert at home: its experts' counts.
        std::vector<std::int64_t> rank_loads(static_cast<std::size_t>(num_ranks), 0);
        for (int e = 0; e < num_experts; ++e) rank_loads[e / (num_experts / num_ranks)] += layer_counts[e];
        record.rank_load_max_over_mean_before.push_back(max_over_mean(rank_loads));
        record.rank_load_max_over_mean_after.push_back(max_over_mean(rank_loads));
        record.expert_counts.push_back(layer_counts);
      }
      for (const std::string& text : reports) {
        const nlohmann::json report = nlohmann::json::parse(text);
        for (const auto& [name, bytes] : report["bytes_sent"].items()) record.bytes_sent[name] += bytes.get<std::int64_t>();
        record.saved_activation_peak_bytes =
            std::max(record.saved_activation_peak_bytes, report["saved_peak"].get<std::int64_t>());
      }
      // With replicas the plan's per-rank loads after balancing (the same on
      // every rank) replace the at-home ones.
      if (modelled) {
        std::vector<ModelledRankTime> ranks;
        for (const std::string& text : reports) ranks.push_back(nlohmann::json::parse(text)["modelled"].get<ModelledRankTime>());
        const ModelledStep step_time = modelled_step(ranks);
        record.modelled = step_time.json;
        record.modelled["tokens_per_second"] =
            step_time.step_seconds > 0 ? static_cast<double>(global_tokens) / step_time.step_seconds : 0.0;
      }
      const nlohmann::json own = nlohmann::json::parse(reports[0]);
      for (int l = 0; l < num_layers; ++l) {
        if (!own["after"][l].is_null()) record.rank_load_max_over_mean_after[l] = own["after"][l].get<double>();
      }
      if (observer.on_step) observer.on_step(record);
    }
    previous_checkpoint_seconds = -1;
    if (checkpoint_now) {
      Stopwatch checkpoint_watch;
      nlohmann::json metadata = config.checkpoint_metadata;
      metadata["step"] = step + 1;
      metadata["num_ranks"] = num_ranks;
      metadata["loss"] = loss;
      save_checkpoint(*store, step + 1, state, metadata, checkpoint_context);
      if (rank == 0) store->remove_all_but_latest(config.checkpoint_keep);
      summary.last_checkpoint = step + 1;
      previous_checkpoint_seconds = checkpoint_watch.elapsed_seconds();
    }
    ++summary.steps_run;
  } catch (const Error&) {
    rethrow_naming_step(step + 1);
  }
  summary.seconds = run_watch.elapsed_seconds();
  return summary;
}

}  // namespace epmoe
