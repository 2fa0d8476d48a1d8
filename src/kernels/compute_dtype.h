// The operand type fed to the GEMMs. Accumulation is always fp32
// (DESIGN.md §3): bf16 means bf16 operands, fp32 accumulate and fp32 output,
// the way MoE training runs on accelerators.
#pragma once

#include <string>
#include <string_view>

namespace epmoe {

enum class ComputeDType { f32, bf16 };

// Throws ConfigError naming `key` when `value` is neither "f32" nor "bf16".
ComputeDType parse_compute_dtype(std::string_view key, std::string_view value);
std::string to_string(ComputeDType dtype);

}  // namespace epmoe
