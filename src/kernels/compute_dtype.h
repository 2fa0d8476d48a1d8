// The operand type fed to the GEMMs (ComputeDType, <epmoe/config.h>) and its
// key's parser.
#pragma once

#include <string_view>

#include <epmoe/config.h>

namespace epmoe {

// Throws ConfigError naming `key` when `value` is neither "f32" nor "bf16".
ComputeDType parse_compute_dtype(std::string_view key, std::string_view value);

}  // namespace epmoe
