// The few-rows product (kernels/few_rows_gemm.h) against the double
// reference, alone and as gemm() runs it: at 1-4 rows, odd and
// vector-edge n and k (k around its blocks of 8), overwriting and
// accumulating; its bits for one and two compute threads; NaN and infinity
// carried to the rows they reach; and which products gemm() gives it.
#include "kernels/few_rows_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/threading.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"
#include "reference.h"

namespace epmoe {
namespace {

using testing::random_vector;
using testing::reference_gemm;
using testing::same_bits;

constexpr double kUnitRoundoff = 0x1p-24;

// |c - exact| <= (k + 2) u sum|a_ip b_pj| (+ |c_in| when accumulating):
// every c[i, j] is a sum of k products and, accumulating, c_in, each
// addition rounding once (a blocked sum's bound is smaller).
void expect_within_f32_bound(const std::vector<float>& c, const testing::ReferenceGemm& ref,
                             const std::vector<float>* c_in, std::int64_t k, const std::string& where) {
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double magnitude = ref.abs_sum[i] + (c_in != nullptr ? std::abs((*c_in)[i]) : 0.0);
    ASSERT_LE(std::abs(c[i] - ref.c[i]), (k + 2) * kUnitRoundoff * magnitude + 1e-30) << where << " element " << i;
  }
}

TEST(FewRowsGemm, MatchesDoubleAtEveryRowCountAndEdgeSize) {
  for (std::int64_t m = 1; m <= kFewRows; ++m)
    for (std::int64_t n : {1, 7, 8, 33, 257})
      for (std::int64_t k : {1, 7, 8, 9, 16, 33, 130})
        for (bool accumulate : {false, true}) {
          const auto a = random_vector(m * k, 10 + m), b = random_vector(k * n, 20 + k);
          const auto c_in = random_vector(m * n, 30 + n);
          std::vector<float> c = accumulate ? c_in : std::vector<float>(m * n, std::nanf(""));
          few_rows_gemm(a.data(), b.data(), c.data(), m, n, k, accumulate);
          const auto ref =
              reference_gemm(a.data(), b.data(), accumulate ? c_in.data() : nullptr, m, n, k, false, false);
          expect_within_f32_bound(c, ref, accumulate ? &c_in : nullptr, k,
                                  "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                      " accumulate=" + std::to_string(accumulate));
        }
}

// Large enough for column slices on two threads (k n = 4M weights): the
// same bits as one thread, and right.
TEST(FewRowsGemm, TwoThreadsGiveOneThreadsBits) {
  const std::int64_t m = 3, n = 4099, k = 1031;
  const auto a = random_vector(m * k, 41), b = random_vector(k * n, 42);
  std::vector<float> one(m * n), two(m * n);
  const int budget = compute_threads();
  set_compute_threads(1);
  few_rows_gemm(a.data(), b.data(), one.data(), m, n, k, false);
  set_compute_threads(2);
  few_rows_gemm(a.data(), b.data(), two.data(), m, n, k, false);
  set_compute_threads(budget);
  EXPECT_TRUE(same_bits(one, two));
  const auto ref = reference_gemm(a.data(), b.data(), nullptr, m, n, k, false, false);
  expect_within_f32_bound(two, ref, nullptr, k, "two threads");
}

// A NaN or infinity in a row of a reaches that row of c and no other; one in
// a row of b reaches that column of every row.
TEST(FewRowsGemm, NonFiniteValuesReachExactlyTheirRowsAndColumns) {
  const std::int64_t m = 4, n = 19, k = 17;
  auto a = random_vector(m * k, 51), b = random_vector(k * n, 52);
  a[2 * k + 9] = std::numeric_limits<float>::quiet_NaN();  // row 2 of a
  b[11 * n + 5] = std::numeric_limits<float>::infinity();  // column 5 of b (row 11)
  std::vector<float> c(m * n);
  few_rows_gemm(a.data(), b.data(), c.data(), m, n, k, false);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      if (i == 2) {
        EXPECT_TRUE(std::isnan(c[i * n + j])) << i << "," << j;
      } else if (j == 5) {
        EXPECT_TRUE(std::isinf(c[i * n + j])) << i << "," << j;
      } else {
        EXPECT_TRUE(std::isfinite(c[i * n + j])) << i << "," << j;
      }
    }
}

// gemm() runs f32 products of at most kFewRows rows with a and b as stored
// on it (with a weight version and runtime m, as grouped_gemm calls them, and
// with pack_b), and everything else on oneDNN: one row more, b or a
// transposed, bf16.
TEST(FewRowsGemm, GemmGivesItExactlyTheFewRowsProducts) {
  if (f32_gemm_backend() != F32GemmBackend::onednn) GTEST_SKIP() << "EPMOE_F32_GEMM puts every f32 product elsewhere";
  const std::int64_t n = 40, k = 24;
  const auto a = random_vector((kFewRows + 1) * k, 61), b = random_vector(k * n, 62);
  std::vector<float> c((kFewRows + 1) * n);
  const auto ran_on = [&](GemmArgs args) {
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    reset_gemm_implementation_census();
    gemm(args);
    const auto census = gemm_implementation_census();
    EXPECT_EQ(census.size(), 1u);
    return census.empty() ? std::string() : census[0].implementation;
  };
  for (std::int64_t m = 1; m <= kFewRows; ++m) {
    EXPECT_EQ(ran_on({.m = m, .n = n, .k = k}), "epmoe:few_rows") << m;
    EXPECT_EQ(ran_on({.m = m, .n = n, .k = k, .dynamic_dim = GemmDynamicDim::m, .b_version = 7}), "epmoe:few_rows");
    EXPECT_EQ(ran_on({.m = m, .n = n, .k = k, .b_version = 8, .pack_b = true}), "epmoe:few_rows");
    const auto ref = reference_gemm(a.data(), b.data(), nullptr, m, n, k, false, false);
    expect_within_f32_bound(std::vector<float>(c.begin(), c.begin() + m * n), ref, nullptr, k, "gemm");
  }
  EXPECT_NE(ran_on({.m = kFewRows + 1, .n = n, .k = k}), "epmoe:few_rows");
  EXPECT_NE(ran_on({.m = 2, .n = k, .k = n, .transpose_b = true}), "epmoe:few_rows");
  EXPECT_NE(ran_on({.m = 2, .n = n, .k = 2, .transpose_a = true}), "epmoe:few_rows");
  if (bf16_gemm_supported()) {
    EXPECT_NE(ran_on({.m = 2, .n = n, .k = k, .compute_dtype = ComputeDType::bf16}), "epmoe:few_rows");
  }
  clear_gemm_weight_cache();
  reset_gemm_implementation_census();
}

// A grouped forward whose groups straddle the switch (0 to kFewRows + 2 rows)
// stays within the f32 bound of the double reference in every group.
TEST(FewRowsGemm, GroupedForwardAcrossTheSwitch) {
  const std::vector<std::int64_t> sizes = {0, 1, 2, 3, 4, 5, 6, 0, 4};
  std::int64_t rows = 0;
  for (std::int64_t s : sizes) rows += s;
  const std::int64_t k = 37, n = 29, groups = static_cast<std::int64_t>(sizes.size());
  const auto x = random_vector(rows * k, 71), w = random_vector(groups * k * n, 72);
  for (int threads : {1, 2}) {
    const int budget = compute_threads();
    set_compute_threads(threads);
    std::vector<float> out(rows * n, std::nanf(""));
    grouped_gemm_forward({.group_sizes = sizes, .k = k, .n = n, .weight_version = 5}, x.data(), w.data(), out.data());
    set_compute_threads(budget);
    std::int64_t row = 0;
    for (std::int64_t g = 0; g < groups; ++g) {
      const auto ref = reference_gemm(x.data() + row * k, w.data() + g * k * n, nullptr, sizes[g], n, k, false, false);
      expect_within_f32_bound(std::vector<float>(out.begin() + row * n, out.begin() + (row + sizes[g]) * n), ref,
                              nullptr, k, "group " + std::to_string(g) + ", threads " + std::to_string(threads));
      row += sizes[g];
    }
  }
  clear_gemm_weight_cache();
}

}  // namespace
}  // namespace epmoe
