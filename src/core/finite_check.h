// Finite checks: NaN and infinities never pass silently (issue 12).
//
// One pass over the values, vectorised (an OR of exponent-field compares per
// block; the exact index is searched only inside a block that failed), split
// over the calling thread's compute threads for large tensors. Use it where
// numbers enter epmoe (layer inputs, checkpoint tensors, npy files) and where
// a step produces values a later step would spread (layer outputs).
//
//   check_finite("x", x);                 // TensorView or Tensor (f32, bf16, fp8; ints pass)
//   check_finite("x", span, {n, h});      // any float buffer with its shape
//   // -> NumericError "x[3, 17] = nan: inputs must be finite"
//
// The index is the C-order position in the given shape, so for a shard (e.g.
// wi0 holding this rank's E_l experts) it is the index into the shard.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"

namespace epmoe {

inline constexpr std::string_view kInputsMustBeFinite = "inputs must be finite";

// Index of the first NaN or ±infinity in `values`, or -1 when all are finite.
std::int64_t find_non_finite(std::span<const float> values);
// The same for a contiguous tensor of any dtype (integer dtypes are always
// finite; bf16 infinities and NaNs, fp8 e4m3 NaN codes count).
std::int64_t find_non_finite(TensorView tensor);

// "[3, 17]": the C-order multi-index of `flat_index` in `shape`.
std::string index_to_string(std::span<const std::int64_t> shape, std::int64_t flat_index);
// "nan", "inf", "-inf" (or the number, for messages about finite values).
std::string value_to_string(float value);

// Throws NumericError "<name>[i, j] = <value>: <rule>" for the first
// non-finite element. `values` holds shape_numel(shape) floats.
void check_finite(std::string_view name, std::span<const float> values, const Shape& shape,
                  std::string_view rule = kInputsMustBeFinite);
void check_finite(std::string_view name, TensorView tensor, std::string_view rule = kInputsMustBeFinite);

}  // namespace epmoe
