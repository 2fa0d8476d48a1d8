// Tag bit layout of comm/ (gloo types.h style: collective kind, tag, slot).
// A transport tag has 31 bits (transport::kMaxTag, MPI's tag range):
//
//    bit 30 .... 27 | 26 ............................ 3 | 2 .. 0
//   [ kind (4 bits) | collective tag (24 bits), caller's | slot  ]
//
//  * kind: which collective sends the message (CollectiveKind). Two
//    different collectives in flight at once with the same collective tag
//    (an all-gather and an all-reduce both given tag 5) never match each
//    other's messages; before the kind had bits, they could.
//  * collective tag (0 .. kMaxCollectiveTag = 2^24 - 1): the `tag` field of
//    every options struct. Collectives of one kind that are in flight at the
//    same time on one communicator must use different collective tags; a tag
//    may be reused once the previous collective with it has completed on
//    every rank.
//  * slot (3 bits): which message stream inside one collective - the two
//    lanes of the ring, counts vs data. Streams that share (peer, tag) rely on
//    the transports' in-order matching, so steps need no bits of their own.
#pragma once

#include <cstdint>
#include <string>

#include "transport/communicator.h"

namespace epmoe::comm {

constexpr int kSlotBits = 3;
constexpr int kCollectiveTagBits = 24;
constexpr int kKindBits = 4;
static_assert(kSlotBits + kCollectiveTagBits + kKindBits == 31, "a transport tag has 31 bits");
constexpr std::uint32_t kMaxCollectiveTag = (std::uint32_t{1} << kCollectiveTagBits) - 1;  // 2^24 - 1

enum class CollectiveKind : std::uint32_t {
  point_to_point = 0,  // messages a caller posts itself (ep/replica_exchange)
  all_gather = 1,
  reduce_scatter = 2,
  all_reduce = 3,
  all_to_all_v = 4,
  barrier = 5,
  broadcast = 6,
};

enum class Slot : std::uint32_t {
  ring_clockwise = 0,            // all-gather lane to rank + 1
  ring_counter_clockwise = 1,    // all-gather lane to rank - 1
  reduce = 2,                    // reduce-scatter partial sums, to rank + 1
  reduce_counter_clockwise = 3,  // reduce-scatter partial sums, to rank - 1
  counts = 4,                    // all-to-all-v counts
  data = 5,                      // all-to-all-v payload, broadcast payload, point-to-point
  barrier = 6,
};

constexpr transport::Tag make_tag(CollectiveKind kind, std::uint32_t collective_tag, Slot slot) {
  return (static_cast<std::uint32_t>(kind) << (kCollectiveTagBits + kSlotBits)) | (collective_tag << kSlotBits) |
         static_cast<std::uint32_t>(slot);
}
static_assert(make_tag(CollectiveKind::broadcast, kMaxCollectiveTag, Slot::barrier) <= transport::kMaxTag);

// Throws ConfigError naming `what`, the tag and the limit if the tag is out of range.
void validate_collective_tag(const char* what, std::uint64_t collective_tag);

}  // namespace epmoe::comm
