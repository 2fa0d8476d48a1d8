// What the two layer benchmarks (ep_layer_bench.cc on emulated links,
// modelled_layer_bench.cc on the modelled clock) share: the layer's shape
// from the command line, random weights and inputs, and the analytic chance
// that dedup saves a token's row.
#pragma once

#include <cstdint>

#include "bench_args.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace epmoe::bench {

struct LayerShape {
  int num_ranks;
  std::int64_t tokens, hidden, ffn;  // tokens per rank
  int num_experts, top_k;
};

// ranks (default_ranks), tokens_per_rank (256), hidden (256), ffn (128),
// experts (64), top_k (8).
LayerShape shape_from(const BenchArgs& args, int default_ranks);

// f32, normal(0, scale) entries.
Tensor random_tensor(Shape shape, Rng& rng, double scale);

// The draws every layer bench makes, so that their routings agree (the
// co-location bench re-routes exactly what the modelled runner times): a
// rank's own tokens and weights come from rank_rng(rank); the replicated
// gate [H, E], normal(0, 1/sqrt(H)), is the same on every rank.
Rng rank_rng(int rank);
Tensor replicated_gate(std::int64_t hidden, int num_experts);

// Probability that a token with K distinct uniform experts out of E hits at
// least one of a rank's E_l experts: 1 - C(E - E_l, K) / C(E, K).
double hit_probability(int num_experts, int experts_per_rank, int top_k);

}  // namespace epmoe::bench
