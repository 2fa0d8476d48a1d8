// Dense GEMM on oneDNN's matmul, row-major, contiguous operands:
//   c[m, n] (+)= op(a)[m, k] * op(b)[k, n]
// op(a) = a ([m, k]) or a^T (a stored [k, m]); op(b) = b ([k, n]) or b^T
// (b stored [n, k]). `accumulate` adds into c instead of overwriting it.
// Why oneDNN and not OpenBLAS: DESIGN.md §4.3 (~2x on this machine's cores).
// Primitives are cached per (shape, transposes, dtype, accumulate), so a
// repeated shape costs one lookup, not a primitive creation.
#pragma once

#include <cstdint>

#include "kernels/compute_dtype.h"

namespace epmoe {

struct GemmArgs {
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  bool accumulate = false;
  ComputeDType compute_dtype = ComputeDType::f32;
};

// m, n or k may be zero: then c is left alone (accumulate) or zero-filled.
void gemm(const GemmArgs& args);

}  // namespace epmoe
