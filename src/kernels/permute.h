// Sorting (token, k) pairs by expert (DESIGN.md §4.2). A pair index is
// token * K + k. The sort is a stable counting sort: within one expert, pairs
// keep their original order, so the result is deterministic and the rows of
// an expert are in token order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace epmoe {

struct ExpertPermutation {
  std::vector<std::int64_t> sorted_to_pair;  // sorted position -> pair index
  std::vector<std::int64_t> pair_to_sorted;  // pair index -> sorted position (the inverse)
  std::vector<std::int64_t> group_sizes;     // pairs per expert, num_experts entries
  std::vector<std::int64_t> group_offsets;   // num_experts + 1 entries, prefix sums
};

// Throws InternalError when an id is outside [0, num_experts).
ExpertPermutation sort_by_expert(std::span<const std::int32_t> expert_of_pair, int num_experts);

// dst[i, :] = src[index[i], :] for rows of row_size floats.
void gather_rows(const float* src, std::span<const std::int64_t> index, float* dst, std::int64_t row_size);

}  // namespace epmoe
