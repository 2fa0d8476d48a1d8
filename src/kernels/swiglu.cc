// SwiGLU, elementwise. The loops call an inline exp of our own because glibc's
// expf only vectorises (libmvec) under -ffast-math, which would also drop
// NaN/inf semantics everywhere else in the file.
#include "kernels/swiglu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/modelled_clock.h"
#include "core/threading.h"

namespace epmoe {
namespace {

// exp(x) for x <= 0, relative error ~2 ulp. Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2/2, then a degree-6 Taylor polynomial (truncation
// error r^7/7! < 2e-9 relative) and 2^n assembled in the exponent bits.
// Below about -87.7 the result flushes to 0 (the true value is < 1e-38, i.e.
// negligible next to 1 in every use below): the clamp at -88 makes n >= -127,
// whose exponent field 0 assembles 2^n as exactly 0.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // 10 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: float add rounds to integer
  // max(x, -88) on the bits: for x <= -0 (and NaN, which then acts as -88:
  // every caller multiplies by z, so a NaN z still gives NaN) a float is
  // smaller exactly when its bits, read as a signed integer, are larger.
  // std::max here let GCC split the loop at the clamp (constant-folding the
  // clamped branch), which kept the loops from vectorising.
  x = std::bit_cast<float>(std::min(std::bit_cast<std::int32_t>(x), std::bit_cast<std::int32_t>(-88.0f)));
  const float n = (x * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t exponent_bits = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(exponent_bits);
}

// sigmoid(z) without overflow: exp is only ever taken of -|z| <= 0, so the
// intermediate lies in [0, 1] for every z. As in PyTorch, silu(-inf) is NaN
// (-inf * 0); every finite z gives a finite result.
// Both branches are computed and one chosen by z's sign bit (-0 gives
// e * inv = 0.5 = inv): GCC does not if-convert a conditional float
// operation (-ftrapping-math), so with `z >= 0 ? inv : e * inv` the loops
// below did not vectorise ("control flow in loop") and ran at ~7 ns per
// element (bench_expert_passes, 2026-12-07). The same operations in the same
// order, so the same bits.
inline float sigmoid(float z) {
  const float e = exp_nonpositive(-std::abs(z));
  const float inv = 1.0f / (1.0f + e);
  const float negative = e * inv;
  const std::int32_t negative_mask = std::bit_cast<std::int32_t>(z) >> 31;  // all ones where the sign is set
  return std::bit_cast<float>((std::bit_cast<std::int32_t>(inv) & ~negative_mask) |
                              (std::bit_cast<std::int32_t>(negative) & negative_mask));
}

}  // namespace

void swiglu_forward(const float* h0, const float* h1, float* act, std::int64_t n) {
  const ComputeScope charge("swiglu forward", {.flops = 6.0 * n, .bytes = 12.0 * n});
  parallel_for(n, kElementwiseGrain, [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) act[i] = h0[i] * sigmoid(h0[i]) * h1[i];
  });
}

namespace {

// silu'(z) = s + z s (1 - s) = s (1 + z (1 - s)), s = sigmoid(z).
template <bool kWithActivation>
void swiglu_backward_pass(const float* h0, const float* h1, const float* dact, float* dh0, float* dh1, float* act,
                          std::int64_t n) {
  parallel_for(n, kElementwiseGrain, [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      const float z = h0[i];
      const float s = sigmoid(z);
      const float silu = z * s;
      const float dsilu = s * (1.0f + z * (1.0f - s));
      dh0[i] = dact[i] * h1[i] * dsilu;
      dh1[i] = dact[i] * silu;
      if constexpr (kWithActivation) act[i] = silu * h1[i];  // swiglu_forward's h0 * s * h1
    }
  });
}

}  // namespace

void swiglu_backward(const float* h0, const float* h1, const float* dact, float* dh0, float* dh1, std::int64_t n,
                     float* act) {
  const ComputeScope charge("swiglu backward",
                            {.flops = (act != nullptr ? 13.0 : 12.0) * n, .bytes = (act != nullptr ? 24.0 : 20.0) * n});
  if (act != nullptr)
    swiglu_backward_pass<true>(h0, h1, dact, dh0, dh1, act, n);
  else
    swiglu_backward_pass<false>(h0, h1, dact, dh0, dh1, nullptr, n);
}

}  // namespace epmoe
