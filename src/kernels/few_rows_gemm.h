// The f32 product c[m, n] (+)= a[m, k] b[k, n] for a few rows of a (an
// expert with 1-4 tokens: decoding, or many experts per rank), as one pass
// over b's rows that adds each into the m rows of c while they sit in L1.
//
// Why not the GEMM library: with a few rows a product is bound by reading b
// (2 m flops per weight), and oneDNN 2.6's gemm:jit (AVX2) reached 0.3-0.65
// of that bound at 2-16 rows with the weights cold, 0.1-0.8 warm, and
// OpenBLAS was no better below 5 rows (bench/few_rows.cc, docs/BENCHMARKS.md
// issue 29, 2026-12-07 evening). This loop, plain C++ that the compiler
// vectorises for whatever -march the build targets (no intrinsics), ran
// at 1.29x oneDNN's speed (geometric mean; 1.66x at 2 rows, 1.31x at 3,
// 1.13x at 4, 1.14x at 1) over the forward's two products at H x F =
// 128x256 to 7168x2048, weights cold and warm; slower in 6 of those 64
// cases (0.86-0.97x, at 1 and 4 rows), and no longer ahead at 6-8 rows (a
// probe of the same loop), hence kFewRows.
//
// Bits: every c[i, j] sums its k products in a fixed order (blocks of 8
// terms, pairwise within a block, blocks in order), the same for every
// thread count and vector width; another order than oneDNN's, so a group of
// at most kFewRows rows has other last bits than a larger one, within the
// same f32 bound (tests/kernels/few_rows_gemm_test.cc).
#pragma once

#include <cstdint>

namespace epmoe {

inline constexpr std::int64_t kFewRows = 4;

// Row-major, contiguous: a [m, k], b [k, n], c [m, n]; 1 <= m <= kFewRows,
// n, k >= 1. `accumulate` adds into c instead of overwriting it. Slices of
// columns go to the calling thread's compute threads (core/threading.h)
// when b is large enough to pay for them; the bits do not depend on it.
void few_rows_gemm(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
                   bool accumulate);

}  // namespace epmoe
