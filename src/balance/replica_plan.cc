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

std::vector<std::int64_t> sub_quotas(const ReplicaPlan& plan, std::span<const std::int64_t> counts) {
  const int num_experts = plan.num_experts, num_ranks = plan.num_ranks;
  EPMOE_CHECK_EQ(counts.size(), static_cast<std::size_t>(num_ranks) * num_experts);
  EPMOE_CHECK_EQ(plan.copy_offsets.size(), static_cast<std::size_t>(num_experts) + 1);
  const std::size_t num_copies = plan.copies.size();
  std::vector<std::int64_t> sub(static_cast<std::size_t>(num_ranks) * num_copies, 0);
  std::vector<std::int64_t> source_left(static_cast<std::size_t>(num_ranks));
  std::vector<std::int64_t> quota_left;
  for (int e = 0; e < num_experts; ++e) {
    const int first = plan.copy_offsets[e], last = plan.copy_offsets[e + 1];
    for (int s = 0; s < num_ranks; ++s) {
      source_left[s] = counts[static_cast<std::size_t>(s) * num_experts + e];
      EPMOE_CHECK_GE(source_left[s], 0);
    }
    // 1. Each copy takes its own rank's pairs first (copies of one expert
    // sit on distinct ranks, so no two compete for one source here).
    quota_left.assign(static_cast<std::size_t>(last - first), 0);
    for (int i = first; i < last; ++i) {
      const ExpertCopy& copy = plan.copies[i];
      EPMOE_CHECK(copy.rank >= 0 && copy.rank < num_ranks);
      EPMOE_CHECK_GE(copy.token_quota, 0);
      const std::int64_t local = std::min(copy.token_quota, source_left[copy.rank]);
      sub[static_cast<std::size_t>(copy.rank) * num_copies + i] = local;
      source_left[copy.rank] -= local;
      quota_left[i - first] = copy.token_quota - local;
    }
    // 2. The rest by the northwest corner rule: sources ascending, copies in
    // copy order.
    int s = 0, i = first;
    while (s < num_ranks && i < last) {
      if (source_left[s] == 0) {
        ++s;
        continue;
      }
      if (quota_left[i - first] == 0) {
        ++i;
        continue;
      }
      const std::int64_t take = std::min(source_left[s], quota_left[i - first]);
      sub[static_cast<std::size_t>(s) * num_copies + i] += take;
      source_left[s] -= take;
      quota_left[i - first] -= take;
    }
    // Quotas sum exactly to the expert's global count: nothing left over.
    for (; s < num_ranks; ++s) EPMOE_CHECK_EQ(source_left[s], 0);
    for (; i < last; ++i) EPMOE_CHECK_EQ(quota_left[i - first], 0);
  }
  return sub;
}

std::vector<std::int64_t> source_sub_quotas(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source) {
  EPMOE_CHECK(source >= 0 && source < plan.num_ranks);
  const std::vector<std::int64_t> all = sub_quotas(plan, counts);
  const auto begin = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(source) * plan.copies.size());
  return {begin, begin + static_cast<std::ptrdiff_t>(plan.copies.size())};
}

}  // namespace epmoe::balance
