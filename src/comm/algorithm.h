// Which implementation a collective runs: ours (the ring / pairwise algorithms
// of comm/, on any transport) or the transport's own (MPI's collectives, only
// on the mpi transport; for comparison, DESIGN.md §4.4).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "transport/communicator.h"
#include "transport/native_collectives.h"

namespace epmoe::comm {

enum class Algorithm { ring, native };

// Ring collectives: both directions of every link at once (each half of a
// block travels one way), or one direction only (for comparison).
enum class RingDirection { bidirectional, unidirectional };

constexpr std::string_view algorithm_name(Algorithm algorithm) {
  return algorithm == Algorithm::native ? "native" : "ring";
}

namespace detail {
// Checks shared by every options struct; throw ConfigError naming the
// collective, the field and the rule.
void check_common(const char* collective, std::uint64_t tag, std::chrono::milliseconds timeout);
void check_count(const char* collective, const char* field, std::int64_t count);
void check_buffer(const char* collective, const char* field, const void* data, std::int64_t num_bytes);
// The transport's native collectives, or ConfigError if it has none.
transport::NativeCollectives& require_native(transport::Communicator& comm, const char* collective);
// Runs a native collective on the calling thread, before returning an empty
// (complete) handle: MPI collectives must start in the same order on every
// rank, which only the caller's program order guarantees. So native
// collectives do not overlap with the caller's compute (OpenMPI 4.1's
// nonblocking collectives would progress only inside MPI calls anyway).
// PeerErrors are prefixed with `name`.
void run_native(const std::string& name, const std::function<void()>& fn);
// "ring_all_gather tag 7" - the prefix of the collective's error messages.
std::string collective_name(const char* collective, std::uint32_t tag);
}  // namespace detail

}  // namespace epmoe::comm
