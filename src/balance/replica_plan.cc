#include "balance/replica_plan.h"

#include <algorithm>

#include <vector>

#include "core/error.h"

namespace epmoe::balance {

std::span<const ExpertCopy> ReplicaPlan::copies_of(int expert) const {
  EPMOE_DCHECK(expert >= 0 && expert < num_experts);
  const auto begin = static_cast<std::size_t>(copy_offsets[expert]);
  const auto end = static_cast<std::size_t>(copy_offsets[expert + 1]);
  return std::span<const ExpertCopy>(copies).subspan(begin, end - begin);
}

int ReplicaPlan::num_replicas() const {
  int occupied = 0;
  for (const int expert : slot_experts) occupied += expert != kEmptySlot;
  return occupied;
}

void split_evenly(std::int64_t count, std::span<ExpertCopy> copies) {
  const auto num_copies = static_cast<std::int64_t>(copies.size());
  EPMOE_CHECK_GT(num_copies, 0);
  const std::int64_t base = count / num_copies, remainder = count % num_copies;
  // A copy's position in rank order decides whether it gets a remainder token.
  // Copies are few (at most one per rank, usually 1-3), so counting lower
  // ranks is cheaper than sorting.
  for (ExpertCopy& copy : copies) {
    std::int64_t lower_ranks = 0;
    for (const ExpertCopy& other : copies) lower_ranks += other.rank < copy.rank;
    copy.token_quota = base + (lower_ranks < remainder ? 1 : 0);
  }
}

}  // namespace epmoe::balance

namespace epmoe::balance {

void keep_previous_slot_positions(std::span<int> slot_experts, std::span<const int> previous, int slots_per_rank,
                                  std::span<std::int64_t> slot_values) {
  EPMOE_CHECK_EQ(previous.size(), slot_experts.size());
  EPMOE_CHECK(slot_values.empty() || slot_values.size() == slot_experts.size());
  if (slots_per_rank == 0) return;
  const std::size_t num_ranks = slot_experts.size() / static_cast<std::size_t>(slots_per_rank);
  std::vector<int> experts(slots_per_rank), arranged(slots_per_rank);
  std::vector<std::int64_t> values(slots_per_rank, 0), arranged_values(slots_per_rank, 0);
  for (std::size_t r = 0; r < num_ranks; ++r) {
    const std::size_t base = r * slots_per_rank;
    std::copy_n(slot_experts.begin() + base, slots_per_rank, experts.begin());
    if (!slot_values.empty()) std::copy_n(slot_values.begin() + base, slots_per_rank, values.begin());
    std::fill(arranged.begin(), arranged.end(), kEmptySlot);
    std::fill(arranged_values.begin(), arranged_values.end(), 0);
    for (int b = 0; b < slots_per_rank; ++b) {
      const int held = previous[base + b];
      if (held == kEmptySlot) continue;
      for (int k = 0; k < slots_per_rank; ++k) {
        if (experts[k] != held) continue;
        arranged[b] = held;
        arranged_values[b] = values[k];
        experts[k] = kEmptySlot;
        break;
      }
    }
    int next_free = 0;
    for (int k = 0; k < slots_per_rank; ++k) {
      if (experts[k] == kEmptySlot) continue;
      while (arranged[next_free] != kEmptySlot) ++next_free;
      arranged[next_free] = experts[k];
      arranged_values[next_free] = values[k];
    }
    std::copy(arranged.begin(), arranged.end(), slot_experts.begin() + base);
    if (!slot_values.empty()) std::copy(arranged_values.begin(), arranged_values.end(), slot_values.begin() + base);
  }
}

}  // namespace epmoe::balance
