// Element types of epmoe's tensors and views (include/epmoe/tensor_view.h).
// Compute happens in f32 (DESIGN.md §3); bf16 and fp8 e4m3 are storage /
// transfer formats, converted by kernels/convert.h. i32/i64 hold routing ids,
// counts and permutations. Public and std-only: a caller describes its own
// memory with these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace epmoe {

enum class DType : std::uint8_t { f32, bf16, fp8_e4m3, i32, i64 };

constexpr std::size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::fp8_e4m3:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::fp8_e4m3:
      return "fp8_e4m3";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

// Storage types for the two narrow floats: plain bit patterns, so that no
// arithmetic happens on them by accident.
struct bf16_t {
  std::uint16_t bits;
};
struct fp8_e4m3_t {
  std::uint8_t bits;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16_t>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<fp8_e4m3_t>() {
  return DType::fp8_e4m3;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}

}  // namespace epmoe
