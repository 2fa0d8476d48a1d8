// The vector kernels of rebalance_experts (balance/rebalance_experts.cc):
//  * first_min_index / first_max_index: the index of the first smallest /
//    largest of a few doubles (the lightest GPU with room for each copy
//    packed, the largest load per copy for each copy added);
//  * descending_order: indices of a few dozen doubles, largest first.
// Ties go to the lowest index, exactly as the scalar loops with a strict
// comparison give them, so a placement does not depend on which version
// was compiled: AVX-512 (8 lanes), AVX2 (4 lanes; what valgrind runs) or
// plain C++. Values are never NaN here (loads are validated finite);
// +-infinity marks excluded entries.
#pragma once

#include <cstdint>
#include <limits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace epmoe::balance {

#if defined(__AVX512F__)
namespace detail {
// Lanes [0, count) of an 8-lane mask (none for count <= 0, all from 8 up).
inline __mmask8 first_lanes(int count) {
  if (count <= 0) return 0;
  return count >= 8 ? static_cast<__mmask8>(0xFF) : static_cast<__mmask8>((1u << count) - 1);
}
// The smallest / largest lane, by swapping halves, pairs and neighbours.
// Every intrinsic here is the masked form with all lanes: GCC 12's unmasked
// forms pass an "undefined" vector that -Wmaybe-uninitialized reports (bug
// 105593).
constexpr __mmask8 kAllLanes = 0xFF;
inline double reduce_min(__m512d x) {
  x = _mm512_mask_min_pd(x, kAllLanes, x, _mm512_mask_shuffle_f64x2(x, kAllLanes, x, x, 0b01001110));
  x = _mm512_mask_min_pd(x, kAllLanes, x, _mm512_mask_shuffle_f64x2(x, kAllLanes, x, x, 0b10110001));
  return _mm512_cvtsd_f64(_mm512_mask_min_pd(x, kAllLanes, x, _mm512_mask_permute_pd(x, kAllLanes, x, 0b01010101)));
}
inline double reduce_max(__m512d x) {
  x = _mm512_mask_max_pd(x, kAllLanes, x, _mm512_mask_shuffle_f64x2(x, kAllLanes, x, x, 0b01001110));
  x = _mm512_mask_max_pd(x, kAllLanes, x, _mm512_mask_shuffle_f64x2(x, kAllLanes, x, x, 0b10110001));
  return _mm512_cvtsd_f64(_mm512_mask_max_pd(x, kAllLanes, x, _mm512_mask_permute_pd(x, kAllLanes, x, 0b01010101)));
}
}  // namespace detail
#endif

// The first i in [0, n) with v[i] == min(v), n >= 1.
inline int first_min_index(const double* v, int n) {
#if defined(__AVX512F__)
  if (n <= 8) {  // a node's GPUs, usually: one vector, no loop
    const __mmask8 lanes = detail::first_lanes(n);
    const __m512d x = _mm512_mask_loadu_pd(_mm512_set1_pd(std::numeric_limits<double>::infinity()), lanes, v);
    const __mmask8 equal = _mm512_cmp_pd_mask(x, _mm512_set1_pd(detail::reduce_min(x)), _CMP_EQ_OQ);
    return __builtin_ctz(equal);
  }
  __m512d smallest = _mm512_set1_pd(std::numeric_limits<double>::infinity());
  for (int i = 0; i < n; i += 8) {
    const __mmask8 lanes = detail::first_lanes(n - i);
    smallest = _mm512_mask_min_pd(smallest, lanes, smallest, _mm512_maskz_loadu_pd(lanes, v + i));
  }
  const __m512d target = _mm512_set1_pd(detail::reduce_min(smallest));
  for (int i = 0; i < n; i += 8) {
    const __mmask8 lanes = detail::first_lanes(n - i);
    const __mmask8 equal = _mm512_mask_cmp_pd_mask(lanes, _mm512_maskz_loadu_pd(lanes, v + i), target, _CMP_EQ_OQ);
    if (equal != 0) return i + __builtin_ctz(equal);
  }
  return 0;
#elif defined(__AVX2__)
  int i = 0;
  __m256d smallest = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  for (; i + 4 <= n; i += 4) smallest = _mm256_min_pd(smallest, _mm256_loadu_pd(v + i));
  __m128d half = _mm_min_pd(_mm256_castpd256_pd128(smallest), _mm256_extractf128_pd(smallest, 1));
  double m = _mm_cvtsd_f64(_mm_min_sd(half, _mm_unpackhi_pd(half, half)));
  for (int j = i; j < n; ++j) m = v[j] < m ? v[j] : m;
  const __m256d target = _mm256_set1_pd(m);
  for (int k = 0; k < i; k += 4) {
    const int equal = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(v + k), target, _CMP_EQ_OQ));
    if (equal != 0) return k + __builtin_ctz(equal);
  }
  for (int j = i; j < n; ++j)
    if (v[j] == m) return j;
  return 0;
#else
  int best = 0;
  for (int i = 1; i < n; ++i) best = v[i] < v[best] ? i : best;
  return best;
#endif
}

// The first i in [0, n) with v[i] == max(v), n >= 1.
inline int first_max_index(const double* v, int n) {
#if defined(__AVX512F__)
  if (n <= 8) {
    const __mmask8 lanes = detail::first_lanes(n);
    const __m512d x = _mm512_mask_loadu_pd(_mm512_set1_pd(-std::numeric_limits<double>::infinity()), lanes, v);
    const __mmask8 equal = _mm512_cmp_pd_mask(x, _mm512_set1_pd(detail::reduce_max(x)), _CMP_EQ_OQ);
    return __builtin_ctz(equal);
  }
  __m512d largest = _mm512_set1_pd(-std::numeric_limits<double>::infinity());
  for (int i = 0; i < n; i += 8) {
    const __mmask8 lanes = detail::first_lanes(n - i);
    largest = _mm512_mask_max_pd(largest, lanes, largest, _mm512_maskz_loadu_pd(lanes, v + i));
  }
  const __m512d target = _mm512_set1_pd(detail::reduce_max(largest));
  for (int i = 0; i < n; i += 8) {
    const __mmask8 lanes = detail::first_lanes(n - i);
    const __mmask8 equal = _mm512_mask_cmp_pd_mask(lanes, _mm512_maskz_loadu_pd(lanes, v + i), target, _CMP_EQ_OQ);
    if (equal != 0) return i + __builtin_ctz(equal);
  }
  return 0;
#elif defined(__AVX2__)
  int i = 0;
  __m256d largest = _mm256_set1_pd(-std::numeric_limits<double>::infinity());
  for (; i + 4 <= n; i += 4) largest = _mm256_max_pd(largest, _mm256_loadu_pd(v + i));
  __m128d half = _mm_max_pd(_mm256_castpd256_pd128(largest), _mm256_extractf128_pd(largest, 1));
  double m = _mm_cvtsd_f64(_mm_max_sd(half, _mm_unpackhi_pd(half, half)));
  for (int j = i; j < n; ++j) m = v[j] > m ? v[j] : m;
  const __m256d target = _mm256_set1_pd(m);
  for (int k = 0; k < i; k += 4) {
    const int equal = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(v + k), target, _CMP_EQ_OQ));
    if (equal != 0) return k + __builtin_ctz(equal);
  }
  for (int j = i; j < n; ++j)
    if (v[j] == m) return j;
  return 0;
#else
  int best = 0;
  for (int i = 1; i < n; ++i) best = v[i] > v[best] ? i : best;
  return best;
#endif
}

// order[0, n): the indices of v, largest value first, equal values by index.
// Element j goes to position #{i: v[i] > v[j]} + #{i < j: v[i] == v[j]}:
// O(n^2) comparisons, but branch-free and 8 at a time, where a comparison
// sort of a few dozen (value, index) pairs mispredicts about every other
// branch. For a few dozen values (rebalance_experts: up to 64).
inline void descending_order(const double* v, int n, int* order) {
#if defined(__AVX512F__)
  for (int j = 0; j < n; ++j) {
    const __m512d x = _mm512_set1_pd(v[j]);
    int position = 0;
    for (int i = 0; i < n; i += 8) {
      const __mmask8 lanes = detail::first_lanes(n - i);
      const __m512d y = _mm512_maskz_loadu_pd(lanes, v + i);
      const __mmask8 greater = _mm512_mask_cmp_pd_mask(lanes, y, x, _CMP_GT_OQ);
      const __mmask8 equal_before = _mm512_mask_cmp_pd_mask(detail::first_lanes(j - i), y, x, _CMP_EQ_OQ);
      position += __builtin_popcount(static_cast<unsigned>(greater | equal_before));
    }
    order[position] = j;
  }
#else
  for (int j = 0; j < n; ++j) {
    const double x = v[j];
    int position = 0;
    for (int i = 0; i < n; ++i) position += (v[i] > x) | ((v[i] == x) & (i < j));
    order[position] = j;
  }
#endif
}

}  // namespace epmoe::balance
