// EPLB's rebalance_experts (balance/rebalance_experts.h): the three maps form a
// valid placement (every expert >= 1 copy, counts sum to P, P/G slots per GPU,
// maps consistent, never two copies of one expert on one GPU, the
// hierarchical policy keeps a group's experts and their copies on one node),
// on random, Zipf and adversarial loads (one expert holds everything; as many
// slots per GPU as experts per node, which forces every GPU to hold every
// expert of its node), for both policies; EPLB's published example; where
// EPLB's own placement would duplicate an expert, ours does not and is no
// worse; never a higher max GPU load than EPLB's published algorithm
// (re-stated in rebalance_eplb_reference.h) on seeded random, Zipf and
// adversarial loads, and the same where EPLB's placement has no duplicate;
// arguments that break a rule raise ConfigError naming the argument
// (EplbAssertionError where EPLB asserts), and every call EPLB accepts is
// accepted; hotter experts get at least as many copies where that costs no
// balance.
#include "balance/rebalance_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "rebalance_eplb_reference.h"

namespace epmoe::balance {
namespace {

std::vector<float> make_weights(int layers, int experts, int shape, std::mt19937& rng) {
  std::vector<float> w(static_cast<std::size_t>(layers) * experts);
  std::uniform_int_distribution<int> uniform(0, 1000);
  for (int l = 0; l < layers; ++l) {
    std::vector<int> rank(experts);
    for (int e = 0; e < experts; ++e) rank[e] = e;
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int e = 0; e < experts; ++e) {
      float& x = w[static_cast<std::size_t>(l) * experts + e];
      if (shape == 0) x = static_cast<float>(uniform(rng));                               // random
      if (shape == 1) x = std::floor(100000.0f / std::pow(1.0f + rank[e], 1.2f));         // Zipf 1.2
      if (shape == 2) x = rank[e] == 0 ? 100000.0f : 0.0f;                                // one hot expert
      if (shape == 3) x = rank[e] < 2 ? 50000.0f : static_cast<float>(uniform(rng) % 3);  // two hot, rest tiny
    }
  }
  return w;
}

// Max over mean of the GPU loads, each copy carrying load / copies.
double max_over_mean(const std::vector<std::int64_t>& physical_to_logical, const std::vector<float>& weight,
                     const std::vector<std::int64_t>& counts, int layer, int experts, int replicas, int gpus) {
  const int slots = replicas / gpus;
  std::vector<double> loads(gpus, 0.0);
  double total = 0.0;
  for (int p = 0; p < replicas; ++p) {
    const std::int64_t e = physical_to_logical[static_cast<std::size_t>(layer) * replicas + p];
    const double share = weight[static_cast<std::size_t>(layer) * experts + e] /
                         static_cast<double>(counts[static_cast<std::size_t>(layer) * experts + e]);
    loads[p / slots] += share;
    total += share;
  }
  if (total == 0.0) return 1.0;
  return *std::max_element(loads.begin(), loads.end()) / (total / gpus);
}

void expect_valid(const ExpertRebalance& r, const std::vector<float>& weight, const RebalanceExpertsOptions& o,
                  const std::string& where) {
  const int L = r.num_layers, E = r.num_logical_experts, P = o.num_replicas, G = o.num_gpus;
  ASSERT_EQ(r.max_copies, P - E + 1) << where;
  ASSERT_EQ(r.physical_to_logical.size(), static_cast<std::size_t>(L) * P) << where;
  ASSERT_EQ(r.logical_to_physical.size(), static_cast<std::size_t>(L) * E * r.max_copies) << where;
  ASSERT_EQ(r.logical_count.size(), static_cast<std::size_t>(L) * E) << where;
  const int slots = P / G;
  const bool hierarchical = uses_hierarchical_policy(o);
  const int nodes = hierarchical ? o.num_nodes : 1, group_size = hierarchical ? E / o.num_groups : E;
  for (int l = 0; l < L; ++l) {
    std::vector<std::int64_t> seen(E, 0);
    for (int p = 0; p < P; ++p) {
      const std::int64_t e = r.physical_to_logical[static_cast<std::size_t>(l) * P + p];
      ASSERT_GE(e, 0) << where;
      ASSERT_LT(e, E) << where;
      ++seen[e];
    }
    std::int64_t sum = 0;
    for (int e = 0; e < E; ++e) {
      const std::int64_t count = r.logical_count[static_cast<std::size_t>(l) * E + e];
      EXPECT_GE(count, 1) << where << " layer " << l << " expert " << e;
      EXPECT_EQ(count, seen[e]) << where << " layer " << l << " expert " << e;
      sum += count;
      // logical_to_physical: exactly the slots holding e, ascending, then -1.
      const std::int64_t* row = &r.logical_to_physical[(static_cast<std::size_t>(l) * E + e) * r.max_copies];
      for (int c = 0; c < r.max_copies; ++c) {
        if (c < count) {
          ASSERT_GE(row[c], 0) << where;
          EXPECT_EQ(r.physical_to_logical[static_cast<std::size_t>(l) * P + row[c]], e) << where;
          if (c > 0) {
            EXPECT_LT(row[c - 1], row[c]) << where;
          }
        } else {
          EXPECT_EQ(row[c], -1) << where;
        }
      }
    }
    EXPECT_EQ(sum, P) << where;
    for (int g = 0; g < G; ++g) {
      std::set<std::int64_t> on_gpu;
      for (int s = 0; s < slots; ++s) {
        const std::int64_t e = r.physical_to_logical[static_cast<std::size_t>(l) * P + g * slots + s];
        EXPECT_TRUE(on_gpu.insert(e).second) << where << " layer " << l << ": expert " << e << " twice on GPU " << g;
      }
    }
    // Hierarchical: a group's experts, and all their copies, on one node.
    const int slots_per_node = P / nodes;
    std::vector<int> node_of_group(E / group_size, -1);
    for (int p = 0; p < P; ++p) {
      const int group = static_cast<int>(r.physical_to_logical[static_cast<std::size_t>(l) * P + p]) / group_size;
      if (node_of_group[group] < 0) node_of_group[group] = p / slots_per_node;
      EXPECT_EQ(node_of_group[group], p / slots_per_node) << where << " layer " << l << " group " << group;
    }
  }
}

struct Shape {
  int experts, replicas, groups, nodes, gpus;
};

TEST(RebalanceExperts, ValidPlacementOnRandomZipfAndAdversarialLoadsBothPolicies) {
  std::mt19937 rng(7);
  const std::vector<Shape> shapes = {
      {12, 16, 4, 2, 8},     // EPLB's example: hierarchical
      {12, 16, 3, 2, 8},     // 3 % 2 != 0: global
      {64, 64, 8, 8, 8},     // one GPU per node, no spare slot
      {64, 80, 8, 2, 8},     // hierarchical, 2 nodes of 4 GPUs
      {64, 80, 1, 2, 8},     // global
      {256, 320, 8, 8, 64},  // DeepSeek-V3-like: 8 nodes of 8 GPUs
      {256, 315, 8, 3, 63},  // global (8 % 3 != 0)
      {4, 16, 1, 1, 4},      // every GPU holds every expert
      {8, 32, 4, 2, 8},      // every GPU holds every expert of its node
      {6, 12, 2, 1, 3},      // S = 4 of 6 experts
      {5, 5, 1, 1, 5},       // no redundancy, one slot each
      {3, 6, 1, 1, 2},
  };
  for (const Shape& s : shapes) {
    for (int shape = 0; shape < 4; ++shape) {
      const int layers = 6;
      const std::vector<float> w = make_weights(layers, s.experts, shape, rng);
      const RebalanceExpertsOptions o{s.replicas, s.groups, s.nodes, s.gpus};
      const std::string where = "E=" + std::to_string(s.experts) + " P=" + std::to_string(s.replicas) +
                                " groups=" + std::to_string(s.groups) + " nodes=" + std::to_string(s.nodes) +
                                " gpus=" + std::to_string(s.gpus) + " loads " + std::to_string(shape);
      expect_valid(rebalance_experts(w, layers, s.experts, o), w, o, where);
    }
  }
}

TEST(RebalanceExperts, ReproducesEplbsPublishedExample) {
  // The example of EPLB's README: 2 layers, 12 experts in 4 groups, 16
  // replicas, 2 nodes of 4 GPUs; its printed physical_to_logical map.
  const std::vector<float> w = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                                20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
  const ExpertRebalance r = rebalance_experts(w, 2, 12, {16, 4, 2, 8});
  const std::vector<std::int64_t> expected = {5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                                              7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1};
  EXPECT_EQ(r.physical_to_logical, expected);
  EXPECT_EQ(std::vector<std::int64_t>(r.logical_count.begin(), r.logical_count.begin() + 12),
            (std::vector<std::int64_t>{1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1}));
}

TEST(RebalanceExperts, NeverDuplicatesWhereEplbWouldAndBalancesBetter) {
  // Global policy, 2 GPUs x 3 slots, one hot expert: EPLB gives expert 0
  // three copies, and its packing puts two of them on GPU 0 (max/mean 1.31).
  // Here expert 0 gets two copies (one per GPU) and the spare slot goes to
  // expert 1: every GPU carries 51.5, max/mean 1.
  const std::vector<float> w = {100, 1, 1, 1};
  const RebalanceExpertsOptions o{6, 1, 1, 2};
  const ExpertRebalance r = rebalance_experts(w, 1, 4, o);
  expect_valid(r, w, o, "hot expert");
  EXPECT_EQ(r.logical_count, (std::vector<std::int64_t>{2, 2, 1, 1}));
  EXPECT_DOUBLE_EQ(max_over_mean(r.physical_to_logical, w, r.logical_count, 0, 4, 6, 2), 1.0);
}

TEST(RebalanceExperts, NoDuplicateFreePlacementCanMatchEplbsDuplicateHere) {
  // Why "no duplicate" can cost balance (docs/BALANCE.md): loads {3, 4, 1},
  // 4 slots on 2 GPUs. EPLB gives expert 1 the extra copy (2 + 2) and packs
  // both copies on GPU 1 (4), expert 0 and 2 on GPU 0 (4): max 4, as if one
  // slot stood empty. Without a duplicate one expert sits on both GPUs and
  // every slot carries load: the best is expert 2 twice, {0, 2} = 3.5 and
  // {1, 2} = 4.5. epmoe finds that best one.
  const std::vector<float> w = {3, 4, 1};
  const RebalanceExpertsOptions o{4, 1, 1, 2};
  const reference::EplbLayer eplb = reference::eplb_rebalance_layer(w.data(), 3, 4, 1, 1, 2);
  EXPECT_TRUE(eplb.duplicate);
  EXPECT_DOUBLE_EQ(eplb.max_load(), 4.0);
  EXPECT_DOUBLE_EQ(reference::best_duplicate_free_max_load(w, 4, 2), 4.5);
  const ExpertRebalance r = rebalance_experts(w, 1, 3, o);
  expect_valid(r, w, o, "{3, 4, 1}");
  EXPECT_DOUBLE_EQ(max_over_mean(r.physical_to_logical, w, r.logical_count, 0, 3, 4, 2) * (8.0 / 2), 4.5);
}

// Loads of one layer: 0 random integers in [0, 1000); 1 Zipf with exponent
// `s` over shuffled experts; 2 adversarial: 1-3 experts carry 100000, the rest 0-2.
std::vector<float> seeded_layer(int kind, double s, int experts, std::mt19937_64& rng) {
  std::vector<float> w(experts);
  std::vector<int> rank(experts);
  for (int e = 0; e < experts; ++e) rank[e] = e;
  std::shuffle(rank.begin(), rank.end(), rng);
  std::uniform_int_distribution<int> uniform(0, 999);
  const int hot = std::uniform_int_distribution<int>(1, 3)(rng);
  for (int e = 0; e < experts; ++e) {
    if (kind == 0) w[e] = static_cast<float>(uniform(rng));
    if (kind == 1) w[e] = static_cast<float>(std::floor(100000.0 / std::pow(1.0 + rank[e], s)));
    if (kind == 2) w[e] = rank[e] < hot ? 100000.0f : static_cast<float>(uniform(rng) % 3);
  }
  return w;
}

TEST(RebalanceExperts, NeverWorseThanEplbsPublishedPackingOnSeededLoads) {
  // Per layer, the max GPU load of ours against EPLB's (its duplicates
  // counted twice on their GPU): never higher, and equal where EPLB's own
  // placement holds no duplicate. 10 layers per call, both policies, the
  // shapes of docs/BALANCE.md's table.
  const std::vector<Shape> shapes = {
      {256, 320, 8, 8, 64},  // hierarchical, 8 nodes of 8 GPUs
      {256, 320, 3, 2, 64},  // global (3 % 2 != 0)
      {64, 72, 8, 1, 8},     // hierarchical, one node
      {64, 72, 3, 2, 8},     // global
  };
  const std::vector<std::pair<int, double>> kinds = {{0, 0.0}, {1, 0.6}, {1, 1.0}, {1, 1.2},
                                                     {1, 1.4}, {1, 1.8}, {2, 0.0}};
  constexpr int kLayers = 10, kCalls = 3;
  int checked = 0, with_duplicate = 0, lower = 0;
  for (const Shape& s : shapes) {
    const RebalanceExpertsOptions o{s.replicas, s.groups, s.nodes, s.gpus};
    for (const auto& [kind, exponent] : kinds) {
      std::mt19937_64 rng(1000 + kind * 10 + static_cast<int>(exponent * 10));
      for (int call = 0; call < kCalls; ++call) {
        std::vector<float> w;
        for (int l = 0; l < kLayers; ++l) {
          const std::vector<float> row = seeded_layer(kind, exponent, s.experts, rng);
          w.insert(w.end(), row.begin(), row.end());
        }
        const ExpertRebalance r = rebalance_experts(w, kLayers, s.experts, o);
        const std::string where = "E=" + std::to_string(s.experts) + " P=" + std::to_string(s.replicas) +
                                  " groups=" + std::to_string(s.groups) + " nodes=" + std::to_string(s.nodes) +
                                  " kind " + std::to_string(kind) + " s=" + std::to_string(exponent) + " call " +
                                  std::to_string(call);
        expect_valid(r, w, o, where);
        for (int l = 0; l < kLayers; ++l) {
          const reference::EplbLayer eplb = reference::eplb_rebalance_layer(
              w.data() + static_cast<std::size_t>(l) * s.experts, s.experts, s.replicas, s.groups, s.nodes, s.gpus);
          double total = 0.0;
          for (int e = 0; e < s.experts; ++e) total += w[static_cast<std::size_t>(l) * s.experts + e];
          const double theirs = eplb.max_load() / (total / s.gpus);
          const double ours =
              max_over_mean(r.physical_to_logical, w, r.logical_count, l, s.experts, s.replicas, s.gpus);
          ++checked;
          with_duplicate += eplb.duplicate;
          lower += ours < theirs * (1 - 1e-9);
          EXPECT_LE(ours, theirs * (1 + 1e-9)) << where << " layer " << l;
          if (!eplb.duplicate) {
            EXPECT_NEAR(ours, theirs, 1e-9 * theirs) << where << " layer " << l << " (EPLB: no duplicate)";
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 7 * kCalls * kLayers);
  EXPECT_GT(with_duplicate, checked / 2);  // the loads do exercise the duplicate-free search
  EXPECT_GT(lower, 0);
}

TEST(RebalanceExperts, RaisesConfigErrorNamingTheArgument) {
  // EplbAssertionError exactly where DeepSeek's EPLB asserts; a plain
  // ConfigError where EPLB would divide by zero or where loads are no loads.
  const std::vector<float> w(2 * 12, 1.0f);
  struct Outcome {
    std::string message;
    bool eplb_assertion = false;
  };
  const auto outcome = [&](const RebalanceExpertsOptions& o, std::span<const float> weight = {}) {
    try {
      rebalance_experts(weight.empty() ? std::span<const float>(w) : weight, 2, 12, o);
    } catch (const EplbAssertionError& error) {
      return Outcome{error.what(), true};
    } catch (const ConfigError& error) {
      return Outcome{error.what(), false};
    }
    return Outcome{"no error"};
  };
  const auto expect_assertion = [&](const RebalanceExpertsOptions& o, const std::string& name) {
    const Outcome got = outcome(o);
    EXPECT_NE(got.message.find(name), std::string::npos) << got.message;
    EXPECT_TRUE(got.eplb_assertion) << got.message;
  };
  expect_assertion({10, 4, 2, 8}, "num_replicas=10");  // fewer than E
  expect_assertion({7, 2, 2, 4}, "num_replicas=7");    // not a multiple of 4 (vLLM's test)
  expect_assertion({20, 4, 2, 8}, "num_replicas=20");  // not a multiple of 8
  expect_assertion({18, 4, 4, 6}, "num_gpus=6");       // hierarchical (4 % 4 == 0): 6 % 4 nodes
  expect_assertion({16, 8, 2, 8}, "num_groups=8");     // hierarchical: 12 % 8
  const auto expect_config_error = [&](const Outcome& got, const std::string& name) {
    EXPECT_NE(got.message.find(name), std::string::npos) << got.message;
    EXPECT_FALSE(got.eplb_assertion) << got.message;
  };
  expect_config_error(outcome({16, 4, 0, 8}), "num_nodes=0");
  expect_config_error(outcome({16, 4, 2, 0}), "num_gpus=0");
  expect_config_error(outcome({16, 0, 2, 8}), "num_groups=0");
  std::vector<float> bad = w;
  bad[13] = -1.0f;
  expect_config_error(outcome({16, 4, 2, 8}, bad), "weight[1, 1]");
  bad[13] = std::nanf("");
  expect_config_error(outcome({16, 4, 2, 8}, bad), "weight[1, 1]");
}

TEST(RebalanceExperts, AcceptsEveryCallEplbAccepts) {
  std::mt19937 rng(11);
  // The global policy (num_groups % num_nodes != 0) is EPLB's hierarchical
  // one with one group and one node: num_gpus need not be a multiple of
  // num_nodes, and the placement is the one for 1 group and 1 node.
  for (const Shape& s : std::vector<Shape>{{256, 384, 8, 3, 64}, {12, 16, 4, 3, 8}, {6, 10, 3, 2, 5}}) {
    const std::vector<float> w = make_weights(2, s.experts, 1, rng);
    const RebalanceExpertsOptions o{s.replicas, s.groups, s.nodes, s.gpus};
    const ExpertRebalance r = rebalance_experts(w, 2, s.experts, o);
    expect_valid(r, w, o, "num_nodes=" + std::to_string(s.nodes) + " num_gpus=" + std::to_string(s.gpus));
    const ExpertRebalance one_node = rebalance_experts(w, 2, s.experts, {s.replicas, 1, 1, s.gpus});
    EXPECT_EQ(r.physical_to_logical, one_node.physical_to_logical);
  }
  // More slots per GPU (12) than experts per node (6): every placement holds
  // some expert twice on a GPU, and the answer is EPLB's own placement.
  const std::vector<float> w = make_weights(1, 12, 1, rng);
  const ExpertRebalance r = rebalance_experts(w, 1, 12, {96, 4, 2, 8});
  const reference::EplbLayer eplb = reference::eplb_rebalance_layer(w.data(), 12, 96, 4, 2, 8);
  ASSERT_TRUE(eplb.duplicate);
  for (int g = 0; g < 8; ++g) {
    std::vector<std::int64_t> ours(r.physical_to_logical.begin() + g * 12, r.physical_to_logical.begin() + g * 12 + 12);
    std::vector<std::int64_t> theirs(eplb.gpu_experts[g].begin(), eplb.gpu_experts[g].end());
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    EXPECT_EQ(ours, theirs) << "GPU " << g;
  }
  // EPLB's packing here leaves a duplicate that no single swap removes
  // (the GPUs without the expert hold duplicates of their own); that
  // candidate is skipped (it once failed an internal check).
  const std::vector<float> stuck = {9, 9, 1, 8, 0, 5};
  const RebalanceExpertsOptions o{16, 1, 1, 4};
  expect_valid(rebalance_experts(stuck, 1, 6, o), stuck, o, "{9, 9, 1, 8, 0, 5}");
}

// Copies of each expert of a one-layer result, and its max GPU load.
struct Counts {
  std::vector<std::int64_t> copies;
  double max_load;
};
Counts counts_of(const std::vector<float>& w, const RebalanceExpertsOptions& o) {
  const int experts = static_cast<int>(w.size());
  const ExpertRebalance r = rebalance_experts(w, 1, experts, o);
  expect_valid(r, w, o, "counts_of");
  double total = 0.0;
  for (const float x : w) total += x;
  return {r.logical_count,
          max_over_mean(r.physical_to_logical, w, r.logical_count, 0, experts, o.num_replicas, o.num_gpus) * total /
              o.num_gpus};
}

TEST(RebalanceExperts, HotterExpertsGetAtLeastAsManyCopiesWhereBalanceAllows) {
  // One expert at 1000, the rest 0-2, 4 GPUs x 3 slots. Capped at one copy
  // per GPU, the hot expert's other copies go to the cold ones; the search
  // found max 250 + 4/3 with 3 copies of the load-1 expert and 2 of each
  // load-2 one. The same max holds with 1 and 3 + 3.
  const Counts ordered = counts_of({1000, 0, 1, 2, 2}, {12, 1, 1, 4});
  EXPECT_EQ(ordered.copies, (std::vector<std::int64_t>{4, 1, 1, 3, 3}));
  EXPECT_NEAR(ordered.max_load, 250.0 + 4.0 / 3.0, 1e-9);
  // Every cold expert at 0: the search had given one of them as many
  // copies as the hot one (4 4 3 1); EPLB gives the hottest the most.
  const Counts hottest = counts_of({1000, 0, 0, 0}, {12, 1, 1, 4});
  EXPECT_EQ(hottest.copies, (std::vector<std::int64_t>{4, 3, 3, 2}));
  EXPECT_DOUBLE_EQ(hottest.max_load, 250.0);
  // Where it costs balance it does not hold (docs/BALANCE.md): {1000, 2, 1,
  // 1} on 3 GPUs x 3 slots, 3 2 3 1 copies reach 334.67; with a load-1
  // expert at most as many copies as the load-2 one, 334.83 at best.
  const Counts costly = counts_of({1000, 2, 1, 1}, {9, 1, 1, 3});
  EXPECT_EQ(costly.copies, (std::vector<std::int64_t>{3, 2, 3, 1}));
  EXPECT_NEAR(costly.max_load, 1000.0 / 3 + 4.0 / 3, 1e-9);
}

}  // namespace
}  // namespace epmoe::balance
