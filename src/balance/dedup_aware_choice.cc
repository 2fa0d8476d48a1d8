#include "balance/dedup_aware_choice.h"

#include <algorithm>

#include "core/error.h"

namespace epmoe::balance {
namespace {

void check_inputs(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source,
                  std::span<const std::int32_t> topk_ids, int top_k) {
  const int num_experts = plan.num_experts;
  EPMOE_CHECK_EQ(counts.size(), static_cast<std::size_t>(plan.num_ranks) * num_experts);
  EPMOE_CHECK(source >= 0 && source < plan.num_ranks);
  EPMOE_CHECK_GE(top_k, 1);
  EPMOE_CHECK_EQ(topk_ids.size() % static_cast<std::size_t>(top_k), 0u);
  EPMOE_CHECK_EQ(plan.copy_offsets.size(), static_cast<std::size_t>(num_experts) + 1);
  // The routing is the one the counts were gathered from.
  std::vector<std::int64_t> local(static_cast<std::size_t>(num_experts), 0);
  for (const std::int32_t expert : topk_ids) {
    EPMOE_CHECK(expert >= 0 && expert < num_experts);
    ++local[expert];
  }
  for (int e = 0; e < num_experts; ++e)
    EPMOE_CHECK_EQ(local[e], counts[static_cast<std::size_t>(source) * num_experts + e]);
}

int copy_rank(const ReplicaPlan& plan, int expert, int copy) {
  return plan.copies[static_cast<std::size_t>(plan.copy_offsets[expert] + copy)].rank;
}

}  // namespace

namespace {

// The positional rule from the sub-quotas: per expert, s's pairs in order
// fill its copies' sub-quotas in copy order.
std::vector<int> positional_from(const ReplicaPlan& plan, std::vector<std::int64_t> left,
                                 std::span<const std::int32_t> topk_ids) {
  std::vector<int> current(static_cast<std::size_t>(plan.num_experts), 0);
  std::vector<int> choice(topk_ids.size());
  for (std::size_t p = 0; p < topk_ids.size(); ++p) {
    const int e = topk_ids[p];
    const int first = plan.copy_offsets[e], num_copies = plan.copy_offsets[e + 1] - first;
    int& i = current[e];
    while (i < num_copies && left[first + i] == 0) ++i;
    EPMOE_CHECK_LT(i, num_copies);
    --left[first + i];
    choice[p] = i;
  }
  return choice;
}

}  // namespace

std::vector<int> positional_copy_choice(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source,
                                        std::span<const std::int32_t> topk_ids, int top_k) {
  check_inputs(plan, counts, source, topk_ids, top_k);
  return positional_from(plan, source_sub_quotas(plan, counts, source), topk_ids);
}

std::vector<int> dedup_aware_copy_choice(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source,
                                         std::span<const std::int32_t> topk_ids, int top_k) {
  check_inputs(plan, counts, source, topk_ids, top_k);
  const int num_experts = plan.num_experts;
  const auto num_pairs = static_cast<std::int64_t>(topk_ids.size());
  const std::int64_t num_tokens = num_pairs / top_k;
  const std::vector<std::int64_t> sub_quotas = source_sub_quotas(plan, counts, source);
  std::vector<std::int64_t> left = sub_quotas;

  // An expert is fixed for this source when one copy takes all its pairs.
  std::vector<int> fixed_copy(static_cast<std::size_t>(num_experts), -1);
  for (int e = 0; e < num_experts; ++e) {
    int nonzero = 0, last = 0;
    for (int i = plan.copy_offsets[e]; i < plan.copy_offsets[e + 1]; ++i)
      if (left[i] > 0) {
        ++nonzero;
        last = i - plan.copy_offsets[e];
      }
    if (nonzero <= 1) fixed_copy[e] = last;  // no pairs at all: never asked
  }

  constexpr int kOpen = -1;
  std::vector<int> choice(static_cast<std::size_t>(num_pairs), kOpen);
  // Ranks already receiving token t (other than source), at most K of them:
  // receiving[t * K, t * K + num_receiving[t]).
  std::vector<int> receiving(static_cast<std::size_t>(num_pairs));
  std::vector<int> num_receiving(static_cast<std::size_t>(num_tokens), 0);
  const auto receives = [&](std::int64_t t, int rank) {
    const int* begin = receiving.data() + t * top_k;
    return std::find(begin, begin + num_receiving[t], rank) != begin + num_receiving[t];
  };
  const auto add_receiver = [&](std::int64_t t, int rank) {
    if (rank != source && !receives(t, rank)) receiving[t * top_k + num_receiving[t]++] = rank;
  };
  const auto take = [&](std::int64_t t, std::int64_t pair, int copy) {
    const int e = topk_ids[pair];
    EPMOE_DCHECK(left[plan.copy_offsets[e] + copy] > 0);
    --left[plan.copy_offsets[e] + copy];
    choice[pair] = copy;
    add_receiver(t, copy_rank(plan, e, copy));
  };
  // First copy of pair's expert with sub-quota left that satisfies `pred(rank)`.
  const auto first_copy = [&](std::int64_t pair, const auto& pred) {
    const int e = topk_ids[pair];
    const int first = plan.copy_offsets[e], num_copies = plan.copy_offsets[e + 1] - first;
    for (int i = 0; i < num_copies; ++i)
      if (left[first + i] > 0 && pred(plan.copies[first + i].rank)) return i;
    return kOpen;
  };

  // Fixed pairs.
  bool any_flexible = false;
  for (std::int64_t t = 0, p = 0; t < num_tokens; ++t)
    for (int k = 0; k < top_k; ++k, ++p) {
      const int copy = fixed_copy[topk_ids[p]];
      if (copy >= 0)
        take(t, p, copy);
      else
        any_flexible = true;
    }
  if (!any_flexible) return choice;  // nothing to choose: the positional rule's choice

  // Pass 1: flexible pairs onto a rank the token already reaches.
  for (std::int64_t t = 0, p = 0; t < num_tokens; ++t)
    for (int k = 0; k < top_k; ++k, ++p) {
      if (choice[p] != kOpen) continue;
      const int copy = first_copy(p, [&](int rank) { return rank != source && receives(t, rank); });
      if (copy != kOpen) take(t, p, copy);
    }

  // Pass 2: the rest, token by token.
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    for (std::int64_t p = t * top_k; p < (t + 1) * top_k; ++p) {
      if (choice[p] != kOpen) continue;
      int copy = first_copy(p, [&](int rank) { return rank != source && receives(t, rank); });
      if (copy == kOpen) copy = first_copy(p, [&](int rank) { return rank == source; });
      if (copy == kOpen) {
        // A rank another open pair of this token could also take.
        copy = first_copy(p, [&](int rank) {
          for (std::int64_t q = p + 1; q < (t + 1) * top_k; ++q) {
            if (choice[q] != kOpen) continue;
            if (first_copy(q, [&](int other) { return other == rank; }) != kOpen) return true;
          }
          return false;
        });
      }
      if (copy == kOpen) copy = first_copy(p, [](int) { return true; });
      EPMOE_CHECK_NE(copy, kOpen);  // every expert's sub-quotas sum to its pairs
      take(t, p, copy);
    }
  }
  for (const std::int64_t l : left) EPMOE_CHECK_EQ(l, 0);

  std::vector<int> positional = positional_from(plan, sub_quotas, topk_ids);
  if (off_rank_rows(plan, source, topk_ids, top_k, choice) > off_rank_rows(plan, source, topk_ids, top_k, positional))
    return positional;
  return choice;
}

std::int64_t off_rank_rows(const ReplicaPlan& plan, int source, std::span<const std::int32_t> topk_ids, int top_k,
                           std::span<const int> copy_choice) {
  EPMOE_CHECK_GE(top_k, 1);
  EPMOE_CHECK_EQ(copy_choice.size(), topk_ids.size());
  const auto num_tokens = static_cast<std::int64_t>(topk_ids.size()) / top_k;
  // last_token[r]: the last token that counted a row to rank r.
  std::vector<std::int64_t> last_token(static_cast<std::size_t>(plan.num_ranks), -1);
  last_token[source] = num_tokens;  // never counted
  std::int64_t rows = 0;
  for (std::int64_t t = 0, p = 0; t < num_tokens; ++t)
    for (int k = 0; k < top_k; ++k, ++p) {
      const int e = topk_ids[p];
      EPMOE_CHECK(e >= 0 && e < plan.num_experts);
      EPMOE_CHECK(copy_choice[p] >= 0 && copy_choice[p] < plan.copy_offsets[e + 1] - plan.copy_offsets[e]);
      std::int64_t& last = last_token[copy_rank(plan, e, copy_choice[p])];
      rows += last < t;
      last = std::max(last, t);
    }
  return rows;
}

}  // namespace epmoe::balance
