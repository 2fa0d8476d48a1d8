// How much memory a command may plan to allocate, so sizes that cannot be
// held are refused with a message naming the keys before any work, instead
// of ending as "out of memory" (exit 1) or in the OOM killer after seconds.
#pragma once

#include <cstdint>
#include <string>

namespace epmoe::cli {

// Physical memory, or the address-space limit (ulimit -v) when lower.
std::int64_t memory_budget_bytes();

// ConfigError "SETTING: needs BYTES bytes, more than this machine's memory
// (BUDGET bytes)" when `bytes` exceeds memory_budget_bytes().
void check_fits_in_memory(const std::string& setting, std::int64_t bytes);

}  // namespace epmoe::cli
