// DeepSeek EPLB's published rebalance_experts (github.com/deepseek-ai/EPLB,
// eplb.py; the same in vLLM's vllm/distributed/eplb), re-stated from its code
// as plainly as possible and independently of balance/rebalance_experts.cc,
// for one layer: what tests/balance/rebalance_experts_test.cc and
// bench/balance/rebalance_bench.cc compare epmoe's placement against, so that
// "never worse than EPLB" is checked without vLLM.
//   balanced_packing: items heaviest first (ties to the lower index), each
//     onto the pack with the least weight that has room (first on ties); one
//     item per pack when capacity is 1: item i on pack i;
//   hierarchical (num_groups % num_nodes == 0): groups onto nodes; per node,
//     its experts (its groups in arrival order) replicated: each further copy
//     to the expert with the largest load / copies (first on ties, no cap);
//     the copies (load / copies each) packed onto the node's GPUs, blind to
//     which expert a GPU already holds;
//   global: the same with one group and one node.
// Loads per copy and pack loads in double (EPLB: float32 per copy).
#pragma once

#include <algorithm>
#include <bit>
#include <limits>
#include <numeric>
#include <vector>

namespace epmoe::balance::reference {

// Pack of each item.
inline std::vector<int> eplb_balanced_packing(const std::vector<double>& weights, int num_packs) {
  const int n = static_cast<int>(weights.size()), capacity = n / num_packs;
  std::vector<int> pack_of(n);
  if (capacity == 1) {
    std::iota(pack_of.begin(), pack_of.end(), 0);
    return pack_of;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weights[a] > weights[b]; });
  std::vector<double> pack_weight(num_packs, 0.0);
  std::vector<int> pack_items(num_packs, 0);
  for (const int item : order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_items[p] < capacity && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
    }
    pack_of[item] = best;
    pack_weight[best] += weights[item];
    ++pack_items[best];
  }
  return pack_of;
}

struct EplbLayer {
  std::vector<double> gpu_load;               // [num_gpus]: every copy on the GPU, duplicates included
  std::vector<std::vector<int>> gpu_experts;  // logical experts on each GPU
  bool duplicate = false;                     // some GPU holds an expert twice
  double max_load() const { return *std::max_element(gpu_load.begin(), gpu_load.end()); }
};

inline EplbLayer eplb_rebalance_layer(const float* weight, int num_experts, int num_replicas, int num_groups,
                                      int num_nodes, int num_gpus) {
  if (num_groups % num_nodes != 0) num_groups = 1, num_nodes = 1;  // the global policy
  const int group_size = num_experts / num_groups, groups_per_node = num_groups / num_nodes;
  const int experts_per_node = num_experts / num_nodes, copies_per_node = num_replicas / num_nodes;
  const int gpus_per_node = num_gpus / num_nodes;
  std::vector<double> group_load(num_groups, 0.0);
  for (int g = 0; g < num_groups; ++g) {
    float sum = 0.0f;
    for (int i = 0; i < group_size; ++i) sum += weight[g * group_size + i];
    group_load[g] = sum;
  }
  const std::vector<int> node_of_group = eplb_balanced_packing(group_load, num_nodes);
  EplbLayer out;
  out.gpu_load.assign(num_gpus, 0.0);
  out.gpu_experts.assign(num_gpus, {});
  for (int node = 0; node < num_nodes; ++node) {
    std::vector<int> experts;
    // Arrival order of the node's groups: the packing order, heaviest first.
    std::vector<int> groups;
    std::vector<int> order(num_groups);
    std::iota(order.begin(), order.end(), 0);
    if (groups_per_node > 1)
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return group_load[a] > group_load[b]; });
    for (const int g : order)
      if (node_of_group[g] == node) groups.push_back(g);
    for (const int g : groups)
      for (int i = 0; i < group_size; ++i) experts.push_back(g * group_size + i);
    std::vector<double> load(experts_per_node);
    for (int i = 0; i < experts_per_node; ++i) load[i] = weight[experts[i]];
    std::vector<int> count(experts_per_node, 1), copy_expert(experts_per_node);
    std::iota(copy_expert.begin(), copy_expert.end(), 0);
    for (int j = experts_per_node; j < copies_per_node; ++j) {
      int best = 0;
      for (int i = 1; i < experts_per_node; ++i)
        if (load[i] / count[i] > load[best] / count[best]) best = i;
      ++count[best];
      copy_expert.push_back(best);
    }
    std::vector<double> copy_load(copies_per_node);
    for (int j = 0; j < copies_per_node; ++j) copy_load[j] = load[copy_expert[j]] / count[copy_expert[j]];
    const std::vector<int> gpu_of_copy = eplb_balanced_packing(copy_load, gpus_per_node);
    for (int j = 0; j < copies_per_node; ++j) {
      const int gpu = node * gpus_per_node + gpu_of_copy[j], expert = experts[copy_expert[j]];
      std::vector<int>& on = out.gpu_experts[gpu];
      out.duplicate |= std::find(on.begin(), on.end(), expert) != on.end();
      on.push_back(expert);
      out.gpu_load[gpu] += copy_load[j];
    }
  }
  return out;
}

// Whether a hotter expert never has fewer copies than a colder one.
inline bool in_heat_order(const std::vector<float>& w, const std::vector<int>& count) {
  for (std::size_t i = 0; i < w.size(); ++i)
    for (std::size_t j = 0; j < w.size(); ++j)
      if (w[i] > w[j] && count[i] < count[j]) return false;
  return true;
}

// The lowest max GPU load of any placement of `replicas` copies on `gpus`
// GPUs without a duplicate (every expert at least once), by enumerating
// every GPU's set of experts: for a handful of experts only. With
// `heat_ordered`, of those placements whose copies are in_heat_order.
inline double best_duplicate_free_max_load(const std::vector<float>& w, int replicas, int gpus,
                                           bool heat_ordered = false) {
  const int experts = static_cast<int>(w.size()), slots = replicas / gpus;
  std::vector<unsigned> sets;  // the GPU contents: `slots` distinct experts, as bit masks
  for (unsigned mask = 0; mask < (1u << experts); ++mask)
    if (std::popcount(mask) == slots) sets.push_back(mask);
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> chosen(gpus, 0);  // non-decreasing indices into `sets`: each multiset of GPUs once
  while (true) {
    std::vector<int> count(experts, 0);
    for (const int s : chosen)
      for (int e = 0; e < experts; ++e) count[e] += (sets[s] >> e) & 1;
    if (*std::min_element(count.begin(), count.end()) > 0 && (!heat_ordered || in_heat_order(w, count))) {
      double max_load = 0.0;
      for (const int s : chosen) {
        double load = 0.0;
        for (int e = 0; e < experts; ++e)
          if ((sets[s] >> e) & 1) load += w[e] / static_cast<double>(count[e]);
        max_load = std::max(max_load, load);
      }
      best = std::min(best, max_load);
    }
    int g = gpus - 1;
    while (g >= 0 && chosen[g] == static_cast<int>(sets.size()) - 1) --g;
    if (g < 0) return best;
    ++chosen[g];
    for (int h = g + 1; h < gpus; ++h) chosen[h] = chosen[g];
  }
}

}  // namespace epmoe::balance::reference
