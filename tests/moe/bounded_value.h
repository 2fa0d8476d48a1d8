// BoundedValue: a double together with a first-order bound on the error that
// a lower-precision computation of the same expression can have. Forward
// error analysis made mechanical (Higham, "Accuracy and Stability of
// Numerical Algorithms", ch. 3): every operation propagates the bounds of its
// operands, and `round_operand` adds the error of rounding an operand to a
// narrow format with unit roundoff u (bf16: u = 2^-8; fp8 e4m3: u = 2^-4).
// The reference MoE loop run on BoundedValue yields, per output element,
// |computed - exact| <= bound for any implementation that rounds the same
// operands — the derived bound the bf16 and fp8 tests hold.
#pragma once

#include <algorithm>
#include <cmath>

namespace epmoe::testing {

struct BoundedValue {
  double value = 0;
  double bound = 0;  // |error| <= bound

  BoundedValue() = default;
  BoundedValue(double v) : value(v) {}  // NOLINT: exact inputs convert implicitly
  BoundedValue(double v, double b) : value(v), bound(b) {}
};

inline BoundedValue operator+(BoundedValue a, BoundedValue b) { return {a.value + b.value, a.bound + b.bound}; }
inline BoundedValue operator-(BoundedValue a, BoundedValue b) { return {a.value - b.value, a.bound + b.bound}; }
inline BoundedValue operator-(BoundedValue a) { return {-a.value, a.bound}; }
inline BoundedValue operator*(BoundedValue a, BoundedValue b) {
  return {a.value * b.value, std::abs(a.value) * b.bound + std::abs(b.value) * a.bound + a.bound * b.bound};
}
inline BoundedValue operator/(BoundedValue a, BoundedValue b) {
  const double denominator = std::abs(b.value) - b.bound;  // smallest |b| within its bound
  if (denominator <= 0) return {a.value / b.value, INFINITY};
  return {a.value / b.value,
          (std::abs(a.value) * b.bound + std::abs(b.value) * a.bound) / (std::abs(b.value) * denominator)};
}
inline BoundedValue& operator+=(BoundedValue& a, BoundedValue b) { return a = a + b; }
inline BoundedValue& operator-=(BoundedValue& a, BoundedValue b) { return a = a - b; }
inline BoundedValue& operator*=(BoundedValue& a, BoundedValue b) { return a = a * b; }
inline bool operator<(BoundedValue a, BoundedValue b) { return a.value < b.value; }
inline bool operator>(BoundedValue a, BoundedValue b) { return a.value > b.value; }
inline bool operator==(BoundedValue a, BoundedValue b) { return a.value == b.value; }

inline BoundedValue exp(BoundedValue a) {
  const double v = std::exp(a.value);
  return {v, v * std::expm1(a.bound)};  // exp is increasing: worst case at value + bound
}
// sigmoid' <= 1/4 everywhere.
inline BoundedValue sigmoid(BoundedValue a) { return {1.0 / (1.0 + std::exp(-a.value)), 0.25 * a.bound}; }
inline double magnitude(BoundedValue a) { return std::abs(a.value); }

// The operand of a product is rounded to a format with unit roundoff u.
inline BoundedValue round_operand(BoundedValue a, double u) {
  return {a.value, a.bound + u * (std::abs(a.value) + a.bound)};
}

// Plain doubles: exact arithmetic, so one loop serves both. With u = 2^-8
// the operand is rounded to bf16 itself (round to nearest even), which
// emulates the bf16 GEMM path exactly up to fp32 accumulation order.
double round_to_bf16(double a);
inline double round_operand(double a, double u) { return u == 0 ? a : round_to_bf16(a); }
inline double magnitude(double a) { return std::abs(a); }

}  // namespace epmoe::testing
