#include "balance/replica_plan.h"

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
