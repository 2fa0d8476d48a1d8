// MemoryLedger is public (<epmoe/memory_ledger.h>); inside epmoe this
// header adds the helper the buffers kept across steps charge themselves with.
#pragma once

#include <cstdint>

#include <epmoe/memory_ledger.h>

namespace epmoe {

// Bytes reserved by std::vectors (their capacity, not their size): what a
// buffer kept across steps holds between them.
template <typename... Vectors>
std::int64_t vector_capacity_bytes(const Vectors&... vectors) {
  return (static_cast<std::int64_t>(vectors.capacity() * sizeof(typename Vectors::value_type)) + ... + 0);
}

}  // namespace epmoe
