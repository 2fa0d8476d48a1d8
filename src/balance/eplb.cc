#include "balance/eplb.h"

#include <algorithm>
#include <numeric>

#include "balance/replica_plan.h"
#include "core/error.h"

namespace epmoe::balance {
namespace {

// One physical copy to pack: `weight` is its integer share of the load.
struct PackItem {
  int expert;
  std::int64_t weight;
};

// Packs items (sorted heaviest first) onto `num_packs` packs of `capacity`
// items: each onto the lightest pack with room that does not hold its expert.
// Returns the experts of every pack; an item with no admissible pack is
// dropped (only possible with several copies of one expert, see eplb.h).
std::vector<std::vector<int>> pack_heaviest_first(const std::vector<PackItem>& items, int num_experts, int num_packs,
                                                  int capacity) {
  std::vector<std::vector<int>> packs(num_packs);
  std::vector<std::int64_t> pack_loads(num_packs, 0);
  std::vector<char> holds(static_cast<std::size_t>(num_packs) * num_experts, 0);
  for (const PackItem& item : items) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (static_cast<int>(packs[p].size()) == capacity) continue;
      if (holds[static_cast<std::size_t>(p) * num_experts + item.expert]) continue;
      if (best < 0 || pack_loads[p] < pack_loads[best]) best = p;
    }
    if (best < 0) continue;
    packs[best].push_back(item.expert);
    pack_loads[best] += item.weight;
    holds[static_cast<std::size_t>(best) * num_experts + item.expert] = 1;
  }
  return packs;
}

// Rank of each pack: greedily the (pack, rank) pairs sharing the most experts
// first, so that a re-plan moves as few expert weights as it can; packs left
// over take the free ranks in order. `previously_held` [R * E].
std::vector<int> label_packs_with_ranks(const std::vector<std::vector<int>>& packs, int num_experts,
                                        const std::vector<char>& previously_held) {
  const int num_ranks = static_cast<int>(packs.size());
  struct Overlap {
    int shared, pack, rank;
  };
  std::vector<Overlap> overlaps;
  for (int p = 0; p < num_ranks; ++p) {
    for (int r = 0; r < num_ranks; ++r) {
      int shared = 0;
      for (const int expert : packs[p]) shared += previously_held[static_cast<std::size_t>(r) * num_experts + expert];
      if (shared > 0) overlaps.push_back({shared, p, r});
    }
  }
  std::sort(overlaps.begin(), overlaps.end(), [](const Overlap& a, const Overlap& b) {
    if (a.shared != b.shared) return a.shared > b.shared;
    return a.pack != b.pack ? a.pack < b.pack : a.rank < b.rank;
  });
  std::vector<int> rank_of_pack(num_ranks, -1);
  std::vector<char> rank_taken(num_ranks, 0);
  for (const Overlap& overlap : overlaps) {
    if (rank_of_pack[overlap.pack] >= 0 || rank_taken[overlap.rank]) continue;
    rank_of_pack[overlap.pack] = overlap.rank;
    rank_taken[overlap.rank] = 1;
  }
  int next_rank = 0;
  for (int p = 0; p < num_ranks; ++p) {
    if (rank_of_pack[p] >= 0) continue;
    while (rank_taken[next_rank]) ++next_rank;
    rank_of_pack[p] = next_rank;
    rank_taken[next_rank] = 1;
  }
  return rank_of_pack;
}

// Copies of every expert, each with its integer share of the load, heaviest
// first (ties: lower expert first) — stage 2's order.
std::vector<PackItem> items_heaviest_first(std::span<const std::int64_t> expert_loads,
                                           const std::vector<int>& copies_per_expert) {
  std::vector<PackItem> items;
  for (std::size_t e = 0; e < expert_loads.size(); ++e) {
    const std::int64_t copies = copies_per_expert[e];
    for (std::int64_t j = 0; j < copies; ++j) {
      items.push_back({static_cast<int>(e), expert_loads[e] / copies + (j < expert_loads[e] % copies ? 1 : 0)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const PackItem& a, const PackItem& b) {
    return a.weight != b.weight ? a.weight > b.weight : a.expert < b.expert;
  });
  return items;
}

}  // namespace

int ExpertPlacement::num_copies(int expert) const {
  return static_cast<int>(std::count(slot_experts.begin(), slot_experts.end(), expert));
}

bool ExpertPlacement::holds(int rank, int expert) const {
  const auto begin = slot_experts.begin() + static_cast<std::ptrdiff_t>(rank) * slots_per_rank;
  return std::find(begin, begin + slots_per_rank, expert) != begin + slots_per_rank;
}

std::vector<std::vector<ExpertCopy>> ExpertPlacement::evenly_split_copies(
    std::span<const std::int64_t> expert_counts) const {
  EPMOE_CHECK_EQ(expert_counts.size(), static_cast<std::size_t>(num_experts));
  std::vector<std::vector<ExpertCopy>> copies(num_experts);
  // Slots are rank-major: each expert's copies come out by ascending rank.
  for (std::size_t slot = 0; slot < slot_experts.size(); ++slot) {
    if (slot_experts[slot] != kEmptySlot) {
      copies[slot_experts[slot]].push_back({static_cast<int>(slot) / slots_per_rank, 0});
    }
  }
  for (int e = 0; e < num_experts; ++e) {
    EPMOE_CHECK(!copies[e].empty());
    split_evenly(expert_counts[e], copies[e]);
  }
  return copies;
}

std::vector<std::int64_t> ExpertPlacement::rank_loads(std::span<const std::int64_t> expert_counts) const {
  std::vector<std::int64_t> loads(num_ranks, 0);
  for (const std::vector<ExpertCopy>& copies : evenly_split_copies(expert_counts)) {
    for (const ExpertCopy& copy : copies) loads[copy.rank] += copy.token_quota;
  }
  return loads;
}

std::vector<int> eplb_replica_counts(std::span<const std::int64_t> expert_loads, int num_slots, int max_copies) {
  const int num_experts = static_cast<int>(expert_loads.size());
  EPMOE_CHECK_LE(num_experts, num_slots);
  std::vector<int> copies(num_experts, 1);
  for (int extra = num_slots - num_experts; extra > 0; --extra) {
    int best = -1;
    for (int e = 0; e < num_experts; ++e) {
      if (copies[e] >= max_copies) continue;
      // load[e] / copies[e] > load[best] / copies[best], in integers.
      if (best < 0 || expert_loads[e] * copies[best] > expert_loads[best] * copies[e]) best = e;
    }
    if (best < 0 || expert_loads[best] == 0) break;
    ++copies[best];
  }
  return copies;
}

ExpertPlacement eplb_global_placement(std::span<const std::int64_t> expert_loads, int num_ranks, int slots_per_rank,
                                      const ExpertPlacement* previous) {
  const int num_experts = static_cast<int>(expert_loads.size());
  EPMOE_CHECK_GT(num_ranks, 0);
  EPMOE_CHECK_LE(num_experts, num_ranks * slots_per_rank);
  const std::vector<int> copies = eplb_replica_counts(expert_loads, num_ranks * slots_per_rank, num_ranks);
  const std::vector<std::vector<int>> packs =
      pack_heaviest_first(items_heaviest_first(expert_loads, copies), num_experts, num_ranks, slots_per_rank);

  std::vector<char> previously_held(static_cast<std::size_t>(num_ranks) * num_experts, 0);
  if (previous != nullptr) {
    EPMOE_CHECK_EQ(previous->num_ranks, num_ranks);
    for (std::size_t slot = 0; slot < previous->slot_experts.size(); ++slot) {
      const int expert = previous->slot_experts[slot];
      if (expert != kEmptySlot) previously_held[slot / previous->slots_per_rank * num_experts + expert] = 1;
    }
  }
  const std::vector<int> rank_of_pack = label_packs_with_ranks(packs, num_experts, previously_held);

  ExpertPlacement placement;
  placement.num_experts = num_experts;
  placement.num_ranks = num_ranks;
  placement.slots_per_rank = slots_per_rank;
  placement.slot_experts.assign(static_cast<std::size_t>(num_ranks) * slots_per_rank, kEmptySlot);
  for (int p = 0; p < num_ranks; ++p) {
    std::vector<int> experts = packs[p];
    std::sort(experts.begin(), experts.end());
    std::copy(experts.begin(), experts.end(),
              placement.slot_experts.begin() + static_cast<std::ptrdiff_t>(rank_of_pack[p]) * slots_per_rank);
  }
  return placement;
}

std::vector<int> balanced_home_ranks(std::span<const std::int64_t> expert_loads, int num_ranks,
                                     std::span<const int> previous_homes) {
  const int num_experts = static_cast<int>(expert_loads.size());
  EPMOE_CHECK_GT(num_ranks, 0);
  EPMOE_CHECK_EQ(num_experts % num_ranks, 0);
  const std::vector<std::vector<int>> packs =
      pack_heaviest_first(items_heaviest_first(expert_loads, std::vector<int>(num_experts, 1)), num_experts, num_ranks,
                          num_experts / num_ranks);

  std::vector<char> previously_held(static_cast<std::size_t>(num_ranks) * num_experts, 0);
  if (!previous_homes.empty()) {
    EPMOE_CHECK_EQ(previous_homes.size(), expert_loads.size());
    for (int e = 0; e < num_experts; ++e)
      previously_held[static_cast<std::size_t>(previous_homes[e]) * num_experts + e] = 1;
  }
  const std::vector<int> rank_of_pack = label_packs_with_ranks(packs, num_experts, previously_held);
  std::vector<int> homes(num_experts, -1);
  for (int p = 0; p < num_ranks; ++p) {
    for (const int expert : packs[p]) homes[expert] = rank_of_pack[p];
  }
  for (const int home : homes) EPMOE_CHECK_GE(home, 0);  // one copy each always fits
  return homes;
}

}  // namespace epmoe::balance
