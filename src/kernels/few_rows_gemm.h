// The f32 product c[m, n] (+)= a[m, k] b[k, n] for a few rows of a (an
// expert with 1-4 tokens: decoding, or many experts per rank), as one pass
// over b's rows that adds each into the m rows of c while they sit in L1.
//
// Why not the GEMM library: with a few rows a product is bound by reading b
// (2 m flops per weight), and oneDNN 2.6's gemm:jit (AVX2) reached only
// 0.5-0.6 of that bound at 2-4 rows with the weights cold and 0.2-0.5 with
// them warm, OpenBLAS no better (bench/few_rows.cc, docs/BENCHMARKS.md
// issue 29, 2026-12-07 evening). This loop, plain C++ that the compiler
// vectorises for whatever -march the build targets (no intrinsics), ran
// 1.03-2.2x oneDNN's time at m = 1-4 over H x F = 128x256 to 2048x768,
// warm and cold, and lost from m = 6, hence kFewRows.
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
