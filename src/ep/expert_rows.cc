#include "ep/expert_rows.h"

#include "core/error.h"
#include "kernels/permute.h"

namespace epmoe::ep {

std::int64_t ExpertRows::size_bytes() const {
  return x.size_bytes() +
         static_cast<std::int64_t>(group_sizes.size() * sizeof(std::int64_t) +
                                   weights.size() * sizeof(float) +
                                   slot_of_row.size() * sizeof(std::int64_t));
}

void RowEntries::reserve(std::size_t n) {
  local_expert.reserve(n);
  weight.reserve(n);
  slot.reserve(n);
  source_row.reserve(n);
}

ExpertRows build_expert_rows(const float* source, std::int64_t hidden, const RowEntries& entries,
                             int num_local_experts, std::int64_t num_slots,
                             std::vector<std::int64_t>* entry_of_row) {
  const ExpertPermutation perm = sort_by_expert(entries.local_expert, num_local_experts);
  const std::int64_t num_rows = static_cast<std::int64_t>(entries.size());
  ExpertRows rows;
  rows.num_slots = num_slots;
  rows.group_sizes = perm.group_sizes;
  rows.weights.resize(entries.size());
  rows.slot_of_row.resize(entries.size());
  std::vector<std::int64_t> source_of_row(entries.size());
  for (std::int64_t r = 0; r < num_rows; ++r) {
    const std::int64_t entry = perm.sorted_to_pair[r];
    rows.weights[r] = entries.weight[entry];
    rows.slot_of_row[r] = entries.slot[entry];
    source_of_row[r] = entries.source_row[entry];
    EPMOE_DCHECK_LT(rows.slot_of_row[r], num_slots);
  }
  rows.x = Tensor(DType::f32, {num_rows, hidden});
  gather_rows(source, source_of_row, rows.x.data<float>(), hidden);
  if (entry_of_row != nullptr) *entry_of_row = perm.sorted_to_pair;
  return rows;
}

}  // namespace epmoe::ep
