// Narrow float formats used for storage and transfer (DESIGN.md §3).
//  * bf16: round to nearest even; NaN stays NaN (quiet); infinities kept.
//  * fp8 e4m3 (the "fn" variant: no infinities, max finite 448, one NaN code
//    per sign 0x7f/0xff): round to nearest even, values beyond ±448
//    (infinities included) saturate to ±448, NaN stays NaN. Subnormals are
//    kept (smallest 2^-9).
#pragma once

#include <cstdint>
#include <span>

#include <epmoe/dtype.h>

namespace epmoe {

bf16_t float_to_bf16(float value);
float bf16_to_float(bf16_t value);
fp8_e4m3_t float_to_fp8_e4m3(float value);
float fp8_e4m3_to_float(fp8_e4m3_t value);

constexpr float kFp8E4m3Max = 448.0f;

// Array forms; sizes must match.
void convert(std::span<const float> src, std::span<bf16_t> dst);
void convert(std::span<const bf16_t> src, std::span<float> dst);
void convert(std::span<const float> src, std::span<fp8_e4m3_t> dst);
void convert(std::span<const fp8_e4m3_t> src, std::span<float> dst);

}  // namespace epmoe
