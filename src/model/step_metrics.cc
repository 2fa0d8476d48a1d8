#include "model/step_metrics.h"

#include <algorithm>
#include <utility>

#include "comm/all_gather_texts.h"
#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/trace_recorder.h"
#include "ep/replica_verdict.h"

namespace epmoe {

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
         {"replicas", r.replicas},
         {"replica_verdicts", r.replica_verdicts},
         {"expert_counts", r.expert_counts},
         {"saved_activation_peak_bytes", r.saved_activation_peak_bytes},
         {"dropped_pairs", r.dropped_pairs},
         {"routed_pairs", r.routed_pairs}};
  if (r.checkpoint_step) out["checkpoint_step"] = *r.checkpoint_step;
  if (!r.modelled.is_null()) out["modelled"] = r.modelled;
}

namespace {

// The wire form of a report (between ranks of one run, never stored).
nlohmann::json encode(const RankStepReport& report) {
  nlohmann::json out = {{"bytes_sent", report.bytes_sent},
                        {"saved_peak", report.saved_activation_peak_bytes},
                        {"dropped", report.dropped_pairs}};
  if (report.modelled) out["modelled"] = *report.modelled;
  return out;
}

RankStepReport decode(const std::string& text) {
  const nlohmann::json in = nlohmann::json::parse(text);
  RankStepReport report;
  report.bytes_sent = in.at("bytes_sent").get<std::map<std::string, std::int64_t>>();
  report.saved_activation_peak_bytes = in.at("saved_peak").get<std::int64_t>();
  report.dropped_pairs = in.at("dropped").get<std::int64_t>();
  if (in.contains("modelled")) report.modelled = in.at("modelled").get<ModelledRankTime>();
  return report;
}

}  // namespace

RankStepReport rank_step_report(const MoeLm& model, std::int64_t gradient_bytes,
                                std::optional<ModelledRankTime> modelled) {
  RankStepReport report;
  for (int l = 0; l < model.config().num_layers; ++l) {
    const MoeLayer& layer = model.layer(l);
    const MoeStepStats& step = layer.last_step_stats();
    for (const auto& [name, count] : step.dispatch.bytes_sent) report.bytes_sent["moe/" + name] += count;
    report.saved_activation_peak_bytes =
        std::max(report.saved_activation_peak_bytes, layer.stats().saved_activation_peak_bytes);
    report.dropped_pairs += step.dispatch.dropped_pairs;
  }
  report.bytes_sent["gradients/all_reduce"] = gradient_bytes;
  report.modelled = std::move(modelled);
  return report;
}

StepReportExchange::StepReportExchange(transport::Communicator& comm, std::int64_t step, const RankStepReport& own,
                                       std::uint32_t tag, std::chrono::milliseconds timeout)
    : own_(encode(own).dump()) {
  std::optional<OffTimelineScope> off_timeline;
  std::optional<UntracedScope> untraced;
  if (this_thread_modelled_clock() != nullptr) {
    off_timeline.emplace();
    untraced.emplace();
  }
  exchange_ = comm::launch_collective(
      comm, "metrics exchange of step " + std::to_string(step), timeout,
      [&comm, this, tag](transport::Deadline deadline) {
        const auto remaining =
            std::max(std::chrono::milliseconds(1),
                     std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transport::Clock::now()));
        texts_ = comm::all_gather_texts(comm, own_, tag, remaining);
      });
}

const std::vector<RankStepReport>& StepReportExchange::reports() {
  if (!reports_) {
    exchange_.wait();
    std::vector<RankStepReport> decoded;
    decoded.reserve(texts_.size());
    for (const std::string& text : texts_) decoded.push_back(decode(text));
    reports_ = std::move(decoded);
    texts_ = {};  // decoded: the texts are not read again
  }
  return *reports_;
}

void add_rank_reports(StepRecord& record, std::span<const RankStepReport> reports, std::int64_t global_tokens) {
  EPMOE_CHECK(!reports.empty());
  for (const RankStepReport& report : reports) {
    for (const auto& [name, bytes] : report.bytes_sent) record.bytes_sent[name] += bytes;
    record.saved_activation_peak_bytes =
        std::max(record.saved_activation_peak_bytes, report.saved_activation_peak_bytes);
  }
  const RankStepReport& own = reports.front();
  if (own.modelled) {
    std::vector<ModelledRankTime> ranks;
    for (const RankStepReport& report : reports) ranks.push_back(report.modelled.value());
    const ModelledStep step_time = modelled_step(ranks);
    // The line's own step time and rate are the modelled ones too: a
    // modelled run's metrics hold no wall time, so identical runs write
    // identical lines whatever the host's load (issue 30).
    record.step_seconds = step_time.step_seconds;
    record.tokens_per_second =
        step_time.step_seconds > 0 ? static_cast<double>(global_tokens) / step_time.step_seconds : 0.0;
    record.modelled = step_time.json;
    record.modelled["tokens_per_second"] = record.tokens_per_second;
  }
}

void add_replica_plans(StepRecord& record, const MoeLm& model) {
  const int num_layers = model.config().num_layers;
  EPMOE_CHECK_EQ(record.rank_load_max_over_mean_after.size(), static_cast<std::size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    const ReplicaStats& plan = model.layer(l).last_step_stats().replicas;
    if (!plan.rank_loads_after.empty()) record.rank_load_max_over_mean_after[l] = plan.max_over_mean_after;
    record.replicas.push_back(plan.num_replicas);
    record.replica_verdicts.push_back(ep::replica_verdict_json(plan));
  }
}

}  // namespace epmoe
