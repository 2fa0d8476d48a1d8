// Topology: single caller, no ranks. Pairs are (token, k) with index
// token * K + k; expert ids come from a seeded Rng (uniform and skewed) or are
// adversarial: every pair on one expert, E = 1, N = 0, and ids out of range.
#include "kernels/permute.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace epmoe {
namespace {

// Every property sort_by_expert promises, checked from scratch.
void expect_valid_permutation(const std::vector<std::int32_t>& expert_of_pair, int num_experts,
                              const ExpertPermutation& perm) {
  const auto num_pairs = static_cast<std::int64_t>(expert_of_pair.size());
  ASSERT_EQ(perm.sorted_to_pair.size(), expert_of_pair.size());
  ASSERT_EQ(perm.pair_to_sorted.size(), expert_of_pair.size());
  ASSERT_EQ(perm.group_sizes.size(), static_cast<std::size_t>(num_experts));
  ASSERT_EQ(perm.group_offsets.size(), static_cast<std::size_t>(num_experts + 1));
  EXPECT_EQ(std::accumulate(perm.group_sizes.begin(), perm.group_sizes.end(), std::int64_t{0}), num_pairs);
  std::vector<std::int64_t> expected_sizes(num_experts, 0);
  for (std::int32_t e : expert_of_pair) ++expected_sizes[e];
  EXPECT_EQ(perm.group_sizes, expected_sizes);
  EXPECT_EQ(perm.group_offsets.front(), 0);
  for (int e = 0; e < num_experts; ++e)
    EXPECT_EQ(perm.group_offsets[e + 1] - perm.group_offsets[e], perm.group_sizes[e]);

  std::vector<bool> seen(num_pairs, false);
  for (std::int64_t slot = 0; slot < num_pairs; ++slot) {
    const std::int64_t pair = perm.sorted_to_pair[slot];
    ASSERT_GE(pair, 0);
    ASSERT_LT(pair, num_pairs);
    ASSERT_FALSE(seen[pair]) << "pair " << pair << " placed twice";  // bijection
    seen[pair] = true;
    ASSERT_EQ(perm.pair_to_sorted[pair], slot);  // inverse o perm = id
  }
  for (int e = 0; e < num_experts; ++e) {
    for (std::int64_t slot = perm.group_offsets[e]; slot < perm.group_offsets[e + 1]; ++slot) {
      ASSERT_EQ(expert_of_pair[perm.sorted_to_pair[slot]], e) << "slot " << slot;
      if (slot > perm.group_offsets[e]) {  // stable: token order kept within an expert
        ASSERT_LT(perm.sorted_to_pair[slot - 1], perm.sorted_to_pair[slot]);
      }
    }
  }
}

TEST(SortByExpert, RandomUniformAndSkewedIds) {
  Rng rng(42);
  for (int num_experts : {1, 3, 8, 64}) {
    for (std::int64_t num_pairs : {1, 2, 63, 64, 65, 4096}) {
      std::vector<std::int32_t> uniform(num_pairs), skewed(num_pairs);
      for (auto& e : uniform) e = static_cast<std::int32_t>(rng.uniform_int(num_experts));
      // A uniform draw to the 4th power piles pairs onto low ids and leaves high ids empty.
      for (auto& e : skewed) e = static_cast<std::int32_t>(num_experts * std::pow(rng.uniform01(), 4.0));
      expect_valid_permutation(uniform, num_experts, sort_by_expert(uniform, num_experts));
      expect_valid_permutation(skewed, num_experts, sort_by_expert(skewed, num_experts));
    }
  }
}

TEST(SortByExpert, AdversarialInputs) {
  const std::vector<std::int32_t> all_on_last(1000, 15);
  const auto perm = sort_by_expert(all_on_last, 16);
  expect_valid_permutation(all_on_last, 16, perm);
  for (std::int64_t i = 0; i < 1000; ++i) EXPECT_EQ(perm.sorted_to_pair[i], i);

  const std::vector<std::int32_t> single_expert(7, 0);
  expect_valid_permutation(single_expert, 1, sort_by_expert(single_expert, 1));

  const std::vector<std::int32_t> no_pairs;
  const auto empty = sort_by_expert(no_pairs, 4);
  expect_valid_permutation(no_pairs, 4, empty);
  EXPECT_EQ(empty.group_offsets, (std::vector<std::int64_t>{0, 0, 0, 0, 0}));

  // Descending ids: the sorted order reverses the expert blocks.
  const std::vector<std::int32_t> descending = {3, 3, 2, 1, 1, 0};
  const auto reversed = sort_by_expert(descending, 4);
  EXPECT_EQ(reversed.sorted_to_pair, (std::vector<std::int64_t>{5, 3, 4, 2, 0, 1}));
}

TEST(SortByExpert, OutOfRangeIdThrows) {
  EXPECT_THROW(sort_by_expert(std::vector<std::int32_t>{0, 4, 1}, 4), InternalError);
  EXPECT_THROW(sort_by_expert(std::vector<std::int32_t>{0, -1}, 4), InternalError);
  try {
    sort_by_expert(std::vector<std::int32_t>{0, 1, 9}, 4);
  } catch (const InternalError& error) {
    EXPECT_NE(std::string(error.what()).find("pair 2 has expert id 9"), std::string::npos) << error.what();
  }
}

TEST(GatherRows, CopiesIndexedRowsAndInverseRestores) {
  constexpr std::int64_t kRowSize = 5, kRows = 20000;  // above the parallel grain
  Rng rng(5);
  std::vector<std::int32_t> expert_of_pair(kRows);
  for (auto& e : expert_of_pair) e = static_cast<std::int32_t>(rng.uniform_int(8));
  const auto perm = sort_by_expert(expert_of_pair, 8);
  std::vector<float> rows(kRows * kRowSize);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  std::vector<float> sorted(rows.size()), restored(rows.size());
  gather_rows(rows.data(), perm.sorted_to_pair, sorted.data(), kRowSize);
  for (std::int64_t slot = 0; slot < kRows; ++slot)
    for (std::int64_t j = 0; j < kRowSize; ++j)
      ASSERT_EQ(sorted[slot * kRowSize + j], rows[perm.sorted_to_pair[slot] * kRowSize + j]);
  // The backward of a permutation is the gather by its inverse (DESIGN.md §4.2).
  gather_rows(sorted.data(), perm.pair_to_sorted, restored.data(), kRowSize);
  EXPECT_EQ(restored, rows);
}

}  // namespace
}  // namespace epmoe
