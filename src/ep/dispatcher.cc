#include "ep/dispatcher.h"

#include "core/error.h"

namespace epmoe::ep {

void DispatchStats::reset(int num_local_experts) {
  bytes_sent.clear();
  rows_per_local_expert.assign(static_cast<std::size_t>(num_local_experts), 0);
  dropped_pairs = 0;
  phase_seconds = PhaseTimes();
  rows_per_slot.clear();
  slot_experts.clear();
  slot_quotas.clear();
  home_quotas.clear();
  rank_loads_before.clear();
  rank_loads_after.clear();
  max_over_mean_before = max_over_mean_after = ideal_max_over_mean = 1.0;
  num_replicas = 0;
  slots_refreshed = 0;
  planner_seconds = 0.0;
}

void DispatchStats::count_rows(const ExpertRows& rows, int num_local_experts) {
  for (int e = 0; e < num_local_experts; ++e) rows_per_local_expert[e] += rows.group_sizes[e];
  for (std::size_t b = 0; b < rows_per_slot.size(); ++b) rows_per_slot[b] += rows.group_sizes[num_local_experts + b];
}

ChunkRange chunk_range(std::int64_t num_tokens, int num_chunks, int chunk) {
  EPMOE_CHECK(chunk >= 0 && chunk < num_chunks);
  return {num_tokens * chunk / num_chunks, num_tokens * (chunk + 1) / num_chunks};
}

}  // namespace epmoe::ep
