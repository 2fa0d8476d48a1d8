// RMSNorm forward and backward. Every sum (of a row, of a column) is taken in
// double, in index order: the order is then fixed by the shapes alone, and
// its rounding is negligible next to the fp32 result's even for H or N in the
// thousands.
#include "model/rms_norm.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/threading.h"

namespace epmoe {
namespace {

// dscale's unit of parallel work: 64 doubles of accumulator (one KiB of
// stack) and a 256-byte run of each row.
constexpr std::int64_t kDscaleColumnBlock = 64;

// The smallest number of work units, of `unit_elements` elements each, worth
// giving to one thread.
std::int64_t grain_for(std::int64_t unit_elements) {
  return std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(1, unit_elements));
}

void check_rows(const Tensor& t, std::int64_t rows, std::int64_t hidden) {
  EPMOE_CHECK(t.dtype() == DType::f32);
  EPMOE_CHECK_EQ(t.rank(), 2);
  EPMOE_CHECK_EQ(t.dim(0), rows);
  EPMOE_CHECK_EQ(t.dim(1), hidden);
}

void check_vector(const Tensor& t, std::int64_t size) {
  EPMOE_CHECK(t.dtype() == DType::f32);
  EPMOE_CHECK_EQ(t.rank(), 1);
  EPMOE_CHECK_EQ(t.dim(0), size);
}

}  // namespace

void rms_norm_forward(const Tensor& x, const Tensor& scale, float eps, Tensor& y, Tensor& inv_rms) {
  EPMOE_CHECK_EQ(x.rank(), 2);
  const std::int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  const ComputeScope charge("rms_norm forward", {.flops = 4.0 * x.numel(), .bytes = 8.0 * x.numel()});
  check_rows(x, num_tokens, hidden);
  check_rows(y, num_tokens, hidden);
  check_vector(scale, hidden);
  check_vector(inv_rms, num_tokens);
  EPMOE_CHECK_GT(hidden, 0);
  EPMOE_CHECK_GT(eps, 0.0f);
  if (num_tokens == 0) return;
  const float* xp = x.data<float>();
  const float* sp = scale.data<float>();
  float* yp = y.data<float>();
  float* rp = inv_rms.data<float>();
  parallel_for(num_tokens, grain_for(hidden), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t n = begin; n < end; ++n) {
      const float* row = xp + n * hidden;
      double sum_sq = 0.0;
      for (std::int64_t j = 0; j < hidden; ++j) sum_sq += double(row[j]) * row[j];
      const float r = static_cast<float>(1.0 / std::sqrt(sum_sq / double(hidden) + double(eps)));
      rp[n] = r;
      float* out = yp + n * hidden;
      for (std::int64_t j = 0; j < hidden; ++j) out[j] = row[j] * r * sp[j];
    }
  });
}

// With r = inv_rms[n] and s = scale:
//   dx[j]     += r s[j] dy[j] - r^3 / H * x[j] * sum_k dy[k] s[k] x[k]
//   dscale[j]  = sum_n dy[n, j] x[n, j] r[n]
// dx is row-parallel (rows are independent). dscale is parallel over blocks
// of kDscaleColumnBlock columns at fixed offsets, with the rows looped in order
// inside each block, so every column's sum has the same order for any thread
// count (a row-parallel reduction would not). The blocks are fixed rather
// than the thread's slice so that a column always sits at the same place in
// its vectorised loop (vector body or remainder, which may round differently
// once the compiler fuses multiply-adds).
void rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dy, Tensor& dx,
                       Tensor& dscale) {
  EPMOE_CHECK_EQ(x.rank(), 2);
  const std::int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  const ComputeScope charge("rms_norm backward", {.flops = 8.0 * x.numel(), .bytes = 12.0 * x.numel()});
  check_rows(x, num_tokens, hidden);
  check_rows(dy, num_tokens, hidden);
  check_rows(dx, num_tokens, hidden);
  check_vector(scale, hidden);
  check_vector(inv_rms, num_tokens);
  check_vector(dscale, hidden);
  const float* xp = x.data<float>();
  const float* sp = scale.data<float>();
  const float* rp = inv_rms.data<float>();
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  float* dsp = dscale.data<float>();

  parallel_for(num_tokens, grain_for(hidden), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t n = begin; n < end; ++n) {
      const float* xr = xp + n * hidden;
      const float* dyr = dyp + n * hidden;
      double dot = 0.0;
      for (std::int64_t j = 0; j < hidden; ++j) dot += double(dyr[j]) * sp[j] * xr[j];
      const double r = rp[n];
      const float coeff = static_cast<float>(r * r * r * dot / double(hidden));
      const float rf = rp[n];
      float* dxr = dxp + n * hidden;
      for (std::int64_t j = 0; j < hidden; ++j) dxr[j] += rf * sp[j] * dyr[j] - coeff * xr[j];
    }
  });

  const std::int64_t num_blocks = (hidden + kDscaleColumnBlock - 1) / kDscaleColumnBlock;
  parallel_for(num_blocks, grain_for(num_tokens * kDscaleColumnBlock), [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t block = first; block < last; ++block) {
      const std::int64_t begin = block * kDscaleColumnBlock;
      const std::int64_t width = std::min(kDscaleColumnBlock, hidden - begin);
      double sums[kDscaleColumnBlock] = {};
      for (std::int64_t n = 0; n < num_tokens; ++n) {
        const float* xr = xp + n * hidden + begin;
        const float* dyr = dyp + n * hidden + begin;
        const double r = rp[n];
        for (std::int64_t j = 0; j < width; ++j) sums[j] += double(dyr[j]) * xr[j] * r;
      }
      for (std::int64_t j = 0; j < width; ++j) dsp[begin + j] = static_cast<float>(sums[j]);
    }
  });
}

}  // namespace epmoe
