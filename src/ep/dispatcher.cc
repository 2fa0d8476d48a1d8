#include "ep/dispatcher.h"

#include "core/error.h"

namespace epmoe::ep {

void DispatchStats::reset(int num_local_experts) {
  bytes_sent.clear();
  rows_per_local_expert.assign(static_cast<std::size_t>(num_local_experts), 0);
  dropped_pairs = 0;
  phase_seconds = PhaseTimes();
}

void DispatchStats::count_rows(const ExpertRows& rows, int num_local_experts) {
  for (int e = 0; e < num_local_experts; ++e) rows_per_local_expert[e] += rows.group_sizes[e];
}

ChunkRange chunk_range(std::int64_t num_tokens, int num_chunks, int chunk) {
  EPMOE_CHECK(chunk >= 0 && chunk < num_chunks);
  return {num_tokens * chunk / num_chunks, num_tokens * (chunk + 1) / num_chunks};
}

}  // namespace epmoe::ep
