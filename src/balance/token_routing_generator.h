// Per-token routing for benches of dedup and replica choice: the model of
// balance/load_generator.h (Zipf popularity 1 / (i + 1)^s over popularity
// ranks, K distinct experts per token drawn one after another among those not
// yet picked, hot experts spread or packed), but returning every token's K
// expert ids instead of per-expert counts. Step 0's mapping (no drift).
//
// Randomness: one seeded epmoe::Rng; rank r's tokens draw from stream
// fork(r), so one rank's routing depends only on the seed, the options and r.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/load_generator.h"

namespace epmoe::balance {

// [R][T * K] expert ids, token-major (T = num_tokens_per_rank). num_steps and
// drift are ignored. ConfigError as validate(options).
std::vector<std::vector<std::int32_t>> generate_token_routing(const LoadGeneratorOptions& options);

}  // namespace epmoe::balance
