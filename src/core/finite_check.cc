#include "core/finite_check.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/threading.h"

namespace epmoe {
namespace {

// Blocks of this many elements are tested with a branch-free OR (which GCC
// vectorises); only a block that holds a non-finite value is searched again
// element by element. 1024 floats = 4 KiB: the re-scan stays in L1.
constexpr std::int64_t kBlock = 1024;
// Below ~1 MiB of floats a second thread costs more to wake than it saves.
constexpr std::int64_t kParallelGrain = 1 << 18;

// Exponent field all ones = infinity or NaN, for a float stored in `Bits`.
template <typename Bits>
struct NonFinite {
  Bits exponent_mask;
  bool operator()(Bits bits) const { return (bits & exponent_mask) == exponent_mask; }
};

template <typename Bits, typename IsBad>
std::int64_t find_first(const Bits* bits, std::int64_t n, IsBad is_bad) {
  std::atomic<std::int64_t> first{n};
  parallel_for(n, kParallelGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t block = begin; block < end; block += kBlock) {
      // A slice after an earlier bad one cannot change the answer.
      if (block >= first.load(std::memory_order_relaxed)) return;
      const std::int64_t block_end = std::min(end, block + kBlock);
      unsigned any = 0;
      for (std::int64_t i = block; i < block_end; ++i) any |= is_bad(bits[i]) ? 1u : 0u;
      if (any == 0) continue;
      std::int64_t i = block;
      while (!is_bad(bits[i])) ++i;
      std::int64_t seen = first.load(std::memory_order_relaxed);
      while (i < seen && !first.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
      }
      return;
    }
  });
  const std::int64_t index = first.load();
  return index == n ? -1 : index;
}

float tensor_value(TensorView tensor, std::int64_t index) {
  switch (tensor.dtype()) {
    case DType::f32:
      return tensor.data<float>()[index];
    case DType::bf16: {
      const std::uint32_t bits = std::uint32_t{tensor.data<bf16_t>()[index].bits} << 16;
      return std::bit_cast<float>(bits);
    }
    case DType::fp8_e4m3:
      return NAN;  // its only non-finite codes are NaN
    default:
      return 0.0f;
  }
}

[[noreturn]] void throw_non_finite(std::string_view name, std::span<const std::int64_t> shape, std::int64_t index,
                                   float value, std::string_view rule) {
  std::string message(name);
  message += index_to_string(shape, index);
  message += " = ";
  message += value_to_string(value);
  message += ": ";
  message += rule;
  throw NumericError(message);
}

}  // namespace

std::int64_t find_non_finite(std::span<const float> values) {
  // Read as bits: independent of -ffast-math (which may fold std::isfinite to true).
  const auto* bits = reinterpret_cast<const std::uint32_t*>(values.data());
  return find_first(bits, static_cast<std::int64_t>(values.size()), NonFinite<std::uint32_t>{0x7f800000u});
}

std::int64_t find_non_finite(TensorView tensor) {
  EPMOE_CHECK(tensor.is_contiguous());
  switch (tensor.dtype()) {
    case DType::f32:
      return find_non_finite(tensor.span<float>());
    case DType::bf16: {
      const auto* bits = reinterpret_cast<const std::uint16_t*>(tensor.raw());
      return find_first(bits, tensor.numel(), NonFinite<std::uint16_t>{0x7f80u});
    }
    case DType::fp8_e4m3: {
      // e4m3fn has no infinity; S.1111.111 is its NaN.
      const auto* bits = reinterpret_cast<const std::uint8_t*>(tensor.raw());
      return find_first(bits, tensor.numel(), [](std::uint8_t b) { return (b & 0x7fu) == 0x7fu; });
    }
    case DType::i32:
    case DType::i64:
      return -1;
  }
  return -1;
}

std::string index_to_string(std::span<const std::int64_t> shape, std::int64_t flat_index) {
  std::vector<std::int64_t> index(shape.size());
  std::int64_t rest = flat_index;
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::int64_t extent = std::max<std::int64_t>(shape[d], 1);
    index[d] = rest % extent;
    rest /= extent;
  }
  std::string out = "[";
  for (std::size_t d = 0; d < index.size(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(index[d]);
  }
  return out + "]";
}

std::string value_to_string(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::ostringstream out;
  out << value;
  return out.str();
}

void check_finite(std::string_view name, std::span<const float> values, const Shape& shape, std::string_view rule) {
  EPMOE_CHECK_EQ(static_cast<std::int64_t>(values.size()), shape_numel(shape));
  const std::int64_t index = find_non_finite(values);
  if (index >= 0) throw_non_finite(name, shape, index, values[index], rule);
}

void check_finite(std::string_view name, TensorView tensor, std::string_view rule) {
  const std::int64_t index = find_non_finite(tensor);
  if (index >= 0) throw_non_finite(name, tensor.shape(), index, tensor_value(tensor, index), rule);
}

}  // namespace epmoe
