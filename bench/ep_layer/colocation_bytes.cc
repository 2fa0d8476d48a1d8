// bench_colocated_replicas (issue 31 item 3): how many post-dedup forward
// token rows co-locating replicas of experts that tokens pick together could
// save, measured before building it.
//
// The routings are the ones bench/priced_replicas.sh times: the four shapes
// of that script, each rank's tokens and the replicated gate drawn as every
// layer bench draws them (layer_shape.h: rank_rng, replicated_gate), the
// sigmoid_grouped router with the Zipf s=1.2 selection bias (scale 0.15), hot
// experts packed on rank 0 or spread. For the balance-only plan
// (plan_replicas, rebalance_threshold=1.05, no costs) at B = 1, 2:
//   no replicas  off-rank rows with dedup, every pair home;
//   balance      the plan as the engine makes it, pairs to copies by the
//                dedup-aware choice (balance/dedup_aware_choice.h);
//   co-located   an oracle with the whole routing in hand: a hill climb over
//                the plan's slots that relabels a slot to another expert,
//                moves a slot (expert and quota) to a free slot of another
//                rank, or swaps two slots' experts (quotas kept), accepting a
//                move only if no rank's load goes above the plan's max load
//                and the off-rank rows (the same dedup-aware choice on every
//                source) fall;
//   port-first   the same climb aimed at the busiest port's rows (what the
//                all-to-all's time follows), the total not allowed to rise.
// The oracle sees every token's experts, which the planner never would: what
// it finds is what a co-pick-aware choice with the same loads could hope for
// (a local optimum of these moves, not a proof of the best).
// Rows are summed over source ranks; MB is forward token bytes per rank
// (rows x H x 4 / R, as bench_ep_layer's "fwd token MB" for f32 tokens).
//
//   bench_colocated_replicas
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "balance/dedup_aware_choice.h"
#include "balance/replica_planner.h"
#include "balance/routing_skew.h"
#include "layer_shape.h"
#include "moe/router.h"

namespace {

using namespace epmoe;
using namespace epmoe::balance;

struct Routing {
  std::vector<std::vector<std::int32_t>> ids;  // [R][N * K]
  std::vector<std::int64_t> counts;            // [R * E]
  std::vector<std::int64_t> global;            // [E]
};

// Each rank's routing as bench_ep_layer's modelled runner computes it.
Routing route(const bench::LayerShape& s, HotExpertPlacement placement) {
  const std::vector<float> bias_values = zipf_selection_bias({.num_experts = s.num_experts,
                                                              .num_ranks = s.num_ranks,
                                                              .zipf_exponent = 1.2,
                                                              .placement = placement,
                                                              .scale = 0.15});
  Tensor bias(DType::f32, {s.num_experts});
  std::copy(bias_values.begin(), bias_values.end(), bias.data<float>());
  Routing routing;
  routing.counts.assign(static_cast<std::size_t>(s.num_ranks) * s.num_experts, 0);
  routing.global.assign(s.num_experts, 0);
  for (int r = 0; r < s.num_ranks; ++r) {
    Rng rng = bench::rank_rng(r);
    const Tensor gate = bench::replicated_gate(s.hidden, s.num_experts);
    const Tensor x = bench::random_tensor({s.tokens, s.hidden}, rng, 1.0);
    Router router({.kind = RouterKind::sigmoid_grouped, .num_experts = s.num_experts, .top_k = s.top_k});
    const RouterOutput out = router.forward(x.view(), gate.view(), bias.view());
    const auto ids = out.topk_ids.span<std::int32_t>();
    routing.ids.emplace_back(ids.begin(), ids.end());
    for (const std::int32_t e : ids) {
      ++routing.counts[static_cast<std::size_t>(r) * s.num_experts + e];
      ++routing.global[e];
    }
  }
  return routing;
}

// Off-rank rows with dedup over every source, pairs chosen dedup-aware: the
// total, and the busiest port's (max over ranks of the rows a rank sends or
// receives; the all-to-all's time goes to it).
struct Rows {
  std::int64_t total = 0, busiest_port = 0;
};

Rows rows_of(const ReplicaPlan& plan, const Routing& routing, int top_k) {
  Rows rows;
  std::vector<std::int64_t> in(plan.num_ranks, 0), out(plan.num_ranks, 0);
  for (int s = 0; s < plan.num_ranks; ++s) {
    const std::vector<int> choice = dedup_aware_copy_choice(plan, routing.counts, s, routing.ids[s], top_k);
    const std::vector<std::int32_t>& ids = routing.ids[s];
    std::vector<std::int64_t> last_token(plan.num_ranks, -1);
    for (std::size_t p = 0; p < ids.size(); ++p) {
      const std::int64_t t = static_cast<std::int64_t>(p) / top_k;
      const int rank = plan.copies[plan.copy_offsets[ids[p]] + choice[p]].rank;
      if (rank == s || last_token[rank] == t) continue;
      last_token[rank] = t;
      ++in[rank];
      ++out[s];
    }
    rows.total += off_rank_rows(plan, s, ids, top_k, choice);
  }
  std::int64_t sent = 0;
  for (const std::int64_t n : out) sent += n;
  if (sent != rows.total) {  // the two counts of one choice must agree
    std::fprintf(stderr, "bench_colocated_replicas: %lld rows per port, %lld by off_rank_rows\n",
                 static_cast<long long>(sent), static_cast<long long>(rows.total));
    std::exit(1);
  }
  for (int r = 0; r < plan.num_ranks; ++r) rows.busiest_port = std::max({rows.busiest_port, in[r], out[r]});
  return rows;
}

// A plan as slots (expert, quota) over the homes; rebuilt into a ReplicaPlan
// for the choice after every move.
struct Slots {
  std::vector<int> expert;          // [R * B], kEmptySlot or an expert
  std::vector<std::int64_t> quota;  // [R * B]
};

ReplicaPlan build(const Slots& slots, const std::vector<std::int64_t>& global, const std::vector<int>& homes,
                  int num_ranks, int num_slots) {
  const int num_experts = static_cast<int>(global.size());
  ReplicaPlan plan;
  plan.num_experts = num_experts;
  plan.num_ranks = num_ranks;
  plan.num_redundant_slots_per_rank = num_slots;
  std::vector<int> copies(num_experts, 1);
  std::vector<std::int64_t> home_quota(global);
  for (std::size_t i = 0; i < slots.expert.size(); ++i)
    if (slots.expert[i] != kEmptySlot) {
      ++copies[slots.expert[i]];
      home_quota[slots.expert[i]] -= slots.quota[i];
    }
  plan.copy_offsets.assign(num_experts + 1, 0);
  for (int e = 0; e < num_experts; ++e) plan.copy_offsets[e + 1] = plan.copy_offsets[e] + copies[e];
  plan.copies.resize(plan.copy_offsets[num_experts]);
  std::vector<int> cursor(num_experts);
  plan.rank_loads_after.assign(num_ranks, 0);
  for (int e = 0; e < num_experts; ++e) {
    plan.copies[plan.copy_offsets[e]] = {homes[e], home_quota[e]};
    plan.rank_loads_after[homes[e]] += home_quota[e];
    cursor[e] = plan.copy_offsets[e] + 1;
  }
  for (std::size_t i = 0; i < slots.expert.size(); ++i) {
    const int e = slots.expert[i];
    if (e == kEmptySlot) continue;
    const int rank = static_cast<int>(i) / num_slots;
    plan.copies[cursor[e]++] = {rank, slots.quota[i]};
    plan.rank_loads_after[rank] += slots.quota[i];
  }
  plan.slot_experts = slots.expert;
  return plan;
}

struct Climb {
  Rows rows;
  int moves = 0;
};

// What the oracle's moves must lower: the off-rank rows (whatever the busiest
// port does), or the busiest port's rows without raising the total.
enum class Aim { total_rows, busiest_port };

// The oracle (file comment): first-improvement hill climb.
Climb co_locate(const ReplicaPlan& start, const Routing& routing, const std::vector<int>& homes, int top_k, Aim aim) {
  const int num_ranks = start.num_ranks, num_slots = start.num_redundant_slots_per_rank;
  const int num_experts = start.num_experts;
  Slots slots{start.slot_experts, std::vector<std::int64_t>(start.slot_experts.size(), 0)};
  for (std::size_t i = 0; i < slots.expert.size(); ++i) {
    const int e = slots.expert[i];
    if (e == kEmptySlot) continue;
    for (const ExpertCopy& c : start.copies_of(e))
      if (c.rank == static_cast<int>(i) / num_slots && c.rank != start.home_rank(e)) slots.quota[i] = c.token_quota;
  }
  const std::int64_t max_load = *std::max_element(start.rank_loads_after.begin(), start.rank_loads_after.end());
  Climb climb{rows_of(start, routing, top_k), 0};
  // A move is taken when it is feasible (every copy's quota > 0 at replicas,
  // >= 0 at homes; one copy of an expert per rank), keeps every load within
  // max_load, and lowers the rows.
  const auto try_slots = [&](const Slots& candidate) {
    for (int r = 0; r < num_ranks; ++r)
      for (int b = 0; b < num_slots; ++b) {
        const int e = candidate.expert[static_cast<std::size_t>(r) * num_slots + b];
        if (e == kEmptySlot) continue;
        if (homes[e] == r) return false;
        for (int c = 0; c < b; ++c)
          if (candidate.expert[static_cast<std::size_t>(r) * num_slots + c] == e) return false;
      }
    const ReplicaPlan plan = build(candidate, routing.global, homes, num_ranks, num_slots);
    for (int e = 0; e < num_experts; ++e)
      if (plan.copies[plan.copy_offsets[e]].token_quota < 0) return false;
    if (*std::max_element(plan.rank_loads_after.begin(), plan.rank_loads_after.end()) > max_load) return false;
    const Rows rows = rows_of(plan, routing, top_k);
    const bool lower = aim == Aim::total_rows
                           ? rows.total < climb.rows.total
                           : rows.busiest_port < climb.rows.busiest_port && rows.total <= climb.rows.total;
    if (!lower) return false;
    climb.rows = rows;
    ++climb.moves;
    slots = candidate;
    return true;
  };
  for (bool improved = true; improved;) {
    improved = false;
    for (std::size_t i = 0; i < slots.expert.size(); ++i) {
      if (slots.expert[i] == kEmptySlot) continue;
      for (int e = 0; e < num_experts; ++e) {  // relabel slot i to expert e
        if (e == slots.expert[i]) continue;
        Slots candidate = slots;
        candidate.expert[i] = e;
        improved |= try_slots(candidate);
      }
      for (std::size_t j = 0; j < slots.expert.size(); ++j) {  // move slot i to the free slot j of another rank
        if (slots.expert[j] != kEmptySlot || static_cast<int>(i) / num_slots == static_cast<int>(j) / num_slots)
          continue;
        Slots candidate = slots;
        std::swap(candidate.expert[i], candidate.expert[j]);
        std::swap(candidate.quota[i], candidate.quota[j]);
        if (try_slots(candidate)) {
          improved = true;
          break;
        }
      }
      if (slots.expert[i] == kEmptySlot) continue;
      for (std::size_t j = i + 1; j < slots.expert.size(); ++j) {  // swap the experts of slots i, j
        if (slots.expert[j] == kEmptySlot || slots.expert[j] == slots.expert[i]) continue;
        if (static_cast<int>(i) / num_slots == static_cast<int>(j) / num_slots) continue;
        Slots candidate = slots;
        std::swap(candidate.expert[i], candidate.expert[j]);
        improved |= try_slots(candidate);
      }
    }
  }
  return climb;
}

}  // namespace

int main() {
  struct Case {
    const char* name;
    bench::LayerShape shape;
  };
  const Case cases[] = {
      {"default", {8, 256, 256, 128, 64, 8}},
      {"many tokens per expert", {8, 1024, 256, 256, 16, 2}},
      {"few tokens per expert", {8, 64, 256, 128, 64, 8}},
      {"Mixtral-like", {4, 512, 512, 1024, 8, 2}},
  };
  std::printf(
      "| shape | hot | B | replicas | max/mean | off-rank rows: no replicas / balance / co-located (moves) / "
      "port-first (moves) | fwd token MB per rank: no replicas / balance / co-located / port-first | co-located vs "
      "balance | busiest port rows: no replicas / balance / co-located / port-first |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    const bench::LayerShape& s = c.shape;
    const std::vector<int> homes = contiguous_home_ranks(s.num_experts, s.num_ranks);
    const double mb = static_cast<double>(s.hidden) * 4 / s.num_ranks / 1e6;
    for (const HotExpertPlacement placement : {HotExpertPlacement::packed, HotExpertPlacement::spread}) {
      const Routing routing = route(s, placement);
      const ReplicaPlan none =
          plan_replicas(routing.global, homes, {.num_ranks = s.num_ranks, .num_redundant_slots_per_rank = 0});
      const Rows off = rows_of(none, routing, s.top_k);
      for (const int b : {1, 2}) {
        const ReplicaPlan plan =
            plan_replicas(routing.global, homes,
                          {.num_ranks = s.num_ranks, .num_redundant_slots_per_rank = b, .rebalance_threshold = 1.05});
        const Rows balance = rows_of(plan, routing, s.top_k);
        const Climb total = co_locate(plan, routing, homes, s.top_k, Aim::total_rows);
        const Climb port = co_locate(plan, routing, homes, s.top_k, Aim::busiest_port);
        const auto n = [](std::int64_t v) { return static_cast<long long>(v); };
        std::printf(
            "| %s | %s | %d | %d | %.3f | %lld / %lld / %lld (%d) / %lld (%d) | %.3f / %.3f / %.3f / %.3f | %+.1f%% | "
            "%lld / %lld / %lld / %lld |\n",
            c.name, placement == HotExpertPlacement::packed ? "packed" : "spread", b, plan.num_replicas(),
            plan.after.max_over_mean(), n(off.total), n(balance.total), n(total.rows.total), total.moves,
            n(port.rows.total), port.moves, off.total * mb, balance.total * mb, total.rows.total * mb,
            port.rows.total * mb, 100.0 * (total.rows.total - balance.total) / balance.total, n(off.busiest_port),
            n(balance.busiest_port), n(total.rows.busiest_port), n(port.rows.busiest_port));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
