#include "kernels/permute.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/threading.h"

namespace epmoe {

// One sequential pass to count and one to place: O(N*K + E). At MoE sizes
// (N*K of 16K-1M pairs) this is a few microseconds to a millisecond, smaller
// than the gather of the rows it indexes, so it is not parallelised.
ExpertPermutation sort_by_expert(std::span<const std::int32_t> expert_of_pair, int num_experts) {
  EPMOE_CHECK_GE(num_experts, 1);
  const auto num_pairs = static_cast<std::int64_t>(expert_of_pair.size());
  ExpertPermutation perm;
  perm.group_sizes.assign(num_experts, 0);
  for (std::int64_t pair = 0; pair < num_pairs; ++pair) {
    const std::int32_t expert = expert_of_pair[pair];
    if (expert < 0 || expert >= num_experts) {
      detail::throw_check_failure(__FILE__, __LINE__,
                                  "sort_by_expert: pair " + std::to_string(pair) + " has expert id " +
                                      std::to_string(expert) + ", outside [0, " + std::to_string(num_experts) + ")");
    }
    ++perm.group_sizes[expert];
  }
  perm.group_offsets.assign(num_experts + 1, 0);
  for (int e = 0; e < num_experts; ++e) perm.group_offsets[e + 1] = perm.group_offsets[e] + perm.group_sizes[e];

  // Placing pairs in increasing pair order makes the sort stable.
  std::vector<std::int64_t> next_slot(perm.group_offsets.begin(), perm.group_offsets.end() - 1);
  perm.sorted_to_pair.resize(num_pairs);
  perm.pair_to_sorted.resize(num_pairs);
  for (std::int64_t pair = 0; pair < num_pairs; ++pair) {
    const std::int64_t slot = next_slot[expert_of_pair[pair]]++;
    perm.sorted_to_pair[slot] = pair;
    perm.pair_to_sorted[pair] = slot;
  }
  return perm;
}

void gather_rows(const float* src, std::span<const std::int64_t> index, float* dst, std::int64_t row_size) {
  const auto num_rows = static_cast<std::int64_t>(index.size());
  const auto row_bytes = static_cast<std::size_t>(row_size) * sizeof(float);
  const ComputeScope charge("gather rows", {.bytes = 2.0 * static_cast<double>(num_rows) * row_bytes});
  // ~64 KiB per slice: enough copy work to amortise waking a second thread.
  const std::int64_t grain = std::max<std::int64_t>(1, (64 << 10) / std::max<std::size_t>(1, row_bytes));
  parallel_for(num_rows, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) std::memcpy(dst + i * row_size, src + index[i] * row_size, row_bytes);
  });
}

}  // namespace epmoe
