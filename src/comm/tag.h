// Tag bit layout of comm/ (gloo types.h style). A transport tag has 31 bits
// (transport::kMaxTag, MPI's tag range):
//
//    bit 30 ............................. 4 | 3 ...... 0
//   [ collective tag, chosen by the caller  | slot       ]
//
//  * collective tag (27 bits, 0 .. kMaxCollectiveTag): the `tag` field of every
//    options struct. Collectives that are in flight at the same time on one
//    communicator must use different collective tags; a tag may be reused once
//    the previous collective with it has completed on every rank.
//  * slot (4 bits): which message stream inside one collective - the two
//    lanes of the ring, counts vs data. Streams that share (peer, tag) rely on
//    the transports' in-order matching, so steps need no bits of their own.
#pragma once

#include <cstdint>
#include <string>

#include "transport/communicator.h"

namespace epmoe::comm {

constexpr int kSlotBits = 4;
constexpr std::uint32_t kMaxCollectiveTag = transport::kMaxTag >> kSlotBits;  // 2^27 - 1

enum class Slot : std::uint32_t {
  ring_clockwise = 0,          // all-gather lane to rank + 1
  ring_counter_clockwise = 1,  // all-gather lane to rank - 1
  reduce = 2,                  // reduce-scatter partial sums, to rank + 1
  reduce_counter_clockwise = 3,  // reduce-scatter partial sums, to rank - 1
  counts = 4,                  // all-to-all-v counts
  data = 5,                    // all-to-all-v payload, broadcast payload
  barrier = 6,
};

constexpr transport::Tag make_tag(std::uint32_t collective_tag, Slot slot) {
  return (collective_tag << kSlotBits) | static_cast<std::uint32_t>(slot);
}

// Throws ConfigError naming `what`, the tag and the limit if the tag is out of range.
void validate_collective_tag(const char* what, std::uint64_t collective_tag);

}  // namespace epmoe::comm
