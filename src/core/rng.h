// Rng: a seeded, per-object random generator (xoshiro256** seeded through
// splitmix64). There is no global generator anywhere in epmoe (a lesson of the
// seeds' review): whoever needs randomness owns an Rng, usually derived with
// Rng(seed).fork(stream) so that rank r, layer l, step s each get an
// independent, reproducible stream. Same seed => same numbers on every
// platform: the distributions below are written out here rather than taken
// from <random>, whose distributions are implementation-defined.
#pragma once

#include <cstdint>

namespace epmoe {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  // An independent generator for a sub-stream (rank, layer, step, ...).
  Rng fork(std::uint64_t stream) const;

  std::uint64_t next_u64();
  double uniform01();                          // [0, 1), 53 random bits
  float uniform(float low, float high);        // [low, high)
  double normal();                             // standard normal (Box-Muller)
  std::uint64_t uniform_int(std::uint64_t n);  // [0, n), unbiased; n > 0

 private:
  std::uint64_t seed_;
  std::uint64_t state_[4];
};

}  // namespace epmoe
