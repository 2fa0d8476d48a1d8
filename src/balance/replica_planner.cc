#include "balance/replica_planner.h"

#include <algorithm>

#include "core/error.h"

namespace epmoe::balance {
namespace {

// The planner's working state. Replicas of one expert are chained through
// their slot indices (first_slot_of_expert -> next_slot_of_same_expert), so
// that nothing is allocated per move: a plan for E=256, R=64, B=2 takes tens
// of microseconds (bench/balance).
class PlannerState {
 public:
  PlannerState(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
               const ReplicaPlannerOptions& options)
      : counts_(expert_counts),
        homes_(home_rank_of_expert),
        num_experts_(static_cast<int>(expert_counts.size())),
        num_ranks_(options.num_ranks),
        num_slots_(options.num_redundant_slots_per_rank),
        rank_loads_(num_ranks_, 0),
        home_quota_(expert_counts.begin(), expert_counts.end()),
        num_copies_(num_experts_, 1),
        first_slot_of_expert_(num_experts_, kEmptySlot),
        slot_experts_(static_cast<std::size_t>(num_ranks_) * num_slots_, kEmptySlot),
        slot_quota_(slot_experts_.size(), 0),
        next_slot_of_same_expert_(slot_experts_.size(), kEmptySlot),
        used_slots_(num_ranks_, 0),
        home_offsets_(num_ranks_ + 1, 0),
        experts_by_home_(num_experts_),
        rank_mark_(num_ranks_, 0) {
    for (int e = 0; e < num_experts_; ++e) {
      rank_loads_[homes_[e]] += counts_[e];
      ++home_offsets_[homes_[e] + 1];
    }
    for (int r = 0; r < num_ranks_; ++r) home_offsets_[r + 1] += home_offsets_[r];
    std::vector<int> cursor(home_offsets_.begin(), home_offsets_.end() - 1);
    for (int e = 0; e < num_experts_; ++e) experts_by_home_[cursor[homes_[e]]++] = e;
    copies_scratch_.reserve(num_ranks_ + 1);
    candidates_.reserve(num_experts_ + num_slots_);
  }

  const std::vector<std::int64_t>& rank_loads() const { return rank_loads_; }

  // One greedy move (see replica_planner.h); false when the busiest rank
  // cannot be relieved by any of its experts.
  bool place_one_replica() {
    const int busiest =
        static_cast<int>(std::max_element(rank_loads_.begin(), rank_loads_.end()) - rank_loads_.begin());
    const std::int64_t max_load = rank_loads_[busiest];
    collect_candidates(busiest);
    for (const Candidate& candidate : candidates_) {
      const int expert = candidate.expert;
      if (num_copies_[expert] >= num_ranks_) continue;
      if (counts_[expert] < num_copies_[expert] + 1) continue;  // a quota would be 0
      mark_ranks_holding(expert);
      const int target = least_loaded_admissible_rank();
      if (target < 0) continue;
      const SplitOutcome outcome = try_split(candidate, busiest, target);
      if (outcome.busiest_after < max_load && outcome.target_after < max_load) {
        apply_replica(expert, target);
        return true;
      }
      // Another admissible rank is at least as loaded and its quota differs
      // by at most the remainder token, so it can only work when this one
      // missed by exactly that token (few tokens per copy). Rare, and it
      // keeps the search exhaustive without an O(R) scan per rejected move.
      if (outcome.busiest_after > max_load || outcome.target_after > max_load) continue;
      for (int other = 0; other < num_ranks_; ++other) {
        if (other == target || !admissible(other)) continue;
        const SplitOutcome other_outcome = try_split(candidate, busiest, other);
        if (other_outcome.busiest_after < max_load && other_outcome.target_after < max_load) {
          apply_replica(expert, other);
          return true;
        }
      }
    }
    return false;
  }

  ReplicaPlan finish(std::span<const int> previous_slot_experts, std::vector<std::int64_t> loads_before) {
    if (!previous_slot_experts.empty()) keep_previous_slot_positions(previous_slot_experts);
    ReplicaPlan plan;
    plan.num_experts = num_experts_;
    plan.num_ranks = num_ranks_;
    plan.num_redundant_slots_per_rank = num_slots_;
    plan.copy_offsets.assign(num_experts_ + 1, 0);
    for (int e = 0; e < num_experts_; ++e) plan.copy_offsets[e + 1] = plan.copy_offsets[e] + num_copies_[e];
    plan.copies.resize(plan.copy_offsets[num_experts_]);
    std::vector<int> cursor(num_experts_);
    for (int e = 0; e < num_experts_; ++e) {
      plan.copies[plan.copy_offsets[e]] = {homes_[e], home_quota_[e]};
      cursor[e] = plan.copy_offsets[e] + 1;
    }
    // Slots in index order are rank-major: replicas come out by ascending rank.
    for (std::size_t slot = 0; slot < slot_experts_.size(); ++slot) {
      const int expert = slot_experts_[slot];
      if (expert == kEmptySlot) continue;
      plan.copies[cursor[expert]++] = {static_cast<int>(slot) / num_slots_, slot_quota_[slot]};
    }
    plan.slot_experts = std::move(slot_experts_);
    plan.rank_loads_before = std::move(loads_before);
    plan.rank_loads_after = std::move(rank_loads_);
    plan.before = measure_load_imbalance(plan.rank_loads_before);
    plan.after = measure_load_imbalance(plan.rank_loads_after);
    return plan;
  }

 private:
  struct Candidate {
    int expert;
    std::int64_t quota;  // tokens this expert's copy on the busiest rank computes
  };

  void collect_candidates(int rank) {
    candidates_.clear();
    for (int i = home_offsets_[rank]; i < home_offsets_[rank + 1]; ++i) {
      const int expert = experts_by_home_[i];
      if (home_quota_[expert] > 0) candidates_.push_back({expert, home_quota_[expert]});
    }
    for (int b = 0; b < used_slots_[rank]; ++b) {
      const int slot = rank * num_slots_ + b;
      candidates_.push_back({slot_experts_[slot], slot_quota_[slot]});
    }
    std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) {
      return a.quota != b.quota ? a.quota > b.quota : a.expert < b.expert;
    });
  }

  // Home first, then replicas; current quotas.
  void gather_copies(int expert) {
    copies_scratch_.clear();
    copies_scratch_.push_back({homes_[expert], home_quota_[expert]});
    for (int slot = first_slot_of_expert_[expert]; slot != kEmptySlot; slot = next_slot_of_same_expert_[slot]) {
      copies_scratch_.push_back({slot / num_slots_, slot_quota_[slot]});
    }
  }

  static std::int64_t quota_on(int rank, std::span<const ExpertCopy> copies) {
    for (const ExpertCopy& copy : copies) {
      if (copy.rank == rank) return copy.token_quota;
    }
    return 0;
  }

  // Marks the ranks that hold a copy of `expert` (home or replica).
  void mark_ranks_holding(int expert) {
    ++mark_generation_;
    rank_mark_[homes_[expert]] = mark_generation_;
    for (int slot = first_slot_of_expert_[expert]; slot != kEmptySlot; slot = next_slot_of_same_expert_[slot]) {
      rank_mark_[slot / num_slots_] = mark_generation_;
    }
  }

  // A free slot and no copy of the marked expert.
  bool admissible(int rank) const {
    return used_slots_[rank] < num_slots_ && rank_mark_[rank] != mark_generation_;
  }

  // Least loaded admissible rank (lowest rank on ties); -1 when there is none.
  int least_loaded_admissible_rank() const {
    int best = -1;
    for (int r = 0; r < num_ranks_; ++r) {
      if (admissible(r) && (best < 0 || rank_loads_[r] < rank_loads_[best])) best = r;
    }
    return best;
  }

  struct SplitOutcome {
    std::int64_t busiest_after;  // load of the busiest rank after the move
    std::int64_t target_after;   // load of the new replica's rank after it
  };

  // Splits the candidate over its copies plus `target` into copies_scratch_.
  SplitOutcome try_split(const Candidate& candidate, int busiest, int target) {
    gather_copies(candidate.expert);
    copies_scratch_.push_back({target, 0});
    split_evenly(counts_[candidate.expert], copies_scratch_);
    return {rank_loads_[busiest] - candidate.quota + quota_on(busiest, copies_scratch_),
            rank_loads_[target] + copies_scratch_.back().token_quota};
  }

  // Commits the split computed in copies_scratch_ (existing copies in
  // gather_copies order, then the new replica on `target`).
  void apply_replica(int expert, int target) {
    const int new_slot = target * num_slots_ + used_slots_[target]++;
    slot_experts_[new_slot] = expert;
    next_slot_of_same_expert_[new_slot] = first_slot_of_expert_[expert];
    first_slot_of_expert_[expert] = new_slot;
    ++num_copies_[expert];

    std::size_t i = 0;
    const auto set_quota = [&](int rank, std::int64_t& quota) {
      const std::int64_t new_quota = copies_scratch_[i++].token_quota;
      rank_loads_[rank] += new_quota - quota;
      quota = new_quota;
    };
    set_quota(homes_[expert], home_quota_[expert]);
    // gather_copies walked the chain before new_slot was linked at its head.
    for (int slot = next_slot_of_same_expert_[new_slot]; slot != kEmptySlot;
         slot = next_slot_of_same_expert_[slot]) {
      set_quota(slot / num_slots_, slot_quota_[slot]);
    }
    set_quota(target, slot_quota_[new_slot]);
  }

  // Moves each rank's replicas so that an expert already in slot b of this
  // rank in the previous plan stays in slot b; the others take the remaining
  // slots in placement order. Changes no load.
  void keep_previous_slot_positions(std::span<const int> previous_slot_experts) {
    EPMOE_CHECK_EQ(previous_slot_experts.size(), slot_experts_.size());
    std::vector<int> experts(num_slots_), arranged(num_slots_);
    std::vector<std::int64_t> quotas(num_slots_), arranged_quotas(num_slots_);
    for (int r = 0; r < num_ranks_; ++r) {
      const std::size_t base = static_cast<std::size_t>(r) * num_slots_;
      std::copy_n(slot_experts_.begin() + base, num_slots_, experts.begin());
      std::copy_n(slot_quota_.begin() + base, num_slots_, quotas.begin());
      std::fill(arranged.begin(), arranged.end(), kEmptySlot);
      for (int b = 0; b < num_slots_; ++b) {
        const int previous = previous_slot_experts[base + b];
        if (previous == kEmptySlot) continue;
        for (int k = 0; k < num_slots_; ++k) {
          if (experts[k] != previous) continue;
          arranged[b] = previous;
          arranged_quotas[b] = quotas[k];
          experts[k] = kEmptySlot;
          break;
        }
      }
      int next_free = 0;
      for (int k = 0; k < num_slots_; ++k) {
        if (experts[k] == kEmptySlot) continue;
        while (arranged[next_free] != kEmptySlot) ++next_free;
        arranged[next_free] = experts[k];
        arranged_quotas[next_free] = quotas[k];
      }
      for (int b = 0; b < num_slots_; ++b) {
        slot_experts_[base + b] = arranged[b];
        slot_quota_[base + b] = arranged[b] == kEmptySlot ? 0 : arranged_quotas[b];
      }
    }
    // The per-expert slot chains are stale now; finish() reads slots only.
  }

  std::span<const std::int64_t> counts_;
  std::span<const int> homes_;
  int num_experts_, num_ranks_, num_slots_;

  std::vector<std::int64_t> rank_loads_;     // [R] tokens under the plan so far
  std::vector<std::int64_t> home_quota_;     // [E]
  std::vector<int> num_copies_;              // [E] home + replicas
  std::vector<int> first_slot_of_expert_;    // [E] head of the replica chain
  std::vector<int> slot_experts_;            // [R * B]
  std::vector<std::int64_t> slot_quota_;     // [R * B]
  std::vector<int> next_slot_of_same_expert_;// [R * B]
  std::vector<int> used_slots_;              // [R] slots are filled in index order
  std::vector<int> home_offsets_;            // [R + 1] experts_by_home_ ranges
  std::vector<int> experts_by_home_;         // [E]
  std::vector<std::uint32_t> rank_mark_;     // [R] == mark_generation_: holds the expert
  std::uint32_t mark_generation_ = 0;
  std::vector<ExpertCopy> copies_scratch_;
  std::vector<Candidate> candidates_;
};

void check_planner_inputs(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
                          const ReplicaPlannerOptions& options) {
  EPMOE_CHECK_GT(options.num_ranks, 0);
  EPMOE_CHECK_GE(options.num_redundant_slots_per_rank, 0);
  EPMOE_CHECK_GT(options.rebalance_threshold, 0.0);
  EPMOE_CHECK_GT(expert_counts.size(), 0u);
  EPMOE_CHECK_EQ(expert_counts.size(), home_rank_of_expert.size());
  for (std::size_t e = 0; e < expert_counts.size(); ++e) {
    EPMOE_CHECK_GE(expert_counts[e], 0);
    EPMOE_CHECK(home_rank_of_expert[e] >= 0 && home_rank_of_expert[e] < options.num_ranks);
  }
}

}  // namespace

std::vector<int> contiguous_home_ranks(int num_experts, int num_ranks) {
  EPMOE_CHECK_GT(num_ranks, 0);
  EPMOE_CHECK_EQ(num_experts % num_ranks, 0);
  const int experts_per_rank = num_experts / num_ranks;
  std::vector<int> homes(num_experts);
  for (int e = 0; e < num_experts; ++e) homes[e] = e / experts_per_rank;
  return homes;
}

ReplicaPlan plan_replicas(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
                          const ReplicaPlannerOptions& options, std::span<const int> previous_slot_experts) {
  check_planner_inputs(expert_counts, home_rank_of_expert, options);
  PlannerState state(expert_counts, home_rank_of_expert, options);
  std::vector<std::int64_t> loads_before = state.rank_loads();
  while (!measure_load_imbalance(state.rank_loads()).within(options.rebalance_threshold)) {
    if (!state.place_one_replica()) break;
  }
  return state.finish(previous_slot_experts, std::move(loads_before));
}

}  // namespace epmoe::balance
