// Replica choice aware of dedup (DESIGN.md §4.8, issue 13 item 2): which copy
// of a replicated expert each (token, k) pair of one source rank goes to, so
// that an all-to-all with dedup (one row per (token, destination rank)) sends
// fewer rows than the positional rule of balance/replica_plan.h (same
// per-(source, copy) sub-quotas).
//
// Why. With dedup, a token routed to K experts costs one row per distinct
// destination rank. When expert e has copies on several ranks, sending the
// pair (t, e) to the copy on a rank that already receives t (for another of
// its K experts) costs no row; the positional rule ignores this.
//
// What it keeps. The plan's contract (balance/replica_plan.h) fixes, per
// (source, copy), how many of the source's pairs of e the copy computes: the
// locality-first sub-quota q[s][e][i] (sub_quotas in balance/replica_plan.h). This choice sends
// EXACTLY q[s][e][i] of s's pairs of e to copy i — only WHICH pairs is
// chosen — so every copy still computes exactly its quota (sum over s of q =
// quota), the plan's rank loads hold, and no other rank needs to know the
// choice: a receiver learns its rows from the routing words, never from
// positions. Integers only, no floating point, no communication, ties to the
// lowest copy index, so it is a pure function of (plan, counts, source,
// routing): identical on every rank.
//
// The rule, for source s:
//  * a pair whose expert gets s's pairs on a single copy (R = 1, no replica,
//    or all of s's pairs in one sub-quota — the common case) is fixed; the
//    token's fixed pairs' ranks are the ranks that already receive it;
//  * pass 1, tokens in order, flexible pairs in k order: a copy with
//    sub-quota left on a rank other than s that already receives the token;
//  * pass 2, tokens in order, each still-open pair in k order takes the first
//    copy with sub-quota left, preferring (a) a rank other than s that
//    receives the token by now (its fixed ranks, pass 1's and this pass's
//    choices), (b) the copy on s itself (no row on the wire), (c) a rank
//    another open pair of the token could also use (two pairs, one row),
//    (d) any;
//  * guard: if the result sends more off-rank rows than the positional rule
//    (possible in contrived cases of the greedy), the positional choice is
//    returned instead. So it is never worse, in off-rank rows, by
//    construction.
// Cost: O(N·K·(C + K)) for C copies of an expert (C <= R, usually 1-3).
//
// What it does not optimise. It is a greedy, not an optimal b-matching, and
// it only moves pairs within s's sub-quotas, which the contract fixes before
// any routing is seen. The locality-first sub-quotas already make a copy
// compute its own rank's pairs first (no wire bytes at all), so for most
// (source, expert) one copy takes all of s's pairs and nothing can change;
// only a source whose pairs are split over two or more copies has a choice
// (per expert, the remainder's matching has at most R + C - 1 nonzero cells
// besides the C local ones).
// Choosing the sub-quotas from the tokens' other experts (which needs the
// routing, not only the counts, so it would cost communication) is not
// attempted. Rows counted here are off-rank rows (the bytes on the wire); the
// row a token has to its own rank is free. Token chunks do not matter: rows
// are per token, and the choice is made over the whole step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/replica_plan.h"

namespace epmoe::balance {

// For every pair of `source`'s routing ids [N * top_k] (token-major; must
// match counts[source]), the index within plan.copies_of(expert) of the copy
// it goes to: the positional rule (s's pairs of e in (token, k) order fill
// the copies' sub-quotas in copy order), or dedup-aware.
std::vector<int> positional_copy_choice(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source,
                                        std::span<const std::int32_t> topk_ids, int top_k);
std::vector<int> dedup_aware_copy_choice(const ReplicaPlan& plan, std::span<const std::int64_t> counts, int source,
                                         std::span<const std::int32_t> topk_ids, int top_k);

// Rows `source` sends to other ranks with dedup under `copy_choice`: per
// token, the distinct ranks of its pairs' copies other than `source`.
std::int64_t off_rank_rows(const ReplicaPlan& plan, int source, std::span<const std::int32_t> topk_ids, int top_k,
                           std::span<const int> copy_choice);

}  // namespace epmoe::balance
