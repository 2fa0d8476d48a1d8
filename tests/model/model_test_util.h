// Helpers shared by the model building-block tests: random tensors, double
// copies, the relative error of DESIGN.md §3, central finite differences in
// double, and a scope that sets the calling thread's compute budget.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "core/tensor.h"
#include "core/threading.h"

namespace epmoe::testing {

constexpr double kF32RelativeTolerance = 1e-5;  // DESIGN.md §3
// Central differences in double with step 1e-5 on O(1) inputs: truncation
// ~h^2 = 1e-10 and cancellation ~1e-16 / h = 1e-11, both far below this.
constexpr double kFiniteDifferenceStep = 1e-5;
constexpr double kFiniteDifferenceTolerance = 1e-7;

inline Tensor random_tensor(Shape shape, std::uint64_t seed, float low = -1.0f, float high = 1.0f) {
  Tensor t(DType::f32, std::move(shape));
  Rng rng(seed);
  for (float& v : t.span<float>()) v = rng.uniform(low, high);
  return t;
}

// A tensor full of NaN: an output that must be overwritten shows it if not.
inline Tensor nan_tensor(Shape shape) {
  Tensor t(DType::f32, std::move(shape));
  for (float& v : t.span<float>()) v = std::nanf("");
  return t;
}

inline Tensor ids_tensor(const std::vector<std::int32_t>& ids) {
  Tensor t(DType::i32, {static_cast<std::int64_t>(ids.size())});
  std::copy(ids.begin(), ids.end(), t.data<std::int32_t>());
  return t;
}

inline std::vector<double> to_double(const Tensor& t) {
  const auto values = t.span<float>();
  return {values.begin(), values.end()};
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.size_bytes())) == 0;
}

// max|got - ref| / max|ref|; max|got - ref| for an all-zero reference. NaN in
// got yields NaN, which fails every <= comparison.
template <typename Got>
double relative_error(const Got& got, const std::vector<double>& ref) {
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (std::isnan(diff)) return diff;
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  return max_ref == 0.0 ? max_diff : max_diff / max_ref;
}
inline double relative_error(const Tensor& got, const std::vector<double>& ref) {
  EXPECT_EQ(static_cast<std::size_t>(got.numel()), ref.size());
  return relative_error(got.data<float>(), ref);
}

// d loss / d point[i] by central differences, all in double.
inline std::vector<double> numeric_gradient(std::vector<double> point,
                                            const std::function<double(const std::vector<double>&)>& loss) {
  std::vector<double> grad(point.size());
  for (std::size_t i = 0; i < point.size(); ++i) {
    const double original = point[i];
    point[i] = original + kFiniteDifferenceStep;
    const double plus = loss(point);
    point[i] = original - kFiniteDifferenceStep;
    const double minus = loss(point);
    point[i] = original;
    grad[i] = (plus - minus) / (2.0 * kFiniteDifferenceStep);
  }
  return grad;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// Sets the calling thread's compute budget for a scope (core/threading.h).
class ScopedComputeThreads {
 public:
  explicit ScopedComputeThreads(int num_threads) : previous_(compute_threads()) { set_compute_threads(num_threads); }
  ~ScopedComputeThreads() { set_compute_threads(previous_); }
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;

 private:
  int previous_;
};

}  // namespace epmoe::testing
