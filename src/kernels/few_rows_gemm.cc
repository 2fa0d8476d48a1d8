#include "kernels/few_rows_gemm.h"

#include <algorithm>
#include <cstdint>

#include "core/threading.h"

namespace epmoe {
namespace {

// Two threads, each with a slice of the columns, against one, m = 2,
// k = 1024, weights warm and cold, two runs (AMD EPYC, 2026-12-07, load
// 2-3): 0.86-1.25x at 256K weights of b, 0.69-1.39x at 512K, 1.07-1.62x at
// 1M, 1.36-1.85x from 2M (one outlier of 0.88). So a thread gets at least
// 512K weights (2 MiB). Threads take contiguous column slices of every row;
// no finer column blocks: with c's few rows read from L1 or L2 either way,
// whole rows of b stream best (1 KiB pieces of 7168 rows ran at 0.6-0.8x of
// whole rows).
constexpr std::int64_t kWeightsPerThread = std::int64_t{1} << 19;

// c[:, j0:j1] (+)= a b[:, j0:j1]. Per row of a, eight rows of b at a time:
// one load and store of c per eight products, and eight streams of b the
// prefetcher follows. The j loop is what the compiler vectorises.
void column_block(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
                  std::int64_t j0, std::int64_t j1, bool accumulate) {
  const std::int64_t width = j1 - j0;
  if (!accumulate) {
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * n + j0, c + i * n + j1, 0.0f);
  }
  std::int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    const float* __restrict b0 = b + p * n + j0;
    const float* __restrict b1 = b0 + n;
    const float* __restrict b2 = b1 + n;
    const float* __restrict b3 = b2 + n;
    const float* __restrict b4 = b3 + n;
    const float* __restrict b5 = b4 + n;
    const float* __restrict b6 = b5 + n;
    const float* __restrict b7 = b6 + n;
    for (std::int64_t i = 0; i < m; ++i) {
      const float* ai = a + i * k + p;
      const float a0 = ai[0], a1 = ai[1], a2 = ai[2], a3 = ai[3], a4 = ai[4], a5 = ai[5], a6 = ai[6], a7 = ai[7];
      float* __restrict ci = c + i * n + j0;
      for (std::int64_t j = 0; j < width; ++j) {
        ci[j] += ((a0 * b0[j] + a1 * b1[j]) + (a2 * b2[j] + a3 * b3[j])) +
                 ((a4 * b4[j] + a5 * b5[j]) + (a6 * b6[j] + a7 * b7[j]));
      }
    }
  }
  for (; p < k; ++p) {
    const float* __restrict bp = b + p * n + j0;
    for (std::int64_t i = 0; i < m; ++i) {
      const float ai = a[i * k + p];
      float* __restrict ci = c + i * n + j0;
      for (std::int64_t j = 0; j < width; ++j) ci[j] += ai * bp[j];
    }
  }
}

}  // namespace

void few_rows_gemm(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
                   bool accumulate) {
  const auto run = [&](std::int64_t j0, std::int64_t j1) { column_block(a, b, c, m, n, k, j0, j1, accumulate); };
  const std::int64_t columns_per_thread = std::max<std::int64_t>(1, kWeightsPerThread / k);
  if (compute_threads() == 1 || n < 2 * columns_per_thread) {
    run(0, n);
  } else {
    parallel_for(n, columns_per_thread, run);
  }
}

}  // namespace epmoe
