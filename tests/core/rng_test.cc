#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace epmoe {
namespace {

TEST(Rng, SameSeedSameStream) {
  Rng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const auto x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differs |= x != c.next_u64();
  }
  EXPECT_TRUE(differs);
}

TEST(Rng, ForksAreIndependentAndReproducible) {
  Rng base(1);
  Rng f0 = base.fork(0), f1 = base.fork(1), f0_again = Rng(1).fork(0);
  EXPECT_NE(f0.next_u64(), f1.next_u64());
  Rng g0 = base.fork(0);
  EXPECT_EQ(g0.next_u64(), f0_again.next_u64());
}

TEST(Rng, UniformIntIsInRangeAndRoughlyFlat) {
  Rng rng(3);
  std::vector<int> counts(7, 0);
  const int draws = 70000;
  for (int i = 0; i < draws; ++i) counts[rng.uniform_int(7)] += 1;
  for (int c : counts) EXPECT_NEAR(c, draws / 7, 500);  // ~6 sigma
}

TEST(Rng, NormalMoments) {
  Rng rng(11);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal();
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.015);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.015);
}

}  // namespace
}  // namespace epmoe
