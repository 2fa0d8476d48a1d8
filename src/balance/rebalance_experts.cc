#include "balance/rebalance_experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "balance/rebalance_kernels.h"
#include "core/error.h"

namespace epmoe::balance {
namespace {

// The shape one layer is planned on: the global policy is the hierarchical
// one with one group and one node.
struct Layout {
  int num_nodes, num_groups;
  int gpus_per_node, slots_per_gpu;
  int experts_per_node, copies_per_node;
  int group_size, groups_per_node;
};

Layout layout_of(int num_logical_experts, const RebalanceExpertsOptions& options) {
  const bool hierarchical = uses_hierarchical_policy(options);
  Layout l{};
  l.num_nodes = hierarchical ? options.num_nodes : 1;
  l.num_groups = hierarchical ? options.num_groups : 1;
  l.gpus_per_node = options.num_gpus / l.num_nodes;
  l.slots_per_gpu = options.num_replicas / options.num_gpus;
  l.experts_per_node = num_logical_experts / l.num_nodes;
  l.copies_per_node = options.num_replicas / l.num_nodes;
  l.group_size = num_logical_experts / l.num_groups;
  l.groups_per_node = l.num_groups / l.num_nodes;
  return l;
}

// One node's replication and placement: flat arrays sized once per call and
// reused for every layer and node (copy-assigning one into another reuses the
// storage, so the hot loops never allocate).
struct Candidate {
  int n = 0, copies = 0, gpus = 0, slots = 0;
  const double* w = nullptr;     // [n] expert loads
  std::vector<int> count;        // [n] copies of each expert
  std::vector<double> per_copy;  // [n] replication: each expert's load / its copies
  std::vector<double> choice;    // [n] replication: per_copy, or -infinity for an expert at its limit
  std::vector<int> copy_expert;  // [copies] the experts in order, then the extra copies as created
  std::vector<int> order;        // [copies] heaviest first (ties to the lower index), when `sorted`
  bool sorted = false;
  std::vector<double> copy_load;  // [copies] the expert's load / its copies
  std::vector<int> slot;          // [gpus * slots] copy in each slot
  std::vector<int> fill;          // [gpus] used slots
  std::vector<double> load;       // [gpus]
  std::vector<double> key;        // [gpus] packing scratch
  std::vector<int> holds;         // [n * gpus] copies of each expert on each GPU (an expert's GPUs adjacent)
  bool duplicate = false;         // some GPU holds an expert twice

  void resize(int experts, int num_copies, int num_gpus, int num_slots) {
    n = experts, copies = num_copies, gpus = num_gpus, slots = num_slots;
    count.resize(n), per_copy.resize(n), choice.resize(n), copy_expert.resize(copies), copy_load.resize(copies);
    slot.resize(static_cast<std::size_t>(gpus) * slots), fill.resize(gpus), load.resize(gpus), key.resize(gpus);
    holds.resize(static_cast<std::size_t>(gpus) * n);
  }
  int& held(int gpu, int expert) { return holds[static_cast<std::size_t>(expert) * gpus + gpu]; }
  int held(int gpu, int expert) const { return holds[static_cast<std::size_t>(expert) * gpus + gpu]; }
  int at(int gpu, int s) const { return slot[static_cast<std::size_t>(gpu) * slots + s]; }
  double max_load() const { return load[first_max_index(load.data(), gpus)]; }
  void clear_packing() {
    std::fill(fill.begin(), fill.end(), 0);
    std::fill(load.begin(), load.end(), 0.0);
    std::fill(holds.begin(), holds.end(), 0);
    duplicate = false;
  }
  void put(int gpu, int copy) {
    slot[static_cast<std::size_t>(gpu) * slots + fill[gpu]++] = copy;
    load[gpu] += copy_load[copy];
    duplicate |= ++held(gpu, copy_expert[copy]) > 1;
  }
  // Swaps slot a of GPU p with slot b of GPU q.
  void swap(int p, int a, int q, int b) {
    int& sa = slot[static_cast<std::size_t>(p) * slots + a];
    int& sb = slot[static_cast<std::size_t>(q) * slots + b];
    const double delta = copy_load[sa] - copy_load[sb];
    load[p] -= delta, load[q] += delta;
    --held(p, copy_expert[sa]), ++held(p, copy_expert[sb]);
    --held(q, copy_expert[sb]), ++held(q, copy_expert[sa]);
    std::swap(sa, sb);
  }
};

// Stage 2: one more copy at a time to the largest load per copy (ties to the
// lower index), at most `cap` each (or limit[i] for expert i). In three
// parts so that several nodes can replicate in lockstep (see pack_together).
constexpr double kNoMoreCopies = -std::numeric_limits<double>::infinity();

void start_replication(const double* expert_loads, int cap, Candidate& c, const int* limit) {
  c.w = expert_loads;
  c.sorted = false;
  for (int i = 0; i < c.n; ++i) {
    c.count[i] = 1, c.copy_expert[i] = i, c.per_copy[i] = expert_loads[i];
    c.choice[i] = 1 < (limit == nullptr ? cap : limit[i]) ? c.per_copy[i] : kNoMoreCopies;
  }
}

// Which expert takes the next copy among equal loads per copy: the lowest
// index (EPLB's rule), or the hotter expert (then the lowest index).
enum class CopyTies { lowest_index, hotter };

int next_copy_expert(const Candidate& c, CopyTies ties) {
  const int first = first_max_index(c.choice.data(), c.n);
  if (ties == CopyTies::lowest_index) return first;
  int best = first;
  for (int i = first + 1; i < c.n; ++i) {
    if (c.choice[i] == c.choice[first] && c.w[i] > c.w[best]) best = i;
  }
  return best;
}

void add_copy(Candidate& c, int j, int cap, const int* limit, CopyTies ties = CopyTies::lowest_index) {
  const int best = next_copy_expert(c, ties);
  EPMOE_CHECK(c.choice[best] != kNoMoreCopies);  // validate: copies_per_node <= experts_per_node * gpus_per_node
  const int copies = ++c.count[best];
  c.per_copy[best] = c.w[best] / copies;
  c.choice[best] = copies < (limit == nullptr ? cap : limit[best]) ? c.per_copy[best] : kNoMoreCopies;
  c.copy_expert[j] = best;
}

void finish_replication(Candidate& c) {
  for (int j = 0; j < c.copies; ++j) c.copy_load[j] = c.per_copy[c.copy_expert[j]];
}

void replicate(const double* expert_loads, int cap, Candidate& c, const int* limit = nullptr,
               CopyTies ties = CopyTies::lowest_index) {
  start_replication(expert_loads, cap, c, limit);
  for (int j = c.n; j < c.copies; ++j) add_copy(c, j, cap, limit, ties);
  finish_replication(c);
}

// Stage 3: copies heaviest first (ties to the lower index), each onto the
// lightest GPU with a free slot (ties to the lower GPU); with
// `avoid_duplicates` only GPUs without the expert, and when every GPU with
// room holds it, a copy Y on a full GPU p without the expert, Y not held by
// q = the lightest GPU with room, moves to q and the copy takes Y's slot.
//
// key[g]: GPU g's load, infinite once full; the lightest with room is the
// first minimum of key.
constexpr double kFull = std::numeric_limits<double>::infinity();

// Empties the placement and, when the copies' loads changed, orders them
// heaviest first, ties to the lower index: descending_order's counting up to
// kCountingOrderCopies (40 copies per node at E=256 on 8 nodes of 8 GPUs:
// the whole layer ~1.4x faster than with std::sort), std::sort of (load,
// index) pairs beyond (72 copies, E=64 on 8 GPUs: std::sort ~8% faster;
// the counting is quadratic).
constexpr int kCountingOrderCopies = 64;

void start_packing(Candidate& c, std::vector<std::pair<double, int>>& sort_buffer) {
  c.clear_packing();
  std::fill(c.key.begin(), c.key.end(), 0.0);
  if (c.sorted) return;
  c.order.resize(c.copies);
  if (c.copies <= kCountingOrderCopies) {
    descending_order(c.copy_load.data(), c.copies, c.order.data());
  } else {
    sort_buffer.resize(c.copies);
    for (int j = 0; j < c.copies; ++j) sort_buffer[j] = {-c.copy_load[j], j};
    std::sort(sort_buffer.begin(), sort_buffer.end());
    for (int j = 0; j < c.copies; ++j) c.order[j] = sort_buffer[j].second;
  }
  c.sorted = true;
}

// The copy `copy` of `expert` when every GPU with room holds the expert: a
// copy Y on a full GPU p without the expert, Y not held by q (the lightest
// GPU with room), moves to q and the copy takes Y's slot.
[[gnu::noinline]] void place_by_swapping(Candidate& c, int copy, int expert, int q) {
  int swap_gpu = -1, swap_slot = -1;
  for (int p = 0; p < c.gpus; ++p) {
    if (c.held(p, expert)) continue;
    for (int s = 0; s < c.fill[p]; ++s) {
      const int other = c.at(p, s);
      if (c.held(q, c.copy_expert[other])) continue;
      if (swap_gpu < 0 || c.copy_load[other] < c.copy_load[c.at(swap_gpu, swap_slot)]) swap_gpu = p, swap_slot = s;
    }
  }
  EPMOE_CHECK_GE(swap_gpu, 0);  // a full GPU has an expert q lacks
  c.put(q, copy);               // then swap it with Y: q gets Y, p gets the copy
  c.swap(q, c.fill[q] - 1, swap_gpu, swap_slot);
  c.duplicate = false;
  c.key[q] = c.fill[q] == c.slots ? kFull : c.load[q];
}

// Places the next copy, c.order[k]. `without_expert`: [gpus] scratch.
inline void place(Candidate& c, int k, bool avoid_duplicates, double* without_expert) {
  const int copy = c.order[k], expert = c.copy_expert[copy];
  double* key = c.key.data();
  const int lightest_with_room = first_min_index(key, c.gpus);
  int best = lightest_with_room;
  if (avoid_duplicates && c.held(best, expert)) {  // the lightest with room not holding the expert
    const int* holders = c.holds.data() + static_cast<std::size_t>(expert) * c.gpus;
    for (int g = 0; g < c.gpus; ++g) without_expert[g] = holders[g] != 0 ? kFull : key[g];
    best = first_min_index(without_expert, c.gpus);
    if (without_expert[best] == kFull) return place_by_swapping(c, copy, expert, lightest_with_room);
  }
  c.put(best, copy);
  key[best] = c.fill[best] == c.slots ? kFull : c.load[best];
}

// Packs several candidates of one shape (a layer's nodes) in lockstep, copy
// k of each before copy k + 1 of any. One node's packing is a chain of
// dependent steps (each scan reads the key the previous step wrote); the
// chains of different nodes are independent, so interleaved the core
// overlaps them instead of waiting on each. The placements are each node's
// own packing, exactly.
void pack_together(std::span<Candidate* const> candidates, bool avoid_duplicates,
                   std::vector<std::pair<double, int>>& sort_buffer, std::vector<double>& without_expert) {
  if (candidates.empty()) return;
  const int copies = candidates[0]->copies;
  if (candidates[0]->slots == 1) {  // EPLB's shortcut: copy j on GPU j (no GPU can hold two)
    for (Candidate* c : candidates) {
      c->clear_packing();
      for (int j = 0; j < copies; ++j) c->put(j, j);
    }
    return;
  }
  for (Candidate* c : candidates) start_packing(*c, sort_buffer);
  without_expert.resize(candidates[0]->gpus);
  for (int k = 0; k < copies; ++k) {
    for (Candidate* c : candidates) place(*c, k, avoid_duplicates, without_expert.data());
  }
}

void pack(Candidate& c, bool avoid_duplicates, std::vector<std::pair<double, int>>& sort_buffer,
          std::vector<double>& without_expert) {
  Candidate* const one[] = {&c};
  pack_together(one, avoid_duplicates, sort_buffer, without_expert);
}

// EPLB's packing made duplicate-free: each second copy of an expert on a GPU
// swapped with a copy of another GPU that neither GPU would then hold twice,
// the swap leaving the lower of the two GPUs' new loads. False when some
// duplicate has no such swap: every GPU without the expert holds only
// experts this GPU holds too, which happens when those GPUs hold duplicates
// of their own (loads {9, 9, 1, 8, 0, 5} on 4 GPUs x 4 slots).
bool remove_duplicates(Candidate& c) {
  for (int p = 0; p < c.gpus; ++p) {
    for (int a = 0; a < c.slots; ++a) {
      const int copy = c.at(p, a), expert = c.copy_expert[copy];
      if (c.held(p, expert) < 2) continue;
      int best_gpu = -1, best_slot = -1;
      double best_max = 0.0;
      for (int q = 0; q < c.gpus; ++q) {
        if (q == p || c.held(q, expert) > 0) continue;
        for (int b = 0; b < c.slots; ++b) {
          const int other = c.at(q, b);
          if (c.held(p, c.copy_expert[other]) > 0) continue;
          const double delta = c.copy_load[copy] - c.copy_load[other];
          const double new_max = std::max(c.load[p] - delta, c.load[q] + delta);
          if (best_gpu < 0 || new_max < best_max) best_gpu = q, best_slot = b, best_max = new_max;
        }
      }
      if (best_gpu < 0) return false;
      c.swap(p, a, best_gpu, best_slot);
    }
  }
  c.duplicate = false;
  return true;
}

// Each expert's load per copy with its copies as they are, with one more and
// with one fewer (count >= 2): what the slot re-assignments below compare,
// computed once per search step instead of in their inner loops.
struct RecountedLoads {
  std::vector<double> now, more, fewer;  // [n]
  void compute(const Candidate& c) {
    now.resize(c.n), more.resize(c.n), fewer.resize(c.n);
    for (int i = 0; i < c.n; ++i) {
      now[i] = c.w[i] / c.count[i];
      more[i] = c.w[i] / (c.count[i] + 1);
      fewer[i] = c.count[i] > 1 ? c.w[i] / (c.count[i] - 1) : 0.0;
    }
  }
};

// The node's max load if slot s of GPU h held a copy of `to` instead of its
// expert `from` (which keeps count - 1 >= 1 copies; every copy of both then
// carries the new load / copies). Returns early, with a load >= bound, once
// some GPU reaches `bound`.
double retarget_max(const Candidate& c, const RecountedLoads& r, int h, int s, int to, double bound) {
  const int from = c.copy_expert[c.at(h, s)];
  const double from_old = r.now[from], from_new = r.fewer[from];
  const double to_old = r.now[to], to_new = r.more[to];
  double max = 0.0;
  for (int g = 0; g < c.gpus; ++g) {
    const int hf = c.held(g, from) - (g == h), ht = c.held(g, to);
    double load = c.load[g] + hf * (from_new - from_old) + ht * (to_new - to_old);
    if (g == h) load += to_new - from_old;
    if (load >= bound) return load;
    max = std::max(max, load);
  }
  return max;
}

void retarget(Candidate& c, int h, int s, int to) {
  const int copy = c.at(h, s), from = c.copy_expert[copy];
  --c.count[from], ++c.count[to];
  --c.held(h, from), ++c.held(h, to);
  c.copy_expert[copy] = to;
  c.sorted = false;
  for (int j = 0; j < c.copies; ++j) c.copy_load[j] = c.w[c.copy_expert[j]] / c.count[c.copy_expert[j]];
  for (int g = 0; g < c.gpus; ++g) {
    double load = 0.0;
    for (int k = 0; k < c.slots; ++k) load += c.copy_load[c.at(g, k)];
    c.load[g] = load;
  }
}

// The order of a node's experts by load ("heat"), and how far a candidate's
// copies are out of it: inversions, pairs where the hotter expert has fewer
// copies; and ties with the hottest, colder experts with as many copies as
// the hottest one (EPLB gives a very hot expert more copies than any other).
// EPLB's replication has neither inversions nor, unless loads are close,
// ties: each copy goes to the largest load per copy. The duplicate-free
// search can add both: capping copies at one per GPU hands the hottest
// expert's extra copies to whichever expert is next, and slot
// re-assignments follow loads, not heat.
class HeatOrder {
 public:
  void reset(const double* loads, int n) {
    w_ = loads;
    n_ = n;
    hottest_ = first_max_index(loads, n);
    order_.resize(n);
    if (n <= kCountingOrderCopies) {  // as start_packing orders copies, for the same reason
      descending_order(loads, n, order_.data());
    } else {
      std::iota(order_.begin(), order_.end(), 0);
      std::sort(order_.begin(), order_.end(),
                [&](int a, int b) { return loads[a] > loads[b] || (loads[a] == loads[b] && a < b); });
    }
    // An expert's tie group: the positions of the experts with its load.
    colder_from_.resize(n), hotter_until_.resize(n);
    for (int p = 0; p < n;) {
      int end = p + 1;
      while (end < n && w_[order_[end]] == w_[order_[p]]) ++end;
      for (int q = p; q < end; ++q) hotter_until_[order_[q]] = p, colder_from_[order_[q]] = end;
      p = end;
    }
  }
  // The experts hottest first, ties to the lower index.
  const std::vector<int>& order() const { return order_; }
  int hottest() const { return hottest_; }

  // Whether some expert has fewer copies than a colder one: then some expert
  // has more copies than the fewest among the strictly hotter ones.
  bool has_inversion(const Candidate& c) const {
    int fewest_hotter = std::numeric_limits<int>::max(), fewest_so_far = fewest_hotter;
    for (int k = 0; k < c.n; ++k) {
      const int x = order_[k];
      if (k > 0 && w_[x] < w_[order_[k - 1]]) fewest_hotter = fewest_so_far;
      if (c.count[x] > fewest_hotter) return true;
      fewest_so_far = std::min(fewest_so_far, c.count[x]);
    }
    return false;
  }

  // The counts of `c` (duplicate-free: at most c.gpus copies each) that the
  // two questions below answer in O(1); again after any count changes.
  void index(const Candidate& c) {
    width_ = c.gpus + 3;  // copies 0..gpus + 1, and one past
    fewer_.assign(static_cast<std::size_t>(n_ + 1) * width_, 0);
    for (int p = 0; p < n_; ++p) {
      const int* row = &fewer_[static_cast<std::size_t>(p) * width_];
      int* next = &fewer_[static_cast<std::size_t>(p + 1) * width_];
      const int copies = c.count[order_[p]];
      for (int v = 0; v < width_; ++v) next[v] = row[v] + (copies < v);
    }
    counts_ = c.count.data();
  }
  // Change of the number of inversions when one copy goes from `from` to `to`.
  int inversion_change(int from, int to) const {
    const int cf = counts_[from], ct = counts_[to];
    return inversions_of(to, ct + 1, from) - inversions_of(to, ct, from) + inversions_of(from, cf - 1, to) -
           inversions_of(from, cf, to) + inverted(w_[to], ct + 1, w_[from], cf - 1) -
           inverted(w_[to], ct, w_[from], cf);
  }
  // Ties with the hottest, with one copy moved from `from` to `to` (-1: none).
  int ties_with_hottest(int from = -1, int to = -1) const {
    const auto copies = [&](int k) { return counts_[k] + (k == to) - (k == from); };
    const int h = hottest_, threshold = copies(h), colder = colder_from_[h];
    int ties = (n_ - colder) - (fewer(n_, threshold) - fewer(colder, threshold));
    for (const int k : {from, to}) {
      if (k >= 0 && w_[k] < w_[h]) ties += (copies(k) >= threshold) - (counts_[k] >= threshold);
    }
    return ties;
  }

 private:
  static int inverted(double wx, int cx, double wy, int cy) { return (wx > wy && cx < cy) || (wy > wx && cy < cx); }
  // Experts at positions [0, p) of the order with fewer than v copies.
  int fewer(int p, int v) const { return fewer_[static_cast<std::size_t>(p) * width_ + v]; }
  // Pairs (x, k), k != x and k != skip, out of order if x had `copies`:
  // hotter experts with fewer, colder ones with more.
  int inversions_of(int x, int copies, int skip) const {
    const int hotter = hotter_until_[x], colder = colder_from_[x];
    int count = fewer(hotter, copies) + (n_ - colder) - (fewer(n_, copies + 1) - fewer(colder, copies + 1));
    if (skip >= 0) count -= inverted(w_[x], copies, w_[skip], counts_[skip]);
    return count;
  }

  const double* w_ = nullptr;
  int n_ = 0, hottest_ = 0;
  std::vector<int> order_;
  std::vector<int> hotter_until_, colder_from_;  // [n] by expert: its tie group is [hotter_until, colder_from)
  const int* counts_ = nullptr;                  // index(): the candidate's counts
  int width_ = 0;
  std::vector<int> fewer_;  // [(n + 1) * width]: fewer(p, v)
};

// Local search on a duplicate-free placement: while the most loaded GPU m can
// be lowered, the exchange of one copy (else two copies) of m with as many of
// another GPU, no GPU then holding an expert twice, that leaves the lowest
// larger load of the two. Stops at `floor` (no placement can be lower).
// With `keep`, no re-assignment adds an inversion of its heat order.
void lower_max_load(Candidate& c, double floor, bool two_for_two, RecountedLoads& recounted,
                    HeatOrder* keep = nullptr) {
  const double eps = 1e-12;
  for (int iteration = 0; iteration < 16 * c.gpus; ++iteration) {
    const int m = first_max_index(c.load.data(), c.gpus);
    const double lm = c.load[m];
    if (lm <= floor * (1.0 + eps)) return;
    int best_gpu = -1, a1 = -1, b1 = -1, a2 = -1, b2 = -1;
    double best_max = lm * (1.0 - eps);
    for (int g = 0; g < c.gpus; ++g) {
      if (g == m || c.load[g] >= best_max) continue;
      for (int a = 0; a < c.slots; ++a) {
        const int ca = c.at(m, a);
        if (c.held(g, c.copy_expert[ca]) > 0) continue;
        for (int b = 0; b < c.slots; ++b) {
          const int cb = c.at(g, b);
          const double delta = c.copy_load[ca] - c.copy_load[cb];
          if (delta <= 0.0 || c.held(m, c.copy_expert[cb]) > 0) continue;
          const double new_max = std::max(lm - delta, c.load[g] + delta);
          if (new_max < best_max) best_max = new_max, best_gpu = g, a1 = a, b1 = b;
        }
      }
    }
    if (best_gpu < 0) {  // one copy given to another expert: (i) on m, (ii) to an expert of m elsewhere
      int rh = -1, rs = -1, rto = -1;
      RecountedLoads& r = recounted;
      r.compute(c);
      if (keep != nullptr) keep->index(c);
      for (int a = 0; a < c.slots; ++a) {
        const int from = c.copy_expert[c.at(m, a)];
        if (c.count[from] < 2) continue;
        const double from_old = r.now[from];
        for (int to = 0; to < c.n; ++to) {
          if (c.held(m, to) > 0 || lm - from_old + r.more[to] >= best_max) continue;
          const double new_max = retarget_max(c, r, m, a, to, best_max);
          if (new_max < best_max && !(keep != nullptr && keep->inversion_change(from, to) > 0))
            best_max = new_max, rh = m, rs = a, rto = to;
        }
      }
      for (int a = 0; a < c.slots; ++a) {
        const int to = c.copy_expert[c.at(m, a)];
        if (lm - r.now[to] + r.more[to] >= best_max) continue;
        for (int h = 0; h < c.gpus; ++h) {
          if (c.held(h, to) > 0) continue;
          for (int b = 0; b < c.slots; ++b) {
            const int from = c.copy_expert[c.at(h, b)];
            if (c.count[from] < 2) continue;
            const double new_max = retarget_max(c, r, h, b, to, best_max);
            if (new_max < best_max && !(keep != nullptr && keep->inversion_change(from, to) > 0))
              best_max = new_max, rh = h, rs = b, rto = to;
          }
        }
      }
      if (rh >= 0) {
        retarget(c, rh, rs, rto);
        continue;
      }
    }
    if (best_gpu < 0 && two_for_two && c.slots >= 2) {  // two for two
      for (int g = 0; g < c.gpus; ++g) {
        if (g == m || c.load[g] >= best_max) continue;
        for (int x = 0; x < c.slots; ++x) {
          for (int y = x + 1; y < c.slots; ++y) {
            const int cx = c.at(m, x), cy = c.at(m, y);
            const int ex = c.copy_expert[cx], ey = c.copy_expert[cy];
            const double out = c.copy_load[cx] + c.copy_load[cy];
            for (int u = 0; u < c.slots; ++u) {
              for (int v = u + 1; v < c.slots; ++v) {
                const int cu = c.at(g, u), cv = c.at(g, v);
                const double delta = out - c.copy_load[cu] - c.copy_load[cv];
                if (delta <= 0.0) continue;
                const double new_max = std::max(lm - delta, c.load[g] + delta);
                if (new_max >= best_max) continue;
                const int eu = c.copy_expert[cu], ev = c.copy_expert[cv];
                // g keeps its experts but u and v; m keeps its experts but x and y.
                if ((c.held(g, ex) > 0 && ex != eu && ex != ev) || (c.held(g, ey) > 0 && ey != eu && ey != ev))
                  continue;
                if ((c.held(m, eu) > 0 && eu != ex && eu != ey) || (c.held(m, ev) > 0 && ev != ex && ev != ey))
                  continue;
                best_max = new_max, best_gpu = g, a1 = x, a2 = y, b1 = u, b2 = v;
              }
            }
          }
        }
      }
    }
    if (best_gpu < 0) return;
    c.swap(m, a1, best_gpu, b1);
    if (a2 >= 0) c.swap(m, a2, best_gpu, b2);
  }
}

// Hotter experts get at least as many copies, one move at a time, where a
// move leaves every GPU at most at `limit`: a slot re-assigned (as in
// lower_max_load) from a colder expert to a hotter one with fewer copies
// (the hottest: with as many), or from a colder expert with as many copies
// as the hottest to one no hotter with at least two fewer. A move is taken
// when it lowers the inversions, or keeps them and lowers the ties with the
// hottest; so the moves end.
void prefer_hotter(Candidate& c, double limit, HeatOrder& heat, RecountedLoads& recounted, std::vector<int>& givers) {
  const double bound = std::nextafter(limit, std::numeric_limits<double>::infinity());
  const int h = heat.hottest();
  const double* w = c.w;
  const std::vector<int>& order = heat.order();
  for (int moves = 0; moves < c.copies * c.n; ++moves) {
    // The experts that can give, coldest first: with two copies or more,
    // and as many as the hottest or more than some hotter expert (the
    // fewest copies among the strictly hotter ones, by heat order).
    givers.clear();
    int fewest_hotter = std::numeric_limits<int>::max(), fewest_so_far = std::numeric_limits<int>::max();
    for (int k = 0; k < c.n; ++k) {
      const int x = order[k];
      if (k > 0 && w[x] < w[order[k - 1]]) fewest_hotter = fewest_so_far;
      fewest_so_far = std::min(fewest_so_far, c.count[x]);
      if (c.count[x] >= 2 && (c.count[x] > fewest_hotter || (w[x] < w[h] && c.count[x] >= c.count[h])))
        givers.push_back(x);
    }
    if (givers.empty()) return;
    std::reverse(givers.begin(), givers.end());
    heat.index(c);
    const int ties = heat.ties_with_hottest();
    int best_h = -1, best_s = -1, best_to = -1;
    bool computed = false;
    // From the coldest giver, to the hottest receiver first: the first move
    // possible is taken, on the GPU that leaves the lowest max.
    for (std::size_t f = 0; f < givers.size() && best_h < 0; ++f) {
      const int from = givers[f];
      const bool tied = w[from] < w[h] && c.count[from] >= c.count[h];
      for (int t = 0; t < c.n && best_h < 0; ++t) {
        const int to = order[t];
        if (to == from || c.count[to] >= c.gpus) continue;
        const bool wanted = (w[to] > w[from] && c.count[to] < c.count[from]) ||
                            (tied && (to == h || (w[to] <= w[from] && c.count[to] + 2 <= c.count[from])));
        if (!wanted) continue;
        const int change = heat.inversion_change(from, to);
        if (change > 0 || (change == 0 && heat.ties_with_hottest(from, to) >= ties)) continue;
        if (!computed) recounted.compute(c), computed = true;
        double best_max = bound;
        for (int g = 0; g < c.gpus; ++g) {
          if (c.held(g, from) == 0 || c.held(g, to) > 0) continue;
          int s = 0;
          while (c.copy_expert[c.at(g, s)] != from) ++s;
          const double new_max = retarget_max(c, recounted, g, s, to, best_max);
          if (new_max < best_max) best_max = new_max, best_h = g, best_s = s, best_to = to;
        }
      }
    }
    if (best_h < 0) return;
    retarget(c, best_h, best_s, best_to);
  }
}

// Per-call scratch: everything the nodes need, allocated once.
struct Workspace {
  std::vector<Candidate> eplb;        // [nodes] EPLB's own replication and packing
  std::vector<Candidate> candidates;  // [nodes] the duplicate-free placement of a node EPLB duplicates on
  Candidate trial;
  Candidate ordered;  // the search kept to the heat order
  RecountedLoads recounted;
  HeatOrder heat;
  std::vector<Candidate*> batch;  // the nodes replicated or packed together
  std::vector<double> expert_loads, gpu_scratch, group_loads, pack_loads, eplb_max;
  std::vector<std::pair<double, int>> sort_buffer;
  std::vector<int> node_experts, group_order, node_groups, node_fill, filled, limit, caps, node_order, givers;
  int hot[2] = {-1, -1};  // search_node: the two heaviest replicated experts of candidate (1)
};

// EPLB's balanced packing of groups onto nodes: heaviest first, each onto the
// lightest node with room. node_groups[node * capacity + r] = its r-th group.
void pack_groups(Workspace& w, int num_packs, int capacity) {
  const int num_groups = static_cast<int>(w.group_loads.size());
  w.node_groups.resize(num_groups);
  if (capacity == 1) {
    for (int p = 0; p < num_packs; ++p) w.node_groups[p] = p;
    return;
  }
  w.group_order.resize(num_groups);
  std::iota(w.group_order.begin(), w.group_order.end(), 0);
  const std::vector<double>& loads = w.group_loads;
  std::sort(w.group_order.begin(), w.group_order.end(),
            [&](int a, int b) { return loads[a] > loads[b] || (loads[a] == loads[b] && a < b); });
  w.pack_loads.assign(num_packs, 0.0);
  w.node_fill.assign(num_packs, 0);
  for (const int group : w.group_order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (w.node_fill[p] < capacity && (best < 0 || w.pack_loads[p] < w.pack_loads[best])) best = p;
    }
    w.node_groups[best * capacity + w.node_fill[best]++] = group;
    w.pack_loads[best] += loads[group];
  }
}

// Candidate (1)'s copies: EPLB's when no expert has more copies than the
// node has GPUs, else copies capped at one per GPU.
void capped_copies(const Candidate& eplb, const double* expert_loads, int gpus, Candidate& first) {
  if (*std::max_element(eplb.count.begin(), eplb.count.end()) <= gpus) {
    first.w = eplb.w, first.count = eplb.count, first.copy_expert = eplb.copy_expert;
    first.copy_load = eplb.copy_load, first.order = eplb.order, first.sorted = eplb.sorted;
  } else {
    replicate(expert_loads, gpus, first);
  }
}

// The node's candidates (2)-(4) (see rebalance_layer), numbered 0-9:
// EPLB's copies packed without duplicates (0) and EPLB's packing with its
// duplicates swapped away (1), when no expert has more copies than GPUs;
// then (4), `w.limit` (candidate (1)'s copies after its local search) with
// one or two fewer for the two heaviest replicated experts `w.hot`. Into
// `trial`, packed; false where the variant does not apply.
constexpr int kNumVariants = 10;

bool build_variant(int variant, Candidate& trial, const Candidate& eplb, const double* expert_loads, const Layout& l,
                   Workspace& w) {
  const int n = l.experts_per_node;
  if (variant < 2) {
    if (*std::max_element(eplb.count.begin(), eplb.count.end()) > l.gpus_per_node) return false;
    trial = eplb;
    if (variant == 0) {
      pack(trial, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);
      return true;
    }
    return remove_duplicates(trial);
  }
  static constexpr int kFewer[8][2] = {{1, 1}, {1, 0}, {0, 1}, {2, 1}, {1, 2}, {2, 0}, {0, 2}, {2, 2}};
  const int* fewer = kFewer[variant - 2];
  for (int k = 0; k < 2; ++k) {
    if (fewer[k] > 0 && (w.hot[k] < 0 || w.limit[w.hot[k]] - fewer[k] < 1)) return false;
  }
  std::vector<int>& caps = w.caps;
  caps.assign(n, l.gpus_per_node);
  for (int k = 0; k < 2; ++k)
    if (w.hot[k] >= 0) caps[w.hot[k]] = w.limit[w.hot[k]] - fewer[k];
  if (std::accumulate(caps.begin(), caps.end(), 0) < l.copies_per_node) return false;
  replicate(expert_loads, l.gpus_per_node, trial, caps.data());
  pack(trial, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);
  return true;
}

// Candidate (4)'s basis (see build_variant) from a searched candidate (1):
// its copies, and its two heaviest experts with more than one copy.
void set_variant_basis(const Candidate& first, const double* expert_loads, Workspace& w) {
  w.hot[0] = w.hot[1] = -1;
  for (int i = 0; i < first.n; ++i) {
    if (first.count[i] < 2) continue;
    if (w.hot[0] < 0 || expert_loads[i] > expert_loads[w.hot[0]]) {
      w.hot[1] = w.hot[0], w.hot[0] = i;
    } else if (w.hot[1] < 0 || expert_loads[i] > expert_loads[w.hot[1]]) {
      w.hot[1] = i;
    }
  }
  w.limit.assign(first.count.begin(), first.count.end());
}

// One node's duplicate-free search (see rebalance_layer), from candidate
// (1) packed in `best`, which ends holding the lowest max load found.
void search_node(Candidate& best, const Candidate& eplb, const double* expert_loads, double floor, double stop,
                 const Layout& l, Workspace& w) {
  lower_max_load(best, floor, /*two_for_two=*/false, w.recounted);
  double best_max = best.max_load();
  set_variant_basis(best, expert_loads, w);
  for (int variant = 0; variant < kNumVariants && best_max > stop; ++variant) {
    Candidate& trial = w.trial;
    if (!build_variant(variant, trial, eplb, expert_loads, l, w)) continue;
    lower_max_load(trial, floor, /*two_for_two=*/true, w.recounted);
    const double trial_max = trial.max_load();
    if (trial_max < best_max) std::swap(best, trial), best_max = trial_max;
  }
}

// The search again with no inversion of the heat order (the local search
// adds none), for a node whose placement has one; into `best` at the first
// candidate without an inversion and with a max load at most `limit`.
// Candidate (1)'s copies capped at one per GPU with ties of load per copy
// to the hotter expert, then the first three variants of (4) from them:
// four local searches at most. (All ten variants cost 4x the first search
// on E=256 global-policy hot-group layers and found nothing there; these
// four keep 835 of the 838 tiny layers and 3 of the 16 Zipf ones the ten
// found, bench_balance_rebalance and docs/BALANCE.md.)
void search_in_heat_order(Candidate& best, const Candidate& eplb, const double* expert_loads, double floor,
                          double limit, const Layout& l, Workspace& w) {
  const double bound = limit * (1.0 + 1e-12);
  const auto take = [&](Candidate& c) {
    if (w.heat.has_inversion(c) || c.max_load() > bound) return false;
    std::swap(best, c);
    return true;
  };
  // {1000, 0, 1, 2, 2} on 4 GPUs x 3 slots: ties to the hotter give 4 1 1 3
  // 3 copies (max 251.33, as the search's 4 1 3 2 2), where ties to the
  // lowest index give 4 1 2 3 2 (251.5) and no re-assignment without an
  // inversion lowers it.
  Candidate& ordered = w.ordered;
  replicate(expert_loads, l.gpus_per_node, ordered, nullptr, CopyTies::hotter);
  pack(ordered, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);
  lower_max_load(ordered, floor, /*two_for_two=*/false, w.recounted, &w.heat);
  if (take(ordered)) return;
  set_variant_basis(ordered, expert_loads, w);
  for (const int variant : {2, 3, 4}) {
    if (!build_variant(variant, w.trial, eplb, expert_loads, l, w)) continue;
    lower_max_load(w.trial, floor, /*two_for_two=*/true, w.recounted, &w.heat);
    if (take(w.trial)) return;
  }
}

// A node's placement into the layer's rows of physical_to_logical and logical_count.
void write_node(const Candidate& c, const int* node_experts, int node, const Layout& l,
                std::int64_t* physical_to_logical, std::int64_t* logical_count) {
  for (int g = 0; g < l.gpus_per_node; ++g) {
    EPMOE_CHECK_EQ(c.fill[g], l.slots_per_gpu);
    const std::int64_t first_slot = static_cast<std::int64_t>(node * l.gpus_per_node + g) * l.slots_per_gpu;
    for (int s = 0; s < l.slots_per_gpu; ++s)
      physical_to_logical[first_slot + s] = node_experts[c.copy_expert[c.at(g, s)]];
  }
  for (int i = 0; i < c.n; ++i) logical_count[node_experts[i]] = c.count[i];
}

// One layer: writes its rows of the three outputs.
void rebalance_layer(const float* weight, int num_logical_experts, const Layout& l, int max_copies, Workspace& w,
                     std::int64_t* physical_to_logical, std::int64_t* logical_to_physical,
                     std::int64_t* logical_count) {
  // Stage 1: groups onto nodes.
  w.group_loads.resize(l.num_groups);
  for (int g = 0; g < l.num_groups; ++g) {
    float sum = 0.0f;  // EPLB sums a group in float32
    for (int i = 0; i < l.group_size; ++i) sum += weight[g * l.group_size + i];
    w.group_loads[g] = sum;
  }
  pack_groups(w, l.num_nodes, l.groups_per_node);

  // EPLB's stages 2 and 3 on every node first (copies uncapped, packing
  // blind to duplicates), the nodes in lockstep: a node where that holds no
  // duplicate keeps it.
  const int n = l.experts_per_node;
  w.node_experts.resize(num_logical_experts);
  w.expert_loads.resize(num_logical_experts);
  w.batch.clear();
  for (int node = 0; node < l.num_nodes; ++node) {
    // The node's experts: its groups in arrival order, each group's experts in order.
    int* experts = w.node_experts.data() + node * n;
    for (int r = 0; r < l.groups_per_node; ++r) {
      for (int i = 0; i < l.group_size; ++i)
        experts[r * l.group_size + i] = w.node_groups[node * l.groups_per_node + r] * l.group_size + i;
    }
    for (int i = 0; i < n; ++i) w.expert_loads[node * n + i] = weight[experts[i]];
    start_replication(w.expert_loads.data() + node * n, l.copies_per_node, w.eplb[node], nullptr);
    w.batch.push_back(&w.eplb[node]);
  }
  for (int j = n; j < l.copies_per_node; ++j) {
    for (Candidate* c : w.batch) add_copy(*c, j, l.copies_per_node, nullptr);
  }
  for (Candidate* c : w.batch) finish_replication(*c);
  pack_together(w.batch, /*avoid_duplicates=*/false, w.sort_buffer, w.gpu_scratch);

  double kept_max = 0.0;  // the max GPU load so far of the nodes decided
  // More slots per GPU than experts per node: every placement duplicates.
  const bool duplicate_free_exists = l.slots_per_gpu <= l.experts_per_node;
  w.node_order.clear();
  for (int node = 0; node < l.num_nodes; ++node) {
    const Candidate& eplb = w.eplb[node];
    if (eplb.duplicate && duplicate_free_exists) {
      w.node_order.push_back(node);
    } else {
      kept_max = std::max(kept_max, eplb.max_load());
      write_node(eplb, w.node_experts.data() + node * n, node, l, physical_to_logical, logical_count);
    }
  }
  // The nodes with a duplicate, highest EPLB max load first: the first sets
  // the layer's max load, searched down as far as the local search goes; the
  // others stop once at most the max so far (lower would not lower the
  // layer's max).
  w.eplb_max.resize(l.num_nodes);
  for (const int node : w.node_order) w.eplb_max[node] = w.eplb[node].max_load();
  std::sort(w.node_order.begin(), w.node_order.end(), [&](int a, int b) {
    const double la = w.eplb_max[a], lb = w.eplb_max[b];
    return la > lb || (la == lb && a < b);
  });

  // Duplicate-free candidates, each improved by the local search, until one
  // is at most the node's EPLB max load (or the max so far, when higher):
  // (1) copies capped at one per GPU, packed skipping the GPUs that hold the
  // expert; when no expert has more copies than GPUs, EPLB's copies (2)
  // packed that way and (3) in EPLB's packing with its duplicates swapped
  // away; (4) (1)'s copies with one or two fewer for the two heaviest
  // replicated experts (duplicates let EPLB split an expert unevenly;
  // without them, fewer copies of the hottest experts can be what leaves one
  // per GPU). Else the lowest max load of them. (1) does not depend on the
  // order of the nodes: it is packed for all of them in lockstep.
  w.batch.clear();
  for (const int node : w.node_order) {
    capped_copies(w.eplb[node], w.expert_loads.data() + node * n, l.gpus_per_node, w.candidates[node]);
    w.batch.push_back(&w.candidates[node]);
  }
  pack_together(w.batch, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);

  for (const int node : w.node_order) {
    const double* expert_loads = w.expert_loads.data() + node * n;
    const Candidate& eplb = w.eplb[node];
    double total = 0.0;
    for (int i = 0; i < n; ++i) total += expert_loads[i];
    const double floor = std::max(total / l.gpus_per_node, kept_max);
    const double stop = std::max(floor, eplb.max_load()) * (1.0 + 1e-12);
    Candidate& best = w.candidates[node];
    search_node(best, eplb, expert_loads, floor, stop, l, w);
    // Then hotter experts get at least as many copies where the layer's
    // max load so far allows it.
    const double limit = std::max(best.max_load(), kept_max);
    w.heat.reset(expert_loads, n);
    if (w.heat.has_inversion(best)) search_in_heat_order(best, eplb, expert_loads, floor, limit, l, w);
    prefer_hotter(best, limit, w.heat, w.recounted, w.givers);
    kept_max = std::max(kept_max, best.max_load());
    write_node(best, w.node_experts.data() + node * n, node, l, physical_to_logical, logical_count);
  }

  w.filled.assign(num_logical_experts, 0);
  const int num_physical = l.copies_per_node * l.num_nodes;
  for (int p = 0; p < num_physical; ++p) {
    const std::int64_t expert = physical_to_logical[p];
    logical_to_physical[expert * max_copies + w.filled[expert]++] = p;
  }
}

std::string text(const char* name, int value) { return std::string(name) + "=" + std::to_string(value); }

}  // namespace

bool uses_hierarchical_policy(const RebalanceExpertsOptions& options) {
  return options.num_nodes > 0 && options.num_groups % options.num_nodes == 0;
}

void validate_rebalance(int num_layers, int num_logical_experts, const RebalanceExpertsOptions& o) {
  if (num_layers < 0) throw ConfigError("weight: " + text("layers", num_layers) + "; expected [layers, experts]");
  if (num_logical_experts < 1)
    throw ConfigError("weight: has 0 experts (columns); expected [layers, experts] with experts >= 1");
  if (o.num_gpus < 1) throw ConfigError(text("num_gpus", o.num_gpus) + ": must be >= 1");
  if (o.num_nodes < 1) throw ConfigError(text("num_nodes", o.num_nodes) + ": must be >= 1");
  if (o.num_groups < 1) throw ConfigError(text("num_groups", o.num_groups) + ": must be >= 1");
  // EPLB's asserts, in its order. The global policy is the hierarchical one
  // with one group and one node, so num_groups and num_nodes meet them there.
  if (uses_hierarchical_policy(o)) {
    const std::string policy = " (hierarchical policy: num_groups % num_nodes == 0)";
    if (num_logical_experts % o.num_groups != 0)
      throw EplbAssertionError(text("num_groups", o.num_groups) + ": must divide the " +
                               std::to_string(num_logical_experts) + " logical experts" + policy);
    if (o.num_gpus % o.num_nodes != 0)
      throw EplbAssertionError(text("num_gpus", o.num_gpus) + ": must be a multiple of " +
                               text("num_nodes", o.num_nodes) + policy);
  }
  if (o.num_replicas % o.num_gpus != 0)
    throw EplbAssertionError(text("num_replicas", o.num_replicas) + ": must be a multiple of " +
                             text("num_gpus", o.num_gpus));
  if (o.num_replicas < num_logical_experts)
    throw EplbAssertionError(text("num_replicas", o.num_replicas) + ": must be >= the " +
                             std::to_string(num_logical_experts) + " logical experts (every expert needs a copy)");
}

ExpertRebalance rebalance_experts(std::span<const float> weight, int num_layers, int num_logical_experts,
                                  const RebalanceExpertsOptions& options) {
  validate_rebalance(num_layers, num_logical_experts, options);
  EPMOE_CHECK_EQ(weight.size(), static_cast<std::size_t>(num_layers) * num_logical_experts);
  for (std::size_t i = 0; i < weight.size(); ++i) {
    if (!(std::isfinite(weight[i]) && weight[i] >= 0.0f)) {
      throw ConfigError("weight[" + std::to_string(i / num_logical_experts) + ", " +
                        std::to_string(i % num_logical_experts) + "] = " + std::to_string(weight[i]) +
                        ": loads must be finite and >= 0");
    }
  }
  const Layout l = layout_of(num_logical_experts, options);
  ExpertRebalance out;
  out.num_layers = num_layers;
  out.num_logical_experts = num_logical_experts;
  out.num_physical_experts = options.num_replicas;
  out.max_copies = options.num_replicas - num_logical_experts + 1;
  const std::size_t P = options.num_replicas, E = num_logical_experts;
  out.physical_to_logical.resize(num_layers * P);
  out.logical_to_physical.assign(num_layers * E * out.max_copies, -1);  // EPLB's padding
  out.logical_count.resize(num_layers * E);
  thread_local Workspace w;  // scratch kept between calls: no allocation once warm
  w.eplb.resize(l.num_nodes);
  w.candidates.resize(l.num_nodes);
  for (std::vector<Candidate>* nodes : {&w.eplb, &w.candidates}) {
    for (Candidate& c : *nodes) c.resize(l.experts_per_node, l.copies_per_node, l.gpus_per_node, l.slots_per_gpu);
  }
  for (Candidate* c : {&w.trial, &w.ordered})
    c->resize(l.experts_per_node, l.copies_per_node, l.gpus_per_node, l.slots_per_gpu);
  for (int layer = 0; layer < num_layers; ++layer) {
    rebalance_layer(weight.data() + layer * E, num_logical_experts, l, out.max_copies, w,
                    out.physical_to_logical.data() + layer * P,
                    out.logical_to_physical.data() + layer * E * out.max_copies, out.logical_count.data() + layer * E);
  }
  return out;
}

}  // namespace epmoe::balance
