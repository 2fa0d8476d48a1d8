#include "balance/rebalance_experts.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

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

// Items (indices into `weights`) heaviest first, ties to the lower index.
std::vector<int> heaviest_first(const std::vector<double>& weights) {
  std::vector<int> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weights[a] > weights[b]; });
  return order;
}

// EPLB's balanced packing of groups onto nodes: heaviest first, each onto the
// lightest pack with room. Returns the groups of each pack in arrival order.
std::vector<std::vector<int>> pack_groups(const std::vector<double>& group_loads, int num_packs, int capacity) {
  std::vector<std::vector<int>> packs(num_packs);
  if (capacity == 1) {
    for (int p = 0; p < num_packs; ++p) packs[p].push_back(p);
    return packs;
  }
  std::vector<double> pack_loads(num_packs, 0.0);
  for (const int group : heaviest_first(group_loads)) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (static_cast<int>(packs[p].size()) < capacity && (best < 0 || pack_loads[p] < pack_loads[best])) best = p;
    }
    packs[best].push_back(group);
    pack_loads[best] += group_loads[group];
  }
  return packs;
}

// Stage 3 within one node: the node's copies (copy_expert[j], an index into
// the node's experts; copy_load[j]) onto `num_gpus` GPUs of `capacity` slots,
// heaviest first onto the lightest GPU with a free slot that does not hold
// the expert, with the swap of rebalance_experts.h when none is left. Returns
// each GPU's copies in slot order.
std::vector<std::vector<int>> pack_copies(const std::vector<int>& copy_expert, const std::vector<double>& copy_load,
                                          int num_experts, int num_gpus, int capacity, bool avoid_duplicates) {
  const int num_copies = static_cast<int>(copy_expert.size());
  std::vector<std::vector<int>> gpus(num_gpus);
  if (capacity == 1) {  // EPLB's shortcut: copy j on GPU j (no GPU can hold two)
    for (int j = 0; j < num_copies; ++j) gpus[j].push_back(j);
    return gpus;
  }
  std::vector<double> gpu_loads(num_gpus, 0.0);
  std::vector<char> holds(static_cast<std::size_t>(num_gpus) * num_experts, 0);
  const auto held = [&](int gpu, int expert) -> char& {
    return holds[static_cast<std::size_t>(gpu) * num_experts + expert];
  };
  for (const int copy : heaviest_first(copy_load)) {
    const int expert = copy_expert[copy];
    int best = -1, lightest_with_room = -1;
    for (int g = 0; g < num_gpus; ++g) {
      if (static_cast<int>(gpus[g].size()) == capacity) continue;
      if (lightest_with_room < 0 || gpu_loads[g] < gpu_loads[lightest_with_room]) lightest_with_room = g;
      if (avoid_duplicates && held(g, expert)) continue;
      if (best < 0 || gpu_loads[g] < gpu_loads[best]) best = g;
    }
    if (best >= 0) {
      gpus[best].push_back(copy);
      gpu_loads[best] += copy_load[copy];
      held(best, expert) = 1;
      continue;
    }
    // Every GPU with room holds `expert`: the lightest copy Y on a full GPU p
    // without `expert`, Y not on q = lightest_with_room, moves to q, and the
    // copy takes Y's slot on p.
    const int q = lightest_with_room;
    EPMOE_CHECK_GE(q, 0);
    int swap_gpu = -1, swap_slot = -1;
    for (int p = 0; p < num_gpus; ++p) {
      if (held(p, expert)) continue;
      for (int slot = 0; slot < static_cast<int>(gpus[p].size()); ++slot) {
        const int other = gpus[p][slot];
        if (held(q, copy_expert[other])) continue;
        if (swap_gpu < 0 || copy_load[other] < copy_load[gpus[swap_gpu][swap_slot]]) swap_gpu = p, swap_slot = slot;
      }
    }
    EPMOE_CHECK_GE(swap_gpu, 0);  // rebalance_experts.h: a full GPU has an expert q lacks
    const int moved = gpus[swap_gpu][swap_slot];
    gpus[q].push_back(moved);
    gpu_loads[q] += copy_load[moved];
    held(q, copy_expert[moved]) = 1;
    gpus[swap_gpu][swap_slot] = copy;
    gpu_loads[swap_gpu] += copy_load[copy] - copy_load[moved];
    held(swap_gpu, copy_expert[moved]) = 0;
    held(swap_gpu, expert) = 1;
  }
  return gpus;
}

// Loads of the GPUs of one node.
std::vector<double> gpu_loads_of(const std::vector<std::vector<int>>& gpus, const std::vector<double>& copy_load) {
  std::vector<double> loads(gpus.size(), 0.0);
  for (std::size_t g = 0; g < gpus.size(); ++g) {
    for (const int copy : gpus[g]) loads[g] += copy_load[copy];
  }
  return loads;
}

bool holds_a_duplicate(const std::vector<std::vector<int>>& gpus, const std::vector<int>& copy_expert) {
  for (const std::vector<int>& copies : gpus) {
    for (std::size_t a = 0; a < copies.size(); ++a) {
      for (std::size_t b = a + 1; b < copies.size(); ++b) {
        if (copy_expert[copies[a]] == copy_expert[copies[b]]) return true;
      }
    }
  }
  return false;
}

// How many copies of each expert every GPU holds, [G * E]: the checks of the
// swaps below in O(1).
struct Holdings {
  int num_experts;
  std::vector<int> count;
  Holdings(const std::vector<std::vector<int>>& gpus, const std::vector<int>& copy_expert, int experts)
      : num_experts(experts), count(gpus.size() * static_cast<std::size_t>(experts), 0) {
    for (std::size_t g = 0; g < gpus.size(); ++g) {
      for (const int copy : gpus[g]) ++at(static_cast<int>(g), copy_expert[copy]);
    }
  }
  int& at(int gpu, int expert) { return count[static_cast<std::size_t>(gpu) * num_experts + expert]; }
};

// Swaps slot a of GPU p with slot b of GPU q, keeping loads and holdings.
void swap_copies(std::vector<std::vector<int>>& gpus, std::vector<double>& loads, Holdings& holds,
                 const std::vector<int>& copy_expert, const std::vector<double>& copy_load, int p, int a, int q,
                 int b) {
  const int copy_a = gpus[p][a], copy_b = gpus[q][b];
  const double delta = copy_load[copy_a] - copy_load[copy_b];
  loads[p] -= delta;
  loads[q] += delta;
  --holds.at(p, copy_expert[copy_a]), ++holds.at(p, copy_expert[copy_b]);
  --holds.at(q, copy_expert[copy_b]), ++holds.at(q, copy_expert[copy_a]);
  std::swap(gpus[p][a], gpus[q][b]);
}

// EPLB's packing made duplicate-free: each second copy of an expert on a GPU
// is swapped with a copy on another GPU that neither GPU would then hold
// twice, the swap that leaves the lower of the two GPUs' new loads (one
// always exists: the other GPU is full of distinct experts, this one is not).
void remove_duplicates(std::vector<std::vector<int>>& gpus, const std::vector<int>& copy_expert,
                       const std::vector<double>& copy_load, int num_experts) {
  std::vector<double> loads = gpu_loads_of(gpus, copy_load);
  Holdings holds(gpus, copy_expert, num_experts);
  const int num_gpus = static_cast<int>(gpus.size());
  for (int p = 0; p < num_gpus; ++p) {
    for (int slot = 0; slot < static_cast<int>(gpus[p].size()); ++slot) {
      const int copy = gpus[p][slot], expert = copy_expert[copy];
      if (holds.at(p, expert) < 2) continue;  // not a duplicate
      int best_gpu = -1, best_slot = -1;
      double best_max = 0.0;
      for (int q = 0; q < num_gpus; ++q) {
        if (q == p || holds.at(q, expert) > 0) continue;
        for (int other = 0; other < static_cast<int>(gpus[q].size()); ++other) {
          const int candidate = gpus[q][other];
          if (holds.at(p, copy_expert[candidate]) > 0) continue;
          const double delta = copy_load[copy] - copy_load[candidate];
          const double new_max = std::max(loads[p] - delta, loads[q] + delta);
          if (best_gpu < 0 || new_max < best_max) best_gpu = q, best_slot = other, best_max = new_max;
        }
      }
      EPMOE_CHECK_GE(best_gpu, 0);
      swap_copies(gpus, loads, holds, copy_expert, copy_load, p, slot, best_gpu, best_slot);
    }
  }
}

// Lowers the node's max load while it can: the swap of a copy on the most
// loaded GPU with a lighter copy on another GPU (no GPU then holding an
// expert twice) that lowers the larger of the two loads the most. Only ever
// lowers the max, never the slot counts or the copies.
void lower_max_load(std::vector<std::vector<int>>& gpus, const std::vector<int>& copy_expert,
                    const std::vector<double>& copy_load, int num_experts) {
  std::vector<double> loads = gpu_loads_of(gpus, copy_load);
  Holdings holds(gpus, copy_expert, num_experts);
  const int num_gpus = static_cast<int>(gpus.size());
  for (int iteration = 0; iteration < 4 * num_gpus; ++iteration) {
    const int m = static_cast<int>(std::max_element(loads.begin(), loads.end()) - loads.begin());
    int best_gpu = -1, best_a = -1, best_b = -1;
    double best_max = loads[m] * (1.0 - 1e-12);
    for (int g = 0; g < num_gpus; ++g) {
      if (g == m) continue;
      for (int a = 0; a < static_cast<int>(gpus[m].size()); ++a) {
        const int copy_a = gpus[m][a];
        if (holds.at(g, copy_expert[copy_a]) > 0) continue;
        for (int b = 0; b < static_cast<int>(gpus[g].size()); ++b) {
          const int copy_b = gpus[g][b];
          const double delta = copy_load[copy_a] - copy_load[copy_b];
          if (delta <= 0.0 || holds.at(m, copy_expert[copy_b]) > 0) continue;
          const double new_max = std::max(loads[m] - delta, loads[g] + delta);
          if (new_max < best_max) best_max = new_max, best_gpu = g, best_a = a, best_b = b;
        }
      }
    }
    if (best_gpu < 0) return;
    swap_copies(gpus, loads, holds, copy_expert, copy_load, m, best_a, best_gpu, best_b);
  }
}

double max_load(const std::vector<std::vector<int>>& gpus, const std::vector<double>& copy_load) {
  const std::vector<double> loads = gpu_loads_of(gpus, copy_load);
  return *std::max_element(loads.begin(), loads.end());
}

// Stage 2: one more copy at a time to the largest load per copy (ties to the
// lower index), at most `max_copies` each. Returns the expert of every copy:
// the experts in order, then the extra copies as created.
std::vector<int> replicate(const std::vector<double>& expert_loads, int num_copies, int max_copies,
                           std::vector<int>& copies) {
  const int num_experts = static_cast<int>(expert_loads.size());
  copies.assign(num_experts, 1);
  std::vector<int> copy_expert(num_copies);
  for (int i = 0; i < num_experts; ++i) copy_expert[i] = i;
  for (int j = num_experts; j < num_copies; ++j) {
    int best = -1;
    double best_load = 0.0;
    for (int i = 0; i < num_experts; ++i) {
      if (copies[i] >= max_copies) continue;
      const double load = expert_loads[i] / copies[i];
      if (best < 0 || load > best_load) best = i, best_load = load;
    }
    EPMOE_CHECK_GE(best, 0);  // validate: copies_per_node <= experts_per_node * gpus_per_node
    ++copies[best];
    copy_expert[j] = best;
  }
  return copy_expert;
}

std::vector<double> loads_per_copy(const std::vector<int>& copy_expert, const std::vector<double>& expert_loads,
                                   const std::vector<int>& copies) {
  std::vector<double> out(copy_expert.size());
  for (std::size_t j = 0; j < copy_expert.size(); ++j) out[j] = expert_loads[copy_expert[j]] / copies[copy_expert[j]];
  return out;
}

// One layer: writes its rows of the three outputs.
void rebalance_layer(const float* weight, int num_logical_experts, const Layout& l, int max_copies,
                     std::int64_t* physical_to_logical, std::int64_t* logical_to_physical,
                     std::int64_t* logical_count) {
  // Stage 1: groups onto nodes.
  std::vector<double> group_loads(l.num_groups, 0.0);
  for (int g = 0; g < l.num_groups; ++g) {
    float sum = 0.0f;  // EPLB sums a group in float32
    for (int i = 0; i < l.group_size; ++i) sum += weight[g * l.group_size + i];
    group_loads[g] = sum;
  }
  const std::vector<std::vector<int>> node_groups = pack_groups(group_loads, l.num_nodes, l.groups_per_node);

  std::vector<int> node_experts(l.experts_per_node);
  std::vector<double> expert_loads(l.experts_per_node);
  std::vector<int> copies, copy_expert;
  std::vector<double> copy_load;
  for (int node = 0; node < l.num_nodes; ++node) {
    // The node's experts: its groups in arrival order, each group's experts in order.
    for (int r = 0; r < l.groups_per_node; ++r) {
      for (int i = 0; i < l.group_size; ++i)
        node_experts[r * l.group_size + i] = node_groups[node][r] * l.group_size + i;
    }
    for (int i = 0; i < l.experts_per_node; ++i) expert_loads[i] = weight[node_experts[i]];

    // Stages 2 and 3 as EPLB (copies uncapped, packing blind to duplicates);
    // when that holds no duplicate it is the answer, else the better (lower
    // max load) of two duplicate-free placements, each then improved by swaps:
    // (a) copies capped at one per GPU, packed skipping GPUs that hold the
    // expert; (b) EPLB's own packing with its duplicates swapped away, when
    // no expert has more copies than the node has GPUs.
    std::vector<int> eplb_copies;
    const std::vector<int> eplb_copy_expert =
        replicate(expert_loads, l.copies_per_node, l.copies_per_node, eplb_copies);
    const std::vector<double> eplb_copy_load = loads_per_copy(eplb_copy_expert, expert_loads, eplb_copies);
    std::vector<std::vector<int>> eplb_gpus = pack_copies(eplb_copy_expert, eplb_copy_load, l.experts_per_node,
                                                          l.gpus_per_node, l.slots_per_gpu, /*avoid_duplicates=*/false);
    std::vector<std::vector<int>> gpus;
    if (!holds_a_duplicate(eplb_gpus, eplb_copy_expert)) {
      gpus = std::move(eplb_gpus);
      copies = eplb_copies;
      copy_expert = eplb_copy_expert;
    } else {
      copy_expert = replicate(expert_loads, l.copies_per_node, l.gpus_per_node, copies);
      copy_load = loads_per_copy(copy_expert, expert_loads, copies);
      gpus = pack_copies(copy_expert, copy_load, l.experts_per_node, l.gpus_per_node, l.slots_per_gpu,
                         /*avoid_duplicates=*/true);
      lower_max_load(gpus, copy_expert, copy_load, l.experts_per_node);
      if (*std::max_element(eplb_copies.begin(), eplb_copies.end()) <= l.gpus_per_node) {
        remove_duplicates(eplb_gpus, eplb_copy_expert, eplb_copy_load, l.experts_per_node);
        lower_max_load(eplb_gpus, eplb_copy_expert, eplb_copy_load, l.experts_per_node);
        if (max_load(eplb_gpus, eplb_copy_load) < max_load(gpus, copy_load)) {
          gpus = std::move(eplb_gpus);
          copies = eplb_copies;
          copy_expert = eplb_copy_expert;
        }
      }
    }
    for (int g = 0; g < l.gpus_per_node; ++g) {
      EPMOE_CHECK_EQ(static_cast<int>(gpus[g].size()), l.slots_per_gpu);
      const std::int64_t first_slot = static_cast<std::int64_t>(node * l.gpus_per_node + g) * l.slots_per_gpu;
      for (int slot = 0; slot < l.slots_per_gpu; ++slot) {
        physical_to_logical[first_slot + slot] = node_experts[copy_expert[gpus[g][slot]]];
      }
    }
    for (int i = 0; i < l.experts_per_node; ++i) logical_count[node_experts[i]] = copies[i];
  }

  std::fill(logical_to_physical, logical_to_physical + static_cast<std::size_t>(num_logical_experts) * max_copies, -1);
  std::vector<int> filled(num_logical_experts, 0);
  const int num_physical = l.copies_per_node * l.num_nodes;
  for (int p = 0; p < num_physical; ++p) {
    const std::int64_t expert = physical_to_logical[p];
    logical_to_physical[expert * max_copies + filled[expert]++] = p;
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
  if (o.num_gpus % o.num_nodes != 0)
    throw ConfigError(text("num_gpus", o.num_gpus) + ": must be a multiple of " + text("num_nodes", o.num_nodes));
  if (o.num_replicas < num_logical_experts)
    throw ConfigError(text("num_replicas", o.num_replicas) + ": must be >= the " + std::to_string(num_logical_experts) +
                      " logical experts (every expert needs a copy)");
  if (o.num_replicas % o.num_gpus != 0)
    throw ConfigError(text("num_replicas", o.num_replicas) + ": must be a multiple of " + text("num_gpus", o.num_gpus));
  if (uses_hierarchical_policy(o) && num_logical_experts % o.num_groups != 0)
    throw ConfigError(text("num_groups", o.num_groups) + ": must divide the " + std::to_string(num_logical_experts) +
                      " logical experts");
  const Layout l = layout_of(num_logical_experts, o);
  if (l.slots_per_gpu > l.experts_per_node)
    throw ConfigError(text("num_replicas", o.num_replicas) + ": " + std::to_string(l.slots_per_gpu) +
                      " slots per GPU but only " + std::to_string(l.experts_per_node) + " experts per node (" +
                      (uses_hierarchical_policy(o) ? "hierarchical" : "global") +
                      " policy): a GPU would hold two copies of one expert");
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
  out.logical_to_physical.resize(num_layers * E * out.max_copies);
  out.logical_count.resize(num_layers * E);
  for (int layer = 0; layer < num_layers; ++layer) {
    rebalance_layer(weight.data() + layer * E, num_logical_experts, l, out.max_copies,
                    out.physical_to_logical.data() + layer * P,
                    out.logical_to_physical.data() + layer * E * out.max_copies, out.logical_count.data() + layer * E);
  }
  return out;
}

}  // namespace epmoe::balance
