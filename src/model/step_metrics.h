// A training step's metrics across ranks: rank 0's record of the step
// (StepRecord: a metrics.jsonl line, the progress line), what each rank
// measured in it (RankStepReport), and the exchange of the reports, which
// runs under the next step's forward (model/trainer.cc says when).
//
// The reports travel as JSON text (comm/all_gather_texts.h): their byte
// streams are named by the dispatchers and their modelled collectives vary
// in number, so no fixed layout fits them; each is decoded once, on arrival.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/collective_handle.h"
#include "core/modelled_report.h"
#include "model/moe_lm.h"
#include "transport/communicator.h"

namespace epmoe {

// One step, as rank 0 reports it (metrics.jsonl line, progress line).
struct StepRecord {
  std::int64_t step = 0;  // 1-based: steps completed
  double loss = 0;        // cross-entropy mean + load-balance loss
  double cross_entropy = 0;
  double aux_loss = 0;
  double grad_norm = 0;  // before clipping
  double learning_rate = 0;
  // clock=wall: rank 0's wall time of the step: through its metrics
  // exchange when that completes in the step (a checkpoint follows, or the
  // last step), else up to starting it - it completes under the next step's
  // forward, whose phase_seconds["metrics_exchange"] holds what was left of
  // it. clock=modelled: the modelled step (modelled.step_seconds) and
  // global tokens / that, so the line holds no wall time.
  double step_seconds = 0;
  double tokens_per_second = 0;
  std::map<std::string, double> phase_seconds;         // rank 0: trainer and MoE phases
  std::map<std::string, std::int64_t> bytes_sent;      // summed over ranks and layers
  std::vector<double> expert_load_max_over_mean;       // [L] over experts, from the counts
  std::vector<double> rank_load_max_over_mean_before;  // [L] rows per rank, every expert at home
  std::vector<double> rank_load_max_over_mean_after;   // [L] after replica balancing
  std::vector<int> replicas;                           // [L] replicas the step's plan placed (0 without)
  // [L] the cost model's verdict on each layer's plan: predicted saving and
  // cost of what it placed and of what it refused, the rates it priced at
  // (all 0 without replicas or unpriced; docs/TRAINING.md).
  nlohmann::json replica_verdicts = nlohmann::json::array();
  // [L][E] global (token, k) pairs routed to each expert (summed over ranks,
  // before any capacity cut): what `epmoe balance --loads metrics.jsonl`
  // replays.
  std::vector<std::vector<std::int64_t>> expert_counts;
  std::int64_t saved_activation_peak_bytes = 0;  // max over ranks, all layers
  // (token, expert) pairs lost to capacity_factor, summed over ranks and
  // layers; always 0 with capacity_factor=0 (exact buffers).
  std::int64_t dropped_pairs = 0;
  std::int64_t routed_pairs = 0;  // N * K * L: what dropped_pairs is out of
  // When a checkpoint of this step follows: it is written after this record
  // is reported (the run stops with an error if it fails); its time is in
  // the next record's phase_seconds["checkpoint"].
  std::optional<std::int64_t> checkpoint_step;
  // clock=modelled (null otherwise): the step over all ranks on their modelled
  // clocks (core/modelled_report.h: step_seconds, critical_path_rank,
  // per_rank, collectives) plus tokens_per_second; then phase_seconds are
  // modelled seconds too. The step ends before the metrics exchange, which
  // is this tool's bookkeeping, not training.
  nlohmann::json modelled;
};

void to_json(nlohmann::json& out, const StepRecord& record);

// What one rank measured in a step, for rank 0's record.
struct RankStepReport {
  std::map<std::string, std::int64_t> bytes_sent;  // "moe/<layer stream>" over layers, "gradients/all_reduce"
  std::int64_t saved_activation_peak_bytes = 0;    // max over layers
  std::int64_t dropped_pairs = 0;                  // over layers
  std::optional<ModelledRankTime> modelled;        // clock=modelled
};

// The model's layers' last step; `gradient_bytes`: this rank's share of the
// replicated gradients' sum over ranks.
RankStepReport rank_step_report(const MoeLm& model, std::int64_t gradient_bytes,
                                std::optional<ModelledRankTime> modelled);

// Every rank's report of one step, moving in the background from the
// constructor (collective over comm: every rank starts the exchanges of the
// same steps in the same order) to reports(). clock=modelled: off the modelled
// timeline and untraced (this tool's bookkeeping, not training), so that
// under the next step's forward it takes no link time from it nor shows in
// its trace; wall time keeps it traced, as it costs.
class StepReportExchange {
 public:
  StepReportExchange(transport::Communicator& comm, std::int64_t step, const RankStepReport& own, std::uint32_t tag,
                     std::chrono::milliseconds timeout);
  StepReportExchange(const StepReportExchange&) = delete;
  StepReportExchange& operator=(const StepReportExchange&) = delete;

  // Every rank's report, in rank order: waits for them the first time.
  const std::vector<RankStepReport>& reports();

 private:
  const std::string own_;
  std::vector<std::string> texts_;
  std::optional<std::vector<RankStepReport>> reports_;
  comm::CollectiveHandle exchange_;  // declared last: ends before the buffers go
};

// Rank 0: the record completed from every rank's report (rank order): the
// bytes summed, the peak's maximum, and under clock=modelled the modelled
// step, its rate and time in place of the wall clock's. The dropped pairs
// are summed by every rank (its run summary holds them).
void add_rank_reports(StepRecord& record, std::span<const RankStepReport> reports, std::int64_t global_tokens);

// The replica plans of the model's layers' last step, the same on every rank
// (so rank 0's own, not exchanged): replicas, verdicts, and the per-rank
// loads after balancing in place of the at-home ones where a layer had a
// plan. rank_load_max_over_mean_after holds the at-home loads before.
void add_replica_plans(StepRecord& record, const MoeLm& model);

}  // namespace epmoe
