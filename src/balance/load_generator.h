// Synthetic routing skew for tests, benches and `epmoe balance --generate`:
// per-step global expert loads [steps, E] from a Zipf popularity over experts.
//
// Model. Popularity rank i (0 = hottest) has weight 1 / (i + 1)^s. Every step,
// each of R * T tokens picks K distinct experts, drawn one after another with
// probability proportional to weight among those not yet picked (what a top-K
// router does with Zipf-skewed scores). Which expert holds popularity rank i:
//   spread: the hot experts go round-robin over ranks (rank i % R, local
//           index i / R) — the case a good home placement already produces;
//   packed: expert i, so the E/R hottest all live on rank 0 — the worst case.
// Drift changes that mapping over time, one event every drift_interval steps:
//   swap:   one random adjacent pair of popularity ranks trades places;
//   rotate: every expert moves up one popularity rank, the hottest drops to
//           the coldest (the hot set turns over fully in E events).
//
// Randomness: one seeded epmoe::Rng, never a global generator. Step s's tokens
// draw from stream fork(s) of the token stream, drift from its own stream, so
// a step's loads depend only on the seed, the options and s's mapping.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/expert_load_history.h"

namespace epmoe::balance {

enum class HotExpertPlacement { spread, packed };
enum class PopularityDrift { none, swap, rotate };

struct LoadGeneratorOptions {
  int num_experts = 64;
  int num_ranks = 8;
  std::int64_t num_tokens_per_rank = 1024;
  int top_k = 8;
  int num_steps = 200;
  double zipf_exponent = 1.2;  // s; 0 = uniform popularity
  HotExpertPlacement placement = HotExpertPlacement::spread;
  PopularityDrift drift = PopularityDrift::none;
  int drift_interval_steps = 1;
  std::uint64_t seed = 0;
};

// ConfigError naming the key (experts, ranks, top_k, ...) and the rule.
void validate(const LoadGeneratorOptions& options);

// expert_of_popularity_rank[i] at step 0.
std::vector<int> initial_expert_of_popularity_rank(const LoadGeneratorOptions& options);

ExpertLoadHistory generate_expert_loads(const LoadGeneratorOptions& options);

}  // namespace epmoe::balance
