// EPLB's entry point, `rebalance_experts(weight, num_replicas, num_groups,
// num_nodes, num_gpus)` (DeepSeek, github.com/deepseek-ai/EPLB; the same
// algorithm ships in vLLM, SGLang, Megatron-Core), in C++ with its contract:
// what `epmoe.rebalance_experts` in Python calls.
//
// Per layer, from the loads of the E logical experts, place P = num_replicas
// physical experts (copies) on num_gpus GPUs, P / num_gpus slots each:
//   hierarchical policy (num_groups % num_nodes == 0): (1) the groups of
//     E / num_groups consecutive experts are packed onto the nodes, heaviest
//     group first onto the lightest node with room; (2) within each node, its
//     E / num_nodes experts get P / num_nodes copies, one more copy at a time
//     to the expert with the largest load per copy; (3) the node's copies,
//     heaviest (load / copies) first, each onto the lightest of the node's
//     GPUs with a free slot;
//   global policy (otherwise): the same with one group and one node.
//
// Departures from the published algorithm (docs/BALANCE.md, "EPLB's
// rebalance_experts", has the measurements), per node:
//   * never two copies of one expert on one GPU. Stages 2 and 3 run first as
//     EPLB's on every node; a node where that placement holds no duplicate
//     keeps it, so wherever EPLB's own output has no duplicate the
//     placements are the same. The other nodes, highest EPLB max GPU load
//     first, take the first duplicate-free candidate whose max load is at
//     most the larger of EPLB's max there and the layer's max so far, else
//     the lowest: (1) copies capped at one per GPU, packed heaviest first
//     onto the lightest GPU with room not holding the expert (when every GPU
//     with room holds it, a copy Y on a full GPU without it moves to the
//     lightest GPU with room and the copy takes Y's slot: always possible, a
//     full GPU has more distinct experts than one with room); when no expert
//     has more copies than GPUs, EPLB's copies (2) packed that way and (3) in
//     EPLB's packing with each duplicate swapped away; (4) (1) with one or
//     two fewer copies of the two heaviest replicated experts. Each is
//     improved by a local search on the most loaded GPU: one-for-one copy
//     exchanges, else re-assigning one slot to another expert (loads per
//     copy follow the counts), else (from (2) on) two-for-two exchanges;
//   * then, where it costs no balance, hotter experts get at least as many
//     copies as colder ones of their node: when the placement gives some
//     expert fewer copies than a colder one, the search again (bounded:
//     four local searches, none adding such an inversion), taken if no
//     higher than the layer's max so far; then single slot re-assignments
//     towards hotter experts (and away from colder experts with as many
//     copies as the hottest) that leave every GPU at most at that max;
//   * when P/G slots per GPU exceed the experts per node, every placement
//     holds some expert twice on a GPU: EPLB's placement, as it is;
//   * logical_to_physical lists an expert's copies by ascending physical
//     index (EPLB: in the order the copies were created).
// Arithmetic as EPLB's: loads as float32, loads per copy and pack loads in
// double; ties to the lowest index (EPLB sorts with numpy/torch argsort,
// whose order among exactly equal loads is unspecified).
#pragma once

#include <epmoe/error.h>

#include <cstdint>
#include <span>
#include <vector>

namespace epmoe::balance {

// An argument that breaks a condition DeepSeek's EPLB asserts on (a
// divisibility, fewer replicas than experts). Python raises it as
// epmoe.EplbAssertionError, both an AssertionError (what EPLB's callers
// catch) and a ValueError (what epmoe raises for every bad argument).
class EplbAssertionError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

struct RebalanceExpertsOptions {
  int num_replicas = 0;  // P, a multiple of num_gpus, >= E
  int num_groups = 1;    // expert groups; hierarchical when num_groups % num_nodes == 0
  int num_nodes = 1;
  int num_gpus = 1;  // hierarchical: a multiple of num_nodes (the global policy uses neither)
};

// Which policy rebalance_experts uses: EPLB's rule.
bool uses_hierarchical_policy(const RebalanceExpertsOptions& options);

// EPLB's three outputs, int64, row-major.
struct ExpertRebalance {
  int num_layers = 0;
  int num_logical_experts = 0;                    // E
  int num_physical_experts = 0;                   // P
  int max_copies = 0;                             // P - E + 1, EPLB's padding width
  std::vector<std::int64_t> physical_to_logical;  // [L, P]: the expert in each slot; GPU g holds [g*P/G, (g+1)*P/G)
  std::vector<std::int64_t> logical_to_physical;  // [L, E, max_copies]: copies by ascending index, then -1
  std::vector<std::int64_t> logical_count;        // [L, E]: copies of each expert, >= 1, summing to P
};

// The calls DeepSeek's rebalance_experts accepts, and no other: a ConfigError
// naming the argument (weight, num_replicas, num_groups, num_nodes,
// num_gpus) and the rule it breaks. EplbAssertionError where EPLB asserts:
// hierarchical policy, num_groups not dividing E or num_gpus not a multiple
// of num_nodes; either policy, num_replicas not a multiple of num_gpus or
// below E. A plain ConfigError where EPLB would divide by zero or misbehave:
// an argument below 1, no experts, negative or non-finite loads (checked by
// rebalance_experts).
void validate_rebalance(int num_layers, int num_logical_experts, const RebalanceExpertsOptions& options);

// `weight` [num_layers, num_logical_experts], row-major, loads >= 0. Scratch
// is kept per thread between calls (no allocation once warm besides the
// outputs); calls from several threads are independent.
ExpertRebalance rebalance_experts(std::span<const float> weight, int num_layers, int num_logical_experts,
                                  const RebalanceExpertsOptions& options);

}  // namespace epmoe::balance
