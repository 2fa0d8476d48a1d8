// Double-precision references and error measures shared by the kernel tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/rng.h"

namespace epmoe::testing {

// Whether n floats have the same bits; n == 0 compares nothing (empty data may be null).
inline bool same_bits(const float* a, const float* b, std::int64_t n) {
  return n == 0 || std::memcmp(a, b, sizeof(float) * static_cast<std::size_t>(n)) == 0;
}
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), static_cast<std::int64_t>(a.size()));
}

inline std::vector<float> random_vector(std::int64_t size, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> values(size);
  for (float& v : values) v = rng.uniform(-1.0f, 1.0f);
  return values;
}

// op(a)[i, p] for a row-major a that is [rows, cols], or [cols, rows] if transposed.
inline double element(const float* a, std::int64_t i, std::int64_t p, std::int64_t rows, std::int64_t cols,
                      bool transposed) {
  return transposed ? a[p * rows + i] : a[i * cols + p];
}

struct ReferenceGemm {
  std::vector<double> c;        // m x n, op(a) op(b) (+ c_in)
  std::vector<double> abs_sum;  // m x n, sum_p |op(a)[i,p]| |op(b)[p,j]|, for error bounds
};

inline ReferenceGemm reference_gemm(const float* a, const float* b, const float* c_in, std::int64_t m, std::int64_t n,
                                    std::int64_t k, bool transpose_a, bool transpose_b) {
  ReferenceGemm ref{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = c_in != nullptr ? c_in[i * n + j] : 0.0, abs_sum = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double product = element(a, i, p, m, k, transpose_a) * element(b, p, j, k, n, transpose_b);
        sum += product;
        abs_sum += std::abs(product);
      }
      ref.c[i * n + j] = sum;
      ref.abs_sum[i * n + j] = abs_sum;
    }
  }
  return ref;
}

// max|got - ref| / max|ref| (DESIGN.md §3); 0 for an all-zero reference that is matched.
template <typename Got, typename Ref>
double relative_error(const Got& got, const Ref& ref) {
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - ref[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref[i])));
  }
  return max_ref == 0.0 ? max_diff : max_diff / max_ref;
}

constexpr double kF32RelativeTolerance = 1e-5;  // DESIGN.md §3

}  // namespace epmoe::testing
