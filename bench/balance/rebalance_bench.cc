// bench_balance_rebalance: epmoe's rebalance_experts (balance/rebalance_experts.h)
// against EPLB's published algorithm, re-stated in
// tests/balance/rebalance_eplb_reference.h, without Python or vLLM.
//
//   bench_balance_rebalance [layers_per_kind=200] [timing_repeats=200]
//
// (1) Quality: for each shape and kind of load, `layers_per_kind` seeded
// single layers; per layer the max GPU load of each (EPLB's counting both
// copies of an expert it puts twice on one GPU); epmoe worse / equal (within
// 1e-9 relative) / better, the worst relative excess, and how many of EPLB's
// layers hold a duplicate, and how many of epmoe's give some expert fewer
// copies than a colder expert of its node. Kinds: random = uniform integers
// in [0, 1000); zipf-S = floor(100000 / (1 + rank)^S) over shuffled experts;
// zipf-mix = S drawn in [0.6, 1.6] per layer; adversarial = 1-3 experts
// carry 100000, the rest 0-2; hot-group = one group of experts 100x the
// others.
// (2) Tiny layers: epmoe and EPLB against the exhaustive duplicate-free
// optimum; and how often epmoe's copies are in heat order (no expert with
// fewer copies than a colder one) where a placement at its max load allows.
// (3) Speed: the calling thread's CPU time per call of rebalance_experts on
// Zipf 1.2 loads (1 and 58 layers), median over `timing_repeats` calls.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "balance/rebalance_experts.h"
#include "rebalance_eplb_reference.h"

namespace {

using namespace epmoe::balance;

struct Shape {
  const char* label;
  int experts, replicas, groups, nodes, gpus;
};

std::vector<float> make_layer(const std::string& kind, int experts, int groups, std::mt19937_64& rng) {
  std::vector<float> w(experts);
  std::vector<int> rank(experts);
  for (int e = 0; e < experts; ++e) rank[e] = e;
  std::shuffle(rank.begin(), rank.end(), rng);
  std::uniform_int_distribution<int> uniform(0, 999);
  if (kind == "random") {
    for (float& x : w) x = static_cast<float>(uniform(rng));
  } else if (kind.rfind("zipf", 0) == 0) {
    double s = 0.0;
    if (kind == "zipf-mix") {
      s = std::uniform_real_distribution<double>(0.6, 1.6)(rng);
    } else {
      s = std::atof(kind.c_str() + 5);
    }
    for (int e = 0; e < experts; ++e) w[e] = static_cast<float>(std::floor(100000.0 / std::pow(1.0 + rank[e], s)));
  } else if (kind == "adversarial") {
    const int hot = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int e = 0; e < experts; ++e) w[e] = rank[e] < hot ? 100000.0f : static_cast<float>(uniform(rng) % 3);
  } else {  // hot-group
    const int size = experts / groups, hot = static_cast<int>(rng() % groups);
    for (int e = 0; e < experts; ++e) w[e] = static_cast<float>(uniform(rng)) * (e / size == hot ? 100.0f : 1.0f);
  }
  return w;
}

double epmoe_max_load(const ExpertRebalance& r, const std::vector<float>& w, int gpus) {
  const int P = r.num_physical_experts, slots = P / gpus;
  std::vector<double> load(gpus, 0.0);
  for (int p = 0; p < P; ++p) {
    const std::int64_t e = r.physical_to_logical[p];
    load[p / slots] += w[e] / static_cast<double>(r.logical_count[e]);
  }
  return *std::max_element(load.begin(), load.end());
}

// Whether some expert has fewer copies than a colder expert of its node
// (the node of its slots; the global policy is one node).
bool has_inversion(const ExpertRebalance& r, const std::vector<float>& w, int nodes) {
  const int E = r.num_logical_experts, slots_per_node = r.num_physical_experts / nodes;
  std::vector<int> node_of(E);
  for (int p = 0; p < r.num_physical_experts; ++p) node_of[r.physical_to_logical[p]] = p / slots_per_node;
  for (int i = 0; i < E; ++i)
    for (int j = 0; j < E; ++j)
      if (node_of[i] == node_of[j] && w[i] > w[j] && r.logical_count[i] < r.logical_count[j]) return true;
  return false;
}

double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int layers_per_kind = argc > 1 ? std::atoi(argv[1]) : 200;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 200;
  const std::vector<Shape> shapes = {
      {"E=256, 64 GPUs, 8 nodes (hierarchical)", 256, 320, 8, 8, 64},
      {"E=256, 64 GPUs (global: 3 groups % 2 nodes)", 256, 320, 3, 2, 64},
      {"E=64, 8 GPUs, 1 node (hierarchical)", 64, 72, 8, 1, 8},
      {"E=64, 8 GPUs (global: 3 groups % 2 nodes)", 64, 72, 3, 2, 8},
  };
  const std::vector<std::string> kinds = {"random",   "zipf-0.6", "zipf-1.0",    "zipf-1.4",
                                          "zipf-1.8", "zipf-mix", "adversarial", "hot-group"};
  std::printf(
      "| shape | loads | layers | epmoe worse | equal | epmoe better | worst excess | EPLB layers with a duplicate "
      "| epmoe layers out of heat order |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  int total_worse = 0;
  for (const Shape& s : shapes) {
    const RebalanceExpertsOptions o{s.replicas, s.groups, s.nodes, s.gpus};
    for (const std::string& kind : kinds) {
      std::mt19937_64 rng(12345);
      int worse = 0, equal = 0, better = 0, duplicates = 0, inverted = 0;
      double worst = 0.0;
      for (int layer = 0; layer < layers_per_kind; ++layer) {
        const std::vector<float> w = make_layer(kind, s.experts, s.groups, rng);
        const reference::EplbLayer eplb =
            reference::eplb_rebalance_layer(w.data(), s.experts, s.replicas, s.groups, s.nodes, s.gpus);
        const double theirs = eplb.max_load();
        const ExpertRebalance r = rebalance_experts(w, 1, s.experts, o);
        const double ours = epmoe_max_load(r, w, s.gpus);
        duplicates += eplb.duplicate;
        inverted += has_inversion(r, w, uses_hierarchical_policy(o) ? s.nodes : 1);
        if (ours > theirs * (1 + 1e-9)) {
          ++worse;
          worst = std::max(worst, ours / theirs - 1.0);
        } else if (ours < theirs * (1 - 1e-9)) {
          ++better;
        } else {
          ++equal;
        }
      }
      total_worse += worse;
      std::printf("| %s | %s | %d | %d | %d | %d | %+.2f%% | %d | %d |\n", s.label, kind.c_str(), layers_per_kind,
                  worse, equal, better, 100.0 * worst, duplicates, inverted);
    }
  }
  std::printf("\nworse in total: %d\n\n", total_worse);

  // (2) Tiny layers against the exhaustive duplicate-free optimum: how often
  // epmoe reaches it, how often EPLB's duplicated placement is lower than any
  // duplicate-free one can be, and how often epmoe is above EPLB although a
  // duplicate-free placement at EPLB's max exists.
  {
    std::mt19937_64 rng(2026);
    int layers = 0, optimal = 0, eplb_duplicates = 0, unbeatable = 0, worse_avoidable = 0;
    for (int trial = 0; trial < layers_per_kind * 5; ++trial) {
      const int gpus = 2 + static_cast<int>(rng() % 2), slots = 2 + static_cast<int>(rng() % 2);
      const int replicas = gpus * slots, experts = slots + static_cast<int>(rng() % (replicas - slots));
      std::vector<float> w(experts);
      double total = 0.0;
      for (float& x : w) total += x = static_cast<float>(rng() % 10);
      if (total == 0.0) continue;
      const reference::EplbLayer eplb = reference::eplb_rebalance_layer(w.data(), experts, replicas, 1, 1, gpus);
      const double ours = epmoe_max_load(rebalance_experts(w, 1, experts, {replicas, 1, 1, gpus}), w, gpus);
      const double best = reference::best_duplicate_free_max_load(w, replicas, gpus);
      ++layers;
      optimal += ours <= best * (1 + 1e-12);
      eplb_duplicates += eplb.duplicate;
      unbeatable += best > eplb.max_load() * (1 + 1e-12);
      worse_avoidable += ours > eplb.max_load() * (1 + 1e-12) && best <= eplb.max_load() * (1 + 1e-12);
    }
    std::printf(
        "Tiny layers (2-3 GPUs x 2-3 slots, loads 0-9, global policy): %d layers; epmoe at the duplicate-free "
        "optimum on %d; EPLB duplicates on %d, and is below every duplicate-free placement on %d; epmoe above "
        "EPLB where the optimum is not: %d\n\n",
        layers, optimal, eplb_duplicates, unbeatable, worse_avoidable);
  }

  // (2b) Heat order on tiny layers: where some duplicate-free placement at
  // epmoe's max load gives no expert fewer copies than a colder one, how
  // often epmoe's does. Loads 0-9, and one expert at 1000 with the rest 0-2.
  for (const bool one_hot : {false, true}) {
    std::mt19937_64 rng(2027);
    int layers = 0, possible = 0, ordered = 0;
    for (int trial = 0; trial < layers_per_kind * 5; ++trial) {
      const int gpus = 2 + static_cast<int>(rng() % 3), slots = 2 + static_cast<int>(rng() % 2);
      const int replicas = gpus * slots, experts = slots + static_cast<int>(rng() % (std::min(replicas, 7) - slots));
      std::vector<float> w(experts);
      for (int e = 0; e < experts; ++e) w[e] = static_cast<float>(one_hot ? (e == 0 ? 1000 : rng() % 3) : rng() % 10);
      const ExpertRebalance r = rebalance_experts(w, 1, experts, {replicas, 1, 1, gpus});
      const std::vector<int> count(r.logical_count.begin(), r.logical_count.end());
      const double ours = epmoe_max_load(r, w, gpus);
      ++layers;
      if (reference::best_duplicate_free_max_load(w, replicas, gpus, /*heat_ordered=*/true) <= ours * (1 + 1e-12)) {
        ++possible;
        ordered += reference::in_heat_order(w, count);
      }
    }
    std::printf(
        "Heat order on tiny layers (2-4 GPUs x 2-3 slots, %s, global policy): %d layers; a duplicate-free "
        "placement at epmoe's max load with no hotter expert on fewer copies exists on %d; epmoe's is one on %d\n",
        one_hot ? "one expert at 1000, the rest 0-2" : "loads 0-9", layers, possible, ordered);
  }
  std::printf("\n");

  std::printf("| shape | layers per call | epmoe CPU us per call | per layer |\n|---|---:|---:|---:|\n");
  for (const Shape& s : shapes) {
    const RebalanceExpertsOptions o{s.replicas, s.groups, s.nodes, s.gpus};
    for (const int layers : {1, 58}) {
      std::mt19937_64 rng(7);
      std::vector<float> w;
      for (int l = 0; l < layers; ++l) {
        const std::vector<float> row = make_layer("zipf-1.2", s.experts, s.groups, rng);
        w.insert(w.end(), row.begin(), row.end());
      }
      std::vector<double> samples;
      volatile std::int64_t sink = 0;
      for (int r = 0; r < (layers > 1 ? repeats / 10 + 1 : repeats) + 1; ++r) {
        const double start = thread_cpu_us();
        const ExpertRebalance out = rebalance_experts(w, layers, s.experts, o);
        sink = sink + out.physical_to_logical[0];
        if (r > 0) samples.push_back(thread_cpu_us() - start);  // r = 0: warm-up
      }
      std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
      const double median = samples[samples.size() / 2];
      std::printf("| %s | %d | %.1f | %.1f |\n", s.label, layers, median, median / layers);
    }
  }
  return 0;
}
