// What one rank of a whole-world layer run measured: its line in
// metrics.json (run/layer_metrics.h), and the form in which it travels to the
// rank that writes the outputs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/modelled_report.h"

// nlohmann_json 3.11 (Debian 12) has no std::optional support: null when empty.
namespace nlohmann {
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& value) {
    if (value) {
      j = *value;
    } else {
      j = nullptr;
    }
  }
  static void from_json(const json& j, std::optional<T>& value) {
    if (j.is_null()) {
      value.reset();
    } else {
      value = j.get<T>();
    }
  }
};
}  // namespace nlohmann

namespace epmoe::run {

// What one rank measured; the rank's line in metrics.json.
struct RankReport {
  int rank = 0;
  std::int64_t first_token = 0, num_tokens = 0;  // its rows of x and dy
  int first_expert = 0, num_experts = 0;         // the experts it homes
  // Rows its experts computed, i.e. (token, expert) pairs received, per local
  // expert over all chunks.
  std::vector<std::int64_t> rows_per_local_expert;
  // Bytes it sent to other ranks, by collective ("forward/all_to_all_v tokens").
  std::map<std::string, std::int64_t> bytes_sent;
  std::int64_t dropped_pairs = 0;               // of its tokens, to capacity_factor
  std::map<std::string, double> phase_seconds;  // route, dispatch, experts, combine, backward_*
  double forward_seconds = 0, backward_seconds = 0;
  std::int64_t saved_activation_peak_bytes = 0;
  // Peak bytes per saved name ("saved/x_sorted", ...), and the bytes the
  // remat policy recomputed in the backward.
  std::map<std::string, std::int64_t> saved_peak_bytes_by_name;
  // Bytes the dispatcher keeps across steps ("buffer/dispatch", "buffer/replica slots").
  std::map<std::string, std::int64_t> buffer_bytes_by_name;
  std::int64_t recomputed_bytes = 0;
  // Dynamic replicas (balance=dynamic; empty/zero when off): rows its B
  // redundant slots computed and the expert each held; the plan's per-rank
  // loads (global, every rank has the same plan) before and after balancing;
  // the planner's time on this rank.
  std::vector<std::int64_t> rows_per_slot;
  std::vector<int> slot_experts;
  std::vector<std::int64_t> rank_loads_before, rank_loads_after;
  double max_over_mean_before = 1.0, max_over_mean_after = 1.0, ideal_max_over_mean = 1.0;
  int num_replicas = 0;
  double planner_seconds = 0;
  // The cost model's verdict on the plan (ep/replica_verdict.h).
  nlohmann::json replica_verdict = nlohmann::json::object();
  // clock=modelled only (then phase_seconds are modelled seconds too).
  std::optional<ModelledRankTime> modelled;
};

// One JSON form for both uses: the report travels to rank 0 as this text, and
// metrics.json shows it (with derived totals) under expert_parallel.per_rank.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankReport, rank, first_token, num_tokens, first_expert, num_experts,
                                   rows_per_local_expert, bytes_sent, dropped_pairs, phase_seconds, forward_seconds,
                                   backward_seconds, saved_activation_peak_bytes, saved_peak_bytes_by_name,
                                   buffer_bytes_by_name, recomputed_bytes, rows_per_slot, slot_experts,
                                   rank_loads_before, rank_loads_after, max_over_mean_before, max_over_mean_after,
                                   ideal_max_over_mean, num_replicas, planner_seconds, replica_verdict, modelled)

}  // namespace epmoe::run
