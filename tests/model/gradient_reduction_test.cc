// GradientReduction (model/gradient_reduction.h): bucket by bucket, every
// element of the summed buffer is bit-equal to one comm::all_reduce of the
// whole buffer, for any buckets, R = 2..5; the trainer's policy needs no
// padding (its bytes are the one all-reduce's); a rank that fails with
// buckets in flight fails every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "comm/all_reduce.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/gradient_reduction.h"
#include "transport/threads/launcher.h"

namespace epmoe {
namespace {

// Rank r's values: magnitudes over several decades, so that the order of a
// sum changes its rounding.
std::vector<float> rank_values(int rank, std::int64_t n) {
  Rng rng = Rng(77).fork(static_cast<std::uint64_t>(rank));
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = static_cast<float>(rng.normal() * std::pow(10.0, 3.0 * rng.uniform01()));
  return values;
}

transport::threads::ThreadsOptions one_thread() {
  transport::threads::ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  return options;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Sums {
  std::vector<float> reference;  // one all_reduce of the whole buffer
  std::vector<float> bucketed;
  std::vector<float> naive;  // one all_reduce per bucket
  std::int64_t moved = 0;
};

// Rank 0's sums. `cuts`: the buckets' boundaries, descending from n to 0
// (the order the backward fills the buffer); `policy`: through ready()
// instead of start().
Sums run(int num_ranks, std::int64_t n, const std::vector<std::int64_t>& cuts, bool policy) {
  Sums out;
  std::mutex mutex;
  transport::threads::run_ranks(num_ranks, one_thread(), [&](transport::Communicator& comm) {
    const std::vector<float> own = rank_values(comm.rank(), n);
    std::vector<float> reference = own, bucketed = own, naive = own;
    comm::all_reduce(comm, {.data = reference.data(), .num_elements = n, .tag = 1}).wait();
    for (std::size_t i = 1; i < cuts.size(); ++i) {
      const std::int64_t begin = cuts[i], end = cuts[i - 1];
      comm::all_reduce(
          comm, {.data = naive.data() + begin, .num_elements = end - begin, .tag = 2 + static_cast<std::uint32_t>(i)})
          .wait();
    }
    GradientReduction reduction(comm, bucketed, 100, comm::kDefaultTimeout);
    for (std::size_t i = 1; i < cuts.size(); ++i) {
      if (policy) {
        reduction.ready(cuts[i]);
      } else {
        reduction.start(cuts[i], cuts[i - 1]);
      }
    }
    reduction.wait();
    if (comm.rank() == 0) {
      std::lock_guard lock(mutex);
      out = {reference, bucketed, naive, reduction.elements_moved_over_all_ranks()};
    }
  });
  return out;
}

TEST(GradientReduction, AnyBucketsGiveTheBitsOfOneAllReduce) {
  for (const int ranks : {2, 3, 4, 5}) {
    for (const std::int64_t n : {std::int64_t{1000}, std::int64_t{37}, std::int64_t{7}}) {
      // Cuts inside blocks, inside lanes, one-element buckets, and whole-buffer.
      const std::vector<std::vector<std::int64_t>> schemes = {
          {n, 0}, {n, n - 1, n / 2, n / 3, 1, 0}, {n, 2 * n / 3, n / 5, 0}};
      for (const auto& cuts : schemes) {
        const Sums sums = run(ranks, n, cuts, /*policy=*/false);
        EXPECT_TRUE(same_bits(sums.bucketed, sums.reference))
            << "R=" << ranks << " n=" << n << " buckets=" << cuts.size() - 1;
      }
    }
  }
}

TEST(GradientReduction, APlainAllReducePerBucketChangesBits) {
  // Why the bucket layout (and padding) exists: an all-reduce of a
  // sub-range lays out its own blocks and lanes and sums some elements in
  // another order, so some bits differ.
  const std::int64_t n = 1000;
  for (const int ranks : {3, 4, 5}) {
    const Sums sums = run(ranks, n, {n, 700, 450, 120, 0}, /*policy=*/false);
    ASSERT_TRUE(same_bits(sums.bucketed, sums.reference));
    EXPECT_FALSE(same_bits(sums.naive, sums.reference)) << "R=" << ranks;
  }
}

TEST(GradientReduction, ThePolicyNeedsNoPaddingAndMovesTheOneAllReducesBytes) {
  const std::int64_t n = 1003;
  // The trainer's ready() calls: the tail first, as the backward finishes it.
  const std::vector<std::int64_t> calls = {n, 990, 800, 640, 500, 333, 12, 0};
  for (const int ranks : {2, 3, 4, 5}) {
    const Sums sums = run(ranks, n, calls, /*policy=*/true);
    EXPECT_TRUE(same_bits(sums.bucketed, sums.reference)) << "R=" << ranks;
    EXPECT_EQ(sums.moved, 2 * (ranks - 1) * n) << "R=" << ranks;
  }
}

TEST(GradientReduction, PaddedBucketsCountTheirPadding) {
  const std::int64_t n = 1000;
  const Sums sums = run(4, n, {n, 700, 450, 120, 0}, /*policy=*/false);
  EXPECT_GT(sums.moved, 2 * 3 * n);
}

TEST(GradientReduction, OneRankIsTheBufferItself) {
  const Sums sums = run(1, 50, {50, 20, 0}, /*policy=*/true);
  EXPECT_TRUE(same_bits(sums.bucketed, rank_values(0, 50)));
  EXPECT_EQ(sums.moved, 0);
}

TEST(GradientReduction, ARankFailingWithBucketsInFlightFailsEveryRank) {
  // Rank 1 throws with its bucket in flight (its reduction is destroyed
  // while unwinding); the others wait on buckets that cannot end. Every
  // rank must return (no hang until the 60 s timeout) and the launcher
  // reports rank 1's error.
  std::vector<int> woken(3, 0);
  try {
    transport::threads::run_ranks(3, one_thread(), [&](transport::Communicator& comm) {
      std::vector<float> data(4000, 1.0f);
      GradientReduction reduction(comm, data, 100, std::chrono::milliseconds(60000));
      if (comm.rank() == 1) {
        reduction.ready(2000);
        throw Error("rank 1 gave up mid-backward");
      }
      reduction.ready(2000);
      reduction.ready(0);
      try {
        reduction.wait();
      } catch (const Error&) {
        woken[static_cast<std::size_t>(comm.rank())] = 1;
        throw;
      }
    });
    FAIL() << "expected rank 1's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 gave up mid-backward"), std::string::npos) << e.what();
  }
  EXPECT_EQ(woken[0], 1);
  EXPECT_EQ(woken[2], 1);
}

}  // namespace
}  // namespace epmoe
