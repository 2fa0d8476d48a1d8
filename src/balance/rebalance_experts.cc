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

void add_copy(Candidate& c, int j, int cap, const int* limit) {
  const int best = first_max_index(c.choice.data(), c.n);
  EPMOE_CHECK(c.choice[best] != kNoMoreCopies);  // validate: copies_per_node <= experts_per_node * gpus_per_node
  const int copies = ++c.count[best];
  c.per_copy[best] = c.w[best] / copies;
  c.choice[best] = copies < (limit == nullptr ? cap : limit[best]) ? c.per_copy[best] : kNoMoreCopies;
  c.copy_expert[j] = best;
}

void finish_replication(Candidate& c) {
  for (int j = 0; j < c.copies; ++j) c.copy_load[j] = c.per_copy[c.copy_expert[j]];
}

void replicate(const double* expert_loads, int cap, Candidate& c, const int* limit = nullptr) {
  start_replication(expert_loads, cap, c, limit);
  for (int j = c.n; j < c.copies; ++j) add_copy(c, j, cap, limit);
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

// Local search on a duplicate-free placement: while the most loaded GPU m can
// be lowered, the exchange of one copy (else two copies) of m with as many of
// another GPU, no GPU then holding an expert twice, that leaves the lowest
// larger load of the two. Stops at `floor` (no placement can be lower).
void lower_max_load(Candidate& c, double floor, bool two_for_two, RecountedLoads& recounted) {
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
      for (int a = 0; a < c.slots; ++a) {
        const int from = c.copy_expert[c.at(m, a)];
        if (c.count[from] < 2) continue;
        const double from_old = r.now[from];
        for (int to = 0; to < c.n; ++to) {
          if (c.held(m, to) > 0 || lm - from_old + r.more[to] >= best_max) continue;
          const double new_max = retarget_max(c, r, m, a, to, best_max);
          if (new_max < best_max) best_max = new_max, rh = m, rs = a, rto = to;
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
            if (new_max < best_max) best_max = new_max, rh = h, rs = b, rto = to;
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

// Per-call scratch: everything the nodes need, allocated once.
struct Workspace {
  std::vector<Candidate> eplb;        // [nodes] EPLB's own replication and packing
  std::vector<Candidate> candidates;  // [nodes] the duplicate-free placement of a node EPLB duplicates on
  Candidate trial;
  RecountedLoads recounted;
  std::vector<Candidate*> batch;  // the nodes replicated or packed together
  std::vector<double> expert_loads, gpu_scratch, group_loads, pack_loads, eplb_max;
  std::vector<std::pair<double, int>> sort_buffer;
  std::vector<int> node_experts, group_order, node_groups, node_fill, filled, limit, caps, node_order;
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
    const Candidate& eplb = w.eplb[node];
    Candidate& first = w.candidates[node];
    if (*std::max_element(eplb.count.begin(), eplb.count.end()) <= l.gpus_per_node) {
      // The capped replication is EPLB's.
      first.w = eplb.w, first.count = eplb.count, first.copy_expert = eplb.copy_expert;
      first.copy_load = eplb.copy_load, first.order = eplb.order, first.sorted = eplb.sorted;
    } else {
      replicate(w.expert_loads.data() + node * n, l.gpus_per_node, first);
    }
    w.batch.push_back(&first);
  }
  pack_together(w.batch, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);

  for (const int node : w.node_order) {
    const double* expert_loads = w.expert_loads.data() + node * n;
    const Candidate& eplb = w.eplb[node];
    double total = 0.0;
    for (int i = 0; i < n; ++i) total += expert_loads[i];
    const double floor = std::max(total / l.gpus_per_node, kept_max);
    const double stop = std::max(floor, eplb.max_load()) * (1.0 + 1e-12);
    const bool eplb_copies_fit = *std::max_element(eplb.count.begin(), eplb.count.end()) <= l.gpus_per_node;
    Candidate& best = w.candidates[node];
    lower_max_load(best, floor, /*two_for_two=*/false, w.recounted);
    double best_max = best.max_load();
    // The two heaviest experts with more than one copy in (1).
    int hot[2] = {-1, -1};
    for (int i = 0; i < n; ++i) {
      if (best.count[i] < 2) continue;
      if (hot[0] < 0 || expert_loads[i] > expert_loads[hot[0]]) {
        hot[1] = hot[0], hot[0] = i;
      } else if (hot[1] < 0 || expert_loads[i] > expert_loads[hot[1]]) {
        hot[1] = i;
      }
    }
    w.limit.assign(best.count.begin(), best.count.end());
    static constexpr int kFewer[8][2] = {{1, 1}, {1, 0}, {0, 1}, {2, 1}, {1, 2}, {2, 0}, {0, 2}, {2, 2}};
    for (int variant = 0; variant < 10 && best_max > stop; ++variant) {
      Candidate& trial = w.trial;
      if (variant < 2) {
        if (!eplb_copies_fit) continue;
        trial = eplb;
        if (variant == 0) {
          pack(trial, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);
        } else if (!remove_duplicates(trial)) {
          continue;
        }
      } else {
        const int* fewer = kFewer[variant - 2];
        bool possible = true;
        for (int k = 0; k < 2; ++k) {
          if (fewer[k] > 0 && (hot[k] < 0 || w.limit[hot[k]] - fewer[k] < 1)) possible = false;
        }
        if (!possible) continue;
        std::vector<int>& caps = w.caps;
        caps.assign(n, l.gpus_per_node);
        for (int k = 0; k < 2; ++k)
          if (hot[k] >= 0) caps[hot[k]] = w.limit[hot[k]] - fewer[k];
        if (std::accumulate(caps.begin(), caps.end(), 0) < l.copies_per_node) continue;
        replicate(expert_loads, l.gpus_per_node, trial, caps.data());
        pack(trial, /*avoid_duplicates=*/true, w.sort_buffer, w.gpu_scratch);
      }
      lower_max_load(trial, floor, /*two_for_two=*/true, w.recounted);
      const double trial_max = trial.max_load();
      if (trial_max < best_max) std::swap(best, trial), best_max = trial_max;
    }
    kept_max = std::max(kept_max, best_max);
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
  w.trial.resize(l.experts_per_node, l.copies_per_node, l.gpus_per_node, l.slots_per_gpu);
  for (int layer = 0; layer < num_layers; ++layer) {
    rebalance_layer(weight.data() + layer * E, num_logical_experts, l, out.max_copies, w,
                    out.physical_to_logical.data() + layer * P,
                    out.logical_to_physical.data() + layer * E * out.max_copies, out.logical_count.data() + layer * E);
  }
  return out;
}

}  // namespace epmoe::balance
